"""Supervision of one ``nvidia-imex`` child process.

Owns the child's lifecycle: start, reload (SIGUSR1), restart after an unexpected exit with capped
exponential backoff, and stop (SIGTERM, bounded wait, then SIGKILL). The process is created by an
injected :class:`ProcessRunner` and time comes from an injected :class:`Clock`, so tests drive it
with fakes and never sleep.

Invariants:
- at most one child exists at a time; every public method holds one lock;
- an unexpected exit is reaped and logged with its exit code (or signal) by :meth:`tick`, and the
  child is started again no earlier than the backoff allows; the backoff doubles per consecutive
  crash up to ``cap`` and resets once a child stayed up ``stable_after`` seconds;
- after :meth:`stop` nothing is ever started again;
- a reload requested within ``reload_grace`` seconds of a start is deferred to :meth:`tick`: a
  child that has not installed its SIGUSR1 handler yet would die from the signal.

The caller runs :meth:`tick` when something is due, not on a fixed period: when the child exits
(with ``on_exit`` given, a thread blocked in the child's ``wait()`` calls it as soon as the child
it watches exits while still being the supervised one) and at :meth:`next_due` (a restart after
the crash backoff, a deferred reload). A caller without ``on_exit`` polls :meth:`tick` as before.
Events go to a :class:`SupervisorObserver` (metrics) so this module needs no metrics library.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from pkg.base.clock import Clock

log = logging.getLogger(__name__)


class Process(Protocol):
    """A started child process (the subset of :class:`subprocess.Popen` we use)."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None:
        """Exit code if exited (negative: killed by that signal), else None."""

    def send_signal(self, sig: int) -> None: ...

    def wait(self, timeout: float | None = None) -> int:
        """Exit code; raises :class:`subprocess.TimeoutExpired` after ``timeout``. Safe while
        another thread is blocked in ``wait()`` (``None``: until the process exits) on the same
        process, as :class:`subprocess.Popen` is."""

    def kill(self) -> None: ...


class ProcessRunner(Protocol):
    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None) -> Process:
        """Start ``argv``; raises OSError if it cannot be executed."""


class SupervisorObserver(Protocol):
    def started(self, *, pid: int, restarts: int) -> None: ...

    def exited(self, *, code: int, expected: bool) -> None: ...

    def reloaded(self) -> None: ...


class SubprocessRunner:
    """Real runner: the child inherits stdout/stderr, so IMEX logs land in the pod log."""

    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None) -> Process:
        return subprocess.Popen(
            list(argv), env=dict(env) if env is not None else None, stdin=subprocess.DEVNULL
        )


class NullObserver:
    def started(self, *, pid: int, restarts: int) -> None:
        pass

    def exited(self, *, code: int, expected: bool) -> None:
        pass

    def reloaded(self) -> None:
        pass


@dataclass(frozen=True)
class BackoffPolicy:
    """Delay before restarting a crashed child: ``initial * factor**(n-1)``, at most ``cap``."""

    initial: float = 1.0
    factor: float = 2.0
    cap: float = 30.0
    stable_after: float = 60.0

    def delay(self, consecutive_crashes: int) -> float:
        if consecutive_crashes <= 0:
            return 0.0
        return float(min(self.cap, self.initial * self.factor ** (consecutive_crashes - 1)))


