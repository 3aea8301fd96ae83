"""A real-node lane stopped by SIGTERM (CI's timeout, ``kill``) leaves nothing on the host.

The test starts the lane as CI does, in a child process of its own session: ``pytest`` of one
test of ``test_real_nodes.py``. Once that test's workload pods run (control plane, both nodes,
the driver, a formed domain's daemons and the workload all up: the most there is to leave
behind), it sends SIGTERM to the child's pytest process only, as ``timeout`` would, and waits
for it to exit. ``teardown_on_sigterm`` (``conftest.py``) turns the signal into Ctrl-C, so pytest
ends as INTERRUPTED after its fixtures' teardown; without it the child dies at once (-15) and
kube-scheduler, kube-controller-manager, the kube-proxies, the containerd shims and every pod
stay, with their nodes' namespaces, cgroups and links (seen with the call removed from the
conftest; see :func:`test_sigterm_mid_run_leaves_host_clean` for what is compared).

Every process the child starts inherits a random tag in its environment (``TAG_VAR``): what
still carries it afterwards is the lane's. Pod containers do not inherit the environment; they
are found by their cgroups (``/cde2e-<node>``) and their namespaces.

The host-wide lock of the real-node tier (``hostnet.claim_host``): the child takes it when its
nodes start, so this process must not hold it, and must not have nodes of its own running
(their sweep would be the child's to do). This process claims the host lazily, on its first
``hostnet.sweep`` or ``claim_host``, and keeps it until it exits, so the module is marked
``own_lane`` and ``conftest.py`` runs it before every other module of the lane (before
``test_host_sweep``, which claims the host, and before any module that starts the ``nodes``
fixture). Run alone it needs nothing else.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hostsys import binfmt
from localcluster import bin_dir, hostnet
from localcluster.processes import ClusterError
from localcluster.realnode import missing_prerequisites
from nodeimages import build_all
from testsupport.realsupport import REAL_NODES, REPO, Kubectl

from pkg.testing.eventually import eventually

pytestmark = pytest.mark.own_lane

CHILD = [
    "test/e2e_nodes/test_real_nodes.py",
    "-k",
    "test_job_completes_with_its_channel",
]
TAG_VAR = "CDE2E_SIGTERM_LANE"
WORKDIR_GLOB = "cdreal-*"  # the child's cluster workdir (conftest ``cluster``), under /tmp
UP_TIMEOUT = 300.0  # cached images: 30-40 s until the workload runs (2 cores)
EXIT_TIMEOUT = 240.0  # teardown: namespace, driver, nodes, control plane
PR_SET_PDEATHSIG = 1


def _term_with_parent() -> None:  # runs in the child between fork and exec
    """A SIGKILLed test still stops its child lane, through the lane's own teardown."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _host_holder() -> str | None:
    """The pid holding the real-node host lock (``hostnet.claim_host``), or None if free.

    A lock of this very process also counts: ``flock`` locks belong to an open file, so a
    second open of the lock file conflicts with the claim this process holds."""
    path = hostnet.lock_file()
    if not path.exists():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.read(fd, 32).decode(errors="replace").strip() or "?"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _pids() -> list[int]:
    return [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit()]


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError:  # gone meanwhile, or a kernel thread
        return b""


def _argv(pid: int) -> str:
    return _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace").strip()


def _namespaces() -> dict[str, int]:
    """Net and mount namespaces of every process: inode link -> one pid in it."""
    out: dict[str, int] = {}
    for pid in _pids():
        for kind in ("net", "mnt"):
            with contextlib.suppress(OSError):
                out.setdefault(os.readlink(f"/proc/{pid}/ns/{kind}"), pid)
    return out


def _cgroup_tops() -> set[str]:
    return {
        f"{h}/{d.name}"
        for h in hostnet.cgroup_hierarchies()
        if h.is_dir()
        for d in h.iterdir()
        if d.is_dir()
    }


def _mountpoints() -> set[str]:
    lines = Path("/proc/1/mountinfo").read_text().splitlines()
    return {ln.split()[4] for ln in lines}


def _tunables() -> dict[str, str]:
    return {
        t: Path(f"/proc/sys/{t}").read_text().strip()
        for t in hostnet.KERNEL_TUNABLES
        if Path(f"/proc/sys/{t}").exists()
    }


