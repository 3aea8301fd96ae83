"""Running the driver's own containers as local processes: command mapping, start, stop, probes.

Owns the "container runtime" of the stand-in. A :class:`LocalCommands` table maps the image
command a container would run (``compute-domain-daemon run ...``) onto a local program (``python
cmd/compute-domain-daemon/compute_domain_daemon.py run ...``). Containers whose command is not
in the table are not run: the caller records their edits instead. Processes get their own
session and log to one file per container.

A local process cannot get real bind mounts (that needs root and a mount namespace), so the
container's filesystem is emulated by path remapping:

* every mount (CDI ``mounts``, the pod's ``/etc/hosts``, the termination log) becomes a symlink
  ``<rootfs>/<containerPath> -> <hostPath>`` in a per-container directory (:func:`build_rootfs`);
* ``PATH`` lists the image's ``PATH`` directories inside that rootfs (``image_path``), so a
  program looked up through ``PATH`` -- the daemon's ``nvidia-imex`` -- is found exactly when a
  CDI mount put it there, as in a real container;
* container paths a program opens directly (``/imexd``, ``/etc/hosts``,
  ``/dev/termination-log``) are passed as environment variables named by ``path_env``.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from .podspec import Mount
from .zygote import Zygote, ZygoteProcess

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class LocalCommands:
    """Which container commands run locally, and how container paths are handed to them.

    ``programs`` maps a command's basename to the argv prefix that replaces it;
    ``path_env`` maps a container path to the env var that receives its host path;
    ``env`` is added to every local container (e.g. simulator tuning);
    ``image_path`` is the image's ``PATH``; when set, a local container's ``PATH`` is those
    directories inside its emulated root filesystem (see the module docstring);
    ``zygote``, when set, forks the Python scripts among them (containers and exec probes)
    from a server that imported them once (see ``zygote``) instead of starting interpreters.
    """

    programs: Mapping[str, Sequence[str]]
    path_env: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    image_path: str = ""
    zygote: Zygote | None = None

    def maps(self, argv: Sequence[str]) -> bool:
        return bool(argv) and os.path.basename(argv[0]) in self.programs

    def translate(self, argv: Sequence[str]) -> list[str]:
        return [*self.programs[os.path.basename(argv[0])], *argv[1:]]

    def path_vars(self, mounts: Sequence[Mount]) -> dict[str, str]:
        out = {}
        for m in mounts:
            var = self.path_env.get(m.container_path.rstrip("/") or "/")
            if var:
                out[var] = m.host_path
        return out

    def search_path(self, rootfs: Path) -> str | None:
        """The container's ``PATH`` remapped into ``rootfs`` (None without ``image_path``)."""
        if not self.image_path:
            return None
        return ":".join(str(rootfs / d.lstrip("/")) for d in self.image_path.split(":") if d)


# The daemon image's PATH (Dockerfile ENV PATH) minus its own bin directories: what CDI mounts
# land in.
DAEMON_IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def driver_commands(*, python: str = sys.executable, repo: Path = REPO_ROOT) -> LocalCommands:
    """The driver's daemon image command, run from this checkout.

    ``/imexd``, the pod's ``/etc/hosts`` and the termination log reach the daemon as
    ``IMEX_CONFIG_DIR``, ``IMEX_HOSTS_FILE`` and ``TERMINATION_LOG`` (see
    ``pkg.daemon.options``). ``nvidia-imex``/``nvidia-imex-ctl`` come only from the node's
    fake driver root, through the plugin's CDI mounts and the remapped ``PATH``.
    """
    daemon = [python, str(repo / "cmd" / "compute-domain-daemon" / "compute_domain_daemon.py")]
    return LocalCommands(
        programs={"compute-domain-daemon": daemon},
        path_env={
            "/imexd": "IMEX_CONFIG_DIR",
            "/etc/hosts": "IMEX_HOSTS_FILE",
            TERMINATION_MESSAGE_PATH: "TERMINATION_LOG",
        },
        env={"PYTHONUNBUFFERED": "1"},
        image_path=DAEMON_IMAGE_PATH,
    )


TERMINATION_MESSAGE_PATH = "/dev/termination-log"  # the kubelet's default
TERMINATION_MESSAGE_LIMIT = 4096  # the kubelet keeps at most this many bytes


def build_rootfs(rootfs: Path, mounts: Sequence[Mount]) -> None:
    """(Re)create ``rootfs`` with one symlink ``<containerPath> -> <hostPath>`` per mount."""
    if rootfs.exists():
        shutil.rmtree(rootfs)
    rootfs.mkdir(parents=True)
    for m in mounts:
        link = rootfs / m.container_path.strip("/")
        if link == rootfs:
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink():
            link.unlink()
        link.symlink_to(m.host_path)


