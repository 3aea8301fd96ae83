"""Prometheus metrics for named work queues (client-go's `workqueue_*` family).

Owns the collectors and the per-item timestamps behind them. Invariants: collectors are
created once per `CollectorRegistry` (so many queues can share one registry) and every series
carries the queue `name` label; all methods are called with the queue's lock held, so the
timestamp maps need no lock of their own except for the scrape-time gauges.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Hashable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pkg.base.clock import Clock

__all__ = ["NoopQueueMetrics", "QueueMetrics", "QueueMetricsSink"]

_BUCKETS = tuple(10.0**e for e in range(-8, 4))  # 10ns .. 1000s, as client-go


class QueueMetricsSink:
    """Interface used by the queue; the base class records nothing."""

    def add(self, item: Hashable) -> None:
        """An item entered the queue."""

    def get(self, item: Hashable) -> None:
        """A worker took an item."""

    def done(self, item: Hashable) -> None:
        """A worker finished an item."""

    def retry(self) -> None:
        """An item was re-added through the rate limiter."""


NoopQueueMetrics = QueueMetricsSink


class _Collectors:
    def __init__(self, registry: CollectorRegistry) -> None:
        lbl = ["name"]
        self.depth = Gauge("workqueue_depth", "Current depth of workqueue", lbl, registry=registry)
        self.adds = Counter(
            "workqueue_adds", "Total number of adds handled by workqueue", lbl, registry=registry
        )
        self.latency = Histogram(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            lbl,
            buckets=_BUCKETS,
            registry=registry,
        )
        self.work = Histogram(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            lbl,
            buckets=_BUCKETS,
            registry=registry,
        )
        self.retries = Counter(
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            lbl,
            registry=registry,
        )
        self.unfinished = Gauge(
            "workqueue_unfinished_work_seconds",
            "Seconds of work in progress that has not been observed by work_duration",
            lbl,
            registry=registry,
        )
        self.longest = Gauge(
            "workqueue_longest_running_processor_seconds",
            "Seconds the longest running processor has been running",
            lbl,
            registry=registry,
        )


_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, _Collectors] = (
    weakref.WeakKeyDictionary()
)
_by_registry_lock = threading.Lock()


def _collectors(registry: CollectorRegistry) -> _Collectors:
    with _by_registry_lock:
        found = _by_registry.get(registry)
        if found is None:
            found = _by_registry[registry] = _Collectors(registry)
        return found


class QueueMetrics(QueueMetricsSink):
    """Metrics of one named queue, exported into `registry`."""

    def __init__(self, name: str, registry: CollectorRegistry, clock: Clock) -> None:
        c = _collectors(registry)
        self._clock = clock
        self._depth = c.depth.labels(name)
        self._adds = c.adds.labels(name)
        self._latency = c.latency.labels(name)
        self._work = c.work.labels(name)
        self._retries = c.retries.labels(name)
        self._added_at: dict[Hashable, float] = {}
        self._started_at: dict[Hashable, float] = {}
        self._lock = threading.Lock()
        c.unfinished.labels(name).set_function(self._unfinished)
        c.longest.labels(name).set_function(self._longest)

    def add(self, item: Hashable) -> None:
        """Count the add and start timing the item's queue latency."""
        self._adds.inc()
        self._depth.inc()
        with self._lock:
            self._added_at.setdefault(item, self._clock.monotonic())

    def get(self, item: Hashable) -> None:
        """Observe the item's queue latency and start timing its work duration."""
        self._depth.dec()
        now = self._clock.monotonic()
        with self._lock:
            added = self._added_at.pop(item, None)
            self._started_at[item] = now
        if added is not None:
            self._latency.observe(now - added)

    def done(self, item: Hashable) -> None:
        """Observe the item's work duration."""
        with self._lock:
            started = self._started_at.pop(item, None)
        if started is not None:
            self._work.observe(self._clock.monotonic() - started)

    def retry(self) -> None:
        """Count one retry."""
        self._retries.inc()

    def _unfinished(self) -> float:
        now = self._clock.monotonic()
        with self._lock:
            return sum(now - t for t in self._started_at.values())

    def _longest(self) -> float:
        now = self._clock.monotonic()
        with self._lock:
            return max((now - t for t in self._started_at.values()), default=0.0)
