"""The daemon's idle wakeups: an idle loop sleeps until a real deadline or a kick.

Each test fails if one of the removed timers comes back: the loop's 1 s tick (the child's exit
kicks it instead), ``nvidia-imex-ctl -q`` every 10 s while Ready (the readiness probe tells the
loop instead; the loop's own re-check every 60 s is the safety net), the informer's 240 s resync
and the fixed 5 s peer poll (it backs off to 30 s while nothing changes). Time is the injected
fake clock's; nothing here asserts real durations.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from test_daemon_daemon import (  # type: ignore[import-not-found, unused-ignore]
    FakeCtl,
    FakeProcess,
    FakeRunner,
    following,
    make,
    observe,
    options,
    own_entry,
    own_entry_of,
    record_timeouts,
    seed_clique,
)

from pkg.api import constants as c
from pkg.daemon.check import ProbeNotices, notice_address, run_check
from pkg.daemon.daemon import Daemon, Timing
from pkg.daemon.metrics import DaemonMetrics
from pkg.imex.ctl import CommandResult
from pkg.kube import resources as res
from pkg.testing.clock import FakeClock
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer


class SwitchableCtl:
    """READY whenever the latest fake IMEX runs (as `FakeCtl`), unless the test sets
    ``ready = False``: then a running IMEX answers NOT_READY."""

    def __init__(self, runner: FakeRunner) -> None:
        self.runner = runner
        self.ready = True
        self.queries = 0

    def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        self.queries += 1
        alive = bool(self.runner.procs) and self.runner.procs[-1].code is None
        return CommandResult(0, "READY\n" if alive and self.ready else "NOT_READY\n")


def stepped_daemon(api: FakeApiServer, tmp: Path) -> tuple[Daemon, FakeRunner, SwitchableCtl]:
    """A daemon whose loop clock moves only when the test steps it."""
    runner = FakeRunner()
    ctl = SwitchableCtl(runner)
    daemon = Daemon(
        options(tmp),
        client=api.client(),
        clock=FakeClock(start=100.0, monotonic_start=100.0),
        runner=runner,
        commands=ctl,
        metrics=DaemonMetrics(),
        child_env={"PATH": "/bin"},
        timing=Timing(ready_write_spread=0.0),
        informer_clock=FakeClock(advance_on_wait=True),
        locate=lambda program: f"/usr/bin/{program}",
    )
    return daemon, runner, ctl


def running(daemon: Daemon) -> tuple[threading.Event, threading.Thread]:
    stop = threading.Event()
    ran = threading.Thread(target=daemon.run, args=(stop,))
    ran.start()
    return stop, ran


def stopped(daemon: Daemon, stop: threading.Event, ran: threading.Thread) -> None:
    stop.set()
    daemon.wake()
    ran.join(20)
    assert not ran.is_alive()


def status(api: FakeApiServer) -> object:
    cliques = api.objects(res.COMPUTE_DOMAIN_CLIQUES)
    return own_entry(api)["status"] if cliques and cliques[0].get("daemons") else None


# -- item 1: the main loop tick ------------------------------------------------------------------


@pytest.mark.parametrize("probe_can_notify", [True, False], ids=["probe-notifies", "no-listener"])
def test_a_ready_daemon_alone_wakes_only_for_its_readiness_recheck(
    api: FakeApiServer, tmp_path: Path, probe_can_notify: bool
) -> None:
    """Ready, alone in its clique, nothing changing: every wait of the loop lasts until the
    readiness re-check (60 s while the probe can notify the loop, the 10 s poll when another
    process holds the notice address), and each wake runs one ``nvidia-imex-ctl -q``. The loop
    woke every 1 s before, polling the child and re-reading IMEX's files."""
    daemon, _, ctl, _ = make(api, options(tmp_path))
    clock = daemon._clock
    assert isinstance(clock, FakeClock)
    squatter = ProbeNotices(notice_address(daemon.opts), lambda: None)
    if not probe_can_notify:
        assert squatter.start()
    stop = threading.Event()

    def count(event: threading.Event) -> None:
        # The sixth timed wait is the last: then the loop sees stop. A wait whose kick is
        # already set (the informer delivering the echo of the loop's own clique write, which
        # may land at any point of this virtual-time run) returns at once, is not recorded and
        # does not count: stopping there left five waits (a flake on a clean clone).
        if len(clock.waits) >= 5 and not event.is_set():
            stop.set()

    clock.on_wait = count
    try:
        daemon.run(stop)
    finally:
        squatter.close()
    t = Timing()
    expected = t.ready_recheck_interval if probe_can_notify else t.slow_interval
    assert clock.waits == [expected] * 6
    assert ctl.calls == 6  # the first pass's query, then one per wake but the last
    assert api.objects(res.COMPUTE_DOMAIN_CLIQUES)[0]["daemons"] == []  # left at stop