def read_termination_message(path: Path) -> str:
    """What the kubelet reports as ``terminated.message`` (policy File): the file, truncated."""
    try:
        with path.open("rb") as f:
            return f.read(TERMINATION_MESSAGE_LIMIT).decode(errors="replace")
    except OSError:
        return ""


@dataclass
class ProcessSpec:
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    log_file: Path
    zygote: Zygote | None = None


class _Process(Protocol):
    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class LocalContainer:
    """One started container process (own session; SIGTERM/SIGKILL go to its group)."""

    def __init__(self, spec: ProcessSpec) -> None:
        self.spec = spec
        spec.log_file.parent.mkdir(parents=True, exist_ok=True)
        with spec.log_file.open("ab") as log:
            log.write(f"=== {time.strftime('%H:%M:%S')} start: {' '.join(spec.argv)}\n".encode())
            log.flush()
            self._popen: _Process
            if spec.zygote is not None and spec.zygote.forkable(spec.argv):
                with open(os.devnull, "rb") as null:
                    self._popen = spec.zygote.spawn(
                        spec.argv,
                        env=spec.env,
                        cwd=spec.cwd,
                        stdin=null.fileno(),
                        stdout=log.fileno(),
                        stderr=log.fileno(),
                    )
            else:
                self._popen = subprocess.Popen(
                    spec.argv,
                    env=spec.env,
                    cwd=spec.cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        self.started_at = time.time()

    @property
    def pid(self) -> int:
        return self._popen.pid

    def exit_code(self) -> int | None:
        return self._popen.poll()

    def signal(self, sig: signal.Signals) -> None:
        if self._popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._popen.pid, sig)

    def stop(self, grace: float) -> int | None:
        """SIGTERM, wait ``grace`` seconds, SIGKILL; returns the exit code."""
        self.signal(signal.SIGTERM)
        try:
            return self._popen.wait(timeout=max(grace, 0.1))
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            try:
                return self._popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                return None

    def exec_probe(self, argv: Sequence[str], *, timeout: float) -> tuple[bool, str]:
        """Run a probe command with the container's env; success = exit 0."""
        zygote = self.spec.zygote
        if zygote is not None and zygote.forkable(argv):
            return _forked_probe(zygote, argv, self.spec, timeout)
        try:
            done = subprocess.run(
                list(argv),
                env=self.spec.env,
                cwd=self.spec.cwd,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return False, f"probe timed out after {timeout}s"
        except OSError as e:
            return False, str(e)
        return done.returncode == 0, (done.stdout + done.stderr).strip()


def _forked_probe(
    zygote: Zygote, argv: Sequence[str], spec: ProcessSpec, timeout: float
) -> tuple[bool, str]:
    """``exec_probe`` through the zygote: output through a pipe, killed after ``timeout``."""
    r, w = os.pipe()
    try:
        with open(os.devnull, "rb") as null:
            proc: ZygoteProcess = zygote.spawn(
                argv, env=spec.env, cwd=spec.cwd, stdin=null.fileno(), stdout=w, stderr=w
            )
    except OSError as e:
        os.close(r)
        return False, str(e)
    finally:
        os.close(w)
    deadline = time.monotonic() + timeout
    out = b""
    with os.fdopen(r, "rb", buffering=0) as pipe:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([pipe], [], [], left)[0]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                return False, f"probe timed out after {timeout}s"
            chunk = pipe.read(65536)
            if not chunk:
                break
            out += chunk
    try:
        code = proc.wait(max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        return False, f"probe timed out after {timeout}s"
    return code == 0, out.decode(errors="replace").strip()


@dataclass
class Probe:
    """An exec probe with the kubelet's timing fields (seconds)."""

    argv: list[str]
    period: float = 10.0
    initial_delay: float = 0.0
    timeout: float = 1.0
    failure_threshold: int = 3
    success_threshold: int = 1

    @classmethod
    def from_spec(cls, spec: Mapping[str, object] | None, argv: list[str]) -> Probe:
        s = dict(spec or {})

        def num(key: str, default: float) -> float:
            v = s.get(key)
            return float(v) if isinstance(v, int | float) else default

        return cls(
            argv=argv,
            period=num("periodSeconds", 10),
            initial_delay=num("initialDelaySeconds", 0),
            timeout=num("timeoutSeconds", 1),
            failure_threshold=int(num("failureThreshold", 3)),
            success_threshold=int(num("successThreshold", 1)),
        )
