"""Device health streaming to the kubelet (KEP-4680): the ``DRAResourceHealth`` gRPC service.

Owns how a driver's device health reaches the kubelet, which shows it in
``pod.status.containerStatuses[].allocatedResourcesStatus``; *what* healthy means is the
driver's (it implements `DeviceHealthFeed.snapshot`):

* the service is ``NodeWatchResources`` (server streaming) under both proto packages the
  kubelet dials, ``v1`` (kubelet 1.37+, preferred) and ``v1alpha1`` (kubelets 1.34-1.36): one
  `ResourceHealthServicer` per package over one feed, the messages are the same shape;
* each stream first sends the complete current state, then a complete state again whenever
  it changed -- the driver calls `DeviceHealthFeed.changed` whenever something health depends
  on may have changed, nothing polls -- and, because the kubelet turns a device ``Unknown`` when
  it heard nothing about it for ``health_check_timeout_seconds``, the unchanged state every
  ``resend_interval`` (on the injected clock) well inside `HEALTH_TIMEOUT` -- but only while
  the state lists a device: an empty list times nothing out, so a stream with nothing to report
  (no device prepared) waits for the next change with no timer (no idle wakeups);
* a stream ends when the kubelet goes away (gRPC callback) or `DeviceHealthFeed.close`;
  the kubelet then drops this driver's health and shows ``Unknown`` until it reconnects.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Final

import grpc

from pkg.base.clock import Clock
from pkg.draplugin.proto.gen import kubelet_dra_health_v1_pb2 as v1_pb2

log = logging.getLogger(__name__)

# The kubelet's own default is 30 s; a longer timeout with a resend every third of it keeps a
# device's health through two lost reports.
HEALTH_TIMEOUT: Final = 90
RESEND_INTERVAL: Final = 30.0

# The enum values are identical in v1 and v1alpha1 (the conformance test pins both).
UNKNOWN: Final = int(v1_pb2.UNKNOWN)
HEALTHY: Final = int(v1_pb2.HEALTHY)
UNHEALTHY: Final = int(v1_pb2.UNHEALTHY)
MAX_MESSAGE: Final = 1024  # the kubelet truncates longer messages


@dataclass(frozen=True, order=True)
class DeviceHealth:
    """One device's health as reported to the kubelet (immutable; sorts by pool, device)."""

    pool: str
    device: str
    health: int
    message: str


class _Subscription:
    def __init__(self) -> None:
        self.cancelled = False


class DeviceHealthFeed:
    """Feeds every open health stream; drivers subclass it and implement `snapshot`.

    Thread-safe: `changed`, `close` and `streams` may be called from any thread (informer
    handlers, request threads) and never block on a stream; each `watch` generator runs on the
    gRPC thread of its stream.
    """

    def __init__(self, *, clock: Clock, resend_interval: float = RESEND_INTERVAL) -> None:
        """``clock`` times the resends and stamps the reports; ``resend_interval`` is how long
        an unchanged state may go unsent."""
        self._clock = clock
        self._resend = resend_interval
        self._cond = threading.Condition()
        self._generation = 0
        self._subscriptions: set[_Subscription] = set()
        self._closed = False

    def snapshot(self) -> list[DeviceHealth]:
        """The health of every reported device now, sorted, one entry per (pool, device).

        Implemented by the driver; called from stream threads without any lock held, so it must
        be thread-safe and should not block on the network. Messages should be at most
        `MAX_MESSAGE` characters (the kubelet truncates).
        """
        raise NotImplementedError

    def changed(self) -> None:
        """Something health depends on may have changed: wake every stream (never blocks)."""
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def close(self) -> None:
        """End every stream and refuse new ones (plugin shutdown); idempotent."""
        with self._cond:
            self._closed = True
            for sub in self._subscriptions:
                sub.cancelled = True
            self._cond.notify_all()

    def now(self) -> float:
        """Wall-clock seconds of the injected clock (the reports' ``last_updated_time``)."""
        return self._clock.now()

    def streams(self) -> int:
        """How many streams are open (for tests and logs)."""
        with self._cond:
            return len(self._subscriptions)

    def watch(
        self, *, on_cancel: Callable[[Callable[[], None]], bool] | None = None
    ) -> Iterator[list[DeviceHealth]]:
        """Yield the full state at once, then whenever it changed or a resend is due (an
        unchanged non-empty state after ``resend_interval``; an empty one is never resent).

        ``on_cancel`` receives a function that ends this watch and returns False if the caller
        is already gone (gRPC's ``ServicerContext.add_callback``); the generator returns when
        that function is called or the feed is closed. Blocks between items on the injected
        clock; one generator per stream, not shared between threads.
        """
        sub = _Subscription()

        def stop() -> None:
            with self._cond:
                sub.cancelled = True
                self._cond.notify_all()

        with self._cond:
            if self._closed:
                return
            self._subscriptions.add(sub)
        try:
            if on_cancel is not None and not on_cancel(stop):
                return
            seen = -1
            last: list[DeviceHealth] | None = None
            next_send: float | None = self._clock.monotonic()  # None: no resend due, ever
            while True:
                with self._cond:
                    while not sub.cancelled and self._generation == seen:
                        left = self._left(next_send)
                        if left is not None and left <= 0:
                            break
                        self._clock.wait_condition(self._cond, left)
                    if sub.cancelled:
                        return
                    seen = self._generation
                current = self.snapshot()
                now = self._clock.monotonic()
                if current != last or (next_send is not None and now >= next_send):
                    if current != last:
                        log.info("device health: %s", _describe(current))
                    last = current
                    # The kubelet times out only the devices it was told about.
                    next_send = now + self._resend if current else None
                    yield current
        finally:
            with self._cond:
                self._subscriptions.discard(sub)

    def _left(self, deadline: float | None) -> float | None:
        """Clock-seconds until ``deadline`` (``None``: no deadline, wait for a change)."""
        return None if deadline is None else deadline - self._clock.monotonic()


def _describe(devices: list[DeviceHealth]) -> str:
    names = {UNKNOWN: "Unknown", HEALTHY: "Healthy", UNHEALTHY: "Unhealthy"}
    if not devices:
        return "no prepared devices"
    return "; ".join(f"{d.pool}/{d.device} {names[d.health]} ({d.message})" for d in devices)


class ResourceHealthServicer:
    """``DRAResourceHealth`` of one proto package; ``pb2`` is that version's message module.

    Stateless apart from its feed: one instance serves any number of concurrent streams.
    """

    def __init__(self, *, feed: DeviceHealthFeed, pb2: ModuleType) -> None:
        """``feed`` supplies the states; ``pb2`` is ``kubelet_dra_health_v1{,alpha1}_pb2``."""
        self._feed = feed
        self._pb2 = pb2

    def NodeWatchResources(  # noqa: N802
        self, request: Any, context: grpc.ServicerContext
    ) -> Iterator[Any]:
        """Stream the complete device health list: now, then on every change (and resend)."""
        pb2 = self._pb2
        log.info("kubelet opened a device health stream (%s)", pb2.DESCRIPTOR.package)
        for devices in self._feed.watch(on_cancel=context.add_callback):
            stamp = int(self._feed.now())
            yield pb2.NodeWatchResourcesResponse(
                devices=[
                    pb2.DeviceHealth(
                        device=pb2.DeviceIdentifier(pool_name=d.pool, device_name=d.device),
                        health=d.health,
                        last_updated_time=stamp,
                        health_check_timeout_seconds=HEALTH_TIMEOUT,
                        message=d.message,
                    )
                    for d in devices
                ]
            )
        log.info("device health stream (%s) ended", pb2.DESCRIPTOR.package)
