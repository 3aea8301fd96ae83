"""CliquePruneReconciler: drop ``daemons[]`` entries of IMEX daemons that are gone for good.

Keyed by ComputeDomainClique (``namespace/name``). A daemon removes its own entry when it shuts
down cleanly; one that is SIGKILLed, or whose pod is deleted and not replaced, leaves its entry
behind and every peer keeps it in its IMEX hosts file. Invariants:

* an entry is judged only against daemon pods of *its own* domain (driver namespace, label
  ``computeDomain=<uid>``, ``spec.nodeName`` = the entry's node); upstream counts a pod of any
  domain on that node, so a stale entry survives while another domain's daemon runs there;
* an entry whose node has a daemon pod of the domain that is not terminating (Ready or not,
  any phase) is never removed;
* otherwise the entry is removed only after this controller has observed its node without
  such a pod for ``clique_entry_grace_period`` seconds (plus the termination grace of a pod
  still terminating there), so a daemon recreated by its DaemonSet keeps its index; the
  observation restarts with the process and with a re-registered entry (new IP), so any doubt
  delays a removal and never hastens one;
* the write is a PUT carrying the resourceVersion read; on 409 the clique is read afresh from
  the API server and only the very entries judged stale (node, IP and index unchanged) are
  removed from it, so a concurrent daemon write is never overwritten.

Driven by events only: clique changes and the domain's daemon pod changes enqueue the clique;
a pending removal is re-checked through the workqueue's ``add_after`` when its grace ends.
"""

from __future__ import annotations

import copy
import logging
import threading
from typing import Any

from pkg.api import constants as c
from pkg.kube.client import KubeClient
from pkg.kube.errors import ConflictError, NotFoundError
from pkg.kube.resources import COMPUTE_DOMAIN_CLIQUES
from pkg.reconcilers.cache import BY_DOMAIN, Caches
from pkg.reconcilers.config import ControllerConfig
from pkg.reconcilers.controller import Result
from pkg.reconcilers.events import NORMAL, EventSink
from pkg.runtime.clock import Clock

__all__ = ["CliquePruneReconciler"]

log = logging.getLogger(__name__)

JSON = dict[str, Any]
EntryId = tuple[str, str, int]  # nodeName, ipAddress, index
_WRITE_ATTEMPTS = 5


def _entry_id(entry: JSON) -> EntryId:
    index = entry.get("index")
    return (
        str(entry.get("nodeName") or ""),
        str(entry.get("ipAddress") or ""),
        index if isinstance(index, int) else -1,
    )


def _daemons(clique: JSON) -> list[JSON]:
    return [d for d in clique.get("daemons") or [] if isinstance(d, dict)]


