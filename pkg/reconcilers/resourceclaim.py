"""ResourceClaimReconciler: the node label ``computeDomain=<uid>`` follows allocated channel claims.

Keyed by node name. As soon as the scheduler allocates a channel claim of this driver to a node
(``status.allocation``: the device ``channel-0``, the ``domainID`` of its opaque config and the
node from ``nodeSelector`` ``matchFields metadata.name``), the node is labelled for that domain,
so its IMEX daemon is scheduled while the workload pod is still starting; the kubelet plugin
still labels at NodePrepareResources as a fallback. Invariants:

* a label naming another *live* domain is never overwritten (one domain per node): the claim
  and its domain get a Warning Event; a label naming a deleted domain is replaced;
* a claim that references a domain in another namespace never labels anything and produces one
  Warning Event on the claim and a rate-limited one on the domain (the plugin refuses to prepare
  it anyway). Neither names anything of the other namespace: the claim's Event does not name the
  domain, and the domain's Event -- whose cause another tenant controls -- names no claim and
  comes at most once per domain per :data:`VICTIM_WARNING_INTERVAL`, however many claims point
  at it (no leak, no spam);
* the label is removed only when this process saw claims of that domain on that node and the
  last of them was deallocated, and only while the label still names that domain; a label
  this process never saw a claim for (e.g. set before a restart) is left to the plugin's
  unprepare and the orphan cleanup;
* each allocated claim labels its node at most once: once the plugin's NodeUnprepareResources
  has removed the label, the claim (still allocated while its pod terminates) must not put it
  back, or the node stays held by a finished domain. That memory is per leadership term, so
  a new term (:meth:`ResourceClaimReconciler.adopt_allocations`, before its workers start)
  takes every claim already allocated as applied: it cannot tell an allocation whose pod has
  not reached Prepare from one whose pod the plugin already unprepared, and re-labelling the
  latter would hold the node (seen after an API-server outage cost the leader its lease
  while pods were being deleted). Such a claim's node is labelled by the plugin's Prepare;
* channel-0 is exclusive per node, so a claim of domain B allocated on a node proves that no
  claim of domain A is: a label for A that this process set is replaced by B's.
"""

from __future__ import annotations

import logging
import threading

from pkg.api import constants as c
from pkg.base.clock import Clock, RealClock
from pkg.base.types import JSON
from pkg.informers.store import meta_namespace_key
from pkg.kube.client import KubeClient
from pkg.reconcilers.cache import (
    BY_DOMAIN,
    BY_NODE,
    BY_UID,
    Caches,
    channel_domain_id,
)
from pkg.reconcilers.context import BACKGROUND, ReconcileContext
from pkg.reconcilers.controller import Result
from pkg.reconcilers.dependents import remove_domain_label
from pkg.reconcilers.events import WARNING, OnceEvents, RateLimitedEvents
from pkg.reconcilers.nodecache import patch_node_metadata

__all__ = ["VICTIM_WARNING_INTERVAL", "ResourceClaimReconciler"]

log = logging.getLogger(__name__)

VICTIM_WARNING_INTERVAL = 600.0
"""Least seconds between two ``ComputeDomainNamespaceMismatch`` Warnings on one domain."""


def _conflict_names(recipient: JSON, domains: list[JSON]) -> str:
    """The conflicting domains as ``recipient``'s namespace may see them: those of its own
    namespace by name, the others only counted (their names belong to other tenants)."""
    ns = recipient["metadata"].get("namespace")
    own = sorted(meta_namespace_key(d) for d in domains if d["metadata"].get("namespace") == ns)
    others = sum(1 for d in domains if d["metadata"].get("namespace") != ns)
    if others:
        own.append(f"{others} in other namespaces" if others > 1 else "1 in another namespace")
    return ", ".join(own)