def describe_exit(code: int) -> str:
    """``"exit code 3"`` or ``"signal SIGKILL"``."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class Supervisor:
    """Keeps ``argv`` running; see the module docstring for the guarantees."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        runner: ProcessRunner,
        clock: Clock,
        env: Mapping[str, str] | None = None,
        backoff: BackoffPolicy | None = None,
        stop_timeout: float = 10.0,
        reload_grace: float = 2.0,
        observer: SupervisorObserver | None = None,
        name: str = "nvidia-imex",
        on_exit: Callable[[], None] | None = None,
    ) -> None:
        """``on_exit`` (optional) is called, from a thread of its own per child, when the
        supervised child exits by itself, so the caller can :meth:`tick` at once instead of
        polling; it is not called for a child :meth:`stop` or :meth:`restart` ended."""
        self._argv = list(argv)
        self._runner = runner
        self._clock = clock
        self._env = dict(env) if env is not None else None
        self._backoff = backoff or BackoffPolicy()
        self._stop_timeout = stop_timeout
        self._reload_grace = reload_grace
        self._observer: SupervisorObserver = observer or NullObserver()
        self._name = name
        self._on_exit = on_exit
        self._lock = threading.RLock()
        self._proc: Process | None = None
        self._started_at = 0.0
        self._next_start: float | None = None  # pending restart after a crash
        self._crashes = 0
        self._restarts = 0
        self._reloads = 0
        self._reload_pending = False
        self._stopped = False
        self._last_problem = ""

    @property
    def restarts(self) -> int:
        return self._restarts

    @property
    def reloads(self) -> int:
        return self._reloads

    @property
    def last_problem(self) -> str:
        """The last unexpected exit or failed start, in words (``""``: none yet); kept after a
        successful restart, so a child that keeps failing can be explained."""
        with self._lock:
            return self._last_problem

    @property
    def pid(self) -> int | None:
        with self._lock:
            return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        with self._lock:
            return self._proc is not None and self._proc.poll() is None

    def ensure_started(self) -> bool:
        """Start the child unless it exists or a crash backoff is pending; True if started now."""
        with self._lock:
            if self._stopped or self._proc is not None or self._next_start is not None:
                return False
            self._start()
            return True

    def reload(self) -> bool:
        """Ask a running child to re-read its config (SIGUSR1); False if none is running."""
        with self._lock:
            if self._stopped or self._proc is None or self._proc.poll() is not None:
                return False
            if self._clock.monotonic() - self._started_at < self._reload_grace:
                self._reload_pending = True
                return True
            self._send_reload()
            return True

    def restart(self) -> None:
        """Stop the child (if any) and start a new one now, e.g. after a config rewrite."""
        with self._lock:
            if self._stopped:
                return
            if self._proc is not None:
                self._terminate(expected=True)
            self._next_start = None
            self._restarts += 1
            self._start()

    def next_due(self) -> float | None:
        """Monotonic time of the next thing :meth:`tick` has to do by itself (a restart after
        the crash backoff, a deferred reload), or None: nothing until the child exits."""
        with self._lock:
            if self._stopped:
                return None
            due = []
            if self._next_start is not None:
                due.append(self._next_start)
            if self._reload_pending and self._proc is not None:
                due.append(self._started_at + self._reload_grace)
            return min(due, default=None)

    def tick(self) -> None:
        """Reap an unexpected exit, start a due restart, send a deferred reload."""
        with self._lock:
            if self._stopped:
                return
            now = self._clock.monotonic()
            if self._proc is not None:
                code = self._proc.poll()
                if code is None:
                    if now - self._started_at >= self._backoff.stable_after:
                        self._crashes = 0
                    if self._reload_pending and now - self._started_at >= self._reload_grace:
                        self._send_reload()
                    return
                ran = now - self._started_at
                self._proc = None
                self._reload_pending = False
                if ran >= self._backoff.stable_after:
                    self._crashes = 0
                self._crashes += 1
                delay = self._backoff.delay(self._crashes)
                self._next_start = now + delay
                self._last_problem = (
                    f"{self._name} exited unexpectedly with {describe_exit(code)} after {ran:.1f}s "
                    f"({self._crashes} in a row)"
                )
                log.warning(
                    "%s exited unexpectedly with %s after %.1fs; restarting in %.1fs "
                    "(consecutive crashes: %d)",
                    self._name,
                    describe_exit(code),
                    ran,
                    delay,
                    self._crashes,
                )
                self._observer.exited(code=code, expected=False)
            if self._next_start is not None and now >= self._next_start:
                self._next_start = None
                self._restarts += 1
                self._start()

    def stop(self) -> int | None:
        """Terminate the child for good; returns its exit code (None if none was running)."""
        with self._lock:
            self._stopped = True
            self._next_start = None
            if self._proc is None:
                return None
            return self._terminate(expected=True)

    def _start(self) -> None:
        try:
            proc = self._runner.start(self._argv, env=self._env)
        except OSError as err:
            # Counts as a crash: a missing binary must not turn into a hot loop.
            self._crashes += 1
            delay = self._backoff.delay(self._crashes)
            self._next_start = self._clock.monotonic() + delay
            self._last_problem = f"cannot start {self._name}: {err}"
            log.error(
                "cannot start %s (%s): %s; retrying in %.1fs",
                self._name,
                " ".join(self._argv),
                err,
                delay,
            )
            self._observer.exited(code=127, expected=False)
            return
        self._proc = proc
        self._started_at = self._clock.monotonic()
        self._reload_pending = False
        if self._on_exit is not None:
            threading.Thread(
                target=self._watch,
                args=(proc, self._on_exit),
                name=f"{self._name}-exit",
                daemon=True,
            ).start()
        log.info(
            "started %s pid=%d restarts=%d: %s",
            self._name,
            proc.pid,
            self._restarts,
            " ".join(self._argv),
        )
        self._observer.started(pid=proc.pid, restarts=self._restarts)

    def _watch(self, proc: Process, on_exit: Callable[[], None]) -> None:
        """Block until ``proc`` exits; then tell ``on_exit`` if it was still ours to supervise
        (a child :meth:`stop` or :meth:`restart` ended has been reaped under the lock)."""
        proc.wait()
        with self._lock:
            ours = self._proc is proc and not self._stopped
        if ours:
            on_exit()

    def _send_reload(self) -> None:
        assert self._proc is not None
        self._reload_pending = False
        self._proc.send_signal(signal.SIGUSR1)
        self._reloads += 1
        log.info(
            "sent SIGUSR1 to %s pid=%d (reloads=%d)", self._name, self._proc.pid, self._reloads
        )
        self._observer.reloaded()

    def _terminate(self, *, expected: bool) -> int:
        proc = self._proc
        assert proc is not None
        self._proc = None
        self._reload_pending = False
        code = proc.poll()
        if code is None:
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=self._stop_timeout)
            except subprocess.TimeoutExpired:
                log.warning(
                    "%s pid=%d ignored SIGTERM for %.0fs; sending SIGKILL",
                    self._name,
                    proc.pid,
                    self._stop_timeout,
                )
                proc.kill()
                code = proc.wait(timeout=None)
        log.info("%s pid=%d stopped with %s", self._name, proc.pid, describe_exit(code))
        self._observer.exited(code=code, expected=expected)
        return code
