"""The controller's ``/metrics`` serves its build from the start, leading or not."""

from __future__ import annotations

import platform
import threading
import urllib.request

from cdctl_fakes import DRIVER_NS  # type: ignore[import-not-found, unused-ignore]
from prometheus_client.parser import text_string_to_metric_families

from pkg.reconcilers.app import BUILD_INFO_METRIC, run
from pkg.reconcilers.flags import parse_options
from pkg.runtime.buildinfo import BuildInfo
from pkg.testing.fakeapiserver import FakeApiServer

INFO = BuildInfo(version="1.2.3", revision="a" * 40, build_date="2026-11-26T10:00:00Z")


def test_build_info_is_on_the_served_registry_before_any_term(server: FakeApiServer) -> None:
    argv = [
        "--image-name=img",
        f"--namespace={DRIVER_NS}",
        "--http-endpoint=127.0.0.1:0",
        "--leader-election-enabled",
    ]
    opts = parse_options(argv, {})
    stop = threading.Event()
    scraped: list[str] = []

    def ready(port: int) -> None:  # called once the server listens, before leader election
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            scraped.append(resp.read().decode())
        stop.set()

    thread = threading.Thread(
        target=run,
        args=(opts,),
        daemon=True,
        kwargs={
            "stop": stop,
            "env": {},
            "ready": ready,
            "build_info": INFO,
            "client_factory": lambda _o: server.client(),
        },
    )
    thread.start()
    thread.join(30)
    assert not thread.is_alive() and len(scraped) == 1
    assert BUILD_INFO_METRIC == "nvidia_dra_compute_domain_controller_build_info"
    (family,) = [
        f for f in text_string_to_metric_families(scraped[0]) if f.name == BUILD_INFO_METRIC
    ]
    assert family.type == "gauge"
    assert [(s.labels, s.value) for s in family.samples] == [
        (
            {
                "version": "1.2.3",
                "revision": "a" * 40,
                "build_date": "2026-11-26T10:00:00Z",
                "python_version": platform.python_version(),
            },
            1.0,
        )
    ]
