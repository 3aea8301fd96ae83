"""Per-domain metrics of the controller: domains by status and time to first Ready.

Owns ``nvidia_dra_compute_domain_info{status}`` (upstream's gauge: the number of domains whose
last published status is ``status``) and ``nvidia_dra_compute_domain_time_to_ready_seconds``
(creation → first Ready, observed once per domain per process, labelled with the domain's
``namespace``). Invariants: each domain UID is
counted under exactly one status label at a time; :meth:`DomainMetrics.forget` removes it when
its finalizer is released; a domain seen already Ready when the process started is never
observed as a time-to-ready sample (its creation was not witnessed by this term); both status
values (``Ready``, ``NotReady``) are exported from start, at 0 while no domain has them.

Also owns ``nvidia_dra_compute_domain_workload_waiting`` (not upstream's): the NotReady domains
with at least one node. Nodes join a domain only where a pod using its claim template was
scheduled, so these are the domains a workload waits on, unlike one created ahead of its job
(0 nodes), which is NotReady too; ``ComputeDomainNotReady`` alerts on this gauge.
"""

from __future__ import annotations

import threading
from datetime import datetime

from prometheus_client import CollectorRegistry, Gauge, Histogram

from pkg.api import constants as c

__all__ = ["DomainMetrics", "parse_timestamp"]


def parse_timestamp(value: str) -> float | None:
    """Epoch seconds of an RFC 3339 timestamp such as ``creationTimestamp``."""
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except (ValueError, AttributeError):
        return None


class DomainMetrics:
    """Thread-safe bookkeeping behind the per-domain series."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._info = Gauge(
            "nvidia_dra_compute_domain_info",
            "Number of ComputeDomains by the status the controller last published.",
            ["status"],
            registry=registry,
        )
        self._time_to_ready = Histogram(
            "nvidia_dra_compute_domain_time_to_ready_seconds",
            "Seconds from ComputeDomain creation to its first Ready status, by namespace.",
            ["namespace"],
            buckets=(1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 3600),
            registry=registry,
        )
        self._waiting = Gauge(
            "nvidia_dra_compute_domain_workload_waiting",
            "Number of NotReady ComputeDomains with at least one node (a workload pod waits).",
            registry=registry,
        )
        for status in (c.STATUS_READY, c.STATUS_NOT_READY):  # exported at 0 from start
            self._info.labels(status)
        self._lock = threading.Lock()
        self._status: dict[str, str] = {}
        self._ready_seen: set[str] = set()
        self._waiting_uids: set[str] = set()

    def observe_status(
        self,
        uid: str,
        *,
        namespace: str,
        status: str,
        previous: str | None,
        created: float | None,
        now: float,
        nodes: int,
    ) -> bool:
        """Record that ``uid``'s published status is now ``status`` (was ``previous``) with
        ``nodes`` nodes (``status.nodeCount``).

        True when this was the domain's first Ready witnessed by this process from a write
        (a time-to-ready sample was observed): the moment its formation ended.
        """
        with self._lock:
            old = self._status.get(uid)
            if old != status:
                if old is not None:
                    self._info.labels(old).dec()
                self._info.labels(status).inc()
                self._status[uid] = status
            self._set_waiting(uid, waiting=status == c.STATUS_NOT_READY and nodes > 0)
            if status != "Ready" or uid in self._ready_seen:
                return False
            self._ready_seen.add(uid)
            if previous == "Ready" or created is None:
                return False
        self._time_to_ready.labels(namespace).observe(max(now - created, 0.0))
        return True

    def forget(self, uid: str) -> None:
        with self._lock:
            old = self._status.pop(uid, None)
            self._ready_seen.discard(uid)
            self._set_waiting(uid, waiting=False)
            if old is not None:
                self._info.labels(old).dec()

    def _set_waiting(self, uid: str, *, waiting: bool) -> None:
        """Count ``uid`` in the workload-waiting gauge or not (caller holds the lock)."""
        if waiting and uid not in self._waiting_uids:
            self._waiting_uids.add(uid)
            self._waiting.inc()
        elif not waiting and uid in self._waiting_uids:
            self._waiting_uids.discard(uid)
            self._waiting.dec()
