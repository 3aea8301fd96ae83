"""Importing parts of the official Kubernetes client without its eager package initialisation.

``import kubernetes.client`` first runs ``kubernetes/__init__.py``, which imports every part of
the library: ``config`` (kubeconfig parsing with PyYAML, ``requests_oauthlib``, ``pydantic``,
google-auth), ``dynamic``, ``stream``, ``leaderelection``, ``informer``. In a daemon that only
needs the REST client, the watch framing and the in-cluster service account, that is about
0.15 s of a 0.3 s start on every node of every domain formation.

`defer_package_init` registers a package's module object in ``sys.modules`` without running
its ``__init__``, so ``import kubernetes.client`` (or ``from kubernetes import client``) loads
only that subpackage. The first access
to an attribute the package's ``__init__`` would have defined (``kubernetes.config.
load_kube_config``, ``kubernetes.__version__``) runs the ``__init__`` then, in the same module
object, and answers it: callers that use the package the ordinary way see no difference,
they only pay when they need it. Invariant: a package already imported is left alone, and
``__init__`` runs at most once.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import types

__all__ = ["defer_package_init", "is_deferred"]

_lock = threading.RLock()


def defer_package_init(name: str) -> bool:
    """Register package ``name`` (its parent already imported or deferred) with its ``__init__``
    deferred; True if registered, False if it was imported already. Raises ``ImportError``
    when ``name`` is not an installed package."""
    with _lock:
        if name in sys.modules:
            return False
        spec = importlib.util.find_spec(name)
        if spec is None or spec.submodule_search_locations is None or spec.loader is None:
            raise ImportError(f"{name} is not an installed package")
        module = importlib.util.module_from_spec(spec)
        state = {"ran": False}

        def complete(attr: str) -> object:
            # ``from kubernetes import client`` asks hasattr(kubernetes, "client") first: a
            # submodule is imported on its own, without the package's __init__.
            if not state["ran"] and not attr.startswith("__"):
                try:
                    sub = importlib.util.find_spec(f"{name}.{attr}")
                except (ImportError, ValueError):
                    sub = None
                if sub is not None:
                    return importlib.import_module(f"{name}.{attr}")
            with _lock:
                if not state["ran"]:
                    state["ran"] = True
                    assert spec.loader is not None
                    del module.__dict__["__getattr__"]
                    spec.loader.exec_module(module)
            try:
                return module.__dict__[attr]
            except KeyError:
                raise AttributeError(f"module {name!r} has no attribute {attr!r}") from None

        module.__getattr__ = complete  # type: ignore[method-assign]
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)
        return True


def is_deferred(module: types.ModuleType) -> bool:
    """Whether ``module``'s ``__init__`` has not run yet (for tests and diagnostics)."""
    return "__getattr__" in module.__dict__ and callable(module.__dict__["__getattr__"])
