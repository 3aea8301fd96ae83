"""The deadline and stop signal of one reconcile: what `Reconciler.reconcile` is handed.

Owns cooperative cancellation of reconciles (controller-runtime hands each reconcile a
``context.Context``; this is the part of it a reconcile needs). A reconciler calls
:meth:`ReconcileContext.check` between API calls, so a controller shutting down, or a reconcile
running past its deadline, stops at the next boundary instead of finishing a long sequence of
writes; a call already in flight is never interrupted. Invariants: once :meth:`cancelled` is
true it stays true; the deadline is on the injected clock, so tests step it.
"""

from __future__ import annotations

import threading

from pkg.base.clock import Clock

__all__ = ["BACKGROUND", "CancelledError", "ReconcileContext"]


class CancelledError(Exception):
    """Raised by :meth:`ReconcileContext.check` once the reconcile must stop.

    Not a failure of the object: the controller retries the key (with backoff) after a
    deadline, and drops it when shutting down (the next leader or run reconciles it again).
    """


class ReconcileContext:
    """Deadline and stop signal of one reconcile; immutable, safe to read from any thread.

    ``deadline`` is a :meth:`Clock.monotonic` value (``None``: no deadline); ``stop`` is set
    by whoever owns the run (``Controller.stop``). Without a clock there is no deadline.
    """

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        deadline: float | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        if deadline is not None and clock is None:
            raise ValueError("a deadline needs the clock it is measured on")
        self._clock = clock
        self.deadline = deadline
        self._stop = stop

    def stopped(self) -> bool:
        """True once the owner asked every reconcile to stop (shutdown)."""
        return self._stop is not None and self._stop.is_set()

    def expired(self) -> bool:
        """True once the deadline has passed on the clock."""
        return (
            self.deadline is not None
            and self._clock is not None
            and self._clock.monotonic() >= self.deadline
        )

    def cancelled(self) -> bool:
        """True once the reconcile should stop: stopped or expired."""
        return self.stopped() or self.expired()

    def remaining(self) -> float | None:
        """Clock seconds left before the deadline (never negative); ``None`` without one."""
        if self.deadline is None or self._clock is None:
            return None
        return max(0.0, self.deadline - self._clock.monotonic())

    def check(self) -> None:
        """Raise :class:`CancelledError` if the reconcile should stop; call between API calls."""
        if self.stopped():
            raise CancelledError("controller is shutting down")
        if self.expired():
            raise CancelledError("reconcile deadline exceeded")


BACKGROUND = ReconcileContext()
"""Never cancelled: for direct callers (tests, one-off tools) that own no run."""
