"""The kubelet stand-in's fork server and the time-to-ready stage attribution (hack/)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubeletsim.formation import (
    STAGES,
    UNATTRIBUTED,
    NodeFormation,
    PodTimes,
    formations,
    summarize,
)
from kubeletsim.runtime import LocalContainer, ProcessSpec
from kubeletsim.zygote import ZYGOTE_ENV, Zygote

SCRIPT = """import os, sys, time
print(sys.argv[1:], os.environ.get("FOO"), os.getcwd(), os.getpid() == os.getsid(0), flush=True)
if sys.argv[1] == "sleep":
    time.sleep(60)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Zygote]:
    d = tmp_path_factory.mktemp("zygote")
    z = Zygote(d / "z.sock", preload=["json"]).start(d / "zygote.log")
    yield z
    z.stop()


def script(tmp_path: Path) -> Path:
    """``SCRIPT`` as ``tmp_path/prog.py``, written once: a test asks for it again after it
    started a container from it, and rewriting it in place (truncate, then write) let that
    container, forked a little later on a busy machine, read an empty program and exit 0
    (flake-check, 2026-11-27). A new file is made under another name and renamed over."""
    path = tmp_path / "prog.py"
    if not path.exists():
        tmp = tmp_path / "prog.py.tmp"
        tmp.write_text(SCRIPT)
        tmp.replace(path)
    return path


def test_forked_container_gets_argv_env_cwd_own_session_and_its_exit_code(
    zygote: Zygote, tmp_path: Path
) -> None:
    spec = ProcessSpec(
        [sys.executable, str(script(tmp_path)), "3"],
        {"FOO": "bar"},
        tmp_path,
        tmp_path / "c.log",
        zygote=zygote,
    )
    c = LocalContainer(spec)
    sleeper = LocalContainer(
        ProcessSpec(
            [sys.executable, str(script(tmp_path)), "sleep"],
            {},
            tmp_path,
            tmp_path / "s.log",
            zygote=zygote,
        )
    )
    with pytest.raises(subprocess.TimeoutExpired):
        sleeper._popen.wait(0.2)
    sleeper.stop(5)
    assert c._popen.wait(10) == 3
    assert f"['3'] bar {tmp_path} True" in (tmp_path / "c.log").read_text()


def test_stop_signals_the_forked_process_group(zygote: Zygote, tmp_path: Path) -> None:
    c = LocalContainer(
        ProcessSpec(
            [sys.executable, str(script(tmp_path)), "sleep"],
            {},
            tmp_path,
            tmp_path / "s.log",
            zygote=zygote,
        )
    )
    assert c.exit_code() is None
    assert c.stop(5) == -signal.SIGTERM


def test_exec_probe_through_the_zygote_reports_exit_output_and_timeout(
    zygote: Zygote, tmp_path: Path
) -> None:
    c = LocalContainer(
        ProcessSpec(
            [sys.executable, str(script(tmp_path)), "sleep"],
            {"FOO": "x"},
            tmp_path,
            tmp_path / "s.log",
            zygote=zygote,
        )
    )
    try:
        prog = str(script(tmp_path))
        assert c.exec_probe([sys.executable, prog, "0"], timeout=10) == (
            True,
            f"['0'] x {tmp_path} True",
        )
        ok, out = c.exec_probe([sys.executable, prog, "1"], timeout=10)
        assert not ok and out.startswith("['1']")
        assert c.exec_probe([sys.executable, prog, "sleep"], timeout=0.5) == (
            False,
            "probe timed out after 0.5s",
        )
    finally:
        c.stop(5)


def test_a_client_that_hangs_up_before_its_pid_does_not_take_the_server_down(
    zygote: Zygote, tmp_path: Path
) -> None:
    """A caller that gives up (closes) before the server reports the pid: the program is
    ended and the server keeps forking for everyone else (it once died with EPIPE, and every
    later container start of that run failed with ECONNREFUSED)."""
    prog = str(script(tmp_path))
    for _ in range(3):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(str(zygote.socket_path))
        msg = json.dumps({"argv": [prog, "sleep"], "env": {}, "cwd": str(tmp_path)}).encode()
        socket.send_fds(conn, [msg + b"\n"], [0, 1, 2])
        conn.close()
    c = LocalContainer(
        ProcessSpec(
            [sys.executable, prog, "4"], {}, tmp_path, tmp_path / "after.log", zygote=zygote
        )
    )
    deadline = time.monotonic() + 10
    while c.exit_code() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert c.exit_code() == 4


