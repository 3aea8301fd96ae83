"""Supervisor: start, crash restart with capped backoff, SIGUSR1 reload, SIGTERM then SIGKILL.

Runs on a fake process runner and a fake clock: nothing sleeps.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pytest

from pkg.imex.supervisor import BackoffPolicy, Supervisor, describe_exit
from pkg.testing.clock import FakeClock
from pkg.testing.eventually import eventually


@dataclass
class FakeProcess:
    pid: int
    code: int | None = None
    ignores_term: bool = False
    signals: list[int] = field(default_factory=list)

    def poll(self) -> int | None:
        return self.code

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        if sig == signal.SIGTERM and not self.ignores_term:
            self.code = 0

    def wait(self, timeout: float | None = None) -> int:
        if self.code is None:
            raise subprocess.TimeoutExpired("imex", timeout or 0)
        return self.code

    def kill(self) -> None:
        self.signals.append(signal.SIGKILL)
        self.code = -signal.SIGKILL


class FakeRunner:
    def __init__(self) -> None:
        self.procs: list[FakeProcess] = []
        self.fail_next = 0
        self.env: Mapping[str, str] | None = None

    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None) -> FakeProcess:
        if self.fail_next:
            self.fail_next -= 1
            raise FileNotFoundError(2, "No such file", argv[0])
        self.env = env
        proc = FakeProcess(pid=100 + len(self.procs))
        self.procs.append(proc)
        return proc


class RecordingObserver:
    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def started(self, *, pid: int, restarts: int) -> None:
        self.events.append(("started", restarts))

    def exited(self, *, code: int, expected: bool) -> None:
        self.events.append(("exited" if expected else "crashed", code))

    def reloaded(self) -> None:
        self.events.append(("reloaded", 0))


@pytest.fixture
def parts() -> tuple[Supervisor, FakeRunner, FakeClock, RecordingObserver]:
    runner, clock, obs = FakeRunner(), FakeClock(monotonic_start=1000.0), RecordingObserver()
    sup = Supervisor(
        ["nvidia-imex", "-c", "/imexd/imexd.cfg"],
        runner=runner,
        clock=clock,
        env={"IMEX_HOSTS_FILE": "/h"},
        backoff=BackoffPolicy(initial=1.0, factor=2.0, cap=8.0, stable_after=60.0),
        observer=obs,
        reload_grace=1.0,
    )
    return sup, runner, clock, obs


Parts = tuple[Supervisor, FakeRunner, FakeClock, RecordingObserver]


def test_ensure_started_is_idempotent(parts: Parts) -> None:
    sup, runner, _, _ = parts
    assert sup.ensure_started()
    assert not sup.ensure_started()
    assert len(runner.procs) == 1 and sup.running() and sup.pid == 100
    assert runner.env == {"IMEX_HOSTS_FILE": "/h"}


def test_crash_restarts_with_capped_exponential_backoff(parts: Parts) -> None:
    sup, runner, clock, obs = parts
    sup.ensure_started()
    delays = []
    for _ in range(6):
        runner.procs[-1].code = 3
        sup.tick()  # reaps the crash, schedules the restart
        start = clock.monotonic()
        n = len(runner.procs)
        while len(runner.procs) == n:
            clock.step(0.25)
            sup.tick()
        delays.append(clock.monotonic() - start)
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert sup.restarts == 6
    assert ("crashed", 3) in obs.events
    assert not sup.ensure_started()  # a running child is never doubled


def test_backoff_resets_after_stable_run(parts: Parts) -> None:
    sup, runner, clock, _ = parts
    sup.ensure_started()
    for _ in range(3):
        runner.procs[-1].code = 1
        sup.tick()
        clock.step(10)
        sup.tick()
    clock.step(61)
    sup.tick()
    runner.procs[-1].code = 1
    sup.tick()
    clock.step(1.0)
    sup.tick()
    assert len(runner.procs) == 5  # restarted after the initial 1 s delay again


def test_ensure_started_respects_pending_backoff(parts: Parts) -> None:
    sup, runner, clock, _ = parts
    sup.ensure_started()
    runner.procs[-1].code = -signal.SIGSEGV
    sup.tick()
    assert not sup.ensure_started()
    assert not sup.reload()
    clock.step(1)
    sup.tick()
    assert sup.running()


def test_reload_sends_sigusr1_after_grace(parts: Parts) -> None:
    sup, runner, clock, obs = parts
    sup.ensure_started()
    assert sup.reload()  # too young: deferred, not sent
    assert runner.procs[0].signals == []
    clock.step(1.0)
    sup.tick()
    assert runner.procs[0].signals == [signal.SIGUSR1]
    assert sup.reload()
    assert runner.procs[0].signals == [signal.SIGUSR1, signal.SIGUSR1]
    assert sup.reloads == 2 and obs.events.count(("reloaded", 0)) == 2


def test_reload_without_process_is_noop(parts: Parts) -> None:
    sup, _, _, _ = parts
    assert not sup.reload()


def test_restart_terminates_and_starts(parts: Parts) -> None:
    sup, runner, _, obs = parts
    sup.ensure_started()
    sup.restart()
    assert runner.procs[0].signals == [signal.SIGTERM]
    assert len(runner.procs) == 2 and sup.restarts == 1
    assert ("exited", 0) in obs.events


def test_stop_escalates_to_sigkill(parts: Parts) -> None:
    sup, runner, clock, _ = parts
    sup.ensure_started()
    runner.procs[0].ignores_term = True
    assert sup.stop() == -signal.SIGKILL
    assert runner.procs[0].signals == [signal.SIGTERM, signal.SIGKILL]
    clock.step(100)
    sup.tick()
    assert not sup.ensure_started()
    sup.restart()
    assert len(runner.procs) == 1  # stopped for good


def test_missing_binary_is_retried_with_backoff(parts: Parts) -> None:
    sup, runner, clock, obs = parts
    runner.fail_next = 2
    assert sup.ensure_started()
    assert not runner.procs and ("crashed", 127) in obs.events
    clock.step(1)
    sup.tick()  # second failure, next delay 2 s
    clock.step(1.5)
    sup.tick()
    assert not runner.procs
    clock.step(0.5)
    sup.tick()
    assert len(runner.procs) == 1


@pytest.mark.parametrize(
    ("code", "text"),
    [(0, "exit code 0"), (3, "exit code 3"), (-9, "signal SIGKILL"), (-200, "signal 200")],
)
def test_describe_exit(code: int, text: str) -> None:
    assert describe_exit(code) == text


class ExitingProcess(FakeProcess):
    """`FakeProcess` whose ``wait()`` blocks until it exits, like ``Popen.wait``."""

    def __init__(self, pid: int) -> None:
        super().__init__(pid)
        self.exited = threading.Event()

    def exit(self, code: int) -> None:
        self.code = code
        self.exited.set()

    def send_signal(self, sig: int) -> None:
        super().send_signal(sig)
        if self.code is not None:
            self.exited.set()

    def wait(self, timeout: float | None = None) -> int:
        if not self.exited.wait(timeout):
            raise subprocess.TimeoutExpired("imex", timeout or 0)
        assert self.code is not None
        return self.code


class ExitingRunner(FakeRunner):
    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None) -> FakeProcess:
        proc = ExitingProcess(pid=100 + len(self.procs))
        self.procs.append(proc)
        return proc


def test_an_exit_is_reported_at_once_and_the_restart_is_a_deadline() -> None:
    """Nobody has to poll the child: its own exit calls on_exit (from the watcher thread),
    and next_due says when tick has the restart to do; an exit stop() or restart() caused is
    not reported."""
    runner, clock = ExitingRunner(), FakeClock(monotonic_start=1000.0)
    exits: list[int] = []
    sup = Supervisor(
        ["nvidia-imex"],
        runner=runner,
        clock=clock,
        reload_grace=1.0,
        backoff=BackoffPolicy(initial=2.0),
        on_exit=lambda: exits.append(1),
    )
    sup.ensure_started()
    assert sup.next_due() is None  # running, nothing pending: only its exit matters
    assert sup.reload()  # too young: deferred, and due at the end of the grace
    assert sup.next_due() == 1001.0
    clock.step(1.0)
    sup.tick()
    assert sup.next_due() is None
    proc = runner.procs[0]
    assert isinstance(proc, ExitingProcess)
    proc.exit(3)
    eventually(lambda: exits == [1])
    sup.tick()  # reaps it, schedules the restart
    assert sup.next_due() == 1003.0 and not sup.running()
    clock.step(2.0)
    sup.tick()
    assert sup.running() and len(runner.procs) == 2
    sup.restart()
    sup.stop()
    assert [p.code for p in runner.procs] == [3, 0, 0]
    for p in runner.procs:
        assert isinstance(p, ExitingProcess) and p.exited.is_set()
    assert sup.next_due() is None
    threading.Event().wait(0.1)  # the watchers of the children it ended must not report
    assert exits == [1]


def test_last_problem_names_the_last_crash_and_failed_start(parts: Parts) -> None:
    """What the daemon's not-ready report quotes: kept across a successful restart."""
    sup, runner, clock, _ = parts
    assert sup.last_problem == ""
    sup.ensure_started()
    clock.step(0.5)
    runner.procs[-1].code = 1
    sup.tick()
    assert (
        sup.last_problem
        == "nvidia-imex exited unexpectedly with exit code 1 after 0.5s (1 in a row)"
    )
    runner.fail_next = 1
    clock.step(1.0)
    sup.tick()
    assert sup.last_problem.startswith("cannot start nvidia-imex: ")
    assert "No such file" in sup.last_problem
    clock.step(2.0)
    sup.tick()
    assert sup.running() and sup.last_problem.startswith("cannot start nvidia-imex: ")
