"""Building a configured connection to the API server (host, TLS, credentials).

Owns the discovery order for credentials: an explicit kubeconfig file, else the in-cluster
service account, else the default kubeconfig (`$KUBECONFIG` / `~/.kube/config`). Nothing here
talks to the API server; wrap the result in `pkg.kube.client.RestClient`. The in-cluster path
loads only the client's ``incluster_config`` module; the kubeconfig parser (PyYAML, OAuth,
pydantic) is imported only when a kubeconfig is read.

The result is a `Connection`: the official client's ``Configuration`` and its
``rest.RESTClientObject`` (the urllib3 pool with the configuration's TLS, proxy and keepalive
settings), without the official ``ApiClient`` around them. `RestClient` sends raw JSON and
never uses the ``ApiClient``'s model (de)serialisation, and importing ``kubernetes.client.
api_client`` loads every generated model and pydantic: about 65 ms on every start of every
binary, on the daemon's path to its first request.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from kubernetes.client import rest as k8s_rest
from kubernetes.client.configuration import Configuration
from kubernetes.config.config_exception import ConfigException

__all__ = ["Connection", "KubeConfigError", "load_api_client"]


class KubeConfigError(Exception):
    """No usable cluster configuration: the message says which source was tried and why it
    failed (each binary prints it as its ``cannot start:`` line, never a traceback)."""


class Connection:
    """A configured connection: `pkg.kube.client.ApiConnection` over the official client's
    ``Configuration`` and ``rest.RESTClientObject`` (built from it, so TLS, proxies, the pool
    size and keepalive are the official client's)."""

    def __init__(self, configuration: Configuration) -> None:
        self.configuration = configuration
        new_rest: Callable[[Configuration], Any] = k8s_rest.RESTClientObject
        self.rest_client: Any = new_rest(configuration)

    def update_params_for_auth(  # noqa: PLR0917 -- the official ApiClient's signature
        self,
        headers: dict[str, str],
        queries: list[tuple[str, str]],
        auth_settings: list[str],
        resource_path: str,
        method: str,
        body: Any,
    ) -> None:
        """Add each named credential of the configuration (the official client's
        ``auth_settings()``: the bearer token, re-read through the configuration's refresh hook,
        e.g. a rotated service-account token) as a header or query parameter, as the official
        ``ApiClient`` does. ``resource_path``, ``method`` and ``body`` are unused (signed
        requests are not supported by either)."""
        del resource_path, method, body
        settings: dict[str, Any] = dict(self.configuration.auth_settings())
        for name in auth_settings:
            setting = settings.get(name)
            if not setting:
                continue
            if setting["in"] == "header":
                headers[setting["key"]] = setting["value"]
            elif setting["in"] == "query":
                queries.append((setting["key"], setting["value"]))
            else:
                raise ValueError(f"credential {name!r} must go in a header or the query")


def _loader(module: str, name: str) -> Callable[..., None]:
    """A config loader of the official client (untyped upstream; typed here for --strict)."""
    found: Any = getattr(importlib.import_module(f"kubernetes.config.{module}"), name)
    return found  # type: ignore[no-any-return]


def load_api_client(
    kubeconfig: str | None = None, *, context: str | None = None, pool_maxsize: int = 32
) -> Connection:
    """Return a `Connection` for `kubeconfig`, in-cluster config, or the default kubeconfig.

    `pool_maxsize` bounds kept-alive connections per host; every informer holds one open watch,
    so the default leaves room for a dozen informers plus ordinary requests.
    Raises `KubeConfigError` when none of them gives a configuration.
    """
    cfg = Configuration()

    def load_kube_config(**kwargs: Any) -> None:
        # Imported only here: the kubeconfig parser is the heavy part of the client.
        _loader("kube_config", "load_kube_config")(**kwargs)

    try:
        if kubeconfig:
            load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
        else:
            try:
                _loader("incluster_config", "load_incluster_config")(client_configuration=cfg)
            except ConfigException as in_cluster:
                try:
                    load_kube_config(context=context, client_configuration=cfg)
                except Exception as err:
                    raise KubeConfigError(
                        f"no cluster configuration: not in a pod ({in_cluster}), and no "
                        f"kubeconfig ({err}); set --kubeconfig or KUBECONFIG"
                    ) from err
    except KubeConfigError:
        raise
    except Exception as err:  # the official loaders raise several unrelated types
        raise KubeConfigError(f"cannot load kubeconfig {kubeconfig}: {err}") from err
    cfg.connection_pool_maxsize = pool_maxsize
    # TCP keepalive with client-go's timings (the official client's own switch): a connection
    # whose peer is gone (API server host down, a NAT or load balancer that dropped the flow)
    # is reset by the kernel instead of hanging a watch.
    cfg.keep_alive = True
    return Connection(cfg)