def test_a_program_whose_fork_server_died_is_ended_not_leaked(
    tmp_path: Path,
) -> None:
    """The server reports each program's exit; when it dies, nothing would ever end its
    programs (own sessions): a run once left 12 daemons polling a deleted cluster."""
    z = Zygote(tmp_path / "z.sock", preload=["json"]).start(tmp_path / "zygote.log")
    c = LocalContainer(
        ProcessSpec(
            [sys.executable, str(script(tmp_path)), "sleep"],
            {},
            tmp_path,
            tmp_path / "s.log",
            zygote=z,
        )
    )
    pid = c.pid
    assert _running(pid)
    assert z._server is not None
    z._server.kill()
    z._server.wait(10)
    deadline = time.monotonic() + 10
    while c.exit_code() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert c.exit_code() == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _running(pid)
    z.stop()


def test_only_scripts_of_this_interpreter_are_forked(zygote: Zygote) -> None:
    assert zygote.forkable([sys.executable, "x.py", "run"])
    assert not zygote.forkable(["/bin/sh", "x.py"])
    assert not zygote.forkable([sys.executable, "-m", "mod"])
    with pytest.raises(ValueError, match="forks only"):
        zygote.spawn(["/bin/true"], env={}, cwd=Path("/"), stdin=0, stdout=1, stderr=2)


def test_stages_add_up_to_bound_to_ready_and_overlaps_count_zero() -> None:
    names = [m for _n, _o, a, b in STAGES for m in (a, b)]
    milestones = dict.fromkeys(names, 0.0)
    t = 100.0
    for m in dict.fromkeys(names):  # in stage order, 0.1 s apart
        milestones[m] = t
        t += 0.1
    milestones["final_attempt_start"] = milestones["label_start"]  # already waiting: overlap
    node = NodeFormation("n1", milestones)
    stages = node.stage_seconds()
    assert stages["Ready signalled -> kubelet's final Prepare call"] == 0.0
    assert sum(stages.values()) == pytest.approx(node.total())


def test_milestones_come_from_watch_harness_and_spans() -> None:
    def span(
        name: str, sid: str, parent: str | None, start: float, end: float
    ) -> dict[str, object]:
        iso = "1970-01-01T00:00:{:06.3f}Z".format
        return {
            "name": name,
            "context": {"span_id": sid, "trace_id": "0x1"},
            "parent_id": parent,
            "start_time": iso(start),
            "end_time": iso(end),
            "attributes": {"k8s.node.name": "n1"},
        }

    spans = [
        span("prepare channel claim", "a", None, 1.0, 9.0),
        span("label node", "b", "a", 1.0, 1.5),
        span("IMEX daemon", "c", None, 4.0, 7.0),
        span("join", "d", "c", 4.0, 4.5),
        span("start IMEX", "e", "c", 4.5, 5.0),
        span("IMEX ready on the node", "g", "c", 6.2, 6.3),
        span("IMEX ready", "f", "c", 5.0, 7.0),
    ]
    workload = [PodTimes("ns", "cd-0", node="n1", bound=0.5, ready=10.0)]
    daemons = [PodTimes("drv", "d-1", node="n1", seen=2.0, bound=2.5, ip=4.2)]
    harness = {
        "n1": {
            "prepare_start": 1.0,
            "final_attempt_start": 1.0,
            "prepare_end": 9.0,
            "daemon_prepare_start": 3.0,
            "daemon_prepare_end": 3.5,
            "daemon_process": 3.8,
            "imex_listening": 6.0,
        }
    }
    (f,) = formations(spans, workload, daemons, harness)
    # Ready is signalled by the earlier of the node-local record and the entry.
    assert f.milestones["labelled"] == 1.5 and f.milestones["imex_ready"] == 6.3
    stages = f.stage_seconds()
    # No watch saw the label first: the plugin's Prepare labelled it, after the kubelet's call.
    assert stages[STAGES[0][0]] == pytest.approx(0.5) and STAGES[0][1] == "simulation"
    assert stages[STAGES[1][0]] == pytest.approx(0.5) and STAGES[1][1] == "driver"
    assert stages["daemon loop -> kubelet reported the daemon pod's IP"] == pytest.approx(0.2)
    assert stages["pod IP reported -> joined the clique"] == pytest.approx(0.3)
    summary = summarize([f])
    assert summary["missing"] == []
    assert summary["last_node_total"] == 9.5
    by_owner = summary["last_node_by_owner"]
    assert sum(by_owner.values()) == pytest.approx(9.5)
    assert by_owner["kubernetes"] == pytest.approx(1.0)  # labelled 1.5 -> created 2.0 -> bound 2.5


