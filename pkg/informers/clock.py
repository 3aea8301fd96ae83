"""Injectable time: `Clock` Protocol, `RealClock`, and a steppable `FakeClock` for tests.

Owns every notion of "now" and "wait" used by queues, rate limiters, reflectors and resync, so
unit tests never really sleep. Invariant: `wait(cond, timeout)` must be called with `cond`
held and may return early (spurious wake-ups); callers always re-check their predicate against
`monotonic()`. `FakeClock.step()` wakes every waiter whose deadline has passed.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["Clock", "FakeClock", "RealClock"]


class Clock(Protocol):
    def now(self) -> float:
        """Wall-clock epoch seconds (for timestamps)."""
        ...

    def monotonic(self) -> float:
        """Monotonic seconds (for deadlines and durations)."""
        ...

    def sleep(self, seconds: float) -> None: ...

    def wait(self, cond: threading.Condition, timeout: float | None) -> None:
        """Wait on `cond` (held by the caller) until notified or `timeout` clock-seconds pass."""
        ...


class RealClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    def wait(self, cond: threading.Condition, timeout: float | None) -> None:
        cond.wait(None if timeout is None else max(0.0, timeout))


class FakeClock:
    """Time moves only when a test calls `step()`; waiters are woken at their deadlines."""

    # Real-time safety net so a missed notification can only slow a test down, never hang it.
    _REAL_FALLBACK = 0.2

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._lock = threading.Lock()
        self._now = start
        self._mono = 0.0
        self._waiters: dict[int, tuple[float, threading.Condition]] = {}
        self._seq = 0

    def now(self) -> float:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def step(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
            self._mono += seconds
            due_tokens = [t for t, (d, _) in self._waiters.items() if d <= self._mono]
            # Removed here, not by the woken thread, so waiters() is exact right after step().
            due = [self._waiters.pop(t)[1] for t in due_tokens]
        for cond in due:
            with cond:
                cond.notify_all()

    def wait(self, cond: threading.Condition, timeout: float | None) -> None:
        with self._lock:
            self._seq += 1
            token = self._seq
            deadline = float("inf") if timeout is None else self._mono + max(0.0, timeout)
            if deadline <= self._mono:
                return
            self._waiters[token] = (deadline, cond)
        try:
            cond.wait(self._REAL_FALLBACK)
        finally:
            with self._lock:
                self._waiters.pop(token, None)

    def sleep(self, seconds: float) -> None:
        cond = threading.Condition()
        deadline = self.monotonic() + seconds
        with cond:
            while self.monotonic() < deadline:
                self.wait(cond, deadline - self.monotonic())

    def waiters(self) -> int:
        """How many threads are blocked in `wait`/`sleep` with a finite deadline."""
        with self._lock:
            return sum(1 for d, _ in self._waiters.values() if d != float("inf"))

    def block_until_waiters(self, n: int, *, timeout: float = 5.0) -> bool:
        """Poll (real time) until at least `n` timed waiters exist; lets tests step safely."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.waiters() >= n:
                return True
            time.sleep(0.001)
        return False
