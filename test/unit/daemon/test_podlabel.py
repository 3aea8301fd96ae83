"""The daemon's pod label (`pkg.daemon.podlabel`) and its place as the daemon's first request."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pkg.api import constants as c
from pkg.daemon.podlabel import PodLabeller
from pkg.kube import resources as res
from pkg.testing.clock import FakeClock
from pkg.testing.fakeapiserver import FakeApiServer

NS = "nvidia-dra-driver"
POD = "cd-daemon-abc"
REPO = Path(__file__).resolve().parents[3]
ENTRY = REPO / "cmd" / "compute-domain-daemon" / "compute_domain_daemon.py"


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as srv:
        srv.seed(
            res.PODS,
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": POD, "namespace": NS}},
        )
        yield srv


def labeller(server: FakeApiServer, clock: FakeClock, pod: str = POD) -> PodLabeller:
    return PodLabeller(server.client(), clock, pod_name=pod, pod_namespace=NS, clique_id="cl.7")


def labels(server: FakeApiServer) -> dict[str, str]:
    pod = next(p for p in server.objects(res.PODS) if p["metadata"]["name"] == POD)
    return dict(pod["metadata"].get("labels") or {})


def test_labels_the_pod_with_its_clique(server: FakeApiServer) -> None:
    assert labeller(server, FakeClock()).run(threading.Event())
    assert labels(server) == {c.CLIQUE_ID_LABEL: "cl.7"}


def test_a_missing_pod_or_pod_name_is_not_retried(server: FakeApiServer) -> None:
    clock = FakeClock()
    assert labeller(server, clock, pod="gone").run(threading.Event())
    assert labeller(server, clock, pod="").run(threading.Event())
    assert clock.waits == []
    assert ("PATCH", f"/api/v1/namespaces/{NS}/pods/gone") in server.request_log
    assert not any(p.endswith("/pods/") for _, p in server.request_log)


def test_failures_back_off_doubling_until_it_succeeds(server: FakeApiServer) -> None:
    server.inject_error("PATCH", res.PODS, 500, count=3)
    clock = FakeClock(advance_on_wait=True)
    assert labeller(server, clock).run(threading.Event())
    assert clock.waits == [0.2, 0.4, 0.8]
    assert labels(server) == {c.CLIQUE_ID_LABEL: "cl.7"}


def test_stop_ends_the_retries(server: FakeApiServer) -> None:
    server.inject_error("PATCH", res.PODS, 500, count=100)
    stop = threading.Event()
    clock = FakeClock(advance_on_wait=True)
    clock.on_wait = lambda _w: stop.set() if len(clock.waits) >= 2 else None
    assert not labeller(server, clock).run(stop)
    assert c.CLIQUE_ID_LABEL not in labels(server)


def test_start_is_idempotent_and_join_waits(server: FakeApiServer) -> None:
    one = labeller(server, FakeClock())
    assert one.join(0)  # never started: nothing to wait for
    stop = threading.Event()
    one.start(stop)
    one.start(stop)
    assert one.join(10)
    patches = [p for m, p in server.request_log if m == "PATCH"]
    assert patches == [f"/api/v1/namespaces/{NS}/pods/{POD}"]


def test_run_sends_the_label_before_importing_the_rest_of_the_daemon(tmp_path: Path) -> None:
    """``compute-domain-daemon run`` starts the labeller (its first API request) before the
    informers, IMEX supervision, metrics and tracing are imported."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "x", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "c", "context": {"cluster": "x", "user": "u"}}],
            }
        )
    )
    heavy = (
        "pkg.daemon.daemon",
        "pkg.informers",
        "pkg.imex.supervisor",
        "opentelemetry",
        "prometheus_client",
    )
    probe = (
        "import json, os, runpy, sys\n"
        "from pkg.daemon import podlabel\n"
        "def start(self, stop):\n"
        f"    print(json.dumps([m for m in {heavy!r} if m in sys.modules]), flush=True)\n"
        "    os._exit(0)\n"
        "podlabel.PodLabeller.start = start\n"
        f"sys.argv = [{str(ENTRY)!r}, 'run']\n"
        f"runpy.run_path({str(ENTRY)!r}, run_name='__main__')\n"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "CLIQUE_ID": "cl.7",
        "COMPUTE_DOMAIN_UUID": "uid-1",
        "COMPUTE_DOMAIN_NAME": "cd",
        "COMPUTE_DOMAIN_NAMESPACE": "team",
        "NODE_NAME": "n1",
        "POD_IP": "10.0.0.1",
        "POD_UID": "uid-p",
        "POD_NAME": POD,
        "POD_NAMESPACE": NS,
        "KUBECONFIG": str(kubeconfig),
        "IMEX_CONFIG_DIR": str(tmp_path / "imexd"),
        "PYTHONPATH": str(REPO),
    }
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
