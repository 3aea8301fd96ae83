"""Delaying work queue: `add_after(item, delay)` on top of `WorkQueue`.

Owns a min-heap of (ready_at, item). Invariants: re-adding an item that is already waiting
keeps the *earlier* ready time; due items are promoted into the FIFO by whichever `get` runs
next (no timer thread: getters wait exactly until the next deadline on the injected clock);
waiting items are dropped on shutdown.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Generic

from prometheus_client import CollectorRegistry

from pkg.base.clock import Clock
from pkg.informers.queue import T, WorkQueue

__all__ = ["DelayingQueue"]


class DelayingQueue(WorkQueue[T], Generic[T]):
    """A `WorkQueue` with `add_after`: items become available once their delay has passed on
    the injected clock. Thread-safe; every `WorkQueue` contract holds.
    """

    def __init__(
        self,
        *,
        name: str | None = None,
        clock: Clock | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        super().__init__(name=name, clock=clock, registry=registry)
        self._heap: list[tuple[float, int, T]] = []
        self._waiting: dict[T, float] = {}
        self._seq = itertools.count()

    def add_after(self, item: T, delay: float) -> None:
        """Make ``item`` available after ``delay`` clock seconds (``<= 0``: `add` now).

        If the item is already waiting, the earlier ready time wins. Ignored after shutdown.
        Never blocks; safe from any thread.
        """
        if delay <= 0:
            self.add(item)
            return
        with self._cond:
            if self._shutting_down:
                return
            ready = self._clock.monotonic() + delay
            current = self._waiting.get(item)
            if current is not None and current <= ready:
                return
            self._waiting[item] = ready
            heapq.heappush(self._heap, (ready, next(self._seq), item))
            self._cond.notify_all()  # a getter may be waiting for a later deadline

    def _promote_locked(self) -> float | None:
        now = self._clock.monotonic()
        heap = self._heap
        while heap:
            ready, _, item = heap[0]
            if self._waiting.get(item) != ready:
                heapq.heappop(heap)  # superseded by an earlier add_after
                continue
            if ready > now:
                return ready
            heapq.heappop(heap)
            del self._waiting[item]
            self._add_locked(item)
        return None

    def shutdown(self) -> None:
        """`WorkQueue.shutdown`, and drop every item that is still waiting for its delay."""
        with self._cond:
            self._heap.clear()
            self._waiting.clear()
        super().shutdown()

    def waiting(self) -> int:
        """Items not yet due (for tests and metrics)."""
        with self._cond:
            return len(self._waiting)