class CliquePruneReconciler:
    """Removes stale daemon entries from ComputeDomainCliques by ``namespace/name`` key."""

    def __init__(
        self,
        *,
        client: KubeClient,
        caches: Caches,
        config: ControllerConfig,
        events: EventSink,
        clock: Clock,
    ) -> None:
        self._client = client
        self._caches = caches
        self._grace = config.clique_entry_grace_period
        self._events = events
        self._clock = clock
        # clique key -> entry -> monotonic time we first saw its node without a live pod.
        self._absent_since: dict[str, dict[EntryId, float]] = {}
        self._lock = threading.Lock()

    def keys_for_pod(self, pod: JSON) -> list[str]:
        """Cliques of the pod's domain (for the pod event handler)."""
        uid = (pod.get("metadata", {}).get("labels") or {}).get(c.COMPUTE_DOMAIN_LABEL)
        if not uid:
            return []
        return [
            f"{m['namespace']}/{m['name']}"
            for cl in self._caches.cliques.by_index(BY_DOMAIN, str(uid))
            if (m := cl["metadata"])
        ]

    def reconcile(self, key: str) -> Result:
        clique = self._caches.cliques.get_by_key(key)
        uid = ((clique or {}).get("metadata", {}).get("labels") or {}).get(c.COMPUTE_DOMAIN_LABEL)
        if clique is None or not uid:
            with self._lock:
                self._absent_since.pop(key, None)
            return Result()
        stale, wait = self._judge(key, clique, str(uid))
        if stale:
            self._remove(key, clique, stale)
        return Result(requeue_after=wait) if wait is not None else Result()

    # -- judgement ------------------------------------------------------------------------------

    def _extra_grace(self, pods: list[JSON]) -> float | None:
        """None if a live pod is among ``pods``; else the termination grace still owed."""
        extra = 0.0
        for pod in pods:
            meta = pod.get("metadata", {})
            if not meta.get("deletionTimestamp"):
                return None
            extra = max(extra, float(meta.get("deletionGracePeriodSeconds") or 0))
        return extra

    def _judge(self, key: str, clique: JSON, uid: str) -> tuple[set[EntryId], float | None]:
        """Entries to remove now, and the delay until the next pending one expires."""
        by_node: dict[str, list[JSON]] = {}
        for pod in self._caches.pods.by_index(BY_DOMAIN, uid):
            node_name = pod.get("spec", {}).get("nodeName")
            if node_name:
                by_node.setdefault(str(node_name), []).append(pod)
        now = self._clock.monotonic()
        stale: set[EntryId] = set()
        wait: float | None = None
        with self._lock:
            previous = self._absent_since.get(key, {})
            current: dict[EntryId, float] = {}
            for entry in _daemons(clique):
                ident = _entry_id(entry)
                if not ident[0]:
                    continue  # cannot be matched to a node; not ours to judge
                extra = self._extra_grace(by_node.get(ident[0], []))
                if extra is None:
                    continue  # a daemon pod of this domain runs there
                since = previous.get(ident, now)
                current[ident] = since
                remaining = since + self._grace + extra - now
                if remaining <= 0:
                    stale.add(ident)
                else:
                    wait = remaining if wait is None else min(wait, remaining)
            if current:
                self._absent_since[key] = current
            else:
                self._absent_since.pop(key, None)
        return stale, wait

    # -- write ----------------------------------------------------------------------------------

    def _remove(self, key: str, clique: JSON, stale: set[EntryId]) -> None:
        obj: JSON | None = clique
        for attempt in range(_WRITE_ATTEMPTS):
            if obj is None:
                return
            daemons = _daemons(obj)
            keep = [d for d in daemons if _entry_id(d) not in stale]
            if len(keep) == len(daemons):
                return  # already gone (the daemon or a previous pass removed them)
            body = copy.deepcopy(obj)
            body["daemons"] = keep
            try:
                written = self._client.update(COMPUTE_DOMAIN_CLIQUES, body)
            except NotFoundError:
                return
            except ConflictError:
                if attempt + 1 == _WRITE_ATTEMPTS:
                    raise
                obj = self._fresh(obj)
                continue
            removed = sorted(_entry_id(d) for d in daemons if _entry_id(d) in stale)
            with self._lock:
                pending = self._absent_since.get(key, {})
                for ident in removed:
                    pending.pop(ident, None)
            text = ", ".join(f"{n} ({ip}, index {i})" for n, ip, i in removed)
            log.info("removed stale clique entries: %s", text, extra={"key": key})
            self._events.event(
                written, NORMAL, "StaleDaemonRemoved",
                f"removed entries of daemons gone for {self._grace:.0f}s or more: {text}",
            )  # fmt: skip
            return

    def _fresh(self, obj: JSON) -> JSON | None:
        """The clique as the API server has it now (LIST by name: needs no ``get`` verb)."""
        meta = obj["metadata"]
        found = self._client.list(
            COMPUTE_DOMAIN_CLIQUES,
            namespace=meta["namespace"],
            field_selector=f"metadata.name={meta['name']}",
        )
        items = found.get("items") or []
        return dict(items[0]) if items else None
