"""A fork server for the simulated nodes' Python programs: start them without re-importing.

Owns starting a local "container" or probe process cheaply. A simulated node's daemon and its
exec probes are Python programs; started with ``python script.py`` each pays the interpreter
start and ~0.5 s of CPU importing the API client, informers and tracing. On a real cluster
every node pays that on its own CPU; here 18-64 "nodes" share 2 cores, so those imports are
the simulation's cost, not the driver's (the benchmark reports the import time separately).

:class:`Zygote` runs one server process (``python -m kubeletsim.zygote SOCKET MODULE...``) that
imports the given modules once and then, per request, **forks** a child that runs the script
as ``__main__`` with the request's argv, environment, working directory and stdin/stdout/stderr
(passed as file descriptors over the Unix socket). The child calls ``setsid`` like
``start_new_session``, so ``os.killpg(pid, ...)`` reaches it and its own children. The server
reports the child's pid and, when it exits, its exit status (negative signal number, like
``Popen.returncode``) on the request's connection.

Only scripts (``<python> <path>.py args``) are forked; the server never imports modules that
start threads (forking a process with threads is unsafe) -- the preload list is plain imports.
:class:`ZygoteProcess` is the caller's handle, with the subset of ``subprocess.Popen`` that
``runtime.LocalContainer`` and ``node.SimulatedNode`` use (``pid``, ``poll``, ``wait``).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parents[2]
_HACK = _REPO / "hack"

# What the daemon's ``run`` imports (see cmd/compute-domain-daemon): the expensive part of a
# daemon start. Plain imports only: none of them starts a thread at import time.
DAEMON_PRELOAD = (
    "pkg.base.clock",
    "pkg.daemon.check",
    "pkg.daemon.daemon",
    "pkg.daemon.metrics",
    "pkg.daemon.options",
    "pkg.imex.ctl",
    "pkg.imex.supervisor",
    "pkg.kube.client",
    "pkg.kube.config",
    "pkg.kube.events",
    "pkg.runtime.tracing",
)
# The simulated nvidia-imex / nvidia-imex-ctl (zipapps whose #! is the compiled zclient.c).
SIM_PRELOAD = ("pkg.imex.sim.ctl", "pkg.imex.sim.imexd")
ZYGOTE_ENV = "KUBELETSIM_ZYGOTE"  # the socket zclient connects to


class ZygoteProcess:
    """A process forked by the zygote: ``pid``, ``poll()``, ``wait(timeout)``, ``returncode``."""

    def __init__(self, conn: socket.socket, pid: int) -> None:
        self._conn = conn
        self.pid = pid
        self.returncode: int | None = None
        self._buf = b""

    def _read_exit(self, timeout: float | None) -> None:
        if self.returncode is not None:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._conn], [], [], left)
            if not ready:
                return
            chunk = self._conn.recv(4096)
            if not chunk:  # the server went away: nobody will report this program's exit or
                # end it at teardown (it runs in its own session), so end it now
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.returncode = -signal.SIGKILL
                self._conn.close()
                return
            self._buf += chunk
        self.returncode = int(json.loads(self._buf.split(b"\n", 1)[0])["exit"])
        self._conn.close()

    def poll(self) -> int | None:
        """The exit status if the process has exited, else None (never blocks)."""
        self._read_exit(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit status; ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        self._read_exit(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
        return self.returncode


class Zygote:
    """Client of one fork server; start it with :meth:`start`, end it with :meth:`stop`."""

    def __init__(
        self, socket_path: Path, preload: Sequence[str] = DAEMON_PRELOAD + SIM_PRELOAD
    ) -> None:
        self.socket_path = socket_path
        self._preload = list(preload)
        self._server: subprocess.Popen[bytes] | None = None

    def start(self, log_file: Path, timeout: float = 60.0) -> Zygote:
        """Start the server (imports ``preload``) and wait until it accepts connections."""
        self.socket_path.unlink(missing_ok=True)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": f"{_REPO}:{_HACK}"}
        with log_file.open("ab") as log:
            self._server = subprocess.Popen(
                [sys.executable, "-m", "kubeletsim.zygote", str(self.socket_path), *self._preload],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not self.socket_path.exists():
            if self._server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"zygote did not start; log: {log_file}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        """End the server (its forked children are in their own sessions and live on)."""
        if self._server is not None and self._server.poll() is None:
            self._server.terminate()
            self._server.wait(timeout=10)
        self.socket_path.unlink(missing_ok=True)

    @staticmethod
    def build_client(out_dir: Path) -> Path | None:
        """Compile ``zclient.c`` (the zipapps' interpreter line) into ``out_dir``; None without
        a C compiler. Its fallback interpreter is this Python."""
        cc = shutil.which("gcc") or shutil.which("cc")
        if cc is None:
            return None
        out_dir.mkdir(parents=True, exist_ok=True)
        binary = out_dir / "zclient"
        subprocess.run(
            [
                cc,
                "-O2",
                "-Wall",
                f'-DPYTHON="{sys.executable}"',
                "-o",
                str(binary),
                str(Path(__file__).with_name("zclient.c")),
            ],
            check=True,
            capture_output=True,
        )
        return binary

    @staticmethod
    def forkable(argv: Sequence[str]) -> bool:
        """True for ``<this python> <script>.py ...``, the only form the server forks."""
        return len(argv) >= 2 and argv[0] == sys.executable and argv[1].endswith(".py")

    def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path,
        stdin: int,
        stdout: int,
        stderr: int,
    ) -> ZygoteProcess:
        """Fork ``argv`` (see :meth:`forkable`) with these fds; returns once it has a pid."""
        if not self.forkable(argv):
            raise ValueError(f"zygote forks only '<python> <script>.py ...', not {argv[:2]}")
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(str(self.socket_path))
        msg = json.dumps({"argv": list(argv[1:]), "env": dict(env), "cwd": str(cwd)}).encode()
        socket.send_fds(conn, [msg + b"\n"], [stdin, stdout, stderr])
        buf = b""
        while b"\n" not in buf:
            chunk = conn.recv(4096)
            if not chunk:
                conn.close()
                raise RuntimeError(f"zygote refused {argv[1:]}")
            buf += chunk
        line, rest = buf.split(b"\n", 1)
        proc = ZygoteProcess(conn, int(json.loads(line)["pid"]))
        proc._buf = rest
        return proc


# -- the server -----------------------------------------------------------------------------


_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGPIPE)


def _child(
    conn: socket.socket,
    listener: socket.socket,
    req: dict[str, Any],
    fds: list[int],
    ready: int,
    *,
    others: Sequence[socket.socket],
) -> None:
    """In the forked child: become the requested program; never returns.

    Starts with ``_FORWARDED`` blocked (see :func:`serve`): a SIGTERM sent right after the pid
    was reported waits until the default handlers are back, then ends the program."""
    code = 1
    try:
        listener.close()
        conn.close()
        for other in others:  # other clients' connections: only the server holds them
            other.close()
        os.setsid()
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        os.write(ready, b"x")  # own session, default handlers: the pid may be reported
        os.close(ready)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(str(req["cwd"]))
        env = req["env"]
        assert isinstance(env, dict)
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in env.items()})
        argv = [str(a) for a in req["argv"]]
        sys.argv = argv
        _name_process(argv[0])
        # What `python <script>.py` does before running it (runpy.run_path does not): a
        # forked script sees the same import path as one the interpreter started.
        sys.path.insert(0, str(Path(argv[0]).resolve().parent))
        import runpy  # noqa: PLC0415 - only children run scripts

        try:
            runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if e.code is not None and not isinstance(e.code, int):
                sys.stderr.write(f"{e.code}\n")
        except BaseException:
            traceback.print_exc()
            code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One request: a JSON line (Python clients) or ``B`` + length + NUL fields (zclient)."""
    msg, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 3)
    if msg[:1] == b"B":
        while len(msg) < 9:
            msg += conn.recv(9 - len(msg)) or b"\0" * 9
        need = 9 + int(msg[1:9])
        while len(msg) < need:
            more = conn.recv(need - len(msg))
            if not more:
                break
            msg += more
        fields = [f.decode(errors="surrogateescape") for f in msg[9:need].split(b"\0")[:-1]]
        argc = int(fields[1])
        env = dict(e.split("=", 1) for e in fields[2 + argc :] if "=" in e)
        return {"cwd": fields[0], "argv": fields[2 : 2 + argc], "env": env}, fds
    while not msg.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            break
        msg += more
    return json.loads(msg), fds


