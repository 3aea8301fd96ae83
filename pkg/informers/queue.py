"""The basic work queue: FIFO with per-key dedup and exclusive processing.

Owns the dirty/processing bookkeeping that makes reconcilers safe to run with many workers.
Invariants (client-go `util/workqueue`):
1. An item is never handed to two workers at once (`processing` set).
2. Any number of `add`s while an item is queued are one entry (`dirty` set); adds while it is
   processing collapse into exactly one re-run, queued by `done`.
3. Every `get` must be paired with `done`, even on exceptions, or the item is stuck forever.
4. After `shutdown` adds are ignored; `get` keeps handing out already-queued items and returns
   `(None, True)` once empty; `shutdown_with_drain` also waits for in-flight items.
Subclasses (delaying queue) hook `_promote_locked` to move due items in before every wait.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry

from pkg.base.clock import Clock, RealClock
from pkg.informers.metrics import QueueMetrics, QueueMetricsSink

__all__ = ["WorkQueue"]

T = TypeVar("T", bound=Hashable)


class WorkQueue(Generic[T]):
    """Thread-safe work queue; named queues export metrics into `registry`."""

    def __init__(
        self,
        *,
        name: str | None = None,
        clock: Clock | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.name = name
        self._clock: Clock = clock or RealClock()
        self._cond = threading.Condition()
        self._queue: deque[T] = deque()
        self._dirty: set[T] = set()
        self._processing: set[T] = set()
        self._shutting_down = False
        self._metrics: QueueMetricsSink = (
            QueueMetrics(name, registry, self._clock) if name and registry else QueueMetricsSink()
        )

    def add(self, item: T) -> None:
        """Queue ``item`` unless it is already queued (then this is a no-op). If it is being
        processed, it is queued again by `done`, never handed to a second worker. Ignored after
        shutdown. Never blocks; safe from any thread.
        """
        with self._cond:
            self._add_locked(item)

    def _add_locked(self, item: T) -> None:
        if self._shutting_down or item in self._dirty:
            return
        self._metrics.add(item)
        self._dirty.add(item)
        if item in self._processing:
            return  # re-queued by done(), so two workers never hold the same item
        self._queue.append(item)
        self._cond.notify()

    def _promote_locked(self) -> float | None:
        """Hook: move due delayed items in; return the next monotonic deadline, if any."""
        return None

    def __len__(self) -> int:
        with self._cond:
            return len(self._queue)

    def len(self) -> int:
        """Number of queued items (not counting those being processed or waiting for a delay)."""
        return len(self)

    def get(self) -> tuple[T | None, bool]:
        """Block until an item is available; `(None, True)` once shut down and empty."""
        with self._cond:
            while True:
                deadline = self._promote_locked()
                if self._queue or self._shutting_down:
                    break
                timeout = None if deadline is None else deadline - self._clock.monotonic()
                self._clock.wait_condition(self._cond, timeout)
            if not self._queue:
                return None, True
            item = self._queue.popleft()
            self._metrics.get(item)
            self._processing.add(item)
            self._dirty.discard(item)
            return item, False

    def done(self, item: T) -> None:
        """Mark ``item`` processed. Every `get` must be followed by exactly one `done`, also on
        errors, or the item is never handed out again. Re-queues the item if it was added while
        being processed.
        """
        with self._cond:
            self._metrics.done(item)
            self._processing.discard(item)
            if item in self._dirty:
                self._queue.append(item)
                self._cond.notify()
            elif not self._processing:
                self._cond.notify_all()  # wakes shutdown_with_drain

    def shutdown(self) -> None:
        """Stop accepting items and wake every blocked `get`; items already queued are still handed
        out, then `get` returns ``(None, True)``. Idempotent; never blocks.
        """
        with self._cond:
            self._shutting_down = True
            self._cond.notify_all()

    def shutdown_with_drain(self, timeout: float | None = None) -> bool:
        """Shut down, then wait (clock time) until no item is being processed."""
        with self._cond:
            self._shutting_down = True
            self._cond.notify_all()
            deadline = None if timeout is None else self._clock.monotonic() + timeout
            while self._processing:
                left = None if deadline is None else deadline - self._clock.monotonic()
                if left is not None and left <= 0:
                    return False
                self._clock.wait_condition(self._cond, left)
            return True

    def shutting_down(self) -> bool:
        """True once `shutdown` (or `shutdown_with_drain`) was called."""
        with self._cond:
            return self._shutting_down
