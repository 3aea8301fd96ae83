"""ComputeDomainReconciler: finalizer, dependents, status and deletion of one ComputeDomain.

Owns ``cd.metadata.finalizers`` (our entry) and the whole of ``cd.status``; this reconciler is
the only writer of both, and the workqueue never runs two reconciles of one key at once, so
within the process there is exactly one writer. One pass:

1. domain gone from the cache, or the cache not yet holding our last finalizer write (another
   event came first; that write's own event brings the next pass) → nothing to do;
2. ``deletionTimestamp`` set → ordered teardown (:meth:`Dependents.teardown`); the finalizer is
   removed only when nothing is pending, daemon pods included (upstream #380);
3. invalid spec → ``Ready=False/InvalidSpec`` naming the field, a Warning Event, and a
   :class:`TerminalError` (the spec is immutable: retrying cannot help);
4. critical path first: a domain without our finalizer (a new one) gets only its workload
   ResourceClaimTemplate (the write that unblocks the user's pods) and then the finalizer; the
   watch event of that finalizer write queues the second pass behind the domains already
   waiting, so in a burst every new domain's template comes before any domain's status
   (breadth-first); an orphaned template of a domain deleted between the two writes is found
   by the orphan cleanup (it carries the domain UID label);
5. create-or-adopt the other dependents — the daemon RCT and DaemonSet only once the domain
   is in use (:meth:`Dependents.daemons_wanted`: a channel claim of it allocated, a node
   labelled for it; upstream creates them with the domain), so the scheduler's allocation,
   which also labels the node (:mod:`pkg.reconcilers.resourceclaim`), is what creates them —
   then aggregate members into ``status``:
   a node lost for ``node_loss_grace_period`` leaves (``NodeLost`` Event; the reconcile is
   requeued for the moment the next unhealthy node would be lost), and daemons a full clique
   leaves out make the condition ``CapacityExceeded`` with a Warning Event on the domain and
   on each such daemon pod (once per cause); daemons whose node's driver root lacks IMEX make
   it ``DriverRootIncomplete`` with a Warning Event on the domain (the daemon itself records
   one on its pod); a ``numNodes`` larger than the nodes that could ever join
   (:mod:`pkg.reconcilers.reachability`) makes it ``NumNodesUnreachable`` with a Warning Event.

Status writes go to ``/status`` with the resourceVersion read; on 409 the domain is re-read
from the API server and the same aggregation is written again, so no concurrent change is ever
overwritten blindly. Events are emitted only for transitions that were actually written.

With tracing on, the finalizer write also carries the domain's formation-trace context, the
dependents' creation and each status write before Ready are spans of that trace, and the first
Ready write emits its root span (:mod:`pkg.reconcilers.formation`).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import time

from pkg.api import constants as c
from pkg.api.computedomain import (
    CONDITION_READY,
    ComputeDomain,
    InvalidComputeDomainError,
    parse_compute_domain,
    set_condition,
)
from pkg.api.daemonentry import status_nodes
from pkg.base.clock import Clock
from pkg.base.types import JSON
from pkg.base.verbosity import V
from pkg.informers.store import meta_namespace_key
from pkg.kube.client import KubeClient
from pkg.kube.errors import ConflictError, NotFoundError
from pkg.kube.resources import COMPUTE_DOMAINS
from pkg.reconcilers import placement
from pkg.reconcilers.cache import BY_DOMAIN, BY_NODE, Caches
from pkg.reconcilers.conditions import REASON_INVALID_SPEC, REASON_NO_CLIQUE_FITS
from pkg.reconcilers.config import ControllerConfig
from pkg.reconcilers.context import BACKGROUND, ReconcileContext
from pkg.reconcilers.controller import Result, TerminalError
from pkg.reconcilers.dependents import Dependents, RetryLaterError
from pkg.reconcilers.events import NORMAL, WARNING, EventSink, OnceEvents
from pkg.reconcilers.formation import FormationTracer
from pkg.reconcilers.metrics import DomainMetrics, parse_timestamp
from pkg.reconcilers.reachability import candidate_nodes, num_nodes_problem
from pkg.reconcilers.status import (
    Aggregate,
    Member,
    Problem,
    aggregate,
    as_written,
    condition_events,
    render_status,
    status_events,
)

__all__ = ["ComputeDomainReconciler", "format_time"]

log = logging.getLogger(__name__)

_STATUS_WRITE_ATTEMPTS = 3
_PROBLEM_RECHECK = {"DriverNamespaceUnavailable": 60.0, REASON_NO_CLIQUE_FITS: placement.RECHECK}


def format_time(epoch: float) -> str:
    """``metav1.Time``: RFC 3339 seconds in UTC."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


