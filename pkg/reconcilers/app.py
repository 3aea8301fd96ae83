"""The compute-domain-controller process: observability, leader election and the manager.

Owns the process lifecycle around :class:`ControllerManager`. Invariants:

* the HTTP endpoint (if configured) is up before leader election starts, so a standby answers
  probes; ``/readyz`` is ready when this process is a healthy standby (not leading, elector
  running) or is leading with every cache synced, and never otherwise;
* one manager per leadership term: it is built (fresh caches, queues and metrics, registered
  under the process registry only for the term) when a term starts and stopped completely
  when it ends, so no in-memory state ever outlives a term; a lost term (the lease could not
  be renewed, e.g. the API server was away longer than the renew deadline) is followed by a
  new campaign in the same process, where upstream exits and waits for a pod restart;
* with ``--debug-endpoints`` the same endpoint serves ``/debug/informers``: the current term's
  caches (``pkg.informers.snapshot``), an empty list while not leading; without it, 404;
* in host-managed IMEX mode (``IMEX_MODE=hostManaged``) a term runs
  :class:`pkg.reconcilers.hostmanaged.HostManagedManager` (finalizer, workload template and
  ``Ready`` only) instead of the daemon machinery;
* the first line it logs names the build (``starting compute-domain-controller version=...
  revision=... buildDate=...``), and the process registry serves
  ``nvidia_dra_compute_domain_controller_build_info`` (`pkg.runtime.buildinfometric`) from
  the start, leader or not;
* before campaigning it asks the API server which ``resource.k8s.io`` version it serves
  (`pkg.kube.resourceapi`; v1 > v1beta2 > v1beta1, retried while the server is away), logs the
  choice once and has its client speak it; none supported → :func:`run` returns 1;
* ``stop`` set (SIGTERM) → workers stop, the lease is released, :func:`run` returns 0; caches
  that never sync → :func:`run` returns 1 so the pod restarts.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector

from pkg.base.clock import Clock, RealClock
from pkg.base.types import JSON
from pkg.kube.client import KubeClient, RestClient
from pkg.kube.config import load_api_client
from pkg.kube.errors import ApiError
from pkg.kube.eventbroadcaster import AsyncEventRecorder
from pkg.kube.resourceapi import UnsupportedResourceApiError, use_served_resource_api
from pkg.reconcilers.flags import Options
from pkg.reconcilers.formation import FormationTracer
from pkg.reconcilers.hostmanaged import HostManagedManager
from pkg.reconcilers.manager import ControllerManager, domain_workers
from pkg.runtime.buildinfo import BuildInfo, load_build_info
from pkg.runtime.buildinfometric import register_build_info
from pkg.runtime.httpserver import HealthChecks, ObservabilityServer
from pkg.runtime.leaderelection import LeaderElectionConfig, LeaderElector
from pkg.runtime.startupconfig import startup_config
from pkg.runtime.tracing import setup_tracing

__all__ = ["BUILD_INFO_METRIC", "COMPONENT", "run"]

log = logging.getLogger(__name__)

COMPONENT = "compute-domain-controller"
# The controller's metrics are nvidia_dra_*; the component name keeps this one apart from the
# kubelet plugin's (nvidia_dra_compute_domain_kubelet_plugin_build_info) without a job label.
BUILD_INFO_METRIC = "nvidia_dra_compute_domain_controller_build_info"


def _default_client(options: Options) -> KubeClient:
    api = load_api_client(options.kubeconfig)
    return RestClient(
        api,
        qps=options.kube_api_qps,
        burst=options.kube_api_burst,
        user_agent=COMPONENT,
        per_group_limit=True,
    )


def _default_events_client(options: Options) -> KubeClient:
    """Events get their own connection pool and rate limit, off the reconcile budget."""
    api = load_api_client(options.kubeconfig)
    return RestClient(api, qps=options.events_qps, burst=options.events_burst, user_agent=COMPONENT)


def run(
    options: Options,
    *,
    stop: threading.Event,
    env: Mapping[str, str] | None = None,
    client_factory: Callable[[Options], KubeClient] = _default_client,
    events_client_factory: Callable[[Options], KubeClient] | None = None,
    clock: Clock | None = None,
    registry: CollectorRegistry | None = None,
    ready: Callable[[int], None] | None = None,
    build_info: BuildInfo | None = None,
) -> int:
    """Run until ``stop`` is set (0) or the caches cannot sync (1); lost terms re-campaign.

    ``ready`` is called with the bound HTTP port once the server listens (0 without one).
    Events go through ``events_client_factory`` (default: a second client with the
    ``--events-qps``/``--events-burst`` limit when ``client_factory`` is the default, else
    ``client_factory``) from a background sender, so no reconcile waits for one.
    ``build_info`` (default: this installation's, `load_build_info`) is named by the first log
    line and exported as `BUILD_INFO_METRIC` on ``registry``.
    """
    build_info = build_info or load_build_info()
    log.info("%s", build_info.startup_message(COMPONENT))
    dump = startup_config(
        revision=build_info.revision,
        gates=options.gates.all_values(),
        flags=dict(options.flag_values),
        type_name="*main.Flags",
    )
    log.info("%s", dump)
    clock = clock or RealClock()
    if registry is None:
        registry = CollectorRegistry()
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
    register_build_info(registry, name=BUILD_INFO_METRIC, info=build_info)
    process_registry = registry
    tracing = setup_tracing(COMPONENT, env=os.environ if env is None else env)
    client = client_factory(options)
    if events_client_factory is None:
        events_client_factory = (
            _default_events_client if client_factory is _default_client else client_factory
        )
    recorder = AsyncEventRecorder(events_client_factory(options), COMPONENT, clock)
    recorder.start()
    state: dict[str, ControllerManager | HostManagedManager | None] = {"manager": None}
    leading = threading.Event()
    failed = threading.Event()
    liveness, readiness = HealthChecks(), HealthChecks()
    liveness.add("ping", lambda: True)

    def is_ready() -> bool:
        manager = state["manager"]
        if not options.leader_election or leading.is_set():
            return manager is not None and manager.synced()
        return not failed.is_set()

    readiness.add("controller", is_ready)

    def informers_document() -> JSON:
        manager = state["manager"]
        return {
            "component": COMPONENT,
            "leading": manager is not None,
            "informers": manager.informer_snapshot() if manager is not None else [],
        }

    debug = {"/debug/informers": informers_document} if options.debug_endpoints else {}
    server = None
    if options.http_endpoint:
        server = ObservabilityServer(
            options.http_endpoint,
            registry=registry,
            metrics_path=options.metrics_path,
            liveness=liveness,
            readiness=readiness,
            debug=debug,
        )
        server.start()
    if ready is not None:
        ready(server.port if server else 0)

    terms: dict[str, CollectorRegistry | None] = {"registry": None}

    def start_term() -> None:
        term_registry = CollectorRegistry()
        process_registry.register(term_registry)
        terms["registry"] = term_registry
        manager: ControllerManager | HostManagedManager
        if options.controller.imex.host_managed:
            manager = HostManagedManager(
                client=client,
                config=options.controller,
                registry=term_registry,
                tracer=tracing.tracer,
                clock=clock,
                informer_clock=RealClock(),
                events=recorder,
                cd_workers=domain_workers(options.kube_api_qps),
            )
        else:
            manager = ControllerManager(
                client=client,
                config=options.controller,
                registry=term_registry,
                tracer=tracing.tracer,
                clock=clock,
                informer_clock=RealClock(),
                events=recorder,
                formation=FormationTracer(tracing, clock=clock),
                cd_workers=domain_workers(options.kube_api_qps),
            )
        state["manager"] = manager
        leading.set()

        def sync() -> None:
            if not manager.start() and not manager.stopping:
                failed.set()
                stop.set()

        threading.Thread(target=sync, name="manager-start", daemon=True).start()

    def stop_term() -> None:
        leading.clear()
        manager, state["manager"] = state["manager"], None
        if manager is not None:
            manager.stop()
        term_registry, terms["registry"] = terms["registry"], None
        if term_registry is not None:
            process_registry.unregister(term_registry)

    log.info(
        "starting namespace=%s image=%s leader_election=%s gates=%s imexMode=%s imexIsolation=%s",
        options.controller.namespace,
        options.controller.image_name,
        options.leader_election,
        options.controller.feature_gates,
        options.controller.imex.mode,
        options.controller.imex.isolation,
    )
    try:
        if isinstance(client, RestClient):
            try:
                if not use_served_resource_api(client, clock=clock, stop=stop):
                    return 0
            except (UnsupportedResourceApiError, ApiError) as err:
                log.error("cannot start: %s", err)
                return 1
        if options.leader_election:
            elector = LeaderElector(
                client,
                LeaderElectionConfig(
                    namespace=options.lease_namespace,
                    name=options.lease_name,
                    identity=f"{options.pod_name}-{uuid.uuid4()}",
                    lease_duration=options.lease_duration,
                    renew_deadline=options.renew_deadline,
                    retry_period=options.retry_period,
                ),
                clock=clock,
            )
            elector.run_terms(stop, on_started_leading=start_term, on_stopped_leading=stop_term)
            return 1 if failed.is_set() else 0
        start_term()
        stop.wait()
        stop_term()
        return 1 if failed.is_set() else 0
    finally:
        recorder.stop()
        if server is not None:
            server.stop()
        tracing.shutdown()
