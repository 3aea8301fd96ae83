"""Rate-limited work queue, the queue reconcilers use (client-go `RateLimitingInterface`).

Owns retry pacing: `add_rate_limited(item)` = `add_after(item, limiter.when(item))`; call
`forget(item)` after a success (not after a failure) to reset its backoff. Re-exports the
queue, delaying queue and limiters so callers import one module.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic

from prometheus_client import CollectorRegistry

from pkg.base.clock import Clock
from pkg.informers.delaying import DelayingQueue
from pkg.informers.queue import T, WorkQueue
from pkg.informers.ratelimiter import (
    BucketRateLimiter,
    ItemExponentialFailureRateLimiter,
    MaxOfRateLimiter,
    RateLimiter,
    default_controller_rate_limiter,
)

__all__ = [
    "BucketRateLimiter",
    "DelayingQueue",
    "ItemExponentialFailureRateLimiter",
    "MaxOfRateLimiter",
    "RateLimiter",
    "RateLimitingQueue",
    "WorkQueue",
    "default_controller_rate_limiter",
]


class RateLimitingQueue(DelayingQueue[T], Generic[T]):
    def __init__(
        self,
        rate_limiter: RateLimiter | None = None,
        *,
        name: str | None = None,
        clock: Clock | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        super().__init__(name=name, clock=clock, registry=registry)
        self.rate_limiter = rate_limiter or default_controller_rate_limiter(self._clock)

    def add_rate_limited(self, item: T) -> None:
        with self._cond:
            self._metrics.retry()
        self.add_after(item, self.rate_limiter.when(item))

    def forget(self, item: Hashable) -> None:
        self.rate_limiter.forget(item)

    def num_requeues(self, item: Hashable) -> int:
        return self.rate_limiter.num_requeues(item)
