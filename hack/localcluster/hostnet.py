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
  :func:`sweep`.

Everything created carries the ``cde2e`` prefix, so :func:`sweep` finds leftovers of an
interrupted run even without its state, and :func:`leftovers` lists what is still on the host
(empty list = the host is as it was). Knows nothing about Kubernetes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from .processes import ClusterError, Proc

PREFIX = "cde2e"
BRIDGE = f"{PREFIX}0"
SUBNET = "172.30.250.0/24"
HOST_IP = "172.30.250.1"
SERVICE_CIDR = "10.0.0.0/24"
CLUSTER_CIDR = "10.244.0.0/16"
HOLDER_ARGV0 = f"{PREFIX}-holder-"
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Written by the kubelet's container manager (setupKernelTunables) unless protectKernelDefaults.
KERNEL_TUNABLES = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
# Directories of the node that replace the host's inside its mount namespace.
NODE_BINDS = ("var/lib", "run", "var/log")


def state_file() -> Path:
    """Where host changes are recorded between runs (survives an interrupted run)."""
    root = Path(os.environ.get("CD_E2E_CACHE", Path.home() / ".cache" / "compute-domain-e2e"))
    return root / "realnodes-host-state.json"


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


def record_kernel_tunables() -> None:
    """Record the host's ``KERNEL_TUNABLES`` before any kubelet runs.

    Keeps an existing record: after an interrupted run the values on the host may already be
    the kubelet's, and the record holds the originals."""
    path = state_file()
    state = _read_state()
    if "sysctls" in state:
        return
    state["sysctls"] = {
        t: Path(f"/proc/sys/{t}").read_text().strip()
        for t in KERNEL_TUNABLES
        if Path(f"/proc/sys/{t}").exists()
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(state, indent=1))


def recorded_tunables() -> dict[str, str]:
    """The host's kernel tunables as recorded before the first kubelet ran (may be empty)."""
    return dict(_read_state().get("sysctls", {}))


def _read_state() -> dict[str, dict[str, str]]:
    try:
        data = json.loads(state_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


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

    Kills node processes (by namespace), removes cgroup roots, links and the bridge, restores
    the recorded kernel tunables and drops the state file. Returns what it removed."""
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
    with contextlib.suppress(FileNotFoundError):
        state_file().unlink()
    return done


def leftovers(
    work_root: Path | None = None, *, tunables: dict[str, str] | None = None
) -> list[str]:
    """What this tier still has on the host; ``[]`` means the host is as it was.

    ``work_root``: also report host mounts under it (there should never be any: node mounts
    live in the nodes' own mount namespaces). ``tunables``: the recorded kernel tunables to
    compare with (default: the state file's; :func:`sweep` removes that file)."""
    out = [f"process {p} (namespace holder)" for p in _holders()]
    out += [f"cgroup /{n}" for n in _prefixed_cgroup_roots()]
    out += [f"link {n}" for n in _prefixed_links()]
    recorded = tunables if tunables is not None else recorded_tunables()
    for tunable, value in recorded.items():
        p = Path(f"/proc/sys/{tunable}")
        if p.exists() and p.read_text().strip() != value:
            out.append(f"sysctl {tunable} is {p.read_text().strip()}, was {value}")
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
    "ensure_bridge",
    "ensure_cgroup_root",
    "kill_namespace",
    "leftovers",
    "node_ip",
    "pod_cidr",
    "record_kernel_tunables",
    "recorded_tunables",
    "remove_cgroup_root",
    "run",
    "sweep",
]
