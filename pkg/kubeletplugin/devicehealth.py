"""Device health of the ComputeDomain driver (KEP-4680): what "healthy" means for its devices.

Owns the verdict; the streaming to the kubelet (``DRAResourceHealth`` v1 and v1alpha1, resends,
cancellation) is `pkg.draplugin.resourcehealth`'s, which this module feeds:

* a prepared device (a ``PrepareCompleted`` checkpoint entry's channel or daemon device) is
  ``HEALTHY`` while this node's IMEX daemon is Ready for the device's ComputeDomain,
  ``UNHEALTHY`` while it is not Ready, or the node is no member of the domain any more (its
  clique entry is gone), and ``UNKNOWN`` when the plugin cannot tell (caches not synced, domain
  unknown) -- see `computedomains.DomainTracker.daemon_readiness`; the message says why;
* the state is re-evaluated on every ComputeDomain/clique informer event (the plugin wires
  `DeviceHealthMonitor.changed` as a `DomainTracker` listener) and every checkpoint change
  (`DeviceHealthMonitor.set_prepared`), never by polling.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from pkg.base.clock import Clock
from pkg.draplugin.resourcehealth import (
    HEALTHY,
    MAX_MESSAGE,
    RESEND_INTERVAL,
    UNHEALTHY,
    UNKNOWN,
    DeviceHealth,
    DeviceHealthFeed,
)
from pkg.kubeletplugin.checkpoint import ClaimEntry, ClaimState
from pkg.kubeletplugin.computedomains import DaemonReadiness


def _health(readiness: DaemonReadiness) -> int:
    if readiness.ready is None:
        return UNKNOWN
    return HEALTHY if readiness.ready else UNHEALTHY


class DeviceHealthMonitor(DeviceHealthFeed):
    """The health of the devices in the checkpoint's PrepareCompleted entries.

    Thread-safe like its `DeviceHealthFeed` base: `set_prepared` and `changed` may be called
    from any thread and never block on a stream.
    """

    def __init__(
        self,
        *,
        readiness: Callable[[str], DaemonReadiness],
        clock: Clock,
        resend_interval: float = RESEND_INTERVAL,
    ) -> None:
        """``readiness`` is this node's IMEX daemon verdict for a ComputeDomain UID (cheap,
        cache-backed: it runs on stream threads); ``clock`` and ``resend_interval`` as for
        `DeviceHealthFeed`."""
        super().__init__(clock=clock, resend_interval=resend_interval)
        self._readiness = readiness
        self._entries_lock = threading.Lock()
        self._entries: tuple[ClaimEntry, ...] = ()

    def set_prepared(self, entries: Iterable[ClaimEntry]) -> None:
        """Replace the checkpoint entries whose devices are reported (called on every change)."""
        with self._entries_lock:
            self._entries = tuple(entries)
        self.changed()

    def snapshot(self) -> list[DeviceHealth]:
        """The health of every prepared device now, sorted, one entry per (pool, device)."""
        with self._entries_lock:
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
                            message=verdict.reason[:MAX_MESSAGE],
                        ),
                    )
        return sorted(found.values())
