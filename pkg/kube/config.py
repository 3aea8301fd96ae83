"""Building a configured `kubernetes.client.ApiClient` (host, TLS, credentials).

Owns the discovery order for credentials: an explicit kubeconfig file, else the in-cluster
service account, else the default kubeconfig (`$KUBECONFIG` / `~/.kube/config`). Nothing here
talks to the API server; wrap the result in `pkg.kube.client.RestClient`.
"""

from __future__ import annotations

from collections.abc import Callable

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

__all__ = ["load_api_client"]

# The config loaders are untyped upstream; typed aliases keep --strict honest here.
_load_kube_config: Callable[..., None] = k8s_config.load_kube_config
_load_incluster_config: Callable[..., None] = k8s_config.load_incluster_config


def load_api_client(
    kubeconfig: str | None = None, *, context: str | None = None, pool_maxsize: int = 32
) -> k8s_client.ApiClient:
    """Return an ApiClient for `kubeconfig`, in-cluster config, or the default kubeconfig.

    `pool_maxsize` bounds kept-alive connections per host; every informer holds one open watch,
    so the default leaves room for a dozen informers plus ordinary requests.
    """
    cfg = k8s_client.Configuration()
    if kubeconfig:
        _load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    else:
        try:
            _load_incluster_config(client_configuration=cfg)
        except k8s_config.ConfigException:
            _load_kube_config(context=context, client_configuration=cfg)
    cfg.connection_pool_maxsize = pool_maxsize
    return k8s_client.ApiClient(configuration=cfg)
