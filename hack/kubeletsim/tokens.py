"""Bound ServiceAccount tokens and kubeconfigs for processes the stand-in starts.

Owns what the kubelet's projected service-account token volume provides: a TokenRequest
(``serviceaccounts/<sa>/token``) bound to the pod -- made with the node's own identity, which the
Node authorizer and NodeRestriction allow only for pods bound to that node -- so the API server
sees ``authentication.kubernetes.io/pod-name`` / ``node-name`` in the caller's user info, exactly
what the driver's ValidatingAdmissionPolicies (``config/admission``) check. The kubelet plugin
runs without a pod here, so its token is bound to the Node object instead (same ``node-name``
extra; requested with an identity allowed to, normally admin). Each token is written into a
self-contained kubeconfig next to the pod's files.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from pkg.kube.client import KubeClient
from pkg.kube.resources import Resource

TOKEN_SECONDS = 24 * 3600
# The API server's audience (= its --service-account-issuer, as in localcluster and in-cluster).
API_AUDIENCE = "https://kubernetes.default.svc"


def cluster_of(kubeconfig: Path) -> tuple[str, str]:
    """(server URL, base64 CA data) of the current context's cluster in ``kubeconfig``."""
    doc = yaml.safe_load(kubeconfig.read_text())
    current = doc.get("current-context")
    ctx = next(c for c in doc["contexts"] if c["name"] == current)["context"]
    cluster = next(c for c in doc["clusters"] if c["name"] == ctx["cluster"])["cluster"]
    ca = cluster.get("certificate-authority-data")
    if not ca and cluster.get("certificate-authority"):
        ca = base64.b64encode(Path(cluster["certificate-authority"]).read_bytes()).decode()
    return str(cluster["server"]), str(ca or "")


def write_token_kubeconfig(path: Path, *, server: str, ca_data: str, user: str, token: str) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {
                    "server": server,
                    **({"certificate-authority-data": ca_data} if ca_data else {}),
                },
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc))
    tmp.chmod(0o600)
    tmp.replace(path)
    return path


class TokenMinter:
    """Requests bound tokens through ``client`` and writes kubeconfigs for ``server``."""

    def __init__(
        self, client: KubeClient, *, server: str, ca_data: str, audience: str = API_AUDIENCE
    ) -> None:
        self._client = client
        self._audience = audience
        self._server = server
        self._ca = ca_data

    def _request(self, namespace: str, sa: str, bound: dict[str, Any]) -> str:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                # Explicit API audience: the Node authorizer (ServiceAccountNodeAudienceRestriction)
                # refuses a node's request for the empty/default audience.
                "audiences": [self._audience],
                "expirationSeconds": TOKEN_SECONDS,
                "boundObjectRef": bound,
            },
        }
        # POST .../serviceaccounts/<sa>/token: a create on the subresource path.
        token_request = Resource("", "v1", f"serviceaccounts/{sa}/token", "TokenRequest", True)
        out = self._client.create(token_request, body, namespace=namespace)
        return str(out["status"]["token"])

    def for_pod(self, pod: dict[str, Any], path: Path) -> Path:
        meta, spec = pod["metadata"], pod["spec"]
        sa = spec.get("serviceAccountName") or "default"
        token = self._request(
            meta["namespace"],
            sa,
            {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]},
        )
        user = f"system:serviceaccount:{meta['namespace']}:{sa}"
        return write_token_kubeconfig(
            path, server=self._server, ca_data=self._ca, user=user, token=token
        )

    def for_node(self, namespace: str, sa: str, node: dict[str, Any], path: Path) -> Path:
        meta = node["metadata"]
        token = self._request(
            namespace,
            sa,
            {"apiVersion": "v1", "kind": "Node", "name": meta["name"], "uid": meta["uid"]},
        )
        user = f"system:serviceaccount:{namespace}:{sa}"
        return write_token_kubeconfig(
            path, server=self._server, ca_data=self._ca, user=user, token=token
        )
