"""A generic controller: keys from event handlers → a named workqueue → N workers → reconcile.

Owns the retry policy around a :class:`Reconciler`, with controller-runtime's semantics:

* success → ``forget`` (reset backoff); ``Result(requeue_after=d)`` → ``forget`` + ``add_after``;
* an exception → ``add_rate_limited`` (per-key exponential backoff, global bucket);
* :class:`TerminalError` → logged and counted, never requeued (bad input must not become a
  retry storm; a later change to the object enqueues it again);
* ``done`` is always called, so a key is never stuck, and the queue guarantees that one key is
  never reconciled by two workers at once.

Every reconcile runs in an OpenTelemetry span named ``reconcile <controller>`` with the key as
attribute, logs carry ``controller`` and ``key`` fields, and the totals/errors/duration metrics
are labelled by controller name.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode
from prometheus_client import CollectorRegistry, Counter, Histogram

from pkg.base.types import JSON

__all__ = [
    "Controller",
    "ReconcileMetrics",
    "Reconciler",
    "Result",
    "TerminalError",
    "WorkQueue",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Result:
    """What to do with a key after a successful reconcile."""

    requeue_after: float = 0.0


class TerminalError(Exception):
    """The object cannot be reconciled until it (or something it depends on) changes."""


class Reconciler(Protocol):
    """Brings the world in line with one object, identified by its cache key."""

    def reconcile(self, key: str) -> Result: ...


class WorkQueue(Protocol):
    """client-go's rate-limited, delaying workqueue (see pkg.informers)."""

    def add(self, item: str) -> None: ...

    def add_after(self, item: str, delay: float) -> None: ...

    def add_rate_limited(self, item: str) -> None: ...

    def forget(self, item: str) -> None: ...

    def get(self) -> tuple[str | None, bool]: ...

    def done(self, item: str) -> None: ...

    def shutdown(self) -> None: ...


class ReconcileMetrics:
    """Per-controller reconcile counters and latency, registered once per registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.total = Counter(
            "nvidia_dra_reconcile_total",
            "Reconciles by controller and result (success, requeue, error, terminal).",
            ["controller", "result"],
            registry=registry,
        )
        self.errors = Counter(
            "nvidia_dra_reconcile_errors_total",
            "Reconciles that raised, by controller.",
            ["controller"],
            registry=registry,
        )
        self.duration = Histogram(
            "nvidia_dra_reconcile_duration_seconds",
            "Wall time of one reconcile, by controller.",
            ["controller"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )


class Controller:
    """Runs one reconciler over its own named queue with ``workers`` threads."""

    def __init__(
        self,
        *,
        name: str,
        reconciler: Reconciler,
        queue: WorkQueue,
        metrics: ReconcileMetrics,
        tracer: trace.Tracer,
        workers: int = 1,
    ) -> None:
        self.name = name
        self._reconciler = reconciler
        self._queue = queue
        self._metrics = metrics
        self._tracer = tracer
        self._workers = workers
        self._threads: list[threading.Thread] = []

    # -- producers ------------------------------------------------------------------------------

    def enqueue(self, key: str) -> None:
        self._queue.add(key)

    def enqueue_after(self, key: str, delay: float) -> None:
        self._queue.add_after(key, delay)

    def handler(self, mapper: Callable[[JSON], Iterable[str]]) -> Callable[[JSON], None]:
        """An event-handler callback that maps an object to keys and enqueues them."""

        def on_event(obj: JSON) -> None:
            try:
                keys = list(mapper(obj))
            except Exception:
                log.exception("key mapping failed controller=%s", self.name)
                return
            for key in keys:
                self._queue.add(key)

        return on_event

    # -- consumers ------------------------------------------------------------------------------

    def process_next(self) -> bool:
        """Reconcile one key; returns False once the queue is shut down and drained."""
        key, shutdown = self._queue.get()
        if shutdown or key is None:
            return False
        try:
            self._process(key)
        finally:
            self._queue.done(key)
        return True

    def _process(self, key: str) -> None:
        extra = {"controller": self.name, "key": key}
        start = time.perf_counter()
        with self._tracer.start_as_current_span(
            f"reconcile {self.name}", attributes={"controller": self.name, "key": key}
        ) as span:
            try:
                result = self._reconciler.reconcile(key)
            except TerminalError as exc:
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                self._metrics.total.labels(self.name, "terminal").inc()
                self._metrics.errors.labels(self.name).inc()
                self._queue.forget(key)
                log.warning("reconcile failed permanently: %s", exc, extra=extra)
            except Exception as exc:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                self._metrics.total.labels(self.name, "error").inc()
                self._metrics.errors.labels(self.name).inc()
                self._queue.add_rate_limited(key)
                log.info("reconcile failed, will retry: %s", exc, extra=extra)
                log.debug("reconcile failure detail", exc_info=True, extra=extra)
            else:
                self._queue.forget(key)
                if result.requeue_after > 0:
                    self._queue.add_after(key, result.requeue_after)
                    self._metrics.total.labels(self.name, "requeue").inc()
                else:
                    self._metrics.total.labels(self.name, "success").inc()
            finally:
                self._metrics.duration.labels(self.name).observe(time.perf_counter() - start)

    def _worker(self) -> None:
        while self.process_next():
            pass

    def start(self) -> None:
        """Start the worker threads (caches must already be synced)."""
        for i in range(self._workers):
            thread = threading.Thread(
                target=self._worker, name=f"{self.name}-worker-{i}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 10.0) -> None:
        self._queue.shutdown()
        for thread in self._threads:
            thread.join(timeout=timeout)
        self._threads.clear()