def test_the_childs_exit_wakes_the_loop_and_its_restart_is_a_deadline(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """Nothing polls the nvidia-imex child: its exit wakes the loop (virtual time stands
    still, the entry turns NotReady), and the loop sleeps until the crash backoff is over."""
    daemon, runner, _ = stepped_daemon(api, tmp_path)
    clock = daemon._clock
    assert isinstance(clock, FakeClock)
    stop, ran = running(daemon)
    try:
        eventually(lambda: status(api) == c.STATUS_READY)
        runner.procs[0].code = 1  # IMEX crashes; the clock does not move
        eventually(lambda: status(api) == c.STATUS_NOT_READY, what="NotReady without a tick")
        assert len(runner.procs) == 1
        assert clock.block_until_waiters(1)  # asleep until the 1 s backoff is over
        clock.step(1.0)

        def restarted() -> bool:
            if len(runner.procs) == 2 and status(api) == c.STATUS_READY:
                return True
            clock.step(0.01)  # the loop may have gone to sleep after the first step
            return False

        eventually(restarted, what="restarted and Ready again")
    finally:
        stopped(daemon, stop, ran)


def test_the_wait_for_the_controllers_entry_is_a_deadline(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """CLIQUE_JOIN_BY_CONTROLLER: the loop sleeps until the grace ends (or the entry comes);
    with no tick, the grace's end must be one of its deadlines."""
    opts = options(tmp_path, **{c.CLIQUE_JOIN_BY_CONTROLLER_ENV: "true"})
    daemon, _, _, _ = make(api, opts)
    clock = daemon._clock
    assert isinstance(clock, FakeClock)
    timeouts = record_timeouts(clock)
    stop, ran = running(daemon)
    try:
        eventually(lambda: timeouts)
    finally:
        stopped(daemon, stop, ran)
    assert timeouts[0] == Timing().controller_join_grace


# -- item 2: the informer resync -----------------------------------------------------------------


def test_the_membership_informer_does_not_resync(api: FakeApiServer, tmp_path: Path) -> None:
    """The loop is level-triggered: a replay of its one cached object would only wake it.
    With a resync period the informer's resync thread sleeps on the informer clock until the
    next replay; without one it waits for no time at all."""
    assert Timing().resync_seconds == 0
    informer_clock = FakeClock()
    runner = FakeRunner()
    daemon = Daemon(
        options(tmp_path),
        client=api.client(),
        clock=FakeClock(),
        runner=runner,
        commands=FakeCtl(runner),
        metrics=DaemonMetrics(),
        child_env={"PATH": "/bin"},
        informer_clock=informer_clock,
        locate=lambda program: f"/usr/bin/{program}",
    )
    woken = threading.Event()
    daemon._changed = woken.set  # type: ignore[method-assign]
    with following(daemon):
        seed_clique(api.client(), [("x1", "10.0.1.1", 1)])
        assert woken.wait(10)  # the informer delivers events
        woken.clear()
        assert not informer_clock.block_until_waiters(1, timeout=0.5)  # no resync timer
        informer_clock.step(10 * 240.0)
        assert not informer_clock.block_until_waiters(1, timeout=0.2)
    assert not woken.is_set()


# -- item 3: readiness, shared with the probe ----------------------------------------------------


def test_a_failed_probe_tells_the_loop_and_a_passing_one_does_not(tmp_path: Path) -> None:
    """The probe's answer is upstream's either way; a failure also reaches the listener."""
    opts = options(tmp_path)
    notices: list[int] = []
    got = threading.Event()

    def on_notice() -> None:
        notices.append(1)
        got.set()

    listener = ProbeNotices(notice_address(opts), on_notice)
    assert listener.start()
    try:
        runner = FakeRunner()
        ok, msg = run_check(opts, FakeCtl(runner))
        assert not ok and msg.startswith("check failed: IMEX daemon not ready:")
        assert got.wait(10) and notices == [1]
        runner.procs.append(FakeProcess(1))
        assert run_check(opts, FakeCtl(runner)) == (True, "check succeeded (IMEX daemon is READY)")
        got.clear()
        assert not run_check(options(tmp_path / "other"), FakeCtl(FakeRunner()))[0]
        assert not got.wait(0.2) and notices == [1]  # another daemon's probe: not ours
        assert not ProbeNotices(notice_address(opts), lambda: None).start()  # address taken
    finally:
        listener.close()
    assert not run_check(opts, FakeCtl(FakeRunner()))[0]  # nobody listens: the same answer


def test_a_probe_that_finds_imex_not_ready_makes_the_loop_recheck_at_once(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """While Ready the loop runs ``nvidia-imex-ctl -q`` itself only every 60 s: an IMEX that
    stops being ready between two re-checks is noticed through the probe, whose failure makes
    the loop query at once (virtual time does not reach the next re-check)."""
    daemon, runner, ctl = stepped_daemon(api, tmp_path)
    clock = daemon._clock
    assert isinstance(clock, FakeClock)
    stop, ran = running(daemon)
    try:
        eventually(lambda: status(api) == c.STATUS_READY)
        assert clock.block_until_waiters(1)
        clock.step(1.0)  # past the rate limit of probe-triggered queries, far from 60 s
        queries = ctl.queries
        ctl.ready = False  # IMEX still runs but is not ready any more
        ok, _ = run_check(daemon.opts, ctl)  # the kubelet's readiness probe
        assert not ok
        eventually(lambda: status(api) == c.STATUS_NOT_READY, what="NotReady after the probe")
        assert ctl.queries == queries + 2  # the probe's and the loop's own
        assert len(runner.procs) == 1 and runner.procs[0].code is None
    finally:
        stopped(daemon, stop, ran)


def test_probe_notices_are_rate_limited_and_ignored_while_not_ready(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """Anyone in the container can send a notice; it costs at most one query per
    fast_interval, and none while not Ready (then the loop polls on its own schedule)."""
    daemon, _, ctl, _ = make(api, options(tmp_path))
    clock = daemon._clock
    assert isinstance(clock, FakeClock)
    daemon._write_imex_config()
    daemon.step()
    assert daemon._ready and ctl.calls == 1
    daemon._on_probe_notice()
    daemon.step()  # the last query was just now: the next one fast_interval after it
    assert ctl.calls == 1
    clock.step(Timing().fast_interval)
    daemon.step()
    assert ctl.calls == 2
    daemon._on_probe_notice()
    daemon._on_probe_notice()
    clock.step(Timing().fast_interval)
    daemon.step()
    daemon.step()
    assert ctl.calls == 3


# -- item 4: peer polls back off while nothing changes -------------------------------------------


def test_peer_polls_back_off_while_nothing_changes_and_come_back_on_a_change(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """5 s after Ready, then 5, 10, 20 and 30 s apart while the report stays the same; a
    change in the clique (here a peer joins) brings the next poll within 5 s."""
    seed_clique(api.client(), [("x1", "10.0.1.1", 1)])
    daemon, _, ctl, _ = make(api, options(tmp_path))
    clock = daemon._clock
    assert isinstance(clock, FakeClock)
    polls: list[float] = []
    answer = ctl.run
    connected = {"10.0.1.1"}

    def run(argv: Sequence[str], *, timeout: float) -> CommandResult:
        if "-N" in argv:
            polls.append(round(clock.monotonic() - start, 3))
            conns = {
                str(i): {"host": ip, "status": "CONNECTED"}
                for i, ip in enumerate(sorted(connected))
            }
            own = {"host": "10.0.0.1", "connections": conns}
            return CommandResult(0, json.dumps({"nodes": {"0": own}}))
        result: CommandResult = answer(argv, timeout=timeout)
        return result

    ctl.run = run  # type: ignore[method-assign, unused-ignore]
    daemon._write_imex_config()
    client = api.client()

    def step_to(until: float) -> None:
        while clock.monotonic() - start < until:
            clock.step(1.0)
            daemon.step()

    with following(daemon):
        start = clock.monotonic()
        daemon.step()
        assert own_entry_of(api, "n0")["status"] == c.STATUS_READY
        step_to(200)
        assert polls == [5, 10, 20, 40, 70, 100, 130, 160, 190]
        assert (own_entry_of(api, "n0")["connectedPeers"], daemon._peer_backoff) == (1, 30.0)
        (clique,) = api.objects(res.COMPUTE_DOMAIN_CLIQUES)
        clique["daemons"].append(
            {
                "nodeName": "x2",
                "ipAddress": "10.0.1.2",
                "cliqueID": clique["daemons"][0]["cliqueID"],
                "index": 2,
                "status": "Ready",
            }
        )
        daemon._kick.clear()
        observe(daemon, client.update(res.COMPUTE_DOMAIN_CLIQUES, clique))
        step_to(203)  # the change is seen at 201
        connected.add("10.0.1.2")
        step_to(230)
    assert polls[9:] == [206, 211, 221]  # back to 5 s, then backing off again
    assert own_entry_of(api, "n0")["connectedPeers"] == 2


def test_a_link_that_fails_after_the_backoff_is_confirmed_one_peer_interval_later(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """A link that fails once the polls backed off is seen by the next poll (at most
    peer_max_interval later) and confirmed (two polls in a row) peer_interval after it."""
    seed_clique(api.client(), [("x1", "10.0.1.1", 1)])
    daemon, _, ctl, _ = make(api, options(tmp_path))
    clock = daemon._clock
    assert isinstance(clock, FakeClock)
    polls: list[float] = []
    answer = ctl.run
    link = {"status": "CONNECTED"}

    def run(argv: Sequence[str], *, timeout: float) -> CommandResult:
        if "-N" in argv:
            polls.append(round(clock.monotonic() - start, 3))
            conns = {"1": {"host": "10.0.1.1", **link}}
            own = {"host": "10.0.0.1", "connections": conns}
            return CommandResult(0, json.dumps({"nodes": {"0": own}}))
        result: CommandResult = answer(argv, timeout=timeout)
        return result

    ctl.run = run  # type: ignore[method-assign, unused-ignore]
    daemon._write_imex_config()
    with following(daemon):
        start = clock.monotonic()
        daemon.step()
        while clock.monotonic() - start < 80:
            clock.step(1.0)
            daemon.step()
        link["status"] = "DISCONNECTED"
        while own_entry_of(api, "n0").get("unreachablePeers") != ["x1"]:
            clock.step(1.0)
            daemon.step()
    assert polls == [5, 10, 20, 40, 70, 100, 105]


def test_a_held_back_count_keeps_the_polls_at_peer_interval(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """A change of the connected count alone waits for peer_count_interval after the last
    count written; until it is written the polls do not back off, so it goes out on time."""
    peers = [("x1", "10.0.1.1", 1), ("x2", "10.0.1.2", 2), ("x3", "10.0.1.3", 3)]
    seed_clique(api.client(), peers)
    (clique,) = api.objects(res.COMPUTE_DOMAIN_CLIQUES)
    for entry in clique["daemons"]:
        entry["status"] = c.STATUS_NOT_READY  # still starting: never reported unreachable
    api.client().update(res.COMPUTE_DOMAIN_CLIQUES, clique)
    daemon, _, ctl, _ = make(api, options(tmp_path))
    clock = daemon._clock
    assert isinstance(clock, FakeClock)
    polls: list[float] = []
    written: list[tuple[float, object]] = []
    answer = ctl.run
    connected: list[str] = []

    def run(argv: Sequence[str], *, timeout: float) -> CommandResult:
        if "-N" in argv:
            polls.append(round(clock.monotonic() - start, 3))
            conns = {str(i): {"host": ip, "status": "CONNECTED"} for i, ip in enumerate(connected)}
            own = {"host": "10.0.0.1", "connections": conns}
            return CommandResult(0, json.dumps({"nodes": {"0": own}}))
        result: CommandResult = answer(argv, timeout=timeout)
        return result

    ctl.run = run  # type: ignore[method-assign, unused-ignore]
    set_connectivity = daemon.membership.set_connectivity

    def cached_count() -> object:
        snap = daemon._snapshot()
        own = [e for e in (snap[0] if snap else []) if e.node_name == "n0"]
        return own[0].connected_peers if own else None

    def recording(count: int, unreachable: tuple[str, ...]) -> object:
        written.append((round(clock.monotonic() - start, 3), count))
        entries = set_connectivity(count, unreachable)
        # The loop outruns the informer here (no real time passes between passes); a cache
        # that has not seen our write yet would make a later pass write the count again.
        eventually(lambda: cached_count() == count)
        return entries

    daemon.membership.set_connectivity = recording  # type: ignore[method-assign, unused-ignore]
    daemon._write_imex_config()
    with following(daemon):
        start = clock.monotonic()
        daemon.step()
        while clock.monotonic() - start < 70:
            if clock.monotonic() - start >= 7:
                connected[:] = ["10.0.1.1"]
            clock.step(1.0)
            daemon.step()
    interval = Timing().peer_count_interval
    assert written == [(5, 0), (5 + interval, 1)]
    assert polls == [5, 10, 15, 20, 25, 30, 35, 45, 65]