def test_a_node_the_controller_labelled_waits_for_the_driver_from_binding_not_for_prepare() -> None:
    """The label a watch saw before the plugin's ``label node`` span ended was the controller's:
    the kubelet's call to Prepare is then off the critical path, and so is the plugin's read."""

    def label_span(end: float) -> dict[str, object]:
        iso = "1970-01-01T00:00:{:06.3f}Z".format
        return {
            "name": "label node",
            "context": {"span_id": "b", "trace_id": "0x1"},
            "parent_id": "a",
            "start_time": iso(1.0),
            "end_time": iso(end),
            "attributes": {"k8s.node.name": "n1"},
        }

    attempt = {
        "name": "prepare channel claim",
        "context": {"span_id": "a", "trace_id": "0x1"},
        "parent_id": None,
        "start_time": "1970-01-01T00:00:01.000Z",
        "end_time": "1970-01-01T00:00:09.000Z",
        "attributes": {"k8s.node.name": "n1"},
    }
    workload = [PodTimes("ns", "cd-0", node="n1", bound=0.5, ready=10.0)]
    harness = {"n1": {"prepare_start": 1.0}}
    for watched, driver in ((0.3, 0.0), (0.8, 0.3)):  # before / after the binding
        (f,) = formations(
            [attempt, label_span(1.5)],
            workload,
            [],
            harness,
            labelled={"n1": watched},
            daemon_set=0.2,
        )
        stages = f.stage_seconds()
        assert f.milestones["labelled"] == watched
        assert stages[STAGES[0][0]] == 0.0
        assert stages[STAGES[1][0]] == pytest.approx(driver)
    # The plugin wrote it first (the watch saw it later), but the DaemonSet came later still.
    (f,) = formations(
        [attempt, label_span(1.5)], workload, [], harness, labelled={"n1": 1.8}, daemon_set=1.7
    )
    assert f.milestones["labelled"] == 1.7 and f.milestones["label_start"] == 1.0


def test_a_missing_milestone_leaves_its_time_unattributed_not_lost() -> None:
    node = NodeFormation(
        "n1", {"bound": 0.0, "label_start": 1.0, "daemon_created": 4.0, "pod_ready": 10.0}
    )
    stages = node.stage_seconds()
    assert stages[STAGES[0][0]] == 1.0
    assert stages[UNATTRIBUTED] == 9.0  # labelled and everything after daemon_created missing
    assert sum(stages.values()) == node.total()


@pytest.fixture(scope="module")
def zclient(tmp_path_factory: pytest.TempPathFactory) -> Path:
    binary = Zygote.build_client(tmp_path_factory.mktemp("zclient"))
    if binary is None:
        pytest.skip("no C compiler")
    return binary


def test_zclient_runs_a_script_forked_by_the_zygote_with_its_exit_code(
    zygote: Zygote, zclient: Path, tmp_path: Path
) -> None:
    env = {"FOO": "z", ZYGOTE_ENV: str(zygote.socket_path)}
    out = subprocess.run(
        [str(zclient), str(script(tmp_path)), "4"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 4
    assert out.stdout.strip() == f"['4'] z {tmp_path} True"


def test_zclient_forwards_sigterm_and_its_death_kills_the_program(
    zygote: Zygote, zclient: Path, tmp_path: Path
) -> None:
    env = {ZYGOTE_ENV: str(zygote.socket_path)}
    pidfile = tmp_path / "pid"
    prog = tmp_path / "pid.py"
    prog.write_text(
        f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n"
    )
    for sig, expect in ((signal.SIGTERM, -signal.SIGTERM), (signal.SIGKILL, -signal.SIGKILL)):
        pidfile.unlink(missing_ok=True)
        proc = subprocess.Popen([str(zclient), str(prog)], env=env)
        deadline = time.monotonic() + 30
        while not pidfile.exists() or not pidfile.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        program = int(pidfile.read_text())
        proc.send_signal(sig)
        assert proc.wait(30) == expect
        while _alive(program):  # the forked program ends too (forwarded, or killed for it)
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_zclient_without_a_zygote_runs_the_script_with_python(
    zclient: Path, tmp_path: Path
) -> None:
    out = subprocess.run(
        [str(zclient), str(script(tmp_path)), "0"],
        env={"FOO": "p"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0 and out.stdout.startswith("['0'] p")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan waits for whoever reaps it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"