@dataclass
class HostState:
    """What of the host a lane may change, as compared before and after it."""

    namespaces: set[str] = field(default_factory=set)
    cgroups: set[str] = field(default_factory=set)
    links: set[str] = field(default_factory=set)
    mounts: set[str] = field(default_factory=set)
    tunables: dict[str, str] = field(default_factory=dict)
    binfmt: list[str] = field(default_factory=list)
    binfmt_mounted: bool = False

    @classmethod
    def take(cls) -> HostState:
        return cls(
            namespaces=set(_namespaces()),
            cgroups=_cgroup_tops(),
            links={d.name for d in Path("/sys/class/net").iterdir()},
            mounts=_mountpoints(),
            tunables=_tunables(),
            binfmt=binfmt.state(),
            binfmt_mounted=binfmt.mounted(),
        )

    def changes_since(self, before: HostState) -> list[str]:
        now = _namespaces()
        out = [
            f"namespace {ns} of pid {now[ns]} ({_argv(now[ns])})"
            for ns in sorted(set(now) - before.namespaces)
        ]
        out += [f"cgroup {c}" for c in sorted(self.cgroups - before.cgroups)]
        out += [f"link {n}" for n in sorted(self.links - before.links)]
        out += [f"mount {m}" for m in sorted(self.mounts - before.mounts)]
        out += [
            f"sysctl {t} is {v}, was {before.tunables.get(t)}"
            for t, v in self.tunables.items()
            if v != before.tunables.get(t)
        ]
        out += [f"binfmt handler {h}" for h in self.binfmt if h not in before.binfmt]
        if self.binfmt_mounted and not before.binfmt_mounted:
            out.append(f"mount {binfmt.BINFMT_MISC}")
        return out


def _lane_processes(tag: str, workdir: Path | None) -> list[str]:
    """Processes of the lane: carrying its tag, naming its workdir, or in a node's cgroups."""
    marker = f"{TAG_VAR}={tag}".encode()
    out = []
    for pid in _pids():
        if pid == os.getpid():
            continue
        why = ""
        if marker in _read(f"/proc/{pid}/environ").split(b"\0"):
            why = "tagged"
        elif workdir is not None and str(workdir) in _argv(pid):
            why = "names the workdir"
        elif f":/{hostnet.PREFIX}-" in _read(f"/proc/{pid}/cgroup").decode(errors="replace"):
            why = "in a node cgroup"
        if why:
            out.append(f"process {pid} ({why}): {_argv(pid)[:200]}")
    return out


def _workload_running(kubeconfig: Path) -> bool:
    if not kubeconfig.exists():
        return False
    try:
        pods = Kubectl(kubeconfig).items("pods", "-A", "-l", "job=training-job")
    except (AssertionError, subprocess.SubprocessError, ValueError):
        return False  # the API server is not up yet
    return any(p.get("status", {}).get("phase") == "Running" for p in pods)


