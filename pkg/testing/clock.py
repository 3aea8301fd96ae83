"""`FakeClock`: the one test double of `pkg.base.clock.Clock`; tests assert on virtual time.

Owns virtual time for unit tests, in one of two modes chosen at construction:

* stepped (default): time moves only when the test calls :meth:`FakeClock.step`; a thread
  blocked in ``wait``/``wait_condition``/``sleep`` wakes once its deadline has been stepped past
  (or as soon as its event is set). :meth:`FakeClock.block_until_waiters` lets a test step only
  after the code under test is blocked, so nothing depends on real-time races.
* ``advance_on_wait=True``: every timed wait returns at once and moves time forward by its
  timeout, as if nothing happened in between; for loops a test drives on one thread.

Every finite timed wait is recorded in :attr:`FakeClock.waits` and first calls
:attr:`FakeClock.on_wait` (tests use it to inject events or stop a loop after n waits).
Invariant: a missed notification can only slow a test down by a short real-time poll, never
hang it or make virtual time move.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["FakeClock"]


class FakeClock:
    """Implements `pkg.base.Clock` on virtual time; safe for concurrent use."""

    # Real-time bound of one blocking poll: a missed notification only costs this much.
    _REAL_POLL = 0.2
    _EVENT_POLL = 0.002

    def __init__(
        self,
        start: float = 1_700_000_000.0,
        *,
        monotonic_start: float = 0.0,
        advance_on_wait: bool = False,
    ) -> None:
        self._lock = threading.Lock()
        self._registered = threading.Condition(self._lock)
        self._now = start
        self._mono = monotonic_start
        self._waiters: dict[int, float] = {}
        self._woken: dict[int, threading.Condition] = {}
        self._seq = 0
        self.advance_on_wait = advance_on_wait
        self.waits: list[float] = []
        self.on_wait: Callable[[Any], None] = lambda _w: None  # gets the Event or Condition

    # -- reading time -----------------------------------------------------------------------

    def now(self) -> float:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    # -- moving time (the test) -------------------------------------------------------------

    def step(self, seconds: float) -> None:
        """Advance wall and monotonic time by ``seconds``; wake every waiter now due."""
        with self._lock:
            self._now += seconds
            self._mono += seconds
            due = [t for t, d in self._waiters.items() if d <= self._mono]
            # Removed here, not by the woken thread, so waiters() is exact right after step().
            for token in due:
                del self._waiters[token]
            conds = [self._woken.pop(t) for t in due if t in self._woken]
        for cond in conds:
            with cond:
                cond.notify_all()

    def waiters(self) -> int:
        """How many threads are blocked in a wait or sleep with a finite deadline."""
        with self._lock:
            return sum(1 for d in self._waiters.values() if d != float("inf"))

    def untimed_waiters(self) -> int:
        """How many threads are blocked in a wait with no deadline (``timeout=None``)."""
        with self._lock:
            return sum(1 for d in self._waiters.values() if d == float("inf"))

    def block_until_waiters(self, n: int, *, timeout: float = 5.0) -> bool:
        """Block (real time, at most ``timeout``) until at least ``n`` timed waiters exist."""
        with self._registered:
            return self._registered.wait_for(
                lambda: sum(1 for d in self._waiters.values() if d != float("inf")) >= n,
                timeout,
            )

    def block_until_untimed_waiters(self, n: int, *, timeout: float = 5.0) -> bool:
        """Block (real time, at most ``timeout``) until at least ``n`` threads wait with no
        deadline: code that should sleep until an event, not a timer, has reached its wait."""
        with self._registered:
            return self._registered.wait_for(
                lambda: sum(1 for d in self._waiters.values() if d == float("inf")) >= n,
                timeout,
            )

    # -- waiting (the code under test) ------------------------------------------------------

    def _register(self, timeout: float | None, cond: threading.Condition | None) -> int | None:
        """Record a wait; returns its token, or None when it is already due."""
        with self._lock:
            deadline = float("inf") if timeout is None else self._mono + max(0.0, timeout)
            if deadline <= self._mono:
                return None
            self._seq += 1
            self._waiters[self._seq] = deadline
            if cond is not None:
                self._woken[self._seq] = cond
            self._registered.notify_all()
            return self._seq

    def _unregister(self, token: int) -> bool:
        """Drop a wait; returns whether it was still pending (not woken by step)."""
        with self._lock:
            self._woken.pop(token, None)
            return self._waiters.pop(token, None) is not None

    def _record(self, timeout: float | None) -> None:
        if timeout is not None:
            self.waits.append(timeout)

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        self.on_wait(event)
        if event.is_set():
            return True
        self._record(timeout)
        if self.advance_on_wait and timeout is not None:
            self.step(max(0.0, timeout))
            return event.is_set()
        token = self._register(timeout, None)
        if token is None:
            return event.is_set()
        try:
            while not event.wait(self._EVENT_POLL):
                with self._lock:
                    if token not in self._waiters:
                        break
        finally:
            self._unregister(token)
        return event.is_set()

    def wait_condition(self, cond: threading.Condition, timeout: float | None) -> None:
        self.on_wait(cond)
        self._record(timeout)
        if self.advance_on_wait and timeout is not None:
            self.step(max(0.0, timeout))
            return
        token = self._register(timeout, cond)
        if token is None:
            return
        try:
            cond.wait(self._REAL_POLL)
        finally:
            self._unregister(token)

    def sleep(self, seconds: float) -> None:
        self.wait(threading.Event(), max(0.0, seconds))
