"""The controller in host-managed IMEX mode (``IMEX_MODE=hostManaged``): no daemons at all.

In this mode every node's own ``nvidia-imex.service`` forms the IMEX domain, so the controller
owns only what a workload needs to be scheduled: the domain's finalizer and its workload
ResourceClaimTemplate. Nothing of the daemon machinery is built -- no DaemonSet, daemon RCT,
ComputeDomainClique, ``computeDomain`` node label, daemon pod or clique informer, no status
aggregation -- as upstream v0.5 does (``onAddOrUpdateHostManaged``).

:class:`HostManagedDomainReconciler` (one pass per ``namespace/name`` key):

* not deleting: add our finalizer, create or adopt the workload RCT with ``allocationMode``
  forced to ``Single`` (a host IMEX domain hands out channel 0 only; ``All`` is never
  rendered), then write ``status.status: Ready`` and a ``Ready`` condition at once.
  ``Ready`` means "admitted and its template exists", not "IMEX is healthy": the plugin asks
  the host IMEX at each Prepare. ``status.nodes`` is never written;
* deleting: delete the workload RCT (stripping an upstream finalizer from it), then remove our
  finalizer and forget the domain's metrics.

:class:`HostManagedManager` is this mode's :class:`pkg.reconcilers.lifecycle.Manager` (the
construction and lifecycle every mode shares) with two informers (ComputeDomains, labelled
RCTs), one queue, and the orphan sweep restricted to RCTs of domains that no longer exist.
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import dataclasses
import logging
from collections.abc import Callable

from pkg.api import constants as c
from pkg.api.computedomain import (
    CONDITION_READY,
    InvalidComputeDomainError,
    parse_compute_domain,
    set_condition,
)
from pkg.base.clock import Clock
from pkg.base.types import JSON
from pkg.informers import DeletedFinalStateUnknown
from pkg.informers.store import meta_namespace_key
from pkg.kube import resources as res
from pkg.kube.client import KubeClient
from pkg.kube.errors import ConflictError, NotFoundError
from pkg.reconcilers.cache import INDEXES, Caches, ObjectCache
from pkg.reconcilers.computedomain import format_time
from pkg.reconcilers.conditions import REASON_HOST_MANAGED, REASON_INVALID_SPEC
from pkg.reconcilers.config import ControllerConfig
from pkg.reconcilers.context import BACKGROUND, ReconcileContext
from pkg.reconcilers.controller import Result, TerminalError
from pkg.reconcilers.dependents import Dependents, RetryLaterError
from pkg.reconcilers.events import WARNING, EventSink
from pkg.reconcilers.lifecycle import Manager
from pkg.reconcilers.metrics import DomainMetrics, parse_timestamp

__all__ = ["HostManagedDomainReconciler", "HostManagedManager"]

log = logging.getLogger(__name__)

_READY_MESSAGE = (
    "admitted: the workload ResourceClaimTemplate exists; IMEX is run by each node's "
    "nvidia-imex service, whose readiness the kubelet plugin checks at every prepare"
)
_SINGLE = "Single"
_STATUS_WRITE_ATTEMPTS = 3
_PROBLEM_RECHECK = 300.0


class _Unwatched:
    """The cache of a kind host-managed mode does not watch: it holds nothing, by design."""

    def get_by_key(self, key: str) -> JSON | None:
        """Always None: no object of this kind is tracked in host-managed mode."""
        return None

    def list(self) -> list[JSON]:
        """Always empty."""
        return []

    def by_index(self, index: str, value: str) -> builtins.list[JSON]:
        """Always empty."""
        return []

    def index_values(self, index: str) -> builtins.list[str]:
        """Always empty."""
        return []


def host_managed_caches(*, compute_domains: ObjectCache, rcts: ObjectCache) -> Caches:
    """:class:`Caches` with only the two kinds host-managed mode watches; the daemon kinds,
    nodes, claims and slices are :class:`_Unwatched` (so the shared :class:`Dependents` and
    :class:`OrphanCleaner` find no daemon objects and touch no node)."""
    empty = _Unwatched()
    return Caches(
        compute_domains=compute_domains,
        daemonsets=empty,
        pods=empty,
        cliques=empty,
        rcts=rcts,
        nodes=empty,
        claims=empty,
        slices=empty,
    )


class HostManagedDomainReconciler:
    """Reconciles ComputeDomains by ``namespace/name`` key in host-managed mode.

    Contract: the only writer of our finalizer and of ``status`` of each domain (the workqueue
    never runs one key twice at once); writes carry the resourceVersion read, and a 409 on the
    status is answered by re-reading the domain (at most three attempts per pass).
    """

    def __init__(
        self,
        *,
        client: KubeClient,
        caches: Caches,
        config: ControllerConfig,
        events: EventSink,
        metrics: DomainMetrics,
        clock: Clock,
    ) -> None:
        self._client = client
        self._caches = caches
        self._config = config
        self._events = events
        self._metrics = metrics
        self._clock = clock
        self._dependents = Dependents(client=client, caches=caches, config=config, events=events)

    def reconcile(self, key: str, ctx: ReconcileContext = BACKGROUND) -> Result:
        """One pass over the domain ``namespace/name`` (see the module docstring).

        Returns a requeue while the RCT is still terminating or owned by someone else; raises
        :class:`TerminalError` for a spec the API server should not have admitted."""
        ctx.check()
        obj = self._caches.compute_domains.get_by_key(key)
        if obj is None:
            return Result()
        if obj.get("metadata", {}).get("deletionTimestamp"):
            return self._finalize(obj)
        try:
            cd = parse_compute_domain(obj)
        except InvalidComputeDomainError as exc:
            self._events.event(obj, WARNING, REASON_INVALID_SPEC, str(exc))
            raise TerminalError(f"invalid spec: {exc}") from exc
        if c.FINALIZER not in (obj["metadata"].get("finalizers") or []):
            body = copy.deepcopy(obj)
            body["metadata"]["finalizers"] = [
                *(body["metadata"].get("finalizers") or []),
                c.FINALIZER,
            ]
            ctx.check()
            obj = self._client.update(res.COMPUTE_DOMAINS, body)
        ctx.check()
        single = dataclasses.replace(cd, allocation_mode=_SINGLE)
        try:
            problem = self._dependents.ensure_workload_rct(single, obj)
        except RetryLaterError as exc:
            log.info("%s", exc, extra={"key": key})
            return Result(requeue_after=1.0)
        if problem is not None:
            self._events.event(obj, WARNING, problem.reason, problem.message)
            return Result(requeue_after=_PROBLEM_RECHECK)
        ctx.check()
        self._write_ready(obj)
        return Result()

    def _write_ready(self, obj: JSON) -> None:
        """``status.status: Ready`` plus the ``Ready`` condition, unless already written."""
        for attempt in range(_STATUS_WRITE_ATTEMPTS):
            meta = obj["metadata"]
            previous = dict(obj.get("status") or {})
            conditions = set_condition(
                list(previous.get("conditions") or []),
                type_=CONDITION_READY,
                status=True,
                reason=REASON_HOST_MANAGED,
                message=_READY_MESSAGE,
                observed_generation=int(meta.get("generation", 0)),
                now=format_time(self._clock.now()),
            )
            new = {**previous, "status": c.STATUS_READY, "conditions": conditions}
            if new != previous:
                body = copy.deepcopy(obj)
                body["status"] = new
                try:
                    self._client.update(res.COMPUTE_DOMAINS, body, subresource="status")
                except ConflictError:
                    if attempt + 1 == _STATUS_WRITE_ATTEMPTS:
                        raise
                    obj = self._client.get(
                        res.COMPUTE_DOMAINS, meta["name"], namespace=meta["namespace"]
                    )
                    continue
                log.info(
                    "status written status=%s (host-managed IMEX)",
                    c.STATUS_READY,
                    extra={"key": meta_namespace_key(obj)},
                )
            self._metrics.observe_status(
                str(meta.get("uid")),
                namespace=str(meta.get("namespace", "")),
                status=c.STATUS_READY,
                previous=previous.get("status"),
                created=parse_timestamp(str(meta.get("creationTimestamp", ""))),
                now=self._clock.now(),
                nodes=0,
            )
            return

    def _finalize(self, obj: JSON) -> Result:
        meta = obj["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        if c.FINALIZER not in finalizers:
            return Result()
        uid = str(meta.get("uid"))
        pending = self._dependents.teardown(uid, str(meta.get("namespace")))
        if pending:
            log.info(
                "deleting; waiting for %s",
                ", ".join(pending),
                extra={"key": meta_namespace_key(obj)},
            )
            return Result(requeue_after=self._config.deletion_recheck)
        body = copy.deepcopy(obj)
        body["metadata"]["finalizers"] = [f for f in finalizers if f != c.FINALIZER]
        with contextlib.suppress(NotFoundError):
            self._client.update(res.COMPUTE_DOMAINS, body)
        self._metrics.forget(uid)
        log.info("finalizer removed", extra={"key": meta_namespace_key(obj)})
        return Result()


def _unwrap(obj: JSON | DeletedFinalStateUnknown) -> JSON:
    return obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj


class HostManagedManager(Manager):
    """Everything the controller runs while leading in host-managed IMEX mode: two informers
    (ComputeDomains, labelled RCTs), one ``computedomain`` controller, and the orphan sweep,
    which finds only RCTs of domains that no longer exist (see :func:`host_managed_caches`).
    """

    def _build(self) -> Caches:
        domains = self._factory.informer_for(res.COMPUTE_DOMAINS)
        rcts = self._factory.informer_for(
            res.RESOURCE_CLAIM_TEMPLATES, label_selector=c.COMPUTE_DOMAIN_LABEL
        )
        domains.add_indexers(INDEXES["compute_domains"])
        rcts.add_indexers(INDEXES["rcts"])
        self._informers = {"compute_domains": domains, "rcts": rcts}
        caches = host_managed_caches(compute_domains=domains.indexer, rcts=rcts.indexer)
        self.domains = HostManagedDomainReconciler(
            client=self._client,
            caches=caches,
            config=self._config,
            events=self._events,
            metrics=DomainMetrics(self._registry),
            clock=self._clock,
        )
        self.controller = self._controller(
            "computedomain", self.domains, self._cd_workers, self._config.domain_batch_period
        )
        self.controllers = [self.controller]
        return caches

    def _wire(self) -> None:
        enqueue = self.controller.handler(lambda o: [meta_namespace_key(o)])
        self._informers["compute_domains"].add_event_handler(
            on_add=enqueue,
            on_update=lambda _old, new: enqueue(new),
            on_delete=self._on_domain_deleted(enqueue),
        )

        def by_owner(obj: JSON) -> list[str]:
            uid = (obj["metadata"].get("labels") or {}).get(c.COMPUTE_DOMAIN_LABEL)
            return [
                meta_namespace_key(cd)
                for cd in self.caches.compute_domains.by_index("uid", str(uid))
            ]

        owner_enqueue = self.controller.handler(by_owner)

        def on_rct(obj: JSON) -> None:
            self.cleaner.maybe_orphan(obj)
            owner_enqueue(obj)

        self._informers["rcts"].add_event_handler(
            on_add=on_rct,
            on_update=lambda _old, new: on_rct(new),
            on_delete=lambda o: owner_enqueue(_unwrap(o)),
        )

    def _on_domain_deleted(
        self, enqueue: Callable[[JSON], None]
    ) -> Callable[[JSON | DeletedFinalStateUnknown], None]:
        def on_delete(obj: JSON | DeletedFinalStateUnknown) -> None:
            enqueue(_unwrap(obj))
            self.cleaner.poke()  # its RCT may now be an orphan

        return on_delete

    def _on_synced(self) -> None:
        log.info("caches synced; starting workers (host-managed IMEX)")
