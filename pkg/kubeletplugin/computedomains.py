"""ComputeDomain facts the plugin needs during Prepare/Unprepare, driven by watch events.

Owns three things:

* lookups of ComputeDomains by UID (a cluster-wide watch cache indexed by UID);
* readiness of this node's IMEX daemon for a domain: the ComputeDomainClique
  ``<cdUID>.<cliqueID>`` in the driver namespace has ``daemons[nodeName == me].status == Ready``;
  on a node without a clique (or when no clique object says so) the fallback is
  ``cd.status.nodes[name == me].status == Ready``. Waiting blocks on a condition variable that
  both watch caches notify, so a Ready transition releases the waiter within one event - there is
  no sleep-polling - and the wait is bounded by the caller's deadline;
* the node label ``resource.nvidia.com/computeDomain=<cdUID>``: added with a JSON patch whose
  first operation tests ``metadata.resourceVersion``, so two domains racing for one node can
  never both win (the loser re-reads and sees the other's label: a retryable error); removed only
  when its value is still ours.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from pkg.api.constants import COMPUTE_DOMAIN_LABEL, STATUS_READY, clique_object_name
from pkg.kube.client import JSON, KubeClient
from pkg.kube.errors import ConflictError, InvalidError, NotFoundError
from pkg.kube.resources import COMPUTE_DOMAIN_CLIQUES, COMPUTE_DOMAINS, NODES
from pkg.kubeletplugin.errors import RetryableError
from pkg.kubeletplugin.watchcache import WatchCache

log = logging.getLogger(__name__)

_LABEL_PATH = "/metadata/labels/" + COMPUTE_DOMAIN_LABEL.replace("~", "~0").replace("/", "~1")
_LABEL_ATTEMPTS = 5


def _uid(obj: JSON) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


class DomainTracker:
    """Watch-backed ComputeDomain/Clique view plus node-label management for one node."""

    def __init__(
        self,
        *,
        client: KubeClient,
        node_name: str,
        driver_namespace: str,
        clique_id: str,
        monotonic: Callable[[], float],
        retry_delay: float = 1.0,
        domain_grace: float = 2.0,
    ) -> None:
        self._client = client
        self._node = node_name
        self._namespace = driver_namespace
        self._clique_id = clique_id
        self._monotonic = monotonic
        self._grace = domain_grace
        self._cond = threading.Condition()
        self._domains = WatchCache(
            client=client, resource=COMPUTE_DOMAINS, cond=self._cond, retry_delay=retry_delay
        )
        self._cliques = WatchCache(
            client=client, resource=COMPUTE_DOMAIN_CLIQUES, cond=self._cond,
            namespace=driver_namespace, retry_delay=retry_delay,
        )  # fmt: skip
        self._by_uid: dict[str, JSON] = {}
        self._domains.add_listener(self._index)

    def start(self) -> None:
        self._domains.start()
        self._cliques.start()

    def stop(self) -> None:
        self._domains.stop()
        self._cliques.stop()

    def synced(self) -> bool:
        return self._domains.synced and self._cliques.synced

    def wait_synced(self, timeout: float) -> bool:
        deadline = self._monotonic() + timeout
        return self._domains.wait_synced(timeout) and self._cliques.wait_synced(
            deadline - self._monotonic()
        )

    def _index(self, event_type: str, obj: JSON) -> None:
        with self._cond:
            if event_type == "DELETED":
                self._by_uid.pop(_uid(obj), None)
            else:
                self._by_uid[_uid(obj)] = obj

    def _wait(self, predicate: Callable[[], Any], deadline: float) -> Any:
        with self._cond:
            while True:
                result = predicate()
                remaining = deadline - self._monotonic()
                if result or remaining <= 0:
                    return result
                self._cond.wait(remaining)

    def get_domain(self, uid: str, *, deadline: float) -> JSON | None:
        """The ComputeDomain with this UID, waiting briefly for a just-created one to arrive."""
        self._domains.wait_synced(deadline - self._monotonic())
        found: JSON | None = self._wait(
            lambda: self._by_uid.get(uid), min(deadline, self._monotonic() + self._grace)
        )
        return found

    def is_ready(self, cd_uid: str) -> bool:
        """This node's daemon for the domain is Ready (caller holds no lock)."""
        with self._cond:
            return self._ready(cd_uid)

    def _ready(self, cd_uid: str) -> bool:
        if self._clique_id:
            clique = self._cliques.get(self._namespace, clique_object_name(cd_uid, self._clique_id))
            for daemon in (clique or {}).get("daemons") or []:
                if daemon.get("nodeName") == self._node:
                    return bool(daemon.get("status") == STATUS_READY)
        cd = self._by_uid.get(cd_uid) or {}
        for node in (cd.get("status") or {}).get("nodes") or []:
            if node.get("name") == self._node:
                return bool(node.get("status") == STATUS_READY)
        return False

    def wait_ready(self, cd_uid: str, *, deadline: float) -> bool:
        return bool(self._wait(lambda: self._ready(cd_uid), deadline))

    def add_node_label(self, cd_uid: str) -> None:
        """Label this node for the domain; `RetryableError` if another domain holds it."""
        for _ in range(_LABEL_ATTEMPTS):
            node = self._client.get(NODES, self._node)
            meta = node.get("metadata") or {}
            labels = meta.get("labels") or {}
            current = labels.get(COMPUTE_DOMAIN_LABEL)
            if current == cd_uid:
                return
            if current:
                raise RetryableError(
                    f"node {self._node} is labeled for another ComputeDomain ({current}); "
                    "waiting until that domain's workload leaves the node"
                )
            ops: list[JSON] = [
                {
                    "op": "test",
                    "path": "/metadata/resourceVersion",
                    "value": meta["resourceVersion"],
                }
            ]
            if "labels" in meta:
                ops.append({"op": "add", "path": _LABEL_PATH, "value": cd_uid})
            else:
                ops.append(
                    {
                        "op": "add",
                        "path": "/metadata/labels",
                        "value": {COMPUTE_DOMAIN_LABEL: cd_uid},
                    }
                )
            try:
                self._client.patch(NODES, self._node, ops, patch_type="json")
                log.info("labeled node %s %s=%s", self._node, COMPUTE_DOMAIN_LABEL, cd_uid)
                return
            except (ConflictError, InvalidError):
                continue  # node changed since our read: re-read and decide again
        raise RetryableError(f"node {self._node} kept changing while labeling it; will retry")

    def remove_node_label(self, cd_uid: str) -> None:
        """Remove the label if (and only if) it still names this domain."""
        for _ in range(_LABEL_ATTEMPTS):
            try:
                node = self._client.get(NODES, self._node)
            except NotFoundError:
                return
            labels = (node.get("metadata") or {}).get("labels") or {}
            if labels.get(COMPUTE_DOMAIN_LABEL) != cd_uid:
                return
            ops: list[JSON] = [
                {"op": "test", "path": _LABEL_PATH, "value": cd_uid},
                {"op": "remove", "path": _LABEL_PATH},
            ]
            try:
                self._client.patch(NODES, self._node, ops, patch_type="json")
                log.info(
                    "removed node label %s=%s from %s", COMPUTE_DOMAIN_LABEL, cd_uid, self._node
                )
                return
            except (ConflictError, InvalidError):
                continue
        raise RetryableError(f"could not remove node label for ComputeDomain {cd_uid}; will retry")
