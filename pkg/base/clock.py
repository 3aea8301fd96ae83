"""Time as an injected dependency: wall time, monotonic time, sleeps and interruptible waits.

Owns the one :class:`Clock` Protocol that every queue, rate limiter, reflector, resync loop,
lease, period and backoff in the driver takes instead of calling :mod:`time` directly, and
:class:`RealClock`, its only production implementation. Tests inject
`pkg.testing.clock.FakeClock` and assert on virtual time instead of sleeping.

Invariants every implementation keeps:

* :meth:`Clock.wait` returns ``True`` as soon as the event is set, so a stop signal is never
  delayed by a pending period.
* :meth:`Clock.wait_condition` must be called with the condition held and may return early
  (a notification or a spurious wake-up); callers always re-check their predicate against
  :meth:`Clock.monotonic`.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["Clock", "RealClock"]


class Clock(Protocol):
    """A source of time and a way to wait for it to pass.

    Implementations are safe for concurrent use by any number of threads.
    """

    def now(self) -> float:
        """Wall-clock time in epoch seconds (for timestamps written to the API)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (for deadlines and durations)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block for ``seconds`` of clock time (negative means zero); not interruptible."""
        ...

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        """Block until ``event`` is set or ``timeout`` clock-seconds pass (``None``: no limit).

        Returns whether the event is set. Returns immediately when it already is.
        """
        ...

    def wait_condition(self, cond: threading.Condition, timeout: float | None) -> None:
        """Wait on ``cond`` until notified or ``timeout`` clock-seconds pass (``None``: no limit).

        The caller must hold ``cond``; it is released while waiting and re-acquired before
        returning. May return early; the caller re-checks its predicate and deadline.
        """
        ...


class RealClock:
    """The system clock: :func:`time.time`, :func:`time.monotonic` and real blocking waits."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        return event.wait(None if timeout is None else max(0.0, timeout))

    def wait_condition(self, cond: threading.Condition, timeout: float | None) -> None:
        cond.wait(None if timeout is None else max(0.0, timeout))
