"""A daemon whose container got no IMEX binaries through CDI: Event, termination message, exit.

The daemon finds ``nvidia-imex``/``nvidia-imex-ctl`` only through ``PATH`` (where the kubelet
plugin's CDI spec mounts them); the fake driver root's ``usr/bin`` stands for the container's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pkg.api import constants as c
from pkg.daemon.daemon import (
    EXIT_DRIVER_ROOT_INCOMPLETE,
    Daemon,
    Timing,
    missing_imex_programs,
    path_lookup,
    write_termination_message,
)
from pkg.daemon.metrics import DaemonMetrics
from pkg.daemon.options import Options, parse
from pkg.imex.ctl import CommandResult
from pkg.kube import resources as res
from pkg.kube.events import EventRecorder
from pkg.testing.clock import FakeClock
from pkg.testing.fakeapiserver import FakeApiServer
from pkg.testing.fakedriverroot import FakeDriverRoot

NS = "nvidia-dra-driver"


class NeverStarted:
    def start(self, argv: object, *, env: object) -> object:
        raise AssertionError("IMEX must not be started")


class NoCtl:
    def run(self, argv: object, *, timeout: float) -> CommandResult:
        raise AssertionError("nvidia-imex-ctl must not be run")


def options(tmp: Path) -> Options:
    return parse(
        ["run"],
        {
            "CLIQUE_ID": "cl.1",
            "COMPUTE_DOMAIN_UUID": "uid-d",
            "COMPUTE_DOMAIN_NAME": "cd",
            "COMPUTE_DOMAIN_NAMESPACE": "team",
            "NODE_NAME": "gpu-7",
            "POD_IP": "10.0.0.7",
            "POD_UID": "pod-uid",
            "POD_NAME": "daemon-gpu-7",
            "POD_NAMESPACE": NS,
            "IMEX_CONFIG_DIR": str(tmp / "imexd"),
            "IMEX_HOSTS_FILE": str(tmp / "hosts"),
            "TERMINATION_LOG": str(tmp / "termination-log"),
        },
    )


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as srv:
        srv.seed(
            res.PODS,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "daemon-gpu-7", "namespace": NS},
            },
        )
        yield srv


def daemon_on(api: FakeApiServer, tmp: Path, root: FakeDriverRoot) -> Daemon:
    client = api.client()
    return Daemon(
        options(tmp),
        client=client,
        clock=FakeClock(advance_on_wait=True),
        runner=NeverStarted(),  # type: ignore[arg-type]
        commands=NoCtl(),
        metrics=DaemonMetrics(),
        child_env={"PATH": str(root.root / "usr" / "bin")},
        timing=Timing(),
        informer_clock=FakeClock(advance_on_wait=True),
        events=EventRecorder(client, "compute-domain-daemon", FakeClock()),
    )


def test_missing_binary_gives_event_termination_message_and_exit(
    api: FakeApiServer, tmp_path: Path
) -> None:
    root = FakeDriverRoot.create(tmp_path / "driver-root", omit=["nvidia-imex"])
    (tmp_path / "termination-log").touch()  # the kubelet creates the file
    daemon = daemon_on(api, tmp_path, root)
    assert daemon.run(threading.Event()) == EXIT_DRIVER_ROOT_INCOMPLETE
    (event,) = api.objects(res.EVENTS)
    assert event["type"] == "Warning" and event["reason"] == c.REASON_DRIVER_ROOT_INCOMPLETE
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "daemon-gpu-7",
        "namespace": NS,
        "uid": "pod-uid",
    }
    assert "nvidia-imex not found" in event["message"] and "gpu-7" in event["message"]
    assert "nvidiaDriverRoot" in event["message"]
    message = (tmp_path / "termination-log").read_text()
    assert message == f"{c.REASON_DRIVER_ROOT_INCOMPLETE}: {event['message']}"
    # Nothing else happened: no clique entry, no IMEX config.
    assert api.objects(res.COMPUTE_DOMAIN_CLIQUES) == []
    assert not (tmp_path / "imexd").exists()


def test_both_binaries_are_checked(tmp_path: Path) -> None:
    opts = options(tmp_path)
    empty = FakeDriverRoot.create(tmp_path / "r1", omit=["nvidia-imex", "nvidia-imex-ctl"])
    locate = path_lookup({"PATH": str(empty.root / "usr" / "bin")})
    assert missing_imex_programs(opts, locate) == ["nvidia-imex", "nvidia-imex-ctl"]
    full = FakeDriverRoot.create(tmp_path / "r2")
    locate = path_lookup({"PATH": str(full.root / "usr" / "bin")})
    assert missing_imex_programs(opts, locate) == []
    assert locate(str(full.binary("nvidia-imex"))) == str(full.binary("nvidia-imex"))
    assert locate(str(empty.binary("nvidia-imex"))) is None


def test_termination_message_only_into_an_existing_log(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    assert not write_termination_message(str(path), "x")
    assert not path.exists()  # outside a pod nothing is created (never /dev/termination-log)
    path.touch()
    assert write_termination_message(str(path), "y" * 10_000)
    assert len(path.read_text()) == 4096
