"""The IMEX daemon's ``/metrics`` (served only with ``METRICS_ADDRESS``) names its build."""

from __future__ import annotations

import platform
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from pkg.daemon.metrics import BUILD_INFO_METRIC, DaemonMetrics
from pkg.runtime.buildinfo import BuildInfo, load_build_info

INFO = BuildInfo(version="1.2.3", revision="b" * 40, build_date="2026-11-26T10:00:00Z")


def scrape(metrics: DaemonMetrics) -> str:
    host, port = metrics.serve("127.0.0.1:0")
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as resp:
            return str(resp.read().decode())
    finally:
        metrics.close()


def test_served_build_info_gauge() -> None:
    assert BUILD_INFO_METRIC == "compute_domain_daemon_build_info"
    text = scrape(DaemonMetrics(build_info=INFO))
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == BUILD_INFO_METRIC]
    assert family.type == "gauge"
    assert [(s.labels, s.value) for s in family.samples] == [
        (
            {
                "version": "1.2.3",
                "revision": "b" * 40,
                "build_date": "2026-11-26T10:00:00Z",
                "python_version": platform.python_version(),
            },
            1.0,
        )
    ]


def test_defaults_to_this_installations_build() -> None:
    info = load_build_info()
    labels = {
        "version": info.version,
        "revision": info.revision,
        "build_date": info.build_date,
        "python_version": platform.python_version(),
    }
    assert DaemonMetrics().registry.get_sample_value(BUILD_INFO_METRIC, labels) == 1.0
