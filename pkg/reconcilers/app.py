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

from pkg.api.constants import GROUP
from pkg.base.clock import Clock, RealClock
from pkg.base.types import JSON
from pkg.kube.client import KubeClient, RestClient
from pkg.kube.config import KubeConfigError, load_api_client
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
from pkg.runtime.tracing import Tracing, setup_tracing

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
        # Upstream's two clientsets: one budget for the Kubernetes groups, one for ours.
        separate_groups=(GROUP,),
    )


def _default_events_client(options: Options) -> KubeClient:
    """Events get their own connection pool and rate limit, off the reconcile budget."""
    api = load_api_client(options.kubeconfig)
    return RestClient(api, qps=options.events_qps, burst=options.events_burst, user_agent=COMPONENT)


class _Terms:
    """The leadership terms of this process: one manager per term, and the readiness it gives.

    :meth:`start` builds a fresh manager (its metrics under a registry of its own, registered
    under the process registry for the term) and syncs it in the background; caches that never
    sync set ``stop`` and :attr:`failed`. :meth:`stop` stops the term's manager and unregisters
    its metrics. ``/readyz`` (:meth:`ready`) and ``/debug/informers`` (:meth:`informers`) read
    the current term.
    """

    def __init__(
        self,
        options: Options,
        *,
        client: KubeClient,
        events: AsyncEventRecorder,
        tracing: Tracing,
        clock: Clock,
        registry: CollectorRegistry,
        stop: threading.Event,
    ) -> None:
        self._options = options
        self._client = client
        self._events = events
        self._tracing = tracing
        self._clock = clock
        self._process_registry = registry
        self._stop = stop
        self._manager: ControllerManager | HostManagedManager | None = None
        self._term_registry: CollectorRegistry | None = None
        self.leading = threading.Event()
        self.failed = threading.Event()

    def _build_manager(self, registry: CollectorRegistry) -> ControllerManager | HostManagedManager:
        """The manager of the IMEX mode: host-managed IMEX runs no daemon machinery."""
        opts, workers = self._options, domain_workers(self._options.kube_api_qps)
        if opts.controller.imex.host_managed:
            return HostManagedManager(
                client=self._client,
                config=opts.controller,
                registry=registry,
                tracer=self._tracing.tracer,
                clock=self._clock,
                informer_clock=RealClock(),
                events=self._events,
                cd_workers=workers,
            )
        return ControllerManager(
            client=self._client,
            config=opts.controller,
            registry=registry,
            tracer=self._tracing.tracer,
            clock=self._clock,
            informer_clock=RealClock(),
            events=self._events,
            cd_workers=workers,
            formation=FormationTracer(self._tracing, clock=self._clock),
        )

    def start(self) -> None:
        """A term starts: build its manager and sync it in the background."""
        term_registry = CollectorRegistry()
        self._process_registry.register(term_registry)
        self._term_registry = term_registry
        manager = self._build_manager(term_registry)
        self._manager = manager
        self.leading.set()

        def sync() -> None:
            if not manager.start() and not manager.stopping:
                self.failed.set()
                self._stop.set()

        threading.Thread(target=sync, name="manager-start", daemon=True).start()

    def stop(self) -> None:
        """The term ends: stop its manager completely and unregister its metrics."""
        self.leading.clear()
        manager, self._manager = self._manager, None
        if manager is not None:
            manager.stop()
        term_registry, self._term_registry = self._term_registry, None
        if term_registry is not None:
            self._process_registry.unregister(term_registry)

    def ready(self) -> bool:
        """Leading with every cache synced, or a healthy standby (not leading, not failed)."""
        manager = self._manager
        if not self._options.leader_election or self.leading.is_set():
            return manager is not None and manager.synced()
        return not self.failed.is_set()

    def informers(self) -> JSON:
        """The ``/debug/informers`` document: the current term's caches (none: not leading)."""
        manager = self._manager
        return {
            "component": COMPONENT,
            "leading": manager is not None,
            "informers": manager.informer_snapshot() if manager is not None else [],
        }


def _log_startup(options: Options, build_info: BuildInfo) -> None:
    """The build's line first, then the effective configuration."""
    log.info("%s", build_info.startup_message(COMPONENT))
    dump = startup_config(
        revision=build_info.revision,
        gates=options.gates.all_values(),
        flags=dict(options.flag_values),
        type_name="*main.Flags",
    )
    log.info("%s", dump)


def _log_settings(options: Options) -> None:
    log.info(
        "starting namespace=%s image=%s leader_election=%s gates=%s imexMode=%s imexIsolation=%s",
        options.controller.namespace,
        options.controller.image_name,
        options.leader_election,
        options.controller.feature_gates,
        options.controller.imex.mode,
        options.controller.imex.isolation,
    )


def _process_registry(
    registry: CollectorRegistry | None, build_info: BuildInfo
) -> CollectorRegistry:
    """``registry``, or a new one with the process and platform collectors; plus build info."""
    if registry is None:
        registry = CollectorRegistry()
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
    register_build_info(registry, name=BUILD_INFO_METRIC, info=build_info)
    return registry


def _serve(
    options: Options, registry: CollectorRegistry, terms: _Terms
) -> ObservabilityServer | None:
    """The started HTTP endpoint (metrics, probes, debug), or None without ``--http-endpoint``."""
    if not options.http_endpoint:
        return None
    liveness, readiness = HealthChecks(), HealthChecks()
    liveness.add("ping", lambda: True)
    readiness.add("controller", terms.ready)
    server = ObservabilityServer(
        options.http_endpoint,
        registry=registry,
        metrics_path=options.metrics_path,
        liveness=liveness,
        readiness=readiness,
        debug={"/debug/informers": terms.informers} if options.debug_endpoints else {},
    )
    server.start()
    return server


def _lead(
    options: Options, client: KubeClient, terms: _Terms, *, clock: Clock, stop: threading.Event
) -> int:
    """Pick the served resource API, then run terms until ``stop``: 0, or 1 on failure."""
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
        elector.run_terms(stop, on_started_leading=terms.start, on_stopped_leading=terms.stop)
        return 1 if terms.failed.is_set() else 0
    terms.start()
    stop.wait()
    terms.stop()
    return 1 if terms.failed.is_set() else 0


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
    _log_startup(options, build_info)
    clock = clock or RealClock()
    registry = _process_registry(registry, build_info)
    tracing = setup_tracing(COMPONENT, env=os.environ if env is None else env)
    try:
        client = client_factory(options)
    except KubeConfigError as err:
        log.error("cannot start: %s", err)
        tracing.shutdown()
        return 1
    if events_client_factory is None:
        events_client_factory = (
            _default_events_client if client_factory is _default_client else client_factory
        )
    recorder = AsyncEventRecorder(events_client_factory(options), COMPONENT, clock)
    recorder.start()
    terms = _Terms(
        options,
        client=client,
        events=recorder,
        tracing=tracing,
        clock=clock,
        registry=registry,
        stop=stop,
    )
    server = _serve(options, registry, terms)
    if ready is not None:
        ready(server.port if server else 0)
    _log_settings(options)
    try:
        return _lead(options, client, terms, clock=clock, stop=stop)
    finally:
        recorder.stop()
        if server is not None:
            server.stop()
        tracing.shutdown()
