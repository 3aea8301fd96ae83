"""Child processes of the local cluster: free ports, spawning, health waits, stopping, log tails.

Owns the lifecycle of one OS process (``Proc``): it is started in its own session with stdout and
stderr going to ``<logs>/<name>.log``, optionally with ``PR_SET_PDEATHSIG`` so it dies with the
Python process that started it, and stopped with SIGTERM then SIGKILL on its process group.
Knows nothing about Kubernetes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pkg.testing.eventually import eventually


class ClusterError(RuntimeError):
    """A component failed to start or become healthy."""


SETPRIV = "/usr/bin/setpriv"  # util-linux (Essential in Debian): sets PDEATHSIG, then execs


def pid_alive(pid: int, exe: str | None = None) -> bool:
    """True if ``pid`` runs (and, when given, its argv[0] is ``exe``: guards PID reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    return exe is None or cmdline.split(b"\0", 1)[0].decode() == exe


@dataclass
class Proc:
    """A started component. ``popen`` is None when re-attached from a state file."""

    name: str
    argv: list[str]
    pid: int
    log_file: Path
    popen: subprocess.Popen[bytes] | None = None

    @classmethod
    def spawn(
        cls,
        name: str,
        argv: Sequence[str],
        log_dir: Path,
        *,
        die_with_parent: bool = True,
        env: dict[str, str] | None = None,
    ) -> Proc:
        log_dir.mkdir(parents=True, exist_ok=True)
        log_file = log_dir / f"{name}.log"
        with log_file.open("ab") as log:
            log.write(f"=== {time.strftime('%H:%M:%S')} starting: {' '.join(argv)}\n".encode())
            log.flush()
            # PR_SET_PDEATHSIG through util-linux's setpriv, not a preexec_fn: Python code
            # between fork and exec in a process with threads (gRPC's among them) can die or
            # hang there -- a kube-apiserver "exited" at start that way under load, its log
            # holding only gRPC's post-fork complaint. Without a preexec_fn the child is
            # spawned by C code only (vfork), and no fork handler runs.
            popen = subprocess.Popen(
                [SETPRIV, "--pdeathsig", "KILL", "--", *argv] if die_with_parent else list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )
        return cls(name=name, argv=list(argv), pid=popen.pid, log_file=log_file, popen=popen)

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return pid_alive(self.pid, self.argv[0])

    def _wait_gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                return True
            time.sleep(0.05)
        return not self.alive()

    def signal(self, sig: signal.Signals) -> None:
        if not self.alive():
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)  # own session: pgid == pid

    def kill(self, timeout: float = 5.0) -> None:
        """SIGKILL the process group now (a crash, no shutdown); waits for it and reaps it."""
        self.signal(signal.SIGKILL)
        self._wait_gone(timeout)
        if self.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=timeout)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL; reaps the child."""
        self.signal(signal.SIGTERM)
        if not self._wait_gone(grace):
            self.signal(signal.SIGKILL)
            self._wait_gone(5.0)
        if self.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=5.0)

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "argv": self.argv, "pid": self.pid, "log": str(self.log_file)}

    @classmethod
    def from_json(cls, d: dict[str, object]) -> Proc:
        argv = d["argv"]
        pid = d["pid"]
        assert isinstance(argv, list)
        assert isinstance(pid, int)
        return cls(
            name=str(d["name"]), argv=[str(a) for a in argv], pid=pid, log_file=Path(str(d["log"]))
        )


def tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a text file (reads at most the last 256 KiB)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * 1024))
            data = f.read()
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def http_ok(
    url: str,
    *,
    token: str | None = None,
    ca_file: Path | None = None,
    insecure: bool = False,
    check: Callable[[bytes], bool] | None = None,
    timeout: float = 2.0,
) -> bool:
    """One GET; True iff it returns 200 (and ``check(body)`` holds)."""
    ctx: ssl.SSLContext | None = None
    if url.startswith("https:"):
        ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
        if insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
            body: bytes = resp.read()
            return resp.status == 200 and (check is None or check(body))
    except (urllib.error.URLError, OSError, ValueError):
        return False


def etcd_healthy(body: bytes) -> bool:
    try:
        return json.loads(body).get("health") == "true"  # type: ignore[no-any-return]
    except ValueError:
        return False


def wait_until(
    what: str,
    probe: Callable[[], bool],
    procs: Sequence[Proc],
    timeout: float,
    interval: float = 0.2,
) -> None:
    """Poll ``probe`` until True (:func:`pkg.testing.eventually.eventually`); fail fast (with
    the log tail) if one of ``procs`` dies, and with every process's log tail on timeout."""

    def ready() -> bool:
        if probe():
            return True
        for p in procs:
            if not p.alive():
                raise ClusterError(
                    f"{p.name} exited while waiting for {what}; last log lines:\n"
                    + tail(p.log_file, 40)
                )
        return False

    try:
        eventually(ready, timeout, what=what, every=interval)
    except AssertionError:
        logs = "\n".join(f"--- {p.name} ---\n{tail(p.log_file, 20)}" for p in procs)
        raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}\n{logs}") from None


def teardown_on_sigterm() -> None:
    """Make SIGTERM interrupt the process like Ctrl-C (``KeyboardInterrupt``), so a test run
    stopped by a CI timeout or ``kill`` still runs its fixtures' teardown: stops the cluster,
    the nodes and the driver processes (started in their own sessions, they would outlive it)
    and undoes what the run changed on the host. Only from the main thread; idempotent."""
    if threading.current_thread() is not threading.main_thread():
        return

    def interrupt(signum: int, _frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM kills at once
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
