"""A generic controller: keys from event handlers → a named workqueue → N workers → reconcile.

Owns the retry policy around a :class:`Reconciler`, with controller-runtime's semantics.
``forget`` has client-go's one meaning: "stop retrying this key", i.e. clear its failure history
in the rate limiter, so its next failure backs off from the start again:

* success → ``forget``; ``Result(requeue_after=d)`` → ``forget`` + ``add_after`` (a periodic
  recheck, not a retry);
* an exception → ``add_rate_limited`` (per-key exponential backoff, global bucket); no
  ``forget``, so the backoff keeps growing while the failures last;
* :class:`TerminalError` → logged and counted, ``forget``, never requeued (bad input must not
  become a retry storm; a later change to the object enqueues it again);
* `CancelledError` from a reconcile past its deadline → like an exception; from a shutdown →
  dropped (the next run reconciles the key again);
* ``done`` is always called, so a key is never stuck, and the queue guarantees that one key is
  never reconciled by two workers at once.

Every reconcile gets a `ReconcileContext`: the controller's stop signal and, with
``reconcile_timeout``, a deadline on the injected clock. :meth:`Controller.stop` sets the stop
signal, shuts the queue down and waits (bounded) until in-flight reconciles have returned.

With ``batch_period`` (kube-controller-manager's ``--endpoint-updates-batch-period`` idea), an
event for a key whose last reconcile started less than that long ago is delayed until the period
has passed, so a burst of events (a forming domain: every daemon pod, clique and node change)
costs one reconcile per period instead of one per event; the first event after a quiet period is
still reconciled at once.

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

from pkg.base.clock import Clock, RealClock
from pkg.base.types import JSON
from pkg.reconcilers.context import BACKGROUND, CancelledError, ReconcileContext

__all__ = [
    "BACKGROUND",
    "CancelledError",
    "Controller",
    "ReconcileContext",
    "ReconcileMetrics",
    "Reconciler",
    "Result",
    "TerminalError",
    "WorkQueue",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Result:
    """What to do with a key after a successful reconcile.

    ``requeue_after > 0`` reconciles the key again after that many seconds (a periodic
    recheck: the key's failure history is still forgotten); ``0`` waits for the next event.
    """

    requeue_after: float = 0.0


class TerminalError(Exception):
    """The object cannot be reconciled until it (or something it depends on) changes.

    Raise it for bad input; the controller records it and does not retry.
    """


class Reconciler(Protocol):
    """Brings the world in line with one object, identified by its cache key."""

    def reconcile(self, key: str, ctx: ReconcileContext = BACKGROUND) -> Result:
        """Make the world match the object named ``key`` (``namespace/name`` or ``name``).

        Must be idempotent and level-based: it reads the current state (caches, API) instead
        of relying on which event caused it, so any number of calls converge. Never called
        for the same key by two threads at once; different keys run concurrently, so shared
        state needs locking. Should call ``ctx.check()`` between API calls, so a shutdown or
        deadline stops it at the next boundary. Returns a `Result` on success; raises
        `TerminalError` for input that cannot succeed until it changes, anything else to be
        retried with backoff.
        """
        ...


class WorkQueue(Protocol):
    """client-go's rate-limited, delaying workqueue (`pkg.informers.RateLimitingQueue`).

    Thread-safe; see `pkg.informers.queue` for the contracts of each method.
    """

    def add(self, item: str) -> None:
        """Queue ``item`` (deduplicated with a queued copy)."""
        ...

    def add_after(self, item: str, delay: float) -> None:
        """Queue ``item`` after ``delay`` seconds."""
        ...

    def add_rate_limited(self, item: str) -> None:
        """Queue ``item`` after its rate limiter's next backoff (records one failure)."""
        ...

    def forget(self, item: str) -> None:
        """Stop retrying ``item``: clear its failure history (does not dequeue it)."""
        ...

    def get(self) -> tuple[str | None, bool]:
        """Block for the next item; ``(None, True)`` once shut down and empty."""
        ...

    def done(self, item: str) -> None:
        """Mark ``item`` processed; must follow every `get`."""
        ...

    def shutdown(self) -> None:
        """Stop accepting items; blocked getters drain what is queued, then get shutdown."""
        ...

    def shutdown_with_drain(self, timeout: float | None = None) -> bool:
        """`shutdown`, then wait until no item is being processed; False on timeout."""
        ...


class ReconcileMetrics:
    """Per-controller reconcile counters and latency, registered once per registry.

    Create one per registry and share it between the controllers of a process (labels
    separate them); the collectors are thread-safe.
    """

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
    """Runs one reconciler over its own named queue with ``workers`` threads.

    Lifecycle: construct, register `handler` callbacks on informers, `start` once the caches
    have synced, `stop` once. Producers (`enqueue`, handlers) are safe from
    any thread at any time; keys added after `stop` are dropped.
    """

    def __init__(
        self,
        *,
        name: str,
        reconciler: Reconciler,
        queue: WorkQueue,
        metrics: ReconcileMetrics,
        tracer: trace.Tracer,
        workers: int = 1,
        clock: Clock | None = None,
        reconcile_timeout: float | None = None,
        batch_period: float = 0.0,
    ) -> None:
        """``name`` labels metrics, spans and logs; ``queue`` is this controller's own;
        ``reconcile_timeout`` (clock seconds, ``None``: none) is each reconcile's deadline;
        ``batch_period`` (clock seconds, 0: none) the least time between two reconciles of a
        key that events ask for (module docstring)."""
        self.name = name
        self._clock: Clock = clock or RealClock()
        self._reconcile_timeout = reconcile_timeout
        self._stopping = threading.Event()
        self._reconciler = reconciler
        self._queue = queue
        self._metrics = metrics
        self._tracer = tracer
        self._workers = workers
        self._threads: list[threading.Thread] = []
        self._batch_period = batch_period
        # key -> clock.monotonic() when its last reconcile started (only with a batch period).
        self._last_start: dict[str, float] = {}
        self._last_lock = threading.Lock()

    # -- producers ------------------------------------------------------------------------------

    def enqueue(self, key: str) -> None:
        """Reconcile ``key`` soon (once, however often it is enqueued before a worker takes
        it; once more if it is enqueued while being reconciled)."""
        self._queue.add(key)

    def handler(self, mapper: Callable[[JSON], Iterable[str]]) -> Callable[[JSON], None]:
        """An event-handler callback that maps an object to keys and enqueues them.

        The returned callback never raises: a failing ``mapper`` is logged and the event
        dropped (informer handlers must not throw). ``mapper`` runs on the informer's
        handler thread and must not block.
        """

        def on_event(obj: JSON) -> None:
            try:
                keys = list(mapper(obj))
            except Exception:
                log.exception("key mapping failed controller=%s", self.name)
                return
            for key in keys:
                self._add_batched(key)

        return on_event

    def _add_batched(self, key: str) -> None:
        """`add`, or `add_after` the rest of ``key``'s batch period."""
        if self._batch_period <= 0:
            self._queue.add(key)
            return
        with self._last_lock:
            last = self._last_start.get(key)
        wait = 0.0 if last is None else last + self._batch_period - self._clock.monotonic()
        if wait > 0:
            self._queue.add_after(key, wait)
        else:
            self._queue.add(key)

    def _started(self, key: str) -> None:
        if self._batch_period <= 0:
            return
        now = self._clock.monotonic()
        with self._last_lock:
            self._last_start[key] = now
            if len(self._last_start) > 1024:  # forget keys whose period is over
                cutoff = now - self._batch_period
                self._last_start = {k: t for k, t in self._last_start.items() if t > cutoff}

    # -- consumers ------------------------------------------------------------------------------

    def process_next(self) -> bool:
        """Take one key from the queue (blocking) and reconcile it; returns False once the
        queue is shut down and drained. What each worker thread loops on; tests call it
        directly to run the loop step by step."""
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
        self._started(key)
        start = time.perf_counter()
        with self._tracer.start_as_current_span(
            f"reconcile {self.name}", attributes={"controller": self.name, "key": key}
        ) as span:
            ctx = self._context()
            try:
                result = self._reconciler.reconcile(key, ctx)
            except CancelledError as exc:
                if ctx.stopped():
                    log.debug("reconcile cancelled by shutdown", extra=extra)
                    return
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                self._metrics.total.labels(self.name, "error").inc()
                self._metrics.errors.labels(self.name).inc()
                self._queue.add_rate_limited(key)
                log.info("reconcile cancelled, will retry: %s", exc, extra=extra)
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

    def _context(self) -> ReconcileContext:
        timeout = self._reconcile_timeout
        deadline = None if timeout is None else self._clock.monotonic() + timeout
        return ReconcileContext(clock=self._clock, deadline=deadline, stop=self._stopping)

    def _worker(self) -> None:
        while self.process_next():
            pass

    def start(self) -> None:
        """Start the worker threads. Call once, after the informer caches have synced (a
        reconcile reads them as the truth)."""
        for i in range(self._workers):
            thread = threading.Thread(
                target=self._worker, name=f"{self.name}-worker-{i}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop and drain: cancel in-flight reconciles (their context reports `stopped`), shut
        the queue down, and wait up to ``timeout`` clock seconds for them to return and the
        workers to exit. Returns whether everything finished in time; a reconcile that
        ignores its context keeps its (daemon) thread after that. Idempotent; call from any
        thread but a worker."""
        self._stopping.set()
        deadline = self._clock.monotonic() + timeout
        drained = self._queue.shutdown_with_drain(timeout)
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - self._clock.monotonic()))
        alive = [t for t in self._threads if t.is_alive()]
        self._threads = alive
        if alive or not drained:
            log.warning(
                "controller %s: %d worker(s) still busy after %.1fs", self.name, len(alive), timeout
            )
        return drained and not alive
