"""Time as an injected dependency: wall time, monotonic time and interruptible waits.

Owns the :class:`Clock` Protocol every long-running loop in ``pkg.runtime`` and
``pkg.reconcilers`` takes instead of calling :mod:`time` directly, so unit tests can run leases,
periods and backoffs on a fake clock without sleeping. Invariant: :meth:`Clock.wait` returns
early (``True``) as soon as the given event is set, so a stop signal is never delayed by a
pending period.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["Clock", "SystemClock"]


class Clock(Protocol):
    """A source of time and a way to wait for it to pass."""

    def now(self) -> float:
        """Wall-clock time in epoch seconds (for timestamps written to the API)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (for durations and deadlines)."""
        ...

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for ``event``; returns whether it is set."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, event: threading.Event, timeout: float) -> bool:
        return event.wait(max(timeout, 0.0))
