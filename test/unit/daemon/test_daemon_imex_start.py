"""IMEX that does not come up: its ports kept free, a new child polled at once, the user told.

A daemon pod's outbound connections get their local ports from the ephemeral range, which holds
IMEX's ports (`pkg.imex.ports`): the daemon reserves them before it opens its own connections
and whenever IMEX is down, and hands them to IMEX right before starting it. An IMEX that stays
not ready longer than ``IMEX_START_TIMEOUT`` is reported once per stretch: a WARNING and one
Warning Event ``IMEXNotReady`` on the daemon's pod with the last error. Virtual time only (the
loop's clock advances by each wait's timeout); the fake API server records every request.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from test_daemon_daemon import (  # type: ignore[import-not-found, unused-ignore]
    CLIQUE,
    NS,
    UID,
    FakeCtl,
    FakeProcess,
    FakeRunner,
    fake_clock,
    following,
    observe,
    options,
    own_entry,
)

from pkg.api import constants as c
from pkg.daemon.daemon import REASON_IMEX_NOT_READY, Daemon, Timing
from pkg.daemon.metrics import DaemonMetrics
from pkg.daemon.options import Options
from pkg.imex.ctl import CommandResult
from pkg.kube import resources as res
from pkg.kube.events import EventRecorder
from pkg.testing.clock import FakeClock
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer

REFUSED = "IMEX daemon not reachable: [Errno 111] Connection refused\n"
HELD = "port 50000 of 10.0.0.1 is held by another socket of this pod (Address already in use)"


class FakePorts:
    """A `pkg.imex.ports.PortReservation` that records what the daemon did, in ``log``."""

    def __init__(self, log: list[str], api: FakeApiServer, *, problem: str = "") -> None:
        self.log = log
        self.api = api
        self.problem = problem
        self.held: tuple[int, ...] = ()

    def reserve(self) -> list[str]:
        self.log.append(f"reserve after {len(self.api.requests)} API requests")
        self.held = (50000, 50005)
        return [self.problem] if self.problem else []

    def release(self) -> None:
        self.log.append("release")
        self.held = ()


class LoggingRunner(FakeRunner):  # type: ignore[misc]
    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None) -> FakeProcess:
        self.log.append("start")
        return super().start(argv, env=env)


class RefusedCtl:
    """``nvidia-imex-ctl -q`` as the simulator's when nothing listens on the command port."""

    def __init__(self) -> None:
        self.calls = 0

    def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        self.calls += 1
        return CommandResult(1, REFUSED)


def daemon_on(
    api: FakeApiServer, opts: Options, *, runner: FakeRunner, commands: Any, ports: FakePorts
) -> Daemon:
    client = api.client()
    return Daemon(
        opts,
        client=client,
        clock=fake_clock(),
        runner=runner,
        commands=commands,
        metrics=DaemonMetrics(),
        child_env={"PATH": "/bin"},
        timing=Timing(ready_write_spread=0.0),
        informer_clock=FakeClock(advance_on_wait=True),
        events=EventRecorder(client, "compute-domain-daemon", FakeClock()),
        locate=lambda program: f"/usr/bin/{program}",
        ports=ports,  # type: ignore[arg-type]
    )


def run_until(daemon: Daemon, done: Any) -> None:
    """Run the loop until ``done()`` holds at one of its waits (virtual time passes by each
    wait's timeout)."""
    clock = daemon._clock
    assert isinstance(clock, FakeClock)
    stop = threading.Event()

    def check(_event: object) -> None:
        if done():
            stop.set()

    clock.on_wait = check
    assert daemon.run(stop) == 0


def not_ready_events(api: FakeApiServer) -> list[dict[str, Any]]:
    return [e for e in api.objects(res.EVENTS) if e["reason"] == REASON_IMEX_NOT_READY]