def _clean_up(tag: str, workdir: Path | None) -> None:
    """After a failed check: kill what the lane left and sweep, for the modules after this."""
    marker = f"{TAG_VAR}={tag}".encode()
    for pid in _pids():
        if marker in _read(f"/proc/{pid}/environ").split(b"\0"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    hostnet.sweep()
    if workdir is not None and not any(m.startswith(f"{workdir}/") for m in _mountpoints()):
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class Lane:
    """The child pytest running one test of the lane, and what it shows of itself."""

    child: subprocess.Popen[bytes]
    tag: str
    log: Path
    workdirs_before: set[Path]
    workdir: Path | None = None

    @classmethod
    def start(cls, log: Path) -> Lane:
        workdirs = set(Path("/tmp").glob(WORKDIR_GLOB))
        tag = secrets.token_hex(8)
        env = {**os.environ, TAG_VAR: tag}
        env.pop("E2E_KEEP", None)  # the lane's teardown removes its workdir
        with log.open("wb") as out:
            child = subprocess.Popen(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CHILD],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_term_with_parent,  # noqa: PLW1509
            )
        return cls(child=child, tag=tag, log=log, workdirs_before=workdirs)

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def _running(self) -> None:
        assert self.child.poll() is None, f"the lane exited early:\n{self.log_tail()}"

    def wait_workload(self) -> None:
        """Until the lane's cluster workdir appears and its workload pods run."""

        def new_workdir() -> Path | None:
            self._running()
            return next(iter(set(Path("/tmp").glob(WORKDIR_GLOB)) - self.workdirs_before), None)

        workdir = eventually(new_workdir, 60, what="the lane's cluster workdir", every=0.2)
        assert workdir is not None  # eventually returns a truthy value
        self.workdir = workdir
        kubeconfig = workdir / "kubeconfigs" / "admin.kubeconfig"

        def workload_running() -> bool:
            self._running()
            return _workload_running(kubeconfig)

        eventually(workload_running, UP_TIMEOUT, what="the lane's workload pods", every=0.5)

    def abort(self) -> None:
        """This test failed or was interrupted: end the child (through its own teardown if it
        still can: a second SIGTERM is SIG_DFL), then sweep what it left, for what runs next."""
        if self.child.poll() is None:
            os.kill(self.child.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.child.wait(EXIT_TIMEOUT)
        if self.child.poll() is None:
            self.child.kill()
            self.child.wait()
        with contextlib.suppress(ClusterError):  # another run holds the host: not ours to sweep
            _clean_up(self.tag, self.workdir)


# A backstop: the lane is bounded by UP_TIMEOUT and EXIT_TIMEOUT; the images are built before,
# by `build_all` here (a no-op after the simulated lane's test_node_images, ~16 min when cold).
@pytest.mark.timeout(1800)
def test_sigterm_mid_run_leaves_host_clean(tmp_path: Path) -> None:
    """SIGTERM to a lane's pytest while its workload runs; then the host is as before.

    Compared before and after: net and mount namespaces, top-level cgroups of every hierarchy,
    network links, host mounts, the kubelet's kernel tunables, qemu binfmt handlers and the
    ``binfmt_misc`` mount; afterwards no process carries the lane's tag, names its workdir or
    sits in a node's cgroup, the workdir is gone and ``hostnet.leftovers`` is empty."""
    if os.environ.get("SKIP_E2E") == "1":
        pytest.skip("SKIP_E2E=1")
    missing = missing_prerequisites(bin_dir())
    if missing:
        pytest.fail(f"real-node e2e: missing {', '.join(missing)}", pytrace=False)
    holder = _host_holder()
    if holder is not None:
        mine = " (this pytest: a module before this one ran nodes)" * (holder == str(os.getpid()))
        pytest.fail(f"the real-node host is held by pid {holder}{mine}", pytrace=False)
    assert hostnet.leftovers() == [], "host not clean before the test (another real-node run?)"
    build_all()  # the images the child's nodes import: not built on its clock

    before = HostState.take()
    started = time.monotonic()
    lane = Lane.start(tmp_path / "lane.log")
    try:
        lane.wait_workload()
        up = time.monotonic() - started
        running = hostnet.leftovers()
        holders = [x for x in running if "namespace holder" in x]
        assert len(holders) == len(REAL_NODES), f"the lane's nodes are not up: {running}"
        assert _lane_processes(lane.tag, lane.workdir), "no tagged process while the lane runs"
        os.kill(lane.child.pid, signal.SIGTERM)  # the pytest process only, as `timeout` does
        rc = lane.child.wait(EXIT_TIMEOUT)
        down = time.monotonic() - started - up
    except BaseException:
        lane.abort()
        raise

    print(f"lane up after {up:.0f}s, exited {rc} {down:.0f}s after SIGTERM")
    workdir = lane.workdir
    assert workdir is not None
    left = _lane_processes(lane.tag, workdir)
    left += HostState.take().changes_since(before)
    left += hostnet.leftovers(
        workdir,
        tunables=before.tunables,
        binfmt_handlers=before.binfmt,
        binfmt_mounted=before.binfmt_mounted,
    )
    if workdir.exists():
        left.append(f"workdir {workdir}")
    if left:
        _clean_up(lane.tag, workdir)
    assert not left, f"the SIGTERMed lane (rc {rc}) left {left}\n{lane.log_tail()}"
    # pytest's own status after Ctrl-C: its teardown ran (a default SIGTERM gives -15)
    assert rc == pytest.ExitCode.INTERRUPTED, f"lane exited {rc}:\n{lane.log_tail()}"
