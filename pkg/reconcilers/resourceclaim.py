"""ResourceClaimReconciler: the node label ``computeDomain=<uid>`` follows allocated channel claims.

Keyed by node name. As soon as the scheduler allocates a channel claim of this driver to a node
(``status.allocation``: the device ``channel-0``, the ``domainID`` of its opaque config and the
node from ``nodeSelector`` ``matchFields metadata.name``), the node is labelled for that domain,
so its IMEX daemon is scheduled while the workload pod is still starting; the kubelet plugin
still labels at NodePrepareResources as a fallback. Invariants:

* a label naming another *live* domain is never overwritten (one domain per node): the claim
  and its domain get a Warning Event; a label naming a deleted domain is replaced;
* a claim that references a domain in another namespace never labels anything and produces one
  Warning Event on the claim and on the domain (the plugin refuses to prepare it anyway);
* the label is removed only when this process saw claims of that domain on that node and the
  last of them was deallocated, and only while the label still names that domain; a label
  this process never saw a claim for (e.g. set before a restart) is left to the plugin's
  unprepare and the orphan cleanup.
"""

from __future__ import annotations

import copy
import logging
import threading
from typing import Any

from pkg.api import constants as c
from pkg.kube.client import KubeClient
from pkg.kube.resources import NODES
from pkg.reconcilers.cache import BY_DOMAIN, BY_NODE, BY_UID, Caches, channel_domain_id
from pkg.reconcilers.controller import Result
from pkg.reconcilers.dependents import remove_domain_label
from pkg.reconcilers.events import WARNING, OnceEvents

__all__ = ["ResourceClaimReconciler"]

log = logging.getLogger(__name__)

JSON = dict[str, Any]


def _ref(obj: JSON) -> str:
    meta = obj.get("metadata", {})
    return f"{meta.get('namespace')}/{meta.get('name')}"


class ResourceClaimReconciler:
    """Reconciles the domain label of one node from the claims allocated on it."""

    def __init__(self, *, client: KubeClient, caches: Caches, events: OnceEvents) -> None:
        self._client = client
        self._caches = caches
        self._events = events
        # node -> domain UID whose claims we saw allocated there (and so may unlabel).
        self._seen: dict[str, str] = {}
        self._lock = threading.Lock()

    def nodes_of_domain(self, uid: str) -> list[str]:
        """Nodes with allocated claims of ``uid`` (to re-check when the domain appears)."""
        out: set[str] = set()
        for claim in self._caches.claims.by_index(BY_DOMAIN, uid):
            allocation = (claim.get("status") or {}).get("allocation") or {}
            for term in (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
                for field in term.get("matchFields") or []:
                    out.update(field.get("values") or [])
        return sorted(out)

    def _wanted(self, node_name: str) -> dict[str, tuple[JSON, list[JSON]]]:
        """Domain UID → (domain, claims) for the valid channel claims allocated on the node."""
        wanted: dict[str, tuple[JSON, list[JSON]]] = {}
        for claim in self._caches.claims.by_index(BY_NODE, node_name):
            uid = channel_domain_id(claim)
            if uid is None:
                continue
            domains = self._caches.compute_domains.by_index(BY_UID, uid)
            if not domains:
                self._events.event(
                    claim, WARNING, "ComputeDomainNotFound",
                    f"claim {_ref(claim)} references ComputeDomain UID {uid}, which does not exist",
                )  # fmt: skip
                continue
            cd = domains[0]
            cd_ns = cd["metadata"].get("namespace")
            if cd_ns != claim.get("metadata", {}).get("namespace"):
                msg = (
                    f"claim {_ref(claim)} references ComputeDomain {_ref(cd)} in another "
                    "namespace; a channel claim must be in its ComputeDomain's namespace"
                )
                self._events.event(claim, WARNING, "ComputeDomainNamespaceMismatch", msg)
                self._events.event(cd, WARNING, "ComputeDomainNamespaceMismatch", msg)
                continue
            if cd["metadata"].get("deletionTimestamp"):
                continue
            wanted.setdefault(uid, (cd, []))[1].append(claim)
        return wanted

    def reconcile(self, key: str) -> Result:
        node_name = key
        node = self._caches.nodes.get_by_key(node_name)
        if node is None:
            with self._lock:
                self._seen.pop(node_name, None)
            return Result()
        current = (node["metadata"].get("labels") or {}).get(c.COMPUTE_DOMAIN_LABEL)
        wanted = self._wanted(node_name)
        if not wanted:
            with self._lock:
                seen = self._seen.pop(node_name, None)
            if seen is not None and current == seen:
                remove_domain_label(self._client, node, uid=seen)
                log.info("node label removed (no live claim left) uid=%s", seen,
                         extra={"key": node_name})  # fmt: skip
            return Result()
        if len(wanted) > 1:
            names = ", ".join(sorted(_ref(cd) for cd, _ in wanted.values()))
            for cd, _claims in wanted.values():
                self._events.event(
                    cd, WARNING, "NodeConflict",
                    f"node {node_name} has channel claims of several ComputeDomains: {names}",
                )  # fmt: skip
            return Result()
        uid, (cd, claims) = next(iter(wanted.items()))
        with self._lock:
            self._seen[node_name] = uid
        if current == uid:
            return Result()
        if current and self._caches.compute_domains.by_index(BY_UID, current):
            msg = (
                f"node {node_name} already belongs to ComputeDomain UID {current}; "
                f"one ComputeDomain per node, so {_ref(cd)} cannot use it yet"
            )
            self._events.event(cd, WARNING, "NodeInUse", msg)
            for claim in claims:
                self._events.event(claim, WARNING, "NodeInUse", msg)
            return Result()
        body = copy.deepcopy(node)
        body["metadata"].setdefault("labels", {})[c.COMPUTE_DOMAIN_LABEL] = uid
        self._client.update(NODES, body)
        log.info("node labelled for domain uid=%s domain=%s", uid, _ref(cd),
                 extra={"key": node_name})  # fmt: skip
        return Result()