class ResourceClaimReconciler:
    """Reconciles the domain label of one node from the claims allocated on it."""

    def __init__(
        self,
        *,
        client: KubeClient,
        caches: Caches,
        events: OnceEvents,
        clock: Clock | None = None,
        victim_interval: float = VICTIM_WARNING_INTERVAL,
    ) -> None:
        self._client = client
        self._caches = caches
        self._events = events
        # Warnings on a domain that another namespace's claims point at: per domain, not per
        # claim, and past the once-per-message filter (the message is the same every time).
        self._victim_events = RateLimitedEvents(
            events.sink, clock or RealClock(), interval=victim_interval
        )
        # node -> domain UID whose claims we saw allocated there (and so may unlabel).
        self._seen: dict[str, str] = {}
        # node -> UIDs of the allocated claims the node's label was already applied for.
        self._applied: dict[str, set[str]] = {}
        # node -> UIDs of its claims allocated when this term's caches synced (never labelled by
        # this term); forgotten as they leave the node.
        self._adopted: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def adopt_allocations(self) -> int:
        """Take every channel claim allocated in the synced cache as already applied (call once,
        after the caches synced and before the workers start); returns how many."""
        adopted: dict[str, set[str]] = {}
        # The BY_NODE index holds exactly the allocated channel claims: only those are read
        # (decoded, from the serialized cache), not every claim of the cluster.
        for node_name in self._caches.claims.index_values(BY_NODE):
            for claim in self._caches.claims.by_index(BY_NODE, node_name):
                adopted.setdefault(node_name, set()).add(str(claim["metadata"].get("uid")))
        with self._lock:
            for node_name, uids in adopted.items():
                self._adopted.setdefault(node_name, set()).update(uids)
        return sum(len(uids) for uids in adopted.values())

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
                    claim,
                    WARNING,
                    "ComputeDomainNotFound",
                    f"claim {meta_namespace_key(claim)} references ComputeDomain UID {uid}, "
                    "which does not exist",
                )
                continue
            cd = domains[0]
            cd_ns = cd["metadata"].get("namespace")
            if cd_ns != claim.get("metadata", {}).get("namespace"):
                self._events.event(
                    claim,
                    WARNING,
                    "ComputeDomainNamespaceMismatch",
                    (
                        f"claim {meta_namespace_key(claim)} references a ComputeDomain in another "
                        "namespace; a channel claim must be in its ComputeDomain's namespace"
                    ),
                )
                self._victim_events.event(
                    cd,
                    WARNING,
                    "ComputeDomainNamespaceMismatch",
                    (
                        "a channel claim in another namespace references this ComputeDomain and "
                        "is ignored; a channel claim must be in its ComputeDomain's namespace"
                    ),
                )
                continue
            if cd["metadata"].get("deletionTimestamp"):
                continue
            wanted.setdefault(uid, (cd, []))[1].append(claim)
        return wanted

    def reconcile(self, key: str, ctx: ReconcileContext = BACKGROUND) -> Result:
        """Label node ``key`` for the one domain its channel claims belong to (or unlabel
        it); stops before writing once ``ctx`` is cancelled."""
        ctx.check()
        node_name = key
        node = self._caches.nodes.get_by_key(node_name)
        if node is None:
            with self._lock:
                self._seen.pop(node_name, None)
                self._applied.pop(node_name, None)
            return Result()
        self._forget_adopted(node_name)
        current = (node["metadata"].get("labels") or {}).get(c.COMPUTE_DOMAIN_LABEL)
        wanted = self._wanted(node_name)
        if not wanted:
            with self._lock:
                seen = self._seen.pop(node_name, None)
                self._applied.pop(node_name, None)
            if seen is not None and current == seen:
                remove_domain_label(self._client, node, uid=seen)
                log.info(
                    "node label removed (no live claim left) uid=%s", seen, extra={"key": node_name}
                )
            return Result()
        if len(wanted) > 1:
            domains = [cd for cd, _ in wanted.values()]
            for cd in domains:
                self._events.event(
                    cd,
                    WARNING,
                    "NodeConflict",
                    f"node {node_name} has channel claims of several ComputeDomains: "
                    + _conflict_names(cd, domains),
                )
            return Result()
        uid, (cd, claims) = next(iter(wanted.items()))
        claim_uids = {str(cl["metadata"].get("uid")) for cl in claims}
        with self._lock:
            seen = self._seen.get(node_name)
            applied = set(self._applied.get(node_name, set())) if seen == uid else set()
            applied |= self._adopted.get(node_name, set())
        if current == uid:
            self._remember(node_name, uid, claim_uids)
            return Result()
        if current is None and claim_uids <= applied:
            # Either the plugin unprepared these claims and released the node (their pods are
            # terminating and deallocation follows; re-labelling would restart the daemon), or
            # they were allocated before this term and the plugin's Prepare labels the node.
            log.debug(
                "node released by the plugin or claims adopted; not labelling uid=%s",
                uid,
                extra={"key": node_name},
            )
            return Result()
        if current and current != seen and self._caches.compute_domains.by_index(BY_UID, current):
            # The holder is not named: it may be another tenant's (its UID is a handle to it).
            msg = (
                f"node {node_name} already belongs to another ComputeDomain; "
                f"one ComputeDomain per node, so {meta_namespace_key(cd)} cannot use it yet"
            )
            self._events.event(cd, WARNING, "NodeInUse", msg)
            for claim in claims:
                self._events.event(claim, WARNING, "NodeInUse", msg)
            return Result()
        patch_node_metadata(self._client, node, labels={c.COMPUTE_DOMAIN_LABEL: uid})
        self._remember(node_name, uid, claim_uids)
        log.info(
            "node labelled for domain uid=%s domain=%s replaced=%s",
            uid,
            meta_namespace_key(cd),
            current or "-",
            extra={"key": node_name},
        )
        return Result()

    def _forget_adopted(self, node_name: str) -> None:
        """Drop the adopted claims no longer allocated on ``node_name`` (deallocated, deleted)."""
        with self._lock:
            adopted = self._adopted.get(node_name)
            if adopted is None:
                return
        allocated = {
            str(claim["metadata"].get("uid"))
            for claim in self._caches.claims.by_index(BY_NODE, node_name)
        }
        with self._lock:
            adopted = self._adopted.get(node_name)
            if adopted is not None:
                adopted &= allocated
                if not adopted:
                    del self._adopted[node_name]

    def _remember(self, node_name: str, uid: str, claim_uids: set[str]) -> None:
        with self._lock:
            if self._seen.get(node_name) != uid:
                self._applied[node_name] = set()
            self._seen[node_name] = uid
            self._applied.setdefault(node_name, set()).update(claim_uids)
