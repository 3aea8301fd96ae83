"""Prometheus metrics of the kubelet plugin (upstream names, ``pkg/metrics/dra_requests.go``).

Owns metric names, labels and buckets; everything is registered in an injected
`CollectorRegistry` so tests and several plugin instances in one process never collide.
Invariants: request series are pre-created with zero values (dashboards see 0, not "no data");
``prepared_devices`` is recomputed from the checkpoint after every write, never incremented.
`PluginMetrics` is the library fan-out's `pkg.draplugin.fanout.RequestObserver`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pkg.api.constants import DRIVER_NAME

OPERATIONS = ("prepare", "unprepare")
DEVICE_TYPES = ("channel", "daemon", "unknown")
# Upstream: 0.05 s * 2^k for 9 buckets.
BUCKETS = tuple(0.05 * 2**k for k in range(9))


class PluginMetrics:
    """Every metric of one plugin instance; thread-safe (prometheus_client's metrics are)."""

    def __init__(self, *, registry: CollectorRegistry, node_name: str) -> None:
        """Registers the metrics in ``registry`` (`ValueError` if they exist there already)."""
        self.registry = registry
        self._node = node_name
        self.requests_total = Counter(
            "nvidia_dra_requests_total",
            "DRA requests received.",
            ["driver", "operation"],
            registry=registry,
        )
        self.request_duration = Histogram(
            "nvidia_dra_request_duration_seconds",
            "DRA request duration.",
            ["driver", "operation"],
            buckets=BUCKETS,
            registry=registry,
        )
        self.requests_inflight = Gauge(
            "nvidia_dra_requests_inflight",
            "DRA requests in flight.",
            ["driver", "operation"],
            registry=registry,
        )
        self.prepared_devices = Gauge(
            "nvidia_dra_prepared_devices",
            "Devices prepared on this node.",
            ["node", "driver", "device_type"],
            registry=registry,
        )
        self.prepare_errors = Counter(
            "nvidia_dra_node_prepare_errors_total",
            "Failed claim prepares.",
            ["driver", "error_type"],
            registry=registry,
        )
        self.unprepare_errors = Counter(
            "nvidia_dra_node_unprepare_errors_total",
            "Failed claim unprepares.",
            ["driver", "error_type"],
            registry=registry,
        )
        self.checkpoint_corruptions = Counter(
            "nvidia_dra_checkpoint_corruptions_total",
            "Checkpoint files found corrupt or foreign at start (moved aside, see logs).",
            ["driver"],
            registry=registry,
        )
        for op in OPERATIONS:
            self.requests_total.labels(DRIVER_NAME, op)
            self.request_duration.labels(DRIVER_NAME, op)
            self.requests_inflight.labels(DRIVER_NAME, op)
        for error_type in ("lock_acquire", "prepare_devices", "permanent", "retryable"):
            self.prepare_errors.labels(DRIVER_NAME, error_type)
        for error_type in ("lock_acquire", "unprepare_devices"):
            self.unprepare_errors.labels(DRIVER_NAME, error_type)
        self.checkpoint_corruptions.labels(DRIVER_NAME)
        self.set_prepared_devices([])

    @contextmanager
    def track(self, operation: str) -> Iterator[None]:
        """Count one ``prepare``/``unprepare`` request, in flight and timed while inside."""
        labels = (DRIVER_NAME, operation)
        self.requests_total.labels(*labels).inc()
        with (
            self.requests_inflight.labels(*labels).track_inprogress(),
            self.request_duration.labels(*labels).time(),
        ):
            yield

    def claim_failed(self, operation: str, *, permanent: bool) -> None:
        """Count one failed claim: Prepare by class, Unprepare as ``unprepare_devices``."""
        if operation == "prepare":
            error_type = "permanent" if permanent else "retryable"
            self.prepare_errors.labels(DRIVER_NAME, error_type).inc()
        else:
            self.unprepare_errors.labels(DRIVER_NAME, "unprepare_devices").inc()

    def set_prepared_devices(self, kinds: Iterable[str]) -> None:
        """Set ``prepared_devices`` per device type from the kinds of all prepared devices
        (types other than channel/daemon count as ``unknown``)."""
        counts = dict.fromkeys(DEVICE_TYPES, 0)
        for kind in kinds:
            counts[kind if kind in counts else "unknown"] += 1
        for kind, count in counts.items():
            self.prepared_devices.labels(self._node, DRIVER_NAME, kind).set(count)
