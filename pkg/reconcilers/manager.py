"""ControllerManager: wires informers, event handlers, queues, reconcilers and the orphan sweep.

Owns the process-wide object graph of the ComputeDomain controller. One shared informer per
watched slice of the API feeds the caches (:class:`pkg.reconcilers.cache.Caches`); event
handlers only map objects to keys and enqueue them (never call the API); five controllers
with their own named queues run the reconcilers:

* ``computedomain`` (key ``ns/name``): from ComputeDomains, from their allocated channel
  claims (the first one creates the daemon objects), from the DaemonSets, daemon pods,
  cliques, RCTs and Nodes labelled with a domain UID, and from any Node that hosts a daemon
  pod or clique entry of a domain (node health decides membership) — so status aggregation
  is driven by membership events, with no polling;
* ``resourceclaim`` (key node name): from ResourceClaims (old and new allocation node),
  Nodes, and ComputeDomains appearing after their claims;
* ``cliquelabel`` (key node name): from ResourceSlices and Nodes;
* ``cliqueprune`` (key clique ``ns/name``): from ComputeDomainCliques, the daemon pods of
  their domain and the Nodes their entries are on; a pending removal re-checks itself with
  ``add_after``, never by polling;
* ``cliquejoin`` (key clique ``ns/<cdUID>.<cliqueID>``, the clique may not exist yet): from the
  daemon pods, the cliques, ResourceSlices (a node's clique) and node health.

DaemonSets, daemon pods and cliques are watched in the driver namespace and in each
``ADDITIONAL_NAMESPACES`` one (one informer each, read through one merged cache). With gate
``ComputeDomainCliques`` off there is no clique informer and no ``cliqueprune``/``cliquejoin``:
the daemons write ``status.nodes`` and the ``computedomain`` reconciler, woken by those writes,
keeps it (:func:`pkg.reconcilers.status.as_written`).

Invariants: workers start only after every cache has synced (:meth:`ControllerManager.start`
blocks until then); :meth:`stop` stops the queues, the sweep and the informers, in that order.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import trace
from prometheus_client import CollectorRegistry

from pkg.api import constants as c
from pkg.api.computedomain import InvalidComputeDomainError, parse_compute_domain
from pkg.base.clock import Clock
from pkg.base.types import JSON
from pkg.informers import DeletedFinalStateUnknown
from pkg.informers.informer import SharedInformer
from pkg.informers.store import meta_namespace_key
from pkg.kube import resources as res
from pkg.kube.client import KubeClient
from pkg.reconcilers.cache import (
    BY_NODE,
    BY_UID,
    INDEXES,
    Caches,
    MergedCache,
    allocated_node,
    channel_domain_id,
)
from pkg.reconcilers.cliquejoin import CliqueJoinReconciler
from pkg.reconcilers.cliquelabel import CliqueLabelReconciler
from pkg.reconcilers.cliqueprune import CliquePruneReconciler
from pkg.reconcilers.computedomain import ComputeDomainReconciler
from pkg.reconcilers.config import ControllerConfig
from pkg.reconcilers.controller import Controller
from pkg.reconcilers.events import EventSink, OnceEvents
from pkg.reconcilers.formation import FormationTracer
from pkg.reconcilers.lifecycle import Manager
from pkg.reconcilers.metrics import DomainMetrics
from pkg.reconcilers.nodecache import NodeView, as_node_metadata, same_node_metadata
from pkg.reconcilers.resourceclaim import ResourceClaimReconciler
from pkg.reconcilers.slim import slim_node

__all__ = ["ControllerManager", "domain_workers"]

log = logging.getLogger(__name__)

Mapper = Callable[[JSON], Iterable[str]]


def domain_workers(qps: float) -> int:
    """Workers of the ``computedomain`` queue for a client limit of ``qps`` per API group.

    A reconcile is I/O-bound: one worker waits ~50-100 ms per request on a busy node, so it
    issues at most ~10-20 requests/s. One worker per 5 QPS (at least 8, at most 64) keeps
    enough requests in flight that the client's limiter, not the worker count, bounds a burst
    of new domains; idle workers cost only a blocked thread each."""
    return max(8, min(64, math.ceil(qps / 5)))


def _unwrap(obj: JSON | DeletedFinalStateUnknown) -> JSON:
    return obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj


def _deleting(obj: JSON) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


class ControllerManager(Manager):
    """Everything the controller runs while leading in driver-managed IMEX mode (the default):
    the daemon machinery. ``formation``: the domains' formation traces (None: none)."""

    def __init__(
        self,
        *,
        client: KubeClient,
        config: ControllerConfig,
        registry: CollectorRegistry,
        tracer: trace.Tracer,
        clock: Clock,
        informer_clock: Clock,
        events: EventSink,
        cd_workers: int = 8,
        formation: FormationTracer | None = None,
    ) -> None:
        self._formation = formation
        super().__init__(
            client=client,
            config=config,
            registry=registry,
            tracer=tracer,
            clock=clock,
            informer_clock=informer_clock,
            events=events,
            cd_workers=cd_workers,
        )

    def _build(self) -> Caches:
        """Informers of every watched slice of the API, their caches, the five reconcilers and
        their controllers (the clique ones only with gate ``ComputeDomainCliques``)."""
        caches = self._build_informers()
        self._build_reconcilers(caches)
        return caches

    def _build_informers(self) -> Caches:
        config, label, f = self._config, c.COMPUTE_DOMAIN_LABEL, self._factory
        # Kinds cached in full are held serialized (about 1x their JSON size instead of ~6x,
        # docs/benchmarks.md); the Node metadata cache holds dicts: it is read on every
        # placement check and each object is small.
        informers: dict[str, SharedInformer] = {
            "compute_domains": f.informer_for(res.COMPUTE_DOMAINS, serialized=True),
            "rcts": f.informer_for(
                res.RESOURCE_CLAIM_TEMPLATES, label_selector=label, serialized=True
            ),
            "nodes": f.informer_for(res.NODES, transform=as_node_metadata, metadata_only=True),
            "claims": f.informer_for(res.RESOURCE_CLAIMS, serialized=True),
            "slices": f.informer_for(res.RESOURCE_SLICES, serialized=True),
        }
        # Daemon objects: one informer per managed namespace (driver namespace plus
        # ADDITIONAL_NAMESPACES); cliques only while daemons record themselves in them.
        scoped_kinds = [("daemonsets", res.DAEMONSETS), ("pods", res.PODS)]
        if config.compute_domain_cliques:
            scoped_kinds.append(("cliques", res.COMPUTE_DOMAIN_CLIQUES))
        self._scoped: dict[str, list[SharedInformer]] = {"cliques": []}
        for name, resource in scoped_kinds:
            self._scoped[name] = [
                f.informer_for(resource, ns, label_selector=label, serialized=True)
                for ns in config.managed_namespaces
            ]
        for name, inf in informers.items():
            inf.add_indexers(INDEXES[name])
        for name, scoped in self._scoped.items():
            for inf in scoped:
                inf.add_indexers(INDEXES[name])
        # Health (conditions, taints) only of the Nodes that host a domain's daemons.
        self._node_health = f.informer_for(res.NODES, label_selector=label, transform=slim_node)
        caches: dict[str, Any] = {name: inf.indexer for name, inf in informers.items()}
        for name, scoped in self._scoped.items():
            caches[name] = (
                scoped[0].indexer if len(scoped) == 1 else MergedCache(*(i.indexer for i in scoped))
            )
        caches["nodes"] = NodeView(informers["nodes"].indexer, self._node_health.indexer)
        informers["node_health"] = self._node_health
        for name, scoped in self._scoped.items():
            for i, inf in enumerate(scoped):
                informers[f"{name}[{i}]"] = inf
        self._informers = informers
        return Caches(**caches)

    def _build_reconcilers(self, caches: Caches) -> None:
        client, config, events, clock = self._client, self._config, self._events, self._clock
        once = OnceEvents(events)
        self.domains = ComputeDomainReconciler(
            client=client,
            caches=caches,
            config=config,
            events=events,
            metrics=DomainMetrics(self._registry),
            clock=clock,
            formation=self._formation,
        )
        self.claims = ResourceClaimReconciler(
            client=client, caches=caches, events=once, clock=clock
        )
        self.cliques = CliqueLabelReconciler(client=client, caches=caches, events=once)
        self.prune = CliquePruneReconciler(
            client=client, caches=caches, config=config, events=events, clock=clock
        )
        self.joins = CliqueJoinReconciler(client=client, caches=caches, config=config, clock=clock)
        controller = self._controller
        self.controllers = [
            # Reconciles are I/O-bound: enough workers that the client's QPS (per API group),
            # not the worker count, bounds a burst of new domains (see domain_workers).
            # A forming domain gets an event for every daemon pod, clique and node change
            # (~110 reconciles of ~4 ms in an 18-node formation): coalesced per batch period.
            controller("computedomain", self.domains, self._cd_workers, config.domain_batch_period),
            # Keyed by node: the label writes of a domain's nodes, all allocated within a
            # moment, go out in parallel (one worker wrote 18 nodes' labels one after another:
            # ~0.5 s for the last node at a busy API server).
            controller("resourceclaim", self.claims, 4),
            controller("cliquelabel", self.cliques, 1),
        ]
        if config.compute_domain_cliques:
            # Clique entries (ComputeDomainCliques on); off, the daemons' status.nodes entries
            # are kept and pruned by the computedomain reconciler's status writes.
            self.controllers += [
                controller("cliqueprune", self.prune, 1),
                # One worker per clique being formed at once: a slow write to one clique (an
                # API server busy with a large domain) must not hold back the others' joins.
                controller("cliquejoin", self.joins, 4),
            ]

    def _on_synced(self) -> None:
        adopted = self.claims.adopt_allocations()
        log.info("caches synced; starting workers adopted_claims=%d", adopted)

    # -- event handlers → keys --------------------------------------------------------------

    def _domain_keys(self, obj: JSON) -> list[str]:
        uid = (obj["metadata"].get("labels") or {}).get(c.COMPUTE_DOMAIN_LABEL)
        if not uid:
            return []
        return [meta_namespace_key(cd) for cd in self.caches.compute_domains.by_index(BY_UID, uid)]

    def _domain_keys_of_claim(self, claim: JSON) -> list[str]:
        """The domain an allocated channel claim belongs to (it creates the daemon objects)."""
        uid = channel_domain_id(claim)
        if not uid:
            return []
        return [meta_namespace_key(cd) for cd in self.caches.compute_domains.by_index(BY_UID, uid)]

    def _domain_keys_of_node(self, node: JSON) -> list[str]:
        """Domains with a daemon pod or a clique entry on ``node``, and the one it is
        labelled for."""
        name = str(node["metadata"]["name"])
        keys = set(self._domain_keys(node))
        for obj in (
            *self.caches.pods.by_index(BY_NODE, name),
            *self.caches.cliques.by_index(BY_NODE, name),
        ):
            keys.update(self._domain_keys(obj))
        return sorted(keys)

    def _waiting_domain_keys(self) -> list[str]:
        """Domains whose numNodes (> 1) is not met yet: a node or slice change may decide
        whether it ever can be (``NumNodesUnreachable``)."""
        keys = []
        for obj in self.caches.compute_domains.list():
            try:
                cd = parse_compute_domain(obj)
            except InvalidComputeDomainError:
                continue  # its InvalidSpec condition does not depend on nodes or slices
            if cd.num_nodes > 1 and (obj.get("status") or {}).get("status") != c.STATUS_READY:
                keys.append(meta_namespace_key(obj))
        return keys

    def _watch(
        self,
        informer: SharedInformer,
        controller: Controller,
        mapper: Mapper,
        *,
        relevant: Callable[[JSON, JSON], bool] | None = None,
    ) -> None:
        """Enqueue the keys ``mapper`` gives for added, deleted and updated objects; with
        ``relevant``, only updates for which ``relevant(old, new)`` holds."""
        enqueue = controller.handler(mapper)

        def on_update(old: JSON, new: JSON) -> None:
            if relevant is not None and not relevant(old, new):
                return
            enqueue(old)
            enqueue(new)

        informer.add_event_handler(
            on_add=enqueue, on_update=on_update, on_delete=lambda o: enqueue(_unwrap(o))
        )

    def _wire(self) -> None:
        cd_ctl, claim_ctl, clique_ctl = self.controllers[:3]
        inf = self._informers
        scoped = self._scoped
        self._watch(inf["compute_domains"], cd_ctl, lambda o: [meta_namespace_key(o)])
        # Orphan sweeps are event-driven: a domain went away, or something names an unknown one.
        inf["compute_domains"].add_event_handler(on_delete=lambda _o: self.cleaner.poke())

        def maybe_orphan(obj: JSON) -> None:
            self.cleaner.maybe_orphan(obj)

        for informer in (*scoped["daemonsets"], inf["rcts"]):
            informer.add_event_handler(
                on_add=maybe_orphan, on_update=lambda _old, new: maybe_orphan(new)
            )

        # Metadata-only Nodes: an update that changed nothing cached (only the resourceVersion,
        # e.g. a foreign annotation or status heartbeat) wakes no reconciler; with thousands
        # of Nodes those sweeps were the controller's whole idle CPU.
        def node_changed(old: JSON, new: JSON) -> bool:
            return not same_node_metadata(old, new)

        inf["nodes"].add_event_handler(
            on_add=maybe_orphan,
            on_update=lambda old, new: maybe_orphan(new) if node_changed(old, new) else None,
        )
        # A domain's claims re-check its nodes when it appears, goes or starts being deleted;
        # its status writes (dozens while it forms) change nothing the claim reconciler reads.
        self._watch(
            inf["compute_domains"],
            claim_ctl,
            lambda o: self.claims.nodes_of_domain(str(o["metadata"].get("uid"))),
            relevant=lambda old, new: _deleting(old) != _deleting(new),
        )
        for informer in (*scoped["daemonsets"], *scoped["pods"], *scoped["cliques"], inf["rcts"]):
            self._watch(informer, cd_ctl, self._domain_keys)
        self._watch(inf["nodes"], cd_ctl, self._domain_keys_of_node, relevant=node_changed)
        # Node health: a kubelet status report that changed nothing cached (its heartbeat
        # times are not cached, see slim_node) wakes no reconciler.
        self._watch(inf["node_health"], cd_ctl, self._domain_keys_of_node, relevant=node_changed)
        # Nodes that could ever join (reachability): re-check domains still waiting for nodes.
        # That set changes only when a node appears, goes or starts being deleted.
        self._watch(inf["slices"], cd_ctl, lambda _o: self._waiting_domain_keys())
        self._watch(
            inf["nodes"],
            cd_ctl,
            lambda _o: self._waiting_domain_keys(),
            relevant=lambda old, new: _deleting(old) != _deleting(new),
        )
        if len(self.controllers) > 3:
            self._wire_cliques(*self.controllers[3:5], node_changed=node_changed)
        self._watch(inf["claims"], claim_ctl, lambda o: [n] if (n := allocated_node(o)) else [])
        # The first allocated channel claim of a domain makes it create its daemon objects.
        self._watch(inf["claims"], cd_ctl, self._domain_keys_of_claim)
        self._watch(
            inf["nodes"], claim_ctl, lambda o: [str(o["metadata"]["name"])], relevant=node_changed
        )
        self._watch(
            inf["nodes"], clique_ctl, lambda o: [str(o["metadata"]["name"])], relevant=node_changed
        )
        self._watch(
            inf["slices"],
            clique_ctl,
            lambda o: [str(n)] if (n := (o.get("spec") or {}).get("nodeName")) else [],
        )

    def _wire_cliques(
        self,
        prune_ctl: Controller,
        join_ctl: Controller,
        *,
        node_changed: Callable[[JSON, JSON], bool],
    ) -> None:
        """The clique reconcilers' handlers (gate ``ComputeDomainCliques`` on)."""
        inf, scoped = self._informers, self._scoped
        self._watch(inf["nodes"], prune_ctl, self.prune.keys_for_node, relevant=node_changed)
        self._watch(inf["node_health"], prune_ctl, self.prune.keys_for_node, relevant=node_changed)
        for cliques in scoped["cliques"]:
            self._watch(cliques, prune_ctl, lambda o: [meta_namespace_key(o)])
            self._watch(cliques, join_ctl, lambda o: [meta_namespace_key(o)])
        # Entries for joining daemons: their pods (IP, clique label, deletion), their clique,
        # the clique of a node whose daemon has not labelled its pod yet, node health.
        for pods in scoped["pods"]:
            self._watch(pods, prune_ctl, self.prune.keys_for_pod)
            self._watch(pods, join_ctl, self.joins.keys_for_pod)
        self._watch(inf["slices"], join_ctl, self.joins.keys_for_slice)
        self._watch(
            inf["node_health"],
            join_ctl,
            lambda o: self.joins.keys_for_node(str(o["metadata"]["name"])),
            relevant=node_changed,
        )
