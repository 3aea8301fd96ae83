"""Device health for the kubelet (KEP-4680): the ``DRAResourceHealth`` gRPC service.

Owns what "healthy" means for the devices this plugin prepared and how it reaches the kubelet,
which shows it in ``pod.status.containerStatuses[].allocatedResourcesStatus``:

* a prepared device (a ``PrepareCompleted`` checkpoint entry's channel or daemon device) is
  ``HEALTHY`` while this node's IMEX daemon is Ready for the device's ComputeDomain,
  ``UNHEALTHY`` while it is not Ready, or the node is no member of the domain any more (its
  clique entry is gone), and ``UNKNOWN`` when the plugin cannot tell (caches not synced, domain
  unknown) -- see `computedomains.DomainTracker.daemon_readiness`; the message says why;
* the service is ``NodeWatchResources`` (server streaming) under both proto packages the
  kubelet dials, ``v1`` (kubelet 1.37+, preferred) and ``v1alpha1`` (kubelets 1.34-1.36): one
  servicer serves both, the messages are the same shape;
* each stream first sends the complete current state, then a complete state again whenever
  it changed -- re-evaluated on every ComputeDomain/clique informer event and every checkpoint
  change, never by polling -- and, because the kubelet turns a device ``Unknown`` when it heard
  nothing about it for ``health_check_timeout_seconds``, the unchanged state every
  `RESEND_INTERVAL` (on the injected clock) well inside `HEALTH_TIMEOUT`;
* a stream ends when the kubelet goes away (gRPC callback) or `DeviceHealthMonitor.close`;
  the kubelet then drops this driver's health and shows ``Unknown`` until it reconnects.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Final

import grpc

from pkg.base.clock import Clock
from pkg.kubeletplugin.checkpoint import ClaimEntry, ClaimState
from pkg.kubeletplugin.computedomains import DaemonReadiness
from pkg.kubeletplugin.proto.gen import kubelet_dra_health_v1_pb2 as v1_pb2

log = logging.getLogger(__name__)

# The kubelet's own default is 30 s; a longer timeout with a resend every third of it keeps a
# device's health through two lost reports.
HEALTH_TIMEOUT: Final = 90
RESEND_INTERVAL: Final = 30.0

# The enum values are identical in v1 and v1alpha1 (the conformance test pins both).
UNKNOWN: Final = int(v1_pb2.UNKNOWN)
HEALTHY: Final = int(v1_pb2.HEALTHY)
UNHEALTHY: Final = int(v1_pb2.UNHEALTHY)
_MAX_MESSAGE: Final = 1024  # the kubelet truncates longer messages


@dataclass(frozen=True, order=True)
class DeviceHealth:
    """One device's health as reported to the kubelet."""

    pool: str
    device: str
    health: int
    message: str


def _health(readiness: DaemonReadiness) -> int:
    if readiness.ready is None:
        return UNKNOWN
    return HEALTHY if readiness.ready else UNHEALTHY


class _Subscription:
    def __init__(self) -> None:
        self.cancelled = False


class DeviceHealthMonitor:
    """Computes the health of the prepared devices and feeds every open stream."""

    def __init__(
        self,
        *,
        readiness: Callable[[str], DaemonReadiness],
        clock: Clock,
        resend_interval: float = RESEND_INTERVAL,
    ) -> None:
        self._readiness = readiness
        self._clock = clock
        self._resend = resend_interval
        self._cond = threading.Condition()
        self._generation = 0
        self._entries: tuple[ClaimEntry, ...] = ()
        self._subscriptions: set[_Subscription] = set()
        self._closed = False

    def set_prepared(self, entries: Iterable[ClaimEntry]) -> None:
        """Replace the checkpoint entries whose devices are reported (called on every change)."""
        with self._cond:
            self._entries = tuple(entries)
        self.changed()

    def changed(self) -> None:
        """Something health depends on may have changed: wake every stream (never blocks)."""
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def close(self) -> None:
        """End every stream and refuse new ones (plugin shutdown)."""
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

    def snapshot(self) -> list[DeviceHealth]:
        """The health of every prepared device now, sorted, one entry per (pool, device)."""
        with self._cond:
            entries = self._entries
        found: dict[tuple[str, str], DeviceHealth] = {}
        verdicts: dict[str, DaemonReadiness] = {}
        for entry in entries:
            if entry.state != ClaimState.PREPARE_COMPLETED:
                continue
            for group in entry.groups:
                if group.domain_id not in verdicts:
                    verdicts[group.domain_id] = (
                        self._readiness(group.domain_id)
                        if group.domain_id
                        else DaemonReadiness(None, "the claim names no ComputeDomain")
                    )
                verdict = verdicts[group.domain_id]
                for dev in group.devices:
                    key = (dev.pool_name, dev.device_name)
                    found.setdefault(
                        key,
                        DeviceHealth(
                            pool=dev.pool_name,
                            device=dev.device_name,
                            health=_health(verdict),
                            message=verdict.reason[:_MAX_MESSAGE],
                        ),
                    )
        return sorted(found.values())

    def watch(
        self, *, on_cancel: Callable[[Callable[[], None]], bool] | None = None
    ) -> Iterator[list[DeviceHealth]]:
        """Yield the full state at once, then whenever it changed or a resend is due.

        ``on_cancel`` receives a function that ends this watch and returns False if the caller
        is already gone (gRPC's ``ServicerContext.add_callback``); the generator returns when
        that function is called or the monitor is closed.
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
            next_send = self._clock.monotonic()
            while True:
                with self._cond:
                    while (
                        not sub.cancelled
                        and self._generation == seen
                        and self._clock.monotonic() < next_send
                    ):
                        self._clock.wait_condition(self._cond, next_send - self._clock.monotonic())
                    if sub.cancelled:
                        return
                    seen = self._generation
                current = self.snapshot()
                now = self._clock.monotonic()
                if current != last or now >= next_send:
                    if current != last:
                        log.info("device health: %s", _describe(current))
                    last = current
                    next_send = now + self._resend
                    yield current
        finally:
            with self._cond:
                self._subscriptions.discard(sub)


def _describe(devices: list[DeviceHealth]) -> str:
    names = {UNKNOWN: "Unknown", HEALTHY: "Healthy", UNHEALTHY: "Unhealthy"}
    if not devices:
        return "no prepared devices"
    return "; ".join(f"{d.pool}/{d.device} {names[d.health]} ({d.message})" for d in devices)


class ResourceHealthServicer:
    """``DRAResourceHealth`` of one proto package; ``pb2`` is that version's message module."""

    def __init__(self, *, monitor: DeviceHealthMonitor, pb2: ModuleType) -> None:
        self._monitor = monitor
        self._pb2 = pb2

    def NodeWatchResources(  # noqa: N802
        self, request: Any, context: grpc.ServicerContext
    ) -> Iterator[Any]:
        """Stream the complete device health list: now, then on every change (and resend)."""
        pb2 = self._pb2
        log.info("kubelet opened a device health stream (%s)", pb2.DESCRIPTOR.package)
        for devices in self._monitor.watch(on_cancel=context.add_callback):
            stamp = int(self._monitor.now())
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
