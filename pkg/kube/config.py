"""Building a configured `kubernetes.client.ApiClient` (host, TLS, credentials).

Owns the discovery order for credentials: an explicit kubeconfig file, else the in-cluster
service account, else the default kubeconfig (`$KUBECONFIG` / `~/.kube/config`). Nothing here
talks to the API server; wrap the result in `pkg.kube.client.RestClient`. The in-cluster path
loads only the client's ``incluster_config`` module; the kubeconfig parser (PyYAML, OAuth,
pydantic) is imported only when a kubeconfig is read.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.config.config_exception import ConfigException

__all__ = ["load_api_client"]


def _loader(module: str, name: str) -> Callable[..., None]:
    """A config loader of the official client (untyped upstream; typed here for --strict)."""
    found: Any = getattr(importlib.import_module(f"kubernetes.config.{module}"), name)
    return found  # type: ignore[no-any-return]


def load_api_client(
    kubeconfig: str | None = None, *, context: str | None = None, pool_maxsize: int = 32
) -> k8s_client.ApiClient:
    """Return an ApiClient for `kubeconfig`, in-cluster config, or the default kubeconfig.

    `pool_maxsize` bounds kept-alive connections per host; every informer holds one open watch,
    so the default leaves room for a dozen informers plus ordinary requests.
    """
    cfg = k8s_client.Configuration()
    if kubeconfig:
        _loader("kube_config", "load_kube_config")(
            config_file=kubeconfig, context=context, client_configuration=cfg
        )
    else:
        try:
            _loader("incluster_config", "load_incluster_config")(client_configuration=cfg)
        except ConfigException:
            _loader("kube_config", "load_kube_config")(context=context, client_configuration=cfg)
    cfg.connection_pool_maxsize = pool_maxsize
    # TCP keepalive with client-go's timings (the official client's own switch): a connection
    # whose peer is gone (API server host down, a NAT or load balancer that dropped the flow)
    # is reset by the kernel instead of hanging a watch.
    cfg.keep_alive = True
    return k8s_client.ApiClient(configuration=cfg)