def test_imex_ports_are_held_before_the_first_api_request_and_whenever_imex_is_down(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """The reservation comes before the informer's LIST and the join (the pod label's PATCH,
    sent by the entry point before anything else, is the only request that may precede it),
    is released right before each start of IMEX and taken again once IMEX exited, before the
    restart."""
    log: list[str] = []
    runner = LoggingRunner(log)
    daemon = daemon_on(
        api, options(tmp_path), runner=runner, commands=FakeCtl(runner), ports=FakePorts(log, api)
    )
    crashed = False

    def done() -> bool:
        nonlocal crashed
        if runner.procs and not crashed:
            crashed = True
            runner.procs[0].code = 1
        return len(runner.procs) == 2

    run_until(daemon, done)
    first = log[0]
    assert first.startswith("reserve after ") and int(first.split()[2]) <= 1, log
    starts = [i for i, what in enumerate(log) if what == "start"]
    assert len(starts) == 2 and all(log[i - 1] == "release" for i in starts), log
    assert any(what.startswith("reserve") for what in log[starts[0] : starts[1]]), log
    assert log[-1] == "release"  # shutdown


def test_imex_not_ready_within_the_bound_is_one_warning_event_with_the_last_error(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """The failure CI saw: IMEX started but its command port refused every query. Before, the
    pod stayed 0/1 with only the kubelet's (spam-filtered) probe Events; now, 60 s after the
    start, one Warning Event on the pod says so, naming the node and what went wrong."""
    log: list[str] = []
    runner, ctl = LoggingRunner(log), RefusedCtl()
    ports = FakePorts(log, api, problem=HELD)
    daemon = daemon_on(api, options(tmp_path), runner=runner, commands=ctl, ports=ports)
    clock = daemon._clock
    assert isinstance(clock, FakeClock)
    start = clock.monotonic()
    seen: list[tuple[float, int]] = []

    def done() -> bool:
        seen.append((clock.monotonic() - start, len(not_ready_events(api))))
        return clock.monotonic() - start > 300

    run_until(daemon, done)
    (event,) = not_ready_events(api)
    assert event["type"] == "Warning"
    assert event["involvedObject"]["kind"] == "Pod"
    assert event["involvedObject"]["name"] == "daemon-n0"
    message = event["message"]
    assert message.startswith(
        "nvidia-imex on node n0 (pod IP 10.0.0.1) has not been ready for 60s since the daemon "
        "started (IMEX_START_TIMEOUT=60s); last error: "
    ), message
    assert HELD in message
    assert (
        "nvidia-imex-ctl -q: exit code 1, output 'IMEX daemon not reachable: [Errno 111] "
        "Connection refused'" in message
    )
    assert all(n == 0 for t, n in seen if t < 60) and seen[-1][1] == 1


def test_a_bound_of_zero_reports_nothing(api: FakeApiServer, tmp_path: Path) -> None:
    daemon = daemon_on(
        api,
        options(tmp_path, IMEX_START_TIMEOUT="0"),
        runner=FakeRunner(),
        commands=RefusedCtl(),
        ports=FakePorts([], api),
    )
    clock = daemon._clock
    assert isinstance(clock, FakeClock)
    start = clock.monotonic()
    run_until(daemon, lambda: clock.monotonic() - start > 300)
    assert not_ready_events(api) == []


class RelapsingRunner(FakeRunner):  # type: ignore[misc]
    """The first child runs until the test ends it; every later one exits at once with 1."""

    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None) -> FakeProcess:
        proc: FakeProcess = super().start(argv, env=env)
        if len(self.procs) > 1:
            proc.code = 1
        return proc


def entry_status(api: FakeApiServer) -> object:
    cliques = api.objects(res.COMPUTE_DOMAIN_CLIQUES)
    daemons = cliques[0].get("daemons") if cliques else None
    return daemons[0]["status"] if daemons else None


def test_the_bound_counts_again_from_the_last_ready(api: FakeApiServer, tmp_path: Path) -> None:
    """Ready once, then IMEX crashes and every restart fails: reported once, 30 s after it
    was last ready, with the supervisor's last exit."""
    runner = RelapsingRunner()
    daemon = daemon_on(
        api,
        options(tmp_path, IMEX_START_TIMEOUT="30s"),
        runner=runner,
        commands=FakeCtl(runner),
        ports=FakePorts([], api),
    )
    clock = daemon._clock
    assert isinstance(clock, FakeClock)
    ready_at: float | None = None

    def done() -> bool:
        nonlocal ready_at
        if ready_at is None and entry_status(api) == c.STATUS_READY:
            ready_at = clock.monotonic()
            runner.procs[0].code = 1
        return ready_at is not None and clock.monotonic() - ready_at > 200

    run_until(daemon, done)
    assert len(runner.procs) > 2  # restarted, and failed again
    (event,) = not_ready_events(api)
    message = event["message"]
    assert "has not been ready for 30s since it was last ready (IMEX_START_TIMEOUT=30s)" in message
    assert "nvidia-imex exited unexpectedly with exit code 1 after " in message


def test_the_not_ready_report_is_a_deadline_of_an_idle_loop(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """With nothing else due (IMEX not started, no restart pending) the loop would sleep until
    kicked; the report's deadline wakes it, and once reported it sleeps until kicked again."""
    daemon = daemon_on(
        api, options(tmp_path), runner=FakeRunner(), commands=RefusedCtl(), ports=FakePorts([], api)
    )
    now = daemon._clock.monotonic()
    assert daemon._idle_wait(full=False, failed=False) is None  # the loop has not begun
    daemon._not_ready_since = now - 20.0
    assert daemon._idle_wait(full=False, failed=False) == 40.0
    assert daemon._idle_wait(full=True, failed=False) == Timing().slow_interval
    daemon._not_ready_since = now - 55.0
    assert daemon._idle_wait(full=True, failed=False) == 5.0
    daemon._not_ready_warned = True
    assert daemon._idle_wait(full=False, failed=False) is None


def test_a_restart_for_a_new_index_polls_the_new_imex_at_once(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """Our entry's index moved (re-created clique): IMEX is restarted, and the new child's
    readiness is asked in the same pass; before, the old child's Ready stood for up to a
    minute (the next re-check) whatever the new one said."""
    runner = FakeRunner()
    ctl = FakeCtl(runner)
    daemon = daemon_on(
        api, options(tmp_path), runner=runner, commands=ctl, ports=FakePorts([], api)
    )
    daemon._write_imex_config()
    with following(daemon):
        daemon.step()
        assert own_entry(api)["status"] == c.STATUS_READY and len(runner.procs) == 1
        calls = ctl.calls
        client = api.client()
        (clique,) = api.objects(res.COMPUTE_DOMAIN_CLIQUES)
        clique["daemons"][0]["index"] = 3
        daemon._kick.clear()
        observe(daemon, client.update(res.COMPUTE_DOMAIN_CLIQUES, clique))
        daemon.step()
    assert len(runner.procs) == 2 and runner.procs[0].code is not None
    assert ctl.calls == calls + 1


def test_a_clique_deleted_under_a_running_daemon_is_recreated_and_imex_follows(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """Force-deleted daemon pods: the garbage collector deletes the clique with its last owner
    while the new daemon already wrote its entry there (over the old pod's, at index 1). The
    delete wakes the loop, which creates the clique again with its entry at the lowest free
    index and restarts IMEX for the new index; ruled out as the cause of a daemon whose IMEX
    never starts."""
    runner = FakeRunner()
    ctl = FakeCtl(runner)
    opts = options(tmp_path, **{c.CLIQUE_JOIN_BY_CONTROLLER_ENV: "true"})
    daemon = daemon_on(api, opts, runner=runner, commands=ctl, ports=FakePorts([], api))
    daemon._write_imex_config()
    client = api.client()
    client.create(
        res.COMPUTE_DOMAIN_CLIQUES,
        {
            "apiVersion": c.API_VERSION,
            "kind": c.COMPUTE_DOMAIN_CLIQUE_KIND,
            "metadata": {
                "name": f"{UID}.{CLIQUE}",
                "namespace": NS,
                "labels": {c.COMPUTE_DOMAIN_LABEL: UID, c.CLIQUE_ID_LABEL: CLIQUE},
            },
            "daemons": [
                {
                    "nodeName": "n1",
                    "ipAddress": "10.0.0.2",
                    "cliqueID": CLIQUE,
                    "index": 0,
                    "status": "Ready",
                },
                {
                    "nodeName": "n0",
                    "ipAddress": "10.9.9.9",
                    "cliqueID": CLIQUE,
                    "index": 1,
                    "status": "Ready",
                },
            ],
        },
        namespace=NS,
    )
    with following(daemon):
        eventually(lambda: (snap := daemon._snapshot()) is not None and len(snap[0]) == 2)
        daemon.step()  # the old pod's entry: new IP, same index; IMEX starts
        (clique,) = api.objects(res.COMPUTE_DOMAIN_CLIQUES)
        assert clique["daemons"][1]["ipAddress"] == "10.0.0.1" and len(runner.procs) == 1
        daemon._kick.clear()
        client.delete(res.COMPUTE_DOMAIN_CLIQUES, f"{UID}.{CLIQUE}", namespace=NS)
        eventually(lambda: daemon._snapshot() == ([], None))
        eventually(daemon._kick.is_set, what="the delete wakes the loop")
        daemon.step()
    (clique,) = api.objects(res.COMPUTE_DOMAIN_CLIQUES)
    assert [(d["nodeName"], d["ipAddress"], d["index"]) for d in clique["daemons"]] == [
        ("n0", "10.0.0.1", 0)
    ]
    assert clique["metadata"]["ownerReferences"][0]["uid"] == "pu"
    assert len(runner.procs) == 2 and runner.procs[0].code is not None  # restarted: new index
    assert daemon.supervisor.running()
