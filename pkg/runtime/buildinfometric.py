"""The ``<prefix>_build_info`` gauge: which build a scraped process runs, as labels.

Owns the gauge's shape, the Prometheus convention (``prometheus_build_info``,
``kube_state_metrics_build_info``): value 1 from process start, labels ``version``,
``revision``, ``build_date`` (the :class:`BuildInfo` fields) and ``python_version`` (the
interpreter's, as Go binaries export ``goversion``). Each binary chooses the name, under the
metric prefix it already exports, and registers it once on the registry its ``/metrics``
serves; the labels never change for the life of the process.
"""

from __future__ import annotations

import platform

from prometheus_client import CollectorRegistry, Gauge

from pkg.runtime.buildinfo import BuildInfo

__all__ = ["BUILD_INFO_LABELS", "register_build_info"]

BUILD_INFO_LABELS = ("version", "revision", "build_date", "python_version")


def register_build_info(registry: CollectorRegistry, *, name: str, info: BuildInfo) -> Gauge:
    """Register gauge ``name`` (ending in ``_build_info``) in ``registry`` with its one series
    set to 1. Raises ``ValueError`` if ``registry`` already has that name."""
    if not name.endswith("_build_info"):
        raise ValueError(f"build-info metric name must end in _build_info: {name}")
    gauge = Gauge(
        name,
        "A metric with a constant 1 labelled with the version, git revision, build date "
        "and Python version of the running build.",
        BUILD_INFO_LABELS,
        registry=registry,
    )
    gauge.labels(
        version=info.version,
        revision=info.revision,
        build_date=info.build_date,
        python_version=platform.python_version(),
    ).set(1)
    return gauge
