"""Rate limiters deciding how long a failed work item waits before it is retried.

Owns per-item failure counting and the global token bucket. Invariants: `when(item)` records
one failure (or reserves one token) every time it is called; `forget(item)` clears the item's
history; all limiters are thread-safe. Delays are seconds, computed against the injected clock.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Hashable
from typing import Protocol

from pkg.base.clock import Clock, RealClock

__all__ = [
    "BucketRateLimiter",
    "ItemExponentialFailureRateLimiter",
    "MaxOfRateLimiter",
    "RateLimiter",
    "default_controller_rate_limiter",
]


class RateLimiter(Protocol):
    """Decides how long an item waits before its next retry. Implementations are thread-safe."""

    def when(self, item: Hashable) -> float:
        """Seconds to wait before `item` is retried; counts as one more failure."""
        ...

    def forget(self, item: Hashable) -> None:
        """Stop tracking ``item``: clear its failure history, so its next `when` starts from the
        shortest delay. Call when the item stops being retried (success or permanent failure).
        """
        ...

    def num_requeues(self, item: Hashable) -> int:
        """How many failures of ``item`` are on record since the last `forget`."""
        ...


class ItemExponentialFailureRateLimiter:
    """`base * 2**failures` capped at `cap`, optionally stretched by up to `jitter` * delay."""

    def __init__(
        self,
        base: float = 0.005,
        cap: float = 1000.0,
        jitter: float = 0.0,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self._base, self._cap, self._jitter = base, cap, jitter
        self._rng = rng or random.Random()
        self._failures: dict[Hashable, int] = {}
        self._lock = threading.Lock()

    def when(self, item: Hashable) -> float:
        """The item's next delay (``base * 2**failures``, jittered, capped); records one failure."""
        with self._lock:
            n = self._failures.get(item, 0)
            self._failures[item] = n + 1
            # Clamp the exponent first so huge failure counts cannot overflow a float.
            delay = self._base * 2.0 ** min(n, 64)
            if self._jitter:
                delay += delay * self._jitter * self._rng.random()
            return min(delay, self._cap)

    def forget(self, item: Hashable) -> None:
        """Clear the item's failure count."""
        with self._lock:
            self._failures.pop(item, None)

    def num_requeues(self, item: Hashable) -> int:
        """The item's failure count since the last `forget`."""
        with self._lock:
            return self._failures.get(item, 0)


class BucketRateLimiter:
    """Overall token bucket (`qps` refill, `burst` capacity); every `when` reserves a token."""

    def __init__(self, qps: float = 10.0, burst: int = 100, *, clock: Clock | None = None) -> None:
        self._qps = qps
        self._burst = float(burst)
        self._clock = clock or RealClock()
        self._tokens = float(burst)
        self._last = self._clock.monotonic()
        self._lock = threading.Lock()

    def when(self, item: Hashable) -> float:
        """Reserve one token; the wait until it is available (0 within the burst)."""
        with self._lock:
            now = self._clock.monotonic()
            self._tokens = min(self._burst, self._tokens + (now - self._last) * self._qps)
            self._last = now
            self._tokens -= 1.0  # a reservation: may go negative, later callers wait longer
            return 0.0 if self._tokens >= 0 else -self._tokens / self._qps

    def forget(self, item: Hashable) -> None:
        """No per-item state: nothing to clear."""

    def num_requeues(self, item: Hashable) -> int:
        """Always 0 (no per-item state)."""
        return 0


class MaxOfRateLimiter:
    """The longest delay of its limiters; requeues is their maximum; forget forgets in all."""

    def __init__(self, *limiters: RateLimiter) -> None:
        if not limiters:
            raise ValueError("MaxOfRateLimiter needs at least one limiter")
        self._limiters = limiters

    def when(self, item: Hashable) -> float:
        """The longest delay of all limiters (each records the failure)."""
        return max(limiter.when(item) for limiter in self._limiters)

    def forget(self, item: Hashable) -> None:
        """Forget the item in every limiter."""
        for limiter in self._limiters:
            limiter.forget(item)

    def num_requeues(self, item: Hashable) -> int:
        """The largest count any limiter has for the item."""
        return max(limiter.num_requeues(item) for limiter in self._limiters)


def default_controller_rate_limiter(clock: Clock | None = None) -> RateLimiter:
    """client-go's default: max(per-item 5 ms * 2^n capped at 1000 s, bucket 10 qps/100)."""
    return MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(0.005, 1000.0),
        BucketRateLimiter(10.0, 100, clock=clock),
    )
