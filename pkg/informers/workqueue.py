"""Rate-limited work queue, the queue reconcilers use (client-go `RateLimitingInterface`).

Owns retry pacing: `add_rate_limited(item)` = `add_after(item, limiter.when(item))`.
`forget(item)` has client-go's one meaning, "stop retrying this item": it clears the item's
failure history in the limiter, so its next failure backs off from the shortest delay again.
Call it whenever the item leaves the retry cycle - after a success and after a permanent
failure - and never after a failure that will be retried (that would reset its backoff and
turn a persistent failure into a hot loop). `forget` does not dequeue anything. Re-exports the
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
    """A `DelayingQueue` whose retries are paced by a `RateLimiter` (client-go's
    ``RateLimitingInterface``). Thread-safe.

    Use: on failure `add_rate_limited`; when the item stops being retried (success or a
    permanent failure) `forget`; in both cases `done`.
    """

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
        """Re-add ``item`` after the limiter's next delay for it; records one failure."""
        with self._cond:
            self._metrics.retry()
        self.add_after(item, self.rate_limiter.when(item))

    def forget(self, item: Hashable) -> None:
        """Stop retrying ``item``: clear its failure history in the limiter, so its next failure
        backs off from the start. Does not remove a queued or waiting copy.
        """
        self.rate_limiter.forget(item)

    def num_requeues(self, item: Hashable) -> int:
        """Failures of ``item`` on record since the last `forget`."""
        return self.rate_limiter.num_requeues(item)
