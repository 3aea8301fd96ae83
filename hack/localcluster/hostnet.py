"""Host plumbing of the real-node tier, and the sweep that undoes every bit of it.

Owns what a real node (kubelet + containerd, ``realnode``) needs from the host and nothing else:

* one bridge ``cde2e0`` (``HOST_IP`` on ``SUBNET``), created by the run, that the API server
  also listens on;
* per node, a **network + mount namespace** held by a ``cde2e-holder-<node>`` process
  (``unshare --net --mount --propagation slave``). Inside it ``/var/lib``, ``/run`` and
  ``/var/log`` are bind mounts of the node's own directories, so kubelet, containerd, CNI and
  the driver's hostPath volumes see the production paths (``/var/lib/kubelet``,
  ``/run/containerd``, ``/var/run/cdi``, ``/var/log/pods``) without touching the host's, and
  every mount the node makes dies with the namespace. A veth pair joins it to the bridge; its
  only routes are the bridge subnet and the Service range, and an egress guard (iptables in the
  node's namespace) drops anything leaving ``eth0`` for an address outside ``SUBNET``: the
  rule of these machines is that test traffic reaches only loopback or namespaces the run
  created;
* per node, a cgroup root ``/cde2e-<node>`` in every cgroup v1 hierarchy (kubelet's
  ``cgroupRoot``);
* the kernel tunables the kubelet rewrites on start (``KERNEL_TUNABLES``, host-global): their
  values are recorded in a state file *before* the first kubelet starts and restored by
  :func:`sweep`;
* for a node of a foreign architecture (the lane's arm64 node), the qemu-user binfmt handler
  (host-global, ``hostsys.binfmt``): :func:`foreign_arch` registers it for a block (mounting
  ``binfmt_misc`` first where it is not mounted) and notes the handler and the mount in the
  state file while they are there, so :func:`sweep` unregisters and unmounts them after an
  interrupted run; the handlers present before the run, and whether ``binfmt_misc`` was
  mounted, are recorded with the tunables, and :func:`leftovers` reports any handler added
  since and a mount that was not there.

Everything created carries the ``cde2e`` prefix, so :func:`sweep` finds leftovers of an
interrupted run even without its state, and :func:`leftovers` lists what is still on the host
(empty list = the host is as it was). Because :func:`sweep` removes *every* real node on the
machine, one process at a time may run them: :func:`claim_host` (which :func:`sweep` calls
first) takes a host-wide lock that the kernel drops when the process ends, and a second run
fails at once instead of sweeping the first one's nodes. Knows nothing about Kubernetes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hostsys import binfmt

from .processes import ClusterError, Proc

PREFIX = "cde2e"
BRIDGE = f"{PREFIX}0"
SUBNET = "172.30.250.0/24"
HOST_IP = "172.30.250.1"
SERVICE_CIDR = "10.0.0.0/24"
CLUSTER_CIDR = "10.244.0.0/16"
HOLDER_ARGV0 = f"{PREFIX}-holder-"
# Written by the kubelet's container manager (setupKernelTunables) unless protectKernelDefaults.
KERNEL_TUNABLES = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
# Directories of the node that replace the host's inside its mount namespace.
NODE_BINDS = ("var/lib", "run", "var/log")


def state_file() -> Path:
    """Where host changes are recorded between runs (survives an interrupted run)."""
    root = Path(os.environ.get("CD_E2E_CACHE", Path.home() / ".cache" / "compute-domain-e2e"))
    return root / "realnodes-host-state.json"


def lock_file() -> Path:
    """The host-wide lock of the real-node tier (see :func:`claim_host`), next to the state."""
    return state_file().with_name("realnodes-host.lock")


_CLAIM: dict[str, int] = {}  # "fd": the open lock file while this process holds the claim


def claim_host() -> None:
    """Make this process the only one running real nodes on this host until it exits.

    Takes an exclusive ``flock`` on :func:`lock_file` and keeps it: the kernel drops it when the
    process ends, so an interrupted run leaves no stale claim. Idempotent within a process.
    Raises :class:`ClusterError` naming the holder's pid when another process holds the host:
    its nodes are not this run's to sweep."""
    if "fd" in _CLAIM:
        return
    path = lock_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise ClusterError(
            f"another real-node run (pid {holder}) holds this host ({path}): wait until it ends"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _CLAIM["fd"] = fd


def run(argv: Sequence[str], *, check: bool = True, input_text: str | None = None) -> str:
    """Run a host command; raise :class:`ClusterError` with its output when it fails."""
    res = subprocess.run(list(argv), input=input_text, capture_output=True, text=True, check=False)
    if check and res.returncode != 0:
        raise ClusterError(
            f"{' '.join(argv)} failed ({res.returncode}): {(res.stderr or res.stdout).strip()}"
        )
    return res.stdout


def node_ip(index: int) -> str:
    """The address of node ``index`` (1-based) on the bridge subnet."""
    if not 1 <= index <= 200:
        raise ValueError(f"node index {index} out of range 1..200")
    return f"172.30.250.{10 + index}"


def pod_cidr(index: int) -> str:
    """The pod subnet of node ``index`` (inside ``CLUSTER_CIDR``)."""
    return f"10.244.{index}.0/24"


def cgroup_hierarchies() -> list[Path]:
    """Every mounted cgroup v1 hierarchy (``/sys/fs/cgroup/<ctrl>``) plus the v2 one if any."""
    out: list[Path] = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[2] in ("cgroup", "cgroup2"):
            out.append(Path(parts[1]))
    return out


# ---------------------------------------------------------------------------------------- bridge


def ensure_bridge() -> None:
    """Create the bridge with ``HOST_IP`` (idempotent)."""
    if not Path(f"/sys/class/net/{BRIDGE}").exists():
        run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    addrs = run(["ip", "-o", "-4", "addr", "show", "dev", BRIDGE])
    if f" {HOST_IP}/" not in addrs:
        run(["ip", "addr", "add", f"{HOST_IP}/24", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])


# ---------------------------------------------------------------------------------- kernel state


def record_host_state() -> None:
    """Record the host's ``KERNEL_TUNABLES``, qemu binfmt handlers and whether ``binfmt_misc``
    is mounted, before any node runs.

    Keeps an existing record: after an interrupted run the values on the host may already be
    the kubelet's, and the record holds the originals."""
    state = _read_state()
    if "sysctls" not in state:
        state["sysctls"] = {
            t: Path(f"/proc/sys/{t}").read_text().strip()
            for t in KERNEL_TUNABLES
            if Path(f"/proc/sys/{t}").exists()
        }
    if "binfmt" not in state:
        state["binfmt"] = binfmt.state()
    if "binfmt_misc_mounted" not in state:
        state["binfmt_misc_mounted"] = binfmt.mounted()
    _write_state(state)


def recorded_tunables() -> dict[str, str]:
    """The host's kernel tunables as recorded before the first kubelet ran (may be empty)."""
    return dict(_read_state().get("sysctls", {}))


def recorded_binfmt() -> list[str] | None:
    """The qemu binfmt handlers registered before the run (None: nothing recorded)."""
    handlers = _read_state().get("binfmt")
    return list(handlers) if isinstance(handlers, list) else None


def recorded_binfmt_mounted() -> bool | None:
    """Whether ``binfmt_misc`` was mounted before the run (None: nothing recorded)."""
    was = _read_state().get("binfmt_misc_mounted")
    return was if isinstance(was, bool) else None


def _read_state() -> dict[str, Any]:
    try:
        data = json.loads(state_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_state(state: dict[str, Any]) -> None:
    path = state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, path)


def _note_binfmt(name: str, *, registered: bool) -> None:
    state = _read_state()
    noted = set(state.get("binfmt_registered", []))
    if registered:
        noted.add(name)
    else:
        noted.discard(name)
    state["binfmt_registered"] = sorted(noted)
    _write_state(state)


def _note_binfmt_mount(*, mounted: bool) -> None:
    state = _read_state()
    if mounted:
        state["binfmt_misc_mounted_here"] = True
    else:
        state.pop("binfmt_misc_mounted_here", None)
    _write_state(state)


@contextlib.contextmanager
def foreign_arch(arch: str, log: Callable[[str], None] = lambda _m: None) -> Iterator[None]:
    """:func:`hostsys.binfmt.foreign_arch` for the real-node tier: within the block binaries
    of ``arch`` (OCI name) run here; a handler the block registers, and the ``binfmt_misc``
    mount it makes, are noted in the state file until the block has undone them, so
    :func:`sweep` removes them after an interrupted run.

    The handler is host-global: a handler that was already registered (by another process) is
    used and left alone. Raises :class:`hostsys.binfmt.BinfmtError` when it cannot be
    registered."""
    name = binfmt.handler_name(arch)
    before = name in binfmt.state()
    was_mounted = binfmt.mounted()
    mounted_here = False
    try:
        with binfmt.foreign_arch(arch, log):
            mounted_here = not was_mounted and binfmt.mounted()
            if mounted_here:
                _note_binfmt_mount(mounted=True)
            ours = not before and name in binfmt.state()
            if ours:
                _note_binfmt(name, registered=True)
            try:
                yield
            finally:
                if ours:
                    _note_binfmt(name, registered=False)
    finally:
        if mounted_here and not binfmt.mounted():
            _note_binfmt_mount(mounted=False)


# ---------------------------------------------------------------------------------- namespaces


@dataclass
class NodeNamespace:
    """The network + mount namespace of one real node, held by ``holder``."""

    name: str
    index: int
    node_dir: Path
    holder: Proc
    pid: int  # the process inside the namespaces (``nsenter --target``)

    @property
    def ip(self) -> str:
        return node_ip(self.index)

    @property
    def veth(self) -> str:
        return f"{PREFIX}-{self.index}"

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the node's network and mount namespaces."""
        return ["nsenter", f"--target={self.pid}", "--net", "--mount", "--", *argv]

    def run(self, argv: Sequence[str], *, check: bool = True) -> str:
        """Run a command inside the node's namespaces and return its stdout."""
        return run(self.argv(argv), check=check)

    def path(self, inside: str) -> Path:
        """The host path of a path inside the node under one of ``NODE_BINDS``."""
        rel = inside.lstrip("/")
        if rel.startswith("var/run/"):
            rel = "run/" + rel[len("var/run/") :]
        for b in NODE_BINDS:
            if rel == b or rel.startswith(b + "/"):
                return self.node_dir / "root" / rel
        raise ValueError(f"{inside} is not under a node-private directory {NODE_BINDS}")

    @classmethod
    def create(cls, name: str, index: int, node_dir: Path, log_dir: Path) -> NodeNamespace:
        """Create the namespaces, private directories, veth, routes and egress guard."""
        ensure_bridge()
        root = node_dir / "root"
        binds = []
        for b in NODE_BINDS:
            (root / b).mkdir(parents=True, exist_ok=True)
            binds.append(f"mount --bind {root / b} /{b}")
        argv0 = f"{HOLDER_ARGV0}{name}"
        # rshared after the binds: the node's own mounts propagate between the node's
        # components and containers (kubelet volumes, HostToContainer/Bidirectional volumes);
        # / stays a slave of the host's, so nothing propagates back to the host.
        script = " && ".join([*binds, "mount --make-rshared /", f"exec -a {argv0} sleep infinity"])
        holder = Proc.spawn(
            f"{name}-holder",
            [
                "unshare",
                "--net",
                "--mount",
                "--propagation",
                "slave",
                "--fork",
                "--kill-child=SIGKILL",
                "bash",
                "-c",
                script,
            ],
            log_dir,
        )
        deadline = time.monotonic() + 10
        pid = 0
        while not pid:
            pid = next((p for p, a in _processes() if a == argv0), 0)
            if not pid:
                if not holder.alive() or time.monotonic() > deadline:
                    holder.stop(1)
                    raise ClusterError(f"namespace holder of {name} did not start")
                time.sleep(0.05)
        ns = cls(name=name, index=index, node_dir=node_dir, holder=holder, pid=pid)
        try:
            ns._wire()
        except BaseException:
            ns.destroy()
            raise
        return ns

    def _wire(self) -> None:
        if Path(f"/sys/class/net/{self.veth}").exists():
            run(["ip", "link", "del", self.veth])
        peer = ["peer", "name", "eth0", "netns", str(self.pid)]
        run(["ip", "link", "add", self.veth, "type", "veth", *peer])
        run(["ip", "link", "set", self.veth, "master", BRIDGE, "up"])
        # Replies to masqueraded pod traffic never need it, but a host route to the node's pod
        # subnet keeps any stray packet on the bridge instead of the host's default route.
        run(["ip", "route", "replace", pod_cidr(self.index), "via", self.ip, "dev", BRIDGE])
        script = f"""
set -e
ip link set lo up
ip addr add {self.ip}/24 dev eth0
ip link set eth0 up
ip route add {SERVICE_CIDR} dev eth0 src {self.ip}
sysctl -qw net.ipv4.ip_forward=1
iptables -w -N CDE2E-EGRESS-GUARD
iptables -w -A CDE2E-EGRESS-GUARD -d {SUBNET} -j RETURN
iptables -w -A CDE2E-EGRESS-GUARD -j DROP
iptables -w -I OUTPUT -o eth0 -j CDE2E-EGRESS-GUARD
iptables -w -I FORWARD -o eth0 -j CDE2E-EGRESS-GUARD
"""
        self.run(["sh", "-c", script])

    def pids(self) -> list[int]:
        """Every process in this node's network or mount namespace (holder included)."""
        return namespace_members(self.pid)

    def destroy(self) -> None:
        """Kill every process of the node, remove its cgroup root, veth and host route."""
        kill_namespace(self.pid)
        self.holder.stop(2)
        remove_cgroup_root(self.name)
        with contextlib.suppress(ClusterError):
            run(["ip", "route", "del", pod_cidr(self.index)], check=False)
        if Path(f"/sys/class/net/{self.veth}").exists():
            run(["ip", "link", "del", self.veth], check=False)


def _processes() -> Iterator[tuple[int, str]]:
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv0 = (d / "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:
            continue
        yield int(d.name), argv0


def _ns_inode(pid: int, kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def namespace_members(pid: int) -> list[int]:
    """Processes sharing the network or the mount namespace of ``pid`` (incl. ``pid``)."""
    net, mnt = _ns_inode(pid, "net"), _ns_inode(pid, "mnt")
    if net is None and mnt is None:
        return []
    host_net, host_mnt = _ns_inode(1, "net"), _ns_inode(1, "mnt")
    out = []
    for p, _ in _processes():
        n, m = _ns_inode(p, "net"), _ns_inode(p, "mnt")
        if (n is not None and n == net and n != host_net) or (
            m is not None and m == mnt and m != host_mnt
        ):
            out.append(p)
    return out


def kill_namespace(pid: int, timeout: float = 10.0) -> None:
    """SIGKILL every process in ``pid``'s namespaces and wait until they are gone."""
    deadline = time.monotonic() + timeout
    while True:
        members = namespace_members(pid)
        if not members:
            return
        for p in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise ClusterError(f"processes {members} survived SIGKILL")
        time.sleep(0.1)


# ---------------------------------------------------------------------------------- cgroups


def cgroup_root_name(node: str) -> str:
    """The kubelet ``cgroupRoot`` of ``node`` (a top-level cgroup in every hierarchy)."""
    return f"/{PREFIX}-{node}"


def ensure_cgroup_root(node: str) -> None:
    """Create ``cgroup_root_name(node)`` in every hierarchy (cpuset initialised from root)."""
    for h in cgroup_hierarchies():
        d = h / cgroup_root_name(node).lstrip("/")
        d.mkdir(exist_ok=True)
        for f in ("cpuset.cpus", "cpuset.mems"):
            if (h / f).exists() and not (d / f).read_text().strip():
                (d / f).write_text((h / f).read_text())


def _cgroup_dirs_bottom_up(top: Path) -> list[Path]:
    dirs = [Path(r) for r, _, _ in os.walk(top)]
    return sorted(dirs, key=lambda p: len(p.parts), reverse=True)


def remove_cgroup_root(node: str, timeout: float = 10.0) -> None:
    """Kill every process in the node's cgroups, then remove the cgroups bottom-up."""
    tops = [h / cgroup_root_name(node).lstrip("/") for h in cgroup_hierarchies()]
    deadline = time.monotonic() + timeout
    for top in tops:
        while top.exists():
            for d in _cgroup_dirs_bottom_up(top):
                with contextlib.suppress(OSError):
                    for p in (d / "cgroup.procs").read_text().split():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(p), signal.SIGKILL)
                with contextlib.suppress(OSError):
                    d.rmdir()
            if top.exists():
                if time.monotonic() > deadline:
                    raise ClusterError(f"cannot remove cgroup {top}")
                time.sleep(0.1)


# ---------------------------------------------------------------------------------- sweep


def _prefixed_cgroup_roots() -> list[str]:
    names: set[str] = set()
    for h in cgroup_hierarchies():
        with contextlib.suppress(OSError):
            names.update(d.name for d in h.iterdir() if d.is_dir() and d.name.startswith(PREFIX))
    return sorted(names)


def _prefixed_links() -> list[str]:
    return sorted(d.name for d in Path("/sys/class/net").iterdir() if d.name.startswith(PREFIX))


def _holders() -> list[int]:
    return [p for p, a in _processes() if a.startswith(HOLDER_ARGV0)]


def sweep() -> list[str]:
    """Undo every host change of this tier, of this run or an interrupted one.

    Claims the host first (:func:`claim_host`; raises :class:`ClusterError` while another
    process runs real nodes). Kills node processes (by namespace), removes cgroup roots, links
    and the bridge, restores the recorded kernel tunables, unregisters the binfmt handlers
    :func:`foreign_arch` noted and unmounts ``binfmt_misc`` if it noted mounting it, and drops
    the state file. Returns what it removed."""
    claim_host()
    done: list[str] = []
    for pid in _holders():
        kill_namespace(pid)
        done.append(f"node namespace of holder {pid}")
    for name in _prefixed_cgroup_roots():
        remove_cgroup_root(name[len(PREFIX) + 1 :])
        done.append(f"cgroup /{name}")
    for link in _prefixed_links():
        if link != BRIDGE:
            run(["ip", "link", "del", link], check=False)
            done.append(f"link {link}")
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        run(["ip", "link", "del", BRIDGE], check=False)  # also drops the routes through it
        done.append(f"bridge {BRIDGE}")
    state = _read_state()
    for tunable, value in state.get("sysctls", {}).items():
        p = Path(f"/proc/sys/{tunable}")
        if p.exists() and p.read_text().strip() != value:
            p.write_text(value)
            done.append(f"sysctl {tunable}={value}")
    for name in state.get("binfmt_registered", []):
        handler = binfmt.BINFMT_MISC / name
        if handler.exists():
            handler.write_text("-1")
            done.append(f"binfmt handler {name}")
    if state.get("binfmt_misc_mounted_here") and binfmt.mounted():
        binfmt.unmount()
        done.append(f"mount {binfmt.BINFMT_MISC}")
    with contextlib.suppress(FileNotFoundError):
        state_file().unlink()
    return done


def leftovers(
    work_root: Path | None = None,
    *,
    tunables: dict[str, str] | None = None,
    binfmt_handlers: Sequence[str] | None = None,
    binfmt_mounted: bool | None = None,
) -> list[str]:
    """What this tier still has on the host; ``[]`` means the host is as it was.

    ``work_root``: also report host mounts under it (there should never be any: node mounts
    live in the nodes' own mount namespaces). ``tunables``, ``binfmt_handlers`` and
    ``binfmt_mounted``: the recorded kernel tunables, qemu binfmt handlers and ``binfmt_misc``
    mount to compare with (default: the state file's; :func:`sweep` removes that file). A
    handler registered now and not then is a leftover, and so is ``binfmt_misc`` mounted now
    and not then; what another process has removed since is not."""
    out = [f"process {p} (namespace holder)" for p in _holders()]
    out += [f"cgroup /{n}" for n in _prefixed_cgroup_roots()]
    out += [f"link {n}" for n in _prefixed_links()]
    recorded = tunables if tunables is not None else recorded_tunables()
    for tunable, value in recorded.items():
        p = Path(f"/proc/sys/{tunable}")
        if p.exists() and p.read_text().strip() != value:
            out.append(f"sysctl {tunable} is {p.read_text().strip()}, was {value}")
    handlers = binfmt_handlers if binfmt_handlers is not None else recorded_binfmt()
    if handlers is not None:
        out += [f"binfmt handler {h}" for h in binfmt.state() if h not in handlers]
    was_mounted = binfmt_mounted if binfmt_mounted is not None else recorded_binfmt_mounted()
    if was_mounted is False and binfmt.mounted():
        out.append(f"mount {binfmt.BINFMT_MISC}")
    if work_root is not None:
        root = str(work_root.resolve())
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            mountpoint = line.split()[4]
            if mountpoint == root or mountpoint.startswith(root + "/"):
                out.append(f"mount {mountpoint}")
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            if "/var/lib/kubelet" in line.split()[4]:
                out.append(f"mount {line.split()[4]}")
    return out


def node_leftovers(name: str, index: int) -> list[str]:
    """What a node that was stopped alone (the others keep running) left on the host: its
    namespace holder, cgroup root, veth or pod-subnet route (``[]`` = nothing)."""
    argv0 = f"{HOLDER_ARGV0}{name}"
    out = [f"process {p} (namespace holder of {name})" for p, a in _processes() if a == argv0]
    top = cgroup_root_name(name).lstrip("/")
    out += [f"cgroup /{top} in {h}" for h in cgroup_hierarchies() if (h / top).exists()]
    veth = f"{PREFIX}-{index}"
    if Path(f"/sys/class/net/{veth}").exists():
        out.append(f"link {veth}")
    if run(["ip", "route", "show", pod_cidr(index)], check=False).strip():
        out.append(f"route {pod_cidr(index)}")
    return out


__all__ = [
    "BRIDGE",
    "CLUSTER_CIDR",
    "HOST_IP",
    "KERNEL_TUNABLES",
    "PREFIX",
    "SERVICE_CIDR",
    "SUBNET",
    "NodeNamespace",
    "cgroup_root_name",
    "claim_host",
    "ensure_bridge",
    "ensure_cgroup_root",
    "foreign_arch",
    "kill_namespace",
    "leftovers",
    "lock_file",
    "node_ip",
    "node_leftovers",
    "pod_cidr",
    "record_host_state",
    "recorded_binfmt",
    "recorded_binfmt_mounted",
    "recorded_tunables",
    "remove_cgroup_root",
    "run",
    "sweep",
]