class ComputeDomainReconciler:
    """Reconciles ComputeDomains by ``namespace/name`` key."""

    def __init__(
        self,
        *,
        client: KubeClient,
        caches: Caches,
        config: ControllerConfig,
        events: EventSink,
        metrics: DomainMetrics,
        clock: Clock,
        formation: FormationTracer | None = None,
    ) -> None:
        """``formation`` records the domains' formation traces (default: tracing off)."""
        self._client = client
        self._caches = caches
        self._config = config
        self._events = events
        self._metrics = metrics
        self._clock = clock
        self._formation = formation or FormationTracer(None, clock=clock)
        self._dependents = Dependents(client=client, caches=caches, config=config, events=events)
        self._once = OnceEvents(events)
        # uid -> the last status we wrote; the cache may lag our own writes.
        self._written: dict[str, JSON] = {}
        # uid -> clock.monotonic() of our last status write (coalescing, see _write_status)
        self._status_written_at: dict[str, float] = {}
        # key -> resourceVersion our last finalizer write replaced: while the cache still
        # shows it, the cache is behind that write.
        self._behind: dict[str, str] = {}
        self._lock = threading.Lock()

    def reconcile(self, key: str, ctx: ReconcileContext = BACKGROUND) -> Result:
        """One pass over the domain ``namespace/name`` (see the module docstring); stops at the
        next API call once ``ctx`` is cancelled."""
        ctx.check()
        obj = self._caches.compute_domains.get_by_key(key)
        if obj is None:
            with self._lock:
                self._behind.pop(key, None)
            return Result()
        log.log(
            V(2),
            "Processing added or updated ComputeDomain: %s/%s",
            key,
            obj["metadata"].get("uid", ""),
        )
        if self._cache_behind(key, obj):
            # The cache does not hold our last finalizer write yet (another event came first);
            # that write's own watch event brings the next pass. Acting now would PUT a stale
            # resourceVersion (409) or re-remove a finalizer of a deleted domain (404).
            return Result()
        if obj.get("metadata", {}).get("deletionTimestamp"):
            return self._finalize(obj)
        try:
            cd = parse_compute_domain(obj)
        except InvalidComputeDomainError as exc:
            self._events.event(obj, WARNING, REASON_INVALID_SPEC, str(exc))
            self._write_status(obj, members=[], problem=Problem(REASON_INVALID_SPEC, str(exc)))
            raise TerminalError(f"invalid spec: {exc}") from exc
        try:
            if c.FINALIZER not in (obj["metadata"].get("finalizers") or []):
                finalizers = list(obj["metadata"].get("finalizers") or [])
                body = self._with_finalizers(obj, [*finalizers, c.FINALIZER])
                self._formation.annotate(body)  # the trace context rides on the finalizer
                problem = self._ensure_dependents(cd, body, daemons=None)
                ctx.check()
                obj = self._write_finalizers(obj, body)
                if problem is None:
                    # The second pass comes from the watch event of our finalizer write: it
                    # queues the key behind the domains already waiting, and only once the
                    # cache holds that write (a timed requeue could race it into a 409).
                    return Result()
            ctx.check()
            daemons = self._dependents.daemons_wanted(cd.uid)
            problem = self._ensure_dependents(cd, obj, daemons=daemons)
        except RetryLaterError as exc:
            log.info("%s", exc, extra={"key": key})
            return Result(requeue_after=1.0)
        if problem is not None:
            self._events.event(obj, WARNING, problem.reason, problem.message)
        found = self._aggregate(obj)
        unreachable = num_nodes_problem(
            cd.num_nodes,
            candidate_nodes(self._caches.slices.index_values(BY_NODE), self._caches.nodes),
            (m.entry.node_name for m in found.members),
        )
        if unreachable is not None:
            self._once.event(obj, WARNING, unreachable.reason, unreachable.message)
        capacity = found.capacity_problem()
        if capacity is not None:
            self._capacity_events(obj, found)
        driver_root = found.driver_root_problem()
        if driver_root is not None:
            self._once.event(obj, WARNING, driver_root.reason, driver_root.message)
        ctx.check()
        deferred = self._write_status(
            obj,
            members=found.members,
            problem=problem or unreachable or capacity or driver_root,
            found=found,
        )
        after: list[float] = [] if deferred is None else [deferred]
        if problem is not None:
            # No retry storm, but recover on our own from fixes we get no event for (a
            # foreign object deleted, the namespace created).
            after.append(_PROBLEM_RECHECK.get(problem.reason, 300.0))
        elif found.recheck is not None:
            after.append(max(found.recheck, 0.1))
        return Result(requeue_after=min(after)) if after else Result()

    def _ensure_dependents(
        self, cd: ComputeDomain, obj: JSON, *, daemons: bool | None
    ) -> Problem | None:
        """:meth:`Dependents.ensure` (``daemons`` None: the workload RCT only), in a
        formation-trace span when this pass creates any."""

        def ensure() -> Problem | None:
            if daemons is None:
                return self._dependents.ensure_workload_rct(cd, obj)
            return self._dependents.ensure(cd, obj, daemons=daemons)

        missing = (
            self._missing_dependents(cd, daemons=bool(daemons)) if self._formation.enabled else []
        )
        if not missing:
            return ensure()
        with self._formation.span(
            obj, "ensure dependents", {"dependents.missing": ",".join(missing)}
        ):
            return ensure()

    def _missing_dependents(self, cd: ComputeDomain, *, daemons: bool) -> list[str]:
        """The dependents the cache does not hold yet (what :meth:`Dependents.ensure` creates)."""
        ns, name = self._config.namespace, c.daemon_object_name(cd.uid)
        wanted = [
            (
                "ResourceClaimTemplate/" + cd.resource_claim_template_name,
                self._caches.rcts,
                f"{cd.namespace}/{cd.resource_claim_template_name}",
            ),
        ]
        if daemons:
            wanted += [
                ("ResourceClaimTemplate/" + name, self._caches.rcts, f"{ns}/{name}"),
                ("DaemonSet/" + name, self._caches.daemonsets, f"{ns}/{name}"),
            ]
        return [what for what, cache, key in wanted if cache.get_by_key(key) is None]

    def _aggregate(self, obj: JSON) -> Aggregate:
        """The members of the domain ``obj``: from its cliques, or (gate
        ``ComputeDomainCliques`` off) from the ``status.nodes`` its daemons wrote into ``obj``."""
        uid = str(obj["metadata"].get("uid"))
        pods = self._caches.pods.by_index(BY_DOMAIN, uid)
        names = {str(p.get("spec", {}).get("nodeName") or "") for p in pods} - {""}
        nodes = {n: node for n in names if (node := self._caches.nodes.get_by_key(n))}
        by_daemons = not self._config.compute_domain_cliques
        return aggregate(
            cliques=[] if by_daemons else self._caches.cliques.by_index(BY_DOMAIN, uid),
            entries=status_nodes(obj.get("status")) if by_daemons else None,
            pods=pods,
            nodes=nodes,
            now=self._clock.now(),
            node_loss_grace=self._config.node_loss_grace_period,
            max_nodes=self._config.max_nodes_per_imex_domain,
        )

    def _capacity_events(self, obj: JSON, found: Aggregate) -> None:
        for shortfall in found.shortfalls:
            message = shortfall.message()
            self._once.event(obj, WARNING, "CapacityExceeded", message)
            for pod in shortfall.pods:
                node = pod.get("spec", {}).get("nodeName")
                self._once.event(
                    pod,
                    WARNING,
                    "CapacityExceeded",
                    f"IMEX daemon on {node} cannot join: {message}",
                )

    # -- finalizer ------------------------------------------------------------------------------

    def _cache_behind(self, key: str, obj: JSON) -> bool:
        rv = str(obj["metadata"].get("resourceVersion", ""))
        with self._lock:
            replaced = self._behind.get(key)
            if replaced is not None and replaced != rv:
                del self._behind[key]
            return replaced == rv

    @staticmethod
    def _with_finalizers(obj: JSON, finalizers: list[str]) -> JSON:
        body = copy.deepcopy(obj)
        body["metadata"]["finalizers"] = finalizers
        return body

    def _write_finalizers(self, obj: JSON, body: JSON) -> JSON:
        """PUT ``body`` (``obj`` with other finalizers); remembers what the cache will lag."""
        written = self._client.update(COMPUTE_DOMAINS, body)
        meta = obj["metadata"]
        with self._lock:
            self._behind[meta_namespace_key(obj)] = str(meta.get("resourceVersion", ""))
        return written

    def _finalize(self, obj: JSON) -> Result:
        meta = obj["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        if c.FINALIZER not in finalizers:
            return Result()
        uid = str(meta.get("uid"))
        pending = self._dependents.teardown(uid, str(meta.get("namespace")))
        if pending:
            self._events.event(
                obj, NORMAL, "WaitingForDependents", "deleting; waiting for " + ", ".join(pending)
            )
            return Result(requeue_after=self._config.deletion_recheck)
        body = self._with_finalizers(obj, [f for f in finalizers if f != c.FINALIZER])
        with contextlib.suppress(NotFoundError):
            self._write_finalizers(obj, body)
        self._metrics.forget(uid)
        with self._lock:
            self._written.pop(uid, None)
            self._status_written_at.pop(uid, None)
        log.info("finalizer removed", extra={"key": meta_namespace_key(obj)})
        return Result()

    # -- status ---------------------------------------------------------------------------------

    def _write_status(
        self,
        obj: JSON,
        *,
        members: list[Member],
        problem: Problem | None,
        found: Aggregate | None = None,
    ) -> float | None:
        """Write the domain's status if it changed; returns the seconds after which a write
        that was held back (``status_update_interval``: only counts and lists moved since our
        last write) is due, else None.

        With gate ``ComputeDomainCliques`` off the daemons write ``status.nodes`` too: the
        domain's status as read (not our last write) is what the new one is compared with,
        ``status.nodes`` keeps each daemon's entry as written (:func:`as_written`), and after a
        409 the members are aggregated again from the domain as re-read, so a daemon's
        concurrent write is never overwritten."""
        uid = str(obj["metadata"].get("uid"))
        try:
            cd = parse_compute_domain(obj)
        except InvalidComputeDomainError:
            cd = None
        by_daemons = not self._config.compute_domain_cliques and cd is not None
        for attempt in range(_STATUS_WRITE_ATTEMPTS):
            with self._lock:
                last = self._written.get(uid, obj.get("status"))
            previous = obj.get("status") if by_daemons else last
            now = format_time(self._clock.now())
            if cd is None:
                new = _invalid_status(obj, problem, previous=previous, now=now)
            else:
                if by_daemons and attempt > 0:
                    found = self._aggregate(obj)
                    members = found.members
                listed = (
                    as_written(members, status_nodes(obj.get("status"))) if by_daemons else None
                )
                bad = found.bad_entries if found is not None else ()
                new = render_status(
                    cd,
                    members=members,
                    previous=previous,
                    problem=problem,
                    now=now,
                    listed=listed,
                    bad_entries=bad,
                )
            if new == previous:
                # Keeps the per-status gauge right after a restart, when nothing is written.
                self._metrics.observe_status(
                    uid,
                    namespace=str(obj["metadata"].get("namespace", "")),
                    status=new["status"],
                    previous=new["status"],
                    created=None,
                    now=self._clock.now(),
                    nodes=int(new.get("nodeCount") or 0),
                )
                return None
            wait = self._hold_back(uid, previous, new) if cd is not None else None
            if wait is not None:
                return wait
            body = copy.deepcopy(obj)
            body["status"] = new
            try:
                with self._formation.span(obj, "write status", _status_attributes(new)):
                    written = self._client.update(COMPUTE_DOMAINS, body, subresource="status")
            except ConflictError:
                if attempt + 1 == _STATUS_WRITE_ATTEMPTS:
                    raise
                meta = obj["metadata"]
                obj = self._client.get(COMPUTE_DOMAINS, meta["name"], namespace=meta["namespace"])
                with self._lock:
                    self._written.pop(uid, None)
                continue
            with self._lock:
                self._written[uid] = written.get("status") or new
                self._status_written_at[uid] = self._clock.monotonic()
            self._after_write(obj, previous=last, new=new, members=members, found=found)
            return None
        return None

    def _hold_back(self, uid: str, previous: JSON | None, new: JSON) -> float | None:
        """Seconds to hold back a status write that only moves counts and lists, while our
        last write of this domain is younger than ``status_update_interval``; None: write now.

        18 daemons joining and turning Ready within a second otherwise cost ~40 status writes
        per formation; what users and alerts act on (``status``, a condition's status or
        reason) is never delayed."""
        interval = self._config.status_update_interval
        with self._lock:
            last = self._status_written_at.get(uid)
        if interval <= 0 or last is None or not previous:
            return None
        if _headline(previous) != _headline(new):
            return None
        left = last + interval - self._clock.monotonic()
        return left if left > 0 else None

    def _after_write(
        self,
        obj: JSON,
        *,
        previous: JSON | None,
        new: JSON,
        members: list[Member],
        found: Aggregate | None,
    ) -> None:
        meta = obj["metadata"]
        cond = next(x for x in new["conditions"] if x["type"] == CONDITION_READY)
        log.info(
            "status written status=%s ready=%d/%d reason=%s",
            new["status"],
            new["readyNodes"],
            new["nodeCount"],
            cond["reason"],
            extra={"key": meta_namespace_key(obj)},
        )
        lost = found.lost if found is not None else {}
        grace = self._config.node_loss_grace_period
        for ev in status_events(previous, new, members=members, lost=lost, node_loss_grace=grace):
            self._events.event(obj, ev.type, ev.reason, ev.message)
        for ev in condition_events(previous, new):
            self._events.event(obj, ev.type, ev.reason, ev.message)
        first_ready = self._metrics.observe_status(
            str(meta.get("uid")),
            namespace=str(meta.get("namespace", "")),
            status=new["status"],
            previous=(previous or {}).get("status"),
            created=parse_timestamp(str(meta.get("creationTimestamp", ""))),
            now=self._clock.now(),
            nodes=int(new.get("nodeCount") or 0),
        )
        if first_ready:
            self._formation.finish(
                obj, ready_at=self._clock.now(), attributes=_status_attributes(new)
            )


def _headline(status: JSON) -> tuple[object, ...]:
    """What a status write is never held back for: ``status`` and each condition's status and
    reason (messages, counts and node lists may wait for the coalescing interval)."""
    conds = sorted(
        (str(cond.get("type")), str(cond.get("status")), str(cond.get("reason")))
        for cond in status.get("conditions") or []
        if isinstance(cond, dict)
    )
    return (status.get("status"), tuple(conds))


def _status_attributes(status: JSON) -> dict[str, str | int]:
    return {
        "computedomain.status": str(status.get("status", "")),
        "computedomain.ready_nodes": int(status.get("readyNodes") or 0),
        "computedomain.node_count": int(status.get("nodeCount") or 0),
    }


def _invalid_status(obj: JSON, problem: Problem | None, *, previous: JSON | None, now: str) -> JSON:
    reason = problem.reason if problem else REASON_INVALID_SPEC
    message = problem.message if problem else "invalid spec"
    conditions = set_condition(
        list((previous or {}).get("conditions") or []),
        type_=CONDITION_READY,
        status=False,
        reason=reason,
        message=message,
        observed_generation=int(obj["metadata"].get("generation", 0)),
        now=now,
    )
    return {
        "status": c.STATUS_NOT_READY,
        "readyNodes": 0,
        "nodeCount": 0,
        "conditions": conditions,
    }
