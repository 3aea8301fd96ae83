"""CliquePruneReconciler: keep ``daemons[]`` entries honest about daemons that are gone or down.

Keyed by ComputeDomainClique (``namespace/name``). A daemon removes its own entry when it shuts
down cleanly and marks it NotReady when its IMEX is not ready; a daemon that is SIGKILLed or
OOM-killed, whose pod is deleted and not replaced, or whose node dies can do neither, and its
entry would keep telling every peer's hosts file, the plugin (which releases workloads on
``Ready``) and the domain's status something false. Invariants:

* an entry is judged only against daemon pods of *its own* domain (driver namespace, label
  ``computeDomain=<uid>``, ``spec.nodeName`` = the entry's node); upstream counts a pod of any
  domain on that node, so a stale entry survives while another domain's daemon runs there;
* a ``Ready`` entry whose daemon pod runs no daemon container (terminated, waiting to restart
  after a crash or OOM kill, pod still Pending, or the entry carries another pod's IP) is set
  to ``NotReady`` at once, with a Warning Event on the pod; the restarted daemon marks itself
  NotReady at start too, and only the daemon ever sets ``Ready`` again;
* an entry whose node is *lost* (Ready condition False/Unknown for ``node_loss_grace_period``,
  see :func:`pkg.reconcilers.status.node_loss_in`) is removed although its pod stays bound to
  the node (daemon pods tolerate every taint); a daemon still alive there that re-adds itself
  is removed again no sooner than ``clique_entry_grace_period`` later, so the two never race;
* an entry whose node has a daemon pod of the domain that is not terminating (Ready or not,
  any phase) is otherwise never removed;
* otherwise the entry is removed only after this controller has observed its node without
  such a pod for ``clique_entry_grace_period`` seconds (plus the termination grace of a pod
  still terminating there), so a daemon recreated by its DaemonSet keeps its index; the
  observation restarts with the process and with a re-registered entry (new IP), so any doubt
  delays a removal and never hastens one;
* the write is a PUT carrying the resourceVersion read; on 409 the clique is read afresh from
  the API server and only the very entries judged (node, IP and index unchanged) are removed
  or marked in it, so a concurrent daemon write is never overwritten.

Driven by events only: clique changes, the domain's daemon pod changes and changes of the
nodes entries are on enqueue the clique; a pending removal is re-checked through the
workqueue's ``add_after`` when its grace ends.
"""

from __future__ import annotations

import copy
import logging
import threading
from dataclasses import dataclass, field

from pkg.api import constants as c
from pkg.api.daemonentry import (
    DAEMONS,
    DaemonEntry,
    EntryId,
    daemon_items,
    item_identity,
    with_item_status,
)
from pkg.base.clock import Clock
from pkg.base.types import JSON
from pkg.informers.store import meta_namespace_key
from pkg.kube.client import KubeClient
from pkg.kube.errors import ConflictError, NotFoundError
from pkg.kube.resources import COMPUTE_DOMAIN_CLIQUES
from pkg.reconcilers.cache import BY_DOMAIN, BY_NODE, Caches
from pkg.reconcilers.conditions import PROBLEM_DAEMON_NOT_RUNNING
from pkg.reconcilers.config import ControllerConfig
from pkg.reconcilers.context import BACKGROUND, ReconcileContext
from pkg.reconcilers.controller import Result
from pkg.reconcilers.events import NORMAL, WARNING, EventSink
from pkg.reconcilers.status import daemon_not_running, node_loss_in, node_problem

__all__ = ["CliquePruneReconciler"]

log = logging.getLogger(__name__)

_WRITE_ATTEMPTS = 5


def _ready(item: JSON) -> bool:
    """The raw ``daemons[]`` item says its daemon is Ready."""
    entry = DaemonEntry.decode(item)
    return entry is not None and entry.status == c.STATUS_READY