def _name_process(script: str) -> None:
    """Name the child after its script (``/proc/<pid>/comm``, what ``ps``/``top`` show): a
    forked child otherwise looks like the zygote, so CPU could not be told apart per program."""
    with contextlib.suppress(Exception):
        import ctypes  # noqa: PLC0415 - only children rename themselves

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, Path(script).stem.encode()[:15], 0, 0, 0)  # PR_SET_NAME


def serve(socket_path: str, preload: Sequence[str]) -> None:
    """Import ``preload``, then fork one child per request until SIGTERM or the parent exits.

    A child whose client disconnects before it exited (the client was killed) is SIGKILLed
    with its process group, like a container whose runtime shim died."""
    parent = os.getppid()
    for module in preload:
        importlib.import_module(module)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = f"{socket_path}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    listener.bind(tmp)
    listener.listen(128)
    os.rename(tmp, socket_path)  # appears only once it accepts
    stopping = False

    def on_term(_sig: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    children: dict[int, socket.socket] = {}
    watched: dict[socket.socket, int] = {}  # client connections of live children
    while not stopping and os.getppid() == parent:  # never outlive the harness
        try:
            ready, _, _ = select.select([listener, *watched], [], [], 0.05)
        except InterruptedError:
            continue
        for sock in ready:
            if sock is listener:
                continue
            try:
                gone = not sock.recv(1 << 16)
            except OSError:
                gone = True
            if gone:
                pid = watched.pop(sock)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
        if listener in ready:
            conn, _ = listener.accept()
            try:
                req, fds = _read_request(conn)
            except (OSError, ValueError) as e:
                sys.stderr.write(f"zygote: bad request: {e!r}\n")
                conn.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            r, w = os.pipe()
            signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED)
            pid = os.fork()
            if pid == 0:
                os.close(r)
                _child(conn, listener, req, fds, w, others=list(children.values()))
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
            os.close(w)
            os.read(r, 1)  # the child is in its own session (or already gone)
            os.close(r)
            for fd in fds:
                os.close(fd)
            children[pid] = conn
            try:
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            except OSError:  # the client went away first: nobody owns the program; end it
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                conn.close()  # still reaped below; its exit goes nowhere
                continue
            watched[conn] = pid
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            waiter = children.pop(pid, None)
            if waiter is not None:
                watched.pop(waiter, None)
                with contextlib.suppress(OSError):
                    waiter.sendall(json.dumps({"exit": _returncode(status)}).encode() + b"\n")
                waiter.close()
    listener.close()


def _returncode(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2:])
