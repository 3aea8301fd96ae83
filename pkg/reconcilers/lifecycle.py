"""What every controller manager shares, whatever the IMEX mode: its construction and lifecycle.

A manager is one leadership term of the controller. :class:`Manager` builds the parts every
IMEX mode has, in one order: the informer factory (no resync, slimmed objects, watch-list), the
mode's informers, caches and controllers (:meth:`Manager._build`, the mode's strategy), the
orphan sweep over those caches, then the mode's event handlers (:meth:`Manager._wire`). The two
modes are its subclasses: `pkg.reconcilers.manager.ControllerManager` (driver-managed IMEX: the
daemon machinery) and `pkg.reconcilers.hostmanaged.HostManagedManager` (host-managed IMEX:
finalizer, workload template and ``Ready`` only).

:class:`ManagerLifecycle` owns the order of start and stop: start the informers, wait for their
caches (giving up on a timeout or a stop), then, under the lifecycle lock, the mode's on-synced
step, the controllers' workers and the orphan sweep's thread; stop sets the stop event first, so
a start racing a stop never starts workers after it.
"""

from __future__ import annotations

import abc
import logging
import threading
import time
from collections.abc import Callable, Sequence

from opentelemetry import trace
from prometheus_client import CollectorRegistry

from pkg.base.clock import Clock
from pkg.base.types import JSON
from pkg.informers import RateLimitingQueue
from pkg.informers.factory import SharedInformerFactory
from pkg.informers.informer import SharedInformer
from pkg.informers.snapshot import factory_snapshot
from pkg.kube.client import KubeClient
from pkg.reconcilers.cache import Caches
from pkg.reconcilers.cleanup import OrphanCleaner
from pkg.reconcilers.config import ControllerConfig
from pkg.reconcilers.controller import Controller, ReconcileMetrics, Reconciler
from pkg.reconcilers.events import EventSink
from pkg.reconcilers.slim import slim_object

__all__ = ["RESYNC_PERIOD", "Manager", "ManagerLifecycle"]

log = logging.getLogger(__name__)

# No periodic resync: every handler is level-triggered from watch events, and a resync would
# re-run every reconcile every period on an idle cluster (client-go's default is 0 too).
RESYNC_PERIOD = 0.0


class ManagerLifecycle:
    """Start/stop of one manager's informers, controllers and orphan sweep (idempotent stop)."""

    def __init__(self, factory: SharedInformerFactory, cleaner: OrphanCleaner) -> None:
        self._factory = factory
        self._cleaner = cleaner
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._cleanup_thread: threading.Thread | None = None

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stop.is_set()

    def start(
        self,
        controllers: Sequence[Controller],
        *,
        sync_timeout: float,
        on_synced: Callable[[], None],
    ) -> bool:
        """Start the informers, wait for their caches, then run ``on_synced`` and start
        ``controllers`` and the sweep. False if the caches did not sync within
        ``sync_timeout`` seconds or :meth:`stop` was called meanwhile."""
        with self._lock:
            if self._stop.is_set():
                return False
            self._factory.start()
        deadline = time.monotonic() + sync_timeout
        while not self._factory.wait_for_cache_sync(0.2):
            if self._stop.is_set():
                return False
            if time.monotonic() > deadline:
                log.error("caches did not sync within %.0f s", sync_timeout)
                return False
        with self._lock:
            if self._stop.is_set():
                return False
            on_synced()
            for ctl in controllers:
                ctl.start()
            self._cleanup_thread = threading.Thread(
                target=self._cleaner.run, args=(self._stop,), name="orphan-cleanup", daemon=True
            )
            self._cleanup_thread.start()
        return True

    def stop(self, controllers: Sequence[Controller]) -> None:
        """Stop ``controllers``, the sweep and the informers (idempotent)."""
        with self._lock:
            self._stop.set()
        for ctl in controllers:
            ctl.stop()
        self._cleaner.poke()
        if self._cleanup_thread is not None:
            self._cleanup_thread.join(timeout=10)
        self._factory.shutdown()


class Manager(abc.ABC):
    """Everything the controller runs while leading, built once per term (see the module).

    Contract: workers start only after every cache synced (:meth:`start` blocks until then);
    :meth:`stop` stops the queues, the sweep and the informers, in that order. A subclass (an
    IMEX mode) builds its informers, caches and controllers in :meth:`_build`, registers its
    event handlers in :meth:`_wire` and says what runs once the caches synced in
    :meth:`_on_synced`.
    """

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
    ) -> None:
        self._client, self._config, self._events = client, config, events
        self._registry, self._tracer = registry, tracer
        self._clock, self._informer_clock = clock, informer_clock
        self._cd_workers = cd_workers
        self._factory = SharedInformerFactory(
            client,
            clock=informer_clock,
            resync_period=RESYNC_PERIOD,
            transform=slim_object,
            watch_list=True,
        )
        self._reconcile_metrics = ReconcileMetrics(registry)
        self._informers: dict[str, SharedInformer] = {}
        self.controllers: list[Controller] = []
        self.caches = self._build()
        self.cleaner = OrphanCleaner(
            client=client, caches=self.caches, config=config, events=events, clock=clock
        )
        self._run = ManagerLifecycle(self._factory, self.cleaner)
        self._wire()

    # -- the IMEX mode's part -----------------------------------------------------------------

    @abc.abstractmethod
    def _build(self) -> Caches:
        """Create the mode's informers (into ``_informers``, every one of them, for
        :meth:`synced`), reconcilers and controllers (into ``controllers``); return the
        caches the reconcilers and the orphan sweep read."""

    @abc.abstractmethod
    def _wire(self) -> None:
        """Register the event handlers that map objects to keys of the controllers."""

    @abc.abstractmethod
    def _on_synced(self) -> None:
        """Run once the caches synced, before any worker starts."""

    def _controller(
        self, name: str, reconciler: Reconciler, workers: int, batch_period: float = 0.0
    ) -> Controller:
        """A controller with its own named, rate-limited queue, on this term's metrics."""
        queue: RateLimitingQueue[str] = RateLimitingQueue(
            name=name, clock=self._informer_clock, registry=self._registry
        )
        return Controller(
            name=name,
            reconciler=reconciler,
            queue=queue,
            metrics=self._reconcile_metrics,
            tracer=self._tracer,
            workers=workers,
            clock=self._informer_clock,
            batch_period=batch_period,
        )

    # -- lifecycle ----------------------------------------------------------------------------

    def synced(self) -> bool:
        """Whether every informer's cache has synced."""
        return all(i.has_synced() for i in self._informers.values())

    def informer_snapshot(self) -> list[JSON]:
        """Every cache's slice, sync state and ``{key: resourceVersion}`` (``/debug/informers``)."""
        return factory_snapshot(self._factory)

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._run.stopping

    def start(self, *, sync_timeout: float = 120.0) -> bool:
        """Start the informers, wait for their caches, then run the mode's on-synced step and
        start the workers and the sweep (`ManagerLifecycle.start`).

        Returns False if the caches did not sync in time or :meth:`stop` was called meanwhile.
        """
        return self._run.start(
            self.controllers, sync_timeout=sync_timeout, on_synced=self._on_synced
        )

    def stop(self) -> None:
        """Stop the workers, the sweep and the informers (idempotent)."""
        self._run.stop(self.controllers)