@dataclass
class _Verdict:
    """What one pass decided about one clique's entries."""

    stale: set[EntryId] = field(default_factory=set)  # daemon gone: remove
    lost: dict[EntryId, str] = field(default_factory=dict)  # node lost: remove (why)
    down: dict[EntryId, JSON] = field(default_factory=dict)  # daemon not running: NotReady
    wait: float | None = None  # seconds until the next pending decision

    def later(self, seconds: float) -> None:
        self.wait = seconds if self.wait is None else min(self.wait, seconds)

    def removals(self) -> set[EntryId]:
        return self.stale | set(self.lost)


class CliquePruneReconciler:
    """Removes stale entries from ComputeDomainCliques, and marks entries of dead daemons
    NotReady, by ``namespace/name`` key."""

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
        self._node_loss_grace = config.node_loss_grace_period
        self._events = events
        self._clock = clock
        # clique key -> entry -> monotonic time we first saw its node without a live pod.
        self._absent_since: dict[str, dict[EntryId, float]] = {}
        # (clique key, node) -> monotonic time we last removed an entry of that lost node.
        self._lost_removed: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def keys_for_pod(self, pod: JSON) -> list[str]:
        """Cliques of the pod's domain (for the pod event handler)."""
        uid = (pod.get("metadata", {}).get("labels") or {}).get(c.COMPUTE_DOMAIN_LABEL)
        if not uid:
            return []
        return [meta_namespace_key(cl) for cl in self._caches.cliques.by_index(BY_DOMAIN, str(uid))]

    def keys_for_node(self, node: JSON) -> list[str]:
        """Cliques with an entry on the node (for the Node event handler)."""
        name = str(node.get("metadata", {}).get("name") or "")
        return [meta_namespace_key(cl) for cl in self._caches.cliques.by_index(BY_NODE, name)]

    def reconcile(self, key: str, ctx: ReconcileContext = BACKGROUND) -> Result:
        """One pass over the clique ``namespace/name`` (see the module docstring); stops before
        writing once ``ctx`` is cancelled."""
        ctx.check()
        clique = self._caches.cliques.get_by_key(key)
        uid = ((clique or {}).get("metadata", {}).get("labels") or {}).get(c.COMPUTE_DOMAIN_LABEL)
        if clique is None or not uid:
            with self._lock:
                self._absent_since.pop(key, None)
                for lost in [k for k in self._lost_removed if k[0] == key]:
                    del self._lost_removed[lost]
            return Result()
        verdict = self._judge(key, clique, str(uid))
        if verdict.removals() or verdict.down:
            ctx.check()
            self._apply(key, clique, verdict)
        return Result(requeue_after=verdict.wait) if verdict.wait is not None else Result()

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

    def _judge(self, key: str, clique: JSON, uid: str) -> _Verdict:
        by_node: dict[str, list[JSON]] = {}
        for pod in self._caches.pods.by_index(BY_DOMAIN, uid):
            node_name = pod.get("spec", {}).get("nodeName")
            if node_name:
                by_node.setdefault(str(node_name), []).append(pod)
        now = self._clock.monotonic()
        wall = self._clock.now()
        verdict = _Verdict()
        with self._lock:
            previous = self._absent_since.get(key, {})
            current: dict[EntryId, float] = {}
            for entry in daemon_items(clique):
                ident = item_identity(entry)
                node_name = ident[0]
                if not node_name:
                    continue  # cannot be matched to a node; not ours to judge
                node = self._caches.nodes.get_by_key(node_name)
                left = node_loss_in(node, now=wall, grace=self._node_loss_grace)
                if left is not None and left <= 0:
                    last = self._lost_removed.get((key, node_name))
                    if last is None or now - last >= self._grace:
                        verdict.lost[ident] = node_problem(node)
                    else:
                        verdict.later(last + self._grace - now)
                    continue
                self._lost_removed.pop((key, node_name), None)
                if left is not None:
                    verdict.later(left)
                pods = by_node.get(node_name, [])
                extra = self._extra_grace(pods)
                if extra is None:  # a daemon pod of this domain runs there
                    live = next(p for p in pods if not p["metadata"].get("deletionTimestamp"))
                    decoded = DaemonEntry.decode(entry)
                    if (
                        decoded is not None
                        and decoded.status == c.STATUS_READY
                        and daemon_not_running(live, decoded)
                    ):
                        verdict.down[ident] = live
                    continue
                since = previous.get(ident, now)
                current[ident] = since
                remaining = since + self._grace + extra - now
                if remaining <= 0:
                    verdict.stale.add(ident)
                else:
                    verdict.later(remaining)
            if current:
                self._absent_since[key] = current
            else:
                self._absent_since.pop(key, None)
        return verdict

    # -- write ----------------------------------------------------------------------------------

    def _apply(self, key: str, clique: JSON, verdict: _Verdict) -> None:
        obj: JSON | None = clique
        removals = verdict.removals()
        for attempt in range(_WRITE_ATTEMPTS):
            if obj is None:
                return
            daemons = daemon_items(obj)
            edited = [
                with_item_status(d, c.STATUS_NOT_READY)
                if item_identity(d) in verdict.down and _ready(d)
                else d
                for d in daemons
                if item_identity(d) not in removals
            ]
            if edited == daemons:
                return  # already done (the daemon or a previous pass did it)
            body = copy.deepcopy(obj)
            body[DAEMONS] = edited
            try:
                written = self._client.update(COMPUTE_DOMAIN_CLIQUES, body)
            except NotFoundError:
                return
            except ConflictError:
                if attempt + 1 == _WRITE_ATTEMPTS:
                    raise
                obj = self._fresh(obj)
                continue
            self._report(key, written, daemons, edited, verdict)
            return

    def _report(
        self, key: str, written: JSON, before: list[JSON], after: list[JSON], verdict: _Verdict
    ) -> None:
        kept = {item_identity(d) for d in after}
        removed = sorted(i for i in (item_identity(d) for d in before) if i not in kept)
        was_ready = {item_identity(d) for d in before if _ready(d)}
        marked = sorted(
            item_identity(d)
            for d in after
            if item_identity(d) in was_ready and item_identity(d) in verdict.down and not _ready(d)
        )
        now = self._clock.monotonic()
        with self._lock:
            pending = self._absent_since.get(key, {})
            for ident in removed:
                pending.pop(ident, None)
                if ident in verdict.lost:
                    self._lost_removed[(key, ident[0])] = now

        def text(idents: list[EntryId]) -> str:
            return ", ".join(f"{n} ({ip}, index {i})" for n, ip, i in idents)

        gone = [i for i in removed if i not in verdict.lost]
        lost = [i for i in removed if i in verdict.lost]
        if gone:
            log.info("removed stale clique entries: %s", text(gone), extra={"key": key})
            self._events.event(
                written,
                NORMAL,
                "StaleDaemonRemoved",
                f"removed entries of daemons gone for {self._grace:.0f}s or more: {text(gone)}",
            )
        if lost:
            why = ", ".join(f"{i[0]}: {verdict.lost[i]}" for i in lost)
            log.warning(
                "removed clique entries of lost nodes: %s (%s)", text(lost), why, extra={"key": key}
            )
            self._events.event(
                written,
                WARNING,
                "NodeLost",
                f"removed entries of nodes NotReady or unreachable for more than "
                f"{self._node_loss_grace:.0f}s: {text(lost)} ({why})",
            )
        for ident in marked:
            log.warning(
                "daemon on %s is not running: entry marked NotReady", ident[0], extra={"key": key}
            )
            self._events.event(
                verdict.down[ident],
                WARNING,
                PROBLEM_DAEMON_NOT_RUNNING,
                f"the IMEX daemon container is not running; its entry in ComputeDomainClique "
                f"{written['metadata']['name']} is NotReady until the daemon is Ready again",
            )

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
