"""Real nodes for the local cluster: containerd v2 + kubelet + kube-proxy per node, no Docker.

Owns the configuration and lifecycle of the node components of one real node, each running
inside the node's own network + mount namespace (``hostnet.NodeNamespace``):

* containerd (``version = 3`` config): own root/state/socket at the production paths inside
  the namespace, CRI with CDI (``/etc/cdi``, ``/var/run/cdi``), runc from Debian, the CNI bridge
  plugin on the node's pod subnet (masquerading), the pinned pause image, and
  ``restrict_oom_score_adj`` (the VM lacks CAP_SYS_RESOURCE);
* kubelet v1.37: ``cgroupfs`` driver under the node's own cgroup root, ``failCgroupV1: false``
  (the host is cgroup v1), its own ``/var/lib/kubelet`` (the driver's DaemonSets use the
  production hostPaths unchanged), x509 client authentication for the apiserver's
  ``logs``/``exec`` calls, relaxed eviction and image GC (images are imported, never pulled);
* kube-proxy (iptables mode, conntrack sysctls left alone) so pods reach the API server through
  the ``kubernetes`` Service;
* a boot ID of its own (``BOOT_ID_FILE``, written at every start of the node): the kernel's
  ``/proc/sys/kernel/random/boot_id`` is one for all nodes of this host, so containerd's base
  runtime spec (``base_runtime_spec``: ``ctr oci spec`` plus a ``createContainer`` hook) binds
  the node's file over it in every container, where the kubelet plugin reads it.

Faults a node can suffer (the real-node chaos suite): :meth:`RealNode.kill` SIGKILLs containerd
or the kubelet (:meth:`RealNode.restart` starts it again, as systemd would);
:meth:`RealNode.partition` / :meth:`RealNode.heal` take the node's link down and up;
:meth:`RealNode.reboot` power-cycles it (every process killed, every mount of its namespace
gone, ``/run`` emptied, ``/var/lib`` and ``/var/log`` kept, a new boot ID).

A node may have a foreign architecture (``arch="arm64"`` on this amd64 host): its containerd
is then ``<bin>/linux-<arch>/containerd`` (``hack/build-control-plane.sh``), which the kernel
runs through the qemu-user binfmt handler (``hostnet.foreign_arch``, registered by the caller),
because containerd's CRI image store holds only images of containerd's own platform; images
are imported for ``linux/<arch>`` and so are its pods' processes, through the same handler.
The shim, runc, kubelet and kube-proxy stay the host's (the kubelet therefore labels the Node
``kubernetes.io/arch`` with the host's architecture). qemu-user has no seccomp, so that
containerd runs pod sandboxes without a seccomp profile (a build-time change, see
``hack/build-control-plane.sh``). Emulated code is slower (Python 5-10x): callers give such a
node generous timeouts.

:class:`RealNodes` starts N of them against a :class:`~localcluster.cluster.Cluster` started
with ``advertise_address=hostnet.HOST_IP`` (:meth:`RealNodes.add` joins one more and
:meth:`RealNodes.remove` takes it out again) and tears everything down again, checking that
the host is as it found it (``hostnet.leftovers``). Facts and pitfalls:
``shared/reference/real-node-tier.md``.
"""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hostsys import binfmt

from . import hostnet
from .cluster import Cluster
from .pki import write_kubeconfig
from .processes import ClusterError, Proc, tail

RUNC = "/usr/sbin/runc"
CURL = "/usr/bin/curl"  # probes inside a node's namespace
CNI_BIN_DIR = "/usr/lib/cni"
CONTAINERD_SOCK = "/run/containerd/containerd.sock"
#: The node's boot ID, inside the node (under ``/run``: a reboot empties it, the node's start
#: writes a new one); bound over ``/proc/sys/kernel/random/boot_id`` in every container.
BOOT_ID_FILE = "/run/cde2e-boot-id"
#: The ``createContainer`` hook of :func:`base_runtime_spec`. runc runs it in the container's
#: mount namespace after the container's mounts (``/proc`` among them) and before pivot_root,
#: with the rootfs as working directory, so the node's paths are still reachable. A node
#: without the file (a foreign tool started the container) changes nothing.
BOOT_ID_HOOK = (
    f"[ -f {BOOT_ID_FILE} ] || exit 0; "
    f"exec /usr/bin/mount --bind {BOOT_ID_FILE} proc/sys/kernel/random/boot_id"
)
REQUIRED_HOST_TOOLS = ("unshare", "nsenter", "ip", "iptables", "sysctl", RUNC, CURL)
REQUIRED_BINS = ("kubelet", "kube-proxy", "containerd", "containerd-shim-runc-v2", "ctr")
#: What a node of a foreign architecture runs of that architecture (``<bin>/linux-<arch>/``).
FOREIGN_BINS = ("containerd",)
NATIVE_ARCH = binfmt.native_arch()
#: Seconds until containerd answers: natively it takes ~1 s, under qemu ~2 s on an idle host.
CONTAINERD_TIMEOUT = 30.0
CONTAINERD_TIMEOUT_QEMU = 120.0


def foreign_bin_dir(bin_dir: Path, arch: str) -> Path:
    """Where ``hack/build-control-plane.sh`` puts the node binaries of ``arch``."""
    return bin_dir / f"linux-{arch}"


def missing_prerequisites(bin_dir: Path, arches: Sequence[str] = ()) -> list[str]:
    """What the real-node tier lacks on this host (``[]`` = it can run); ``arches``: also
    what nodes of those architectures (OCI names) need: their containerd, qemu-user-static."""
    out = [f"{bin_dir / b} (run hack/build-control-plane.sh)" for b in REQUIRED_BINS]
    out = [o for o, b in zip(out, REQUIRED_BINS, strict=True) if not (bin_dir / b).is_file()]
    for arch in arches:
        if arch == NATIVE_ARCH:
            continue
        for b in FOREIGN_BINS:
            path = foreign_bin_dir(bin_dir, arch) / b
            if not path.is_file():
                out.append(f"{path} (run hack/build-control-plane.sh)")
        conf = binfmt.BINFMT_D / f"{binfmt.handler_name(arch)}.conf"
        if not conf.is_file():
            out.append(f"{conf} of qemu-user-static (run hack/node-deps.sh)")
    for tool in REQUIRED_HOST_TOOLS:
        if shutil.which(tool) is None:
            out.append(f"{tool} (run hack/node-deps.sh)")
    if not Path(CNI_BIN_DIR, "bridge").is_file():
        out.append(f"{CNI_BIN_DIR}/bridge (run hack/node-deps.sh)")
    return out


def base_runtime_spec(ctr: Path) -> dict[str, Any]:
    """containerd's default OCI spec (``ctr oci spec``, containerd's documented way to make a
    base runtime spec) with the node's boot ID hook (``BOOT_ID_HOOK``) added."""
    out = subprocess.run([str(ctr), "oci", "spec"], capture_output=True, text=True, check=True)
    spec: dict[str, Any] = json.loads(out.stdout)
    hooks = spec.setdefault("hooks", {})
    hooks.setdefault("createContainer", []).append(
        {"path": "/bin/sh", "args": ["sh", "-c", BOOT_ID_HOOK], "timeout": 10}
    )
    return spec


def containerd_config(node_dir: Path, pause_image: str, base_spec: Path | None = None) -> str:
    """The containerd v2 (``version = 3``) config of one node (``base_spec``: the runc
    runtime's ``base_runtime_spec``)."""
    base = f'\n        base_runtime_spec = "{base_spec}"' if base_spec is not None else ""
    return f"""version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "{CONTAINERD_SOCK}"

[plugins.'io.containerd.internal.v1.opt']
  path = "/var/lib/containerd-opt"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{pause_image}"

[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"{base}
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{CNI_BIN_DIR}"]
    conf_dir = "{node_dir / "cni"}"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
"""


def cni_config(index: int) -> dict[str, object]:
    """Bridge + host-local on the node's pod subnet; masquerade off-node traffic."""
    return {
        "cniVersion": "1.0.0",
        "name": "cde2e",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "isDefaultGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": hostnet.pod_cidr(index)}]]},
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(
    name: str, ca_file: Path, feature_gates: Mapping[str, bool]
) -> dict[str, object]:
    """KubeletConfiguration of one node (see the module docstring for why each setting)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": hostnet.cgroup_root_name(name),
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCK}",
        "port": 10250,
        "healthzPort": 10248,
        "healthzBindAddress": "127.0.0.1",
        "readOnlyPort": 0,
        "failSwapOn": False,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "0%",
            "imagefs.available": "0%",
            "nodefs.inodesFree": "0%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "clusterDomain": "cluster.local",
        "nodeStatusUpdateFrequency": "5s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "5s",
        "featureGates": dict(feature_gates),
        "shutdownGracePeriod": "0s",
        "registerNode": True,
        "logging": {"format": "text"},
    }


def kube_proxy_config(name: str, kubeconfig: Path) -> dict[str, object]:
    """KubeProxyConfiguration: iptables mode; no host-global conntrack sysctls."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": name,
        "clusterCIDR": hostnet.CLUSTER_CIDR,
        "mode": "iptables",
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "metricsBindAddress": "127.0.0.1:10249",
        "healthzBindAddress": "127.0.0.1:10256",
    }


@dataclass
class RealNode:
    """One real node: its namespaces and its containerd, kubelet and kube-proxy processes.

    ``arch`` (OCI name) is the architecture of its containerd and so of its images and pods
    (see the module docstring)."""

    name: str
    index: int
    ns: hostnet.NodeNamespace
    cluster: Cluster
    node_dir: Path
    log_dir: Path
    procs: dict[str, Proc] = field(default_factory=dict)
    feature_gates: dict[str, bool] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    arch: str = NATIVE_ARCH
    pause_image: str = ""
    boot_id: str = ""

    @property
    def ip(self) -> str:
        return self.ns.ip

    @property
    def native(self) -> bool:
        """True unless the node's containerd runs through qemu-user."""
        return self.arch == NATIVE_ARCH

    @property
    def platform(self) -> str:
        """The OCI platform of the node's images and pods (``linux/arm64``)."""
        return f"linux/{self.arch}"

    def containerd_binary(self) -> Path:
        """The containerd the node runs: the host's, or ``<bin>/linux-<arch>/containerd``."""
        bin_dir = self.cluster.bin_dir
        return (
            bin_dir / "containerd"
            if self.native
            else foreign_bin_dir(bin_dir, self.arch) / "containerd"
        )

    def _spawn(self, component: str, argv: Sequence[str]) -> Proc:
        proc = Proc.spawn(f"{self.name}-{component}", self.ns.argv(argv), self.log_dir)
        self.procs[component] = proc
        return proc

    def _wait(self, what: str, probe: Callable[[], bool], proc: Proc, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not probe():
            if not proc.alive():
                raise ClusterError(
                    f"{proc.name} exited while waiting for {what}:\n{tail(proc.log_file, 40)}"
                )
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out waiting for {what}:\n{tail(proc.log_file, 40)}")
            time.sleep(0.2)

    def start_containerd(self, pause_image: str) -> None:
        """Start containerd and wait until its socket answers.

        Its ``PATH`` starts with the host's bin dir: the shim containerd execs
        (``containerd-shim-runc-v2``) is the host's also on a foreign node."""
        self.pause_image = pause_image
        base_spec = self.node_dir / "base-runtime-spec.json"
        if not base_spec.exists():
            spec = base_runtime_spec(self.cluster.bin_dir / "ctr")
            base_spec.write_text(json.dumps(spec, indent=1))
        cfg = self.node_dir / "containerd.toml"
        cfg.write_text(containerd_config(self.node_dir, pause_image, base_spec))
        cni = self.node_dir / "cni"
        cni.mkdir(exist_ok=True)
        (cni / "10-cde2e.conflist").write_text(json.dumps(cni_config(self.index), indent=1))
        bin_dir = self.cluster.bin_dir
        argv = ["env", f"PATH={bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin"]
        binary = self.containerd_binary()
        proc = self._spawn("containerd", [*argv, str(binary), f"--config={cfg}"])
        ctr = [str(bin_dir / "ctr"), f"--address={CONTAINERD_SOCK}", "version"]
        self._wait(
            f"{self.name} containerd ({self.platform})",
            lambda: self.ns.run(ctr, check=False).find("Server:") >= 0,
            proc,
            CONTAINERD_TIMEOUT if self.native else CONTAINERD_TIMEOUT_QEMU,
        )

    def import_images(self, archives: Sequence[Path]) -> None:
        """Import OCI archives into the node's ``k8s.io`` containerd namespace.

        A foreign node imports the ``linux/<arch>`` image of each (``--platform``): an image
        index must have one, a single-manifest archive must be of that platform."""
        ctr = str(self.cluster.bin_dir / "ctr")
        platform = [] if self.native else ["--platform", self.platform]
        for a in archives:
            self.ns.run(
                [
                    ctr,
                    f"--address={CONTAINERD_SOCK}",
                    "-n",
                    "k8s.io",
                    "images",
                    "import",
                    *platform,
                    "--local",
                    str(a),
                ]
            )

    def start_kubelet(
        self,
        feature_gates: Mapping[str, bool] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        """Start (or restart) the kubelet; returns once its healthz answers.

        ``labels`` are registered with the Node (``--node-labels``; NodeRestriction admits
        only labels outside the ``kubernetes.io`` namespaces)."""
        if feature_gates is None:
            feature_gates = self.feature_gates
        if labels is None:
            labels = self.labels
        self.feature_gates, self.labels = dict(feature_gates), dict(labels)
        server = f"https://{hostnet.HOST_IP}:{self.cluster.ports.apiserver}"
        ident = self.cluster.identity(self.name)
        kubeconfig = self.node_dir / "kubelet.kubeconfig"
        write_kubeconfig(kubeconfig, server, self.cluster.ca_file.read_bytes(), ident)
        cfg = self.node_dir / "kubelet.json"
        cfg.write_text(
            json.dumps(kubelet_config(self.name, self.cluster.ca_file, feature_gates or {}))
        )
        hostnet.ensure_cgroup_root(self.name)
        argv = [
            str(self.cluster.bin_dir / "kubelet"),
            f"--config={cfg}",
            f"--kubeconfig={kubeconfig}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.ip}",
            *(
                [f"--node-labels={','.join(f'{k}={v}' for k, v in sorted(labels.items()))}"]
                if labels
                else []
            ),
            "--v=2",
        ]
        proc = self._spawn("kubelet", argv)
        healthz = [CURL, "-sS", "--max-time", "2", "http://127.0.0.1:10248/healthz"]
        self._wait(
            f"{self.name} kubelet healthz",
            lambda: "ok" in self.ns.run(healthz, check=False),
            proc,
            60,
        )

    def stop_kubelet(self) -> None:
        """Stop the kubelet only (containers keep running, as when a kubelet dies)."""
        proc = self.procs.pop("kubelet", None)
        if proc is not None:
            proc.stop(5)

    def start_kube_proxy(self) -> None:
        """Start kube-proxy with the ``system:kube-proxy`` identity."""
        server = f"https://{hostnet.HOST_IP}:{self.cluster.ports.apiserver}"
        kubeconfig = self.node_dir / "kube-proxy.kubeconfig"
        write_kubeconfig(
            kubeconfig,
            server,
            self.cluster.ca_file.read_bytes(),
            self.cluster.identity("kube-proxy"),
        )
        cfg = self.node_dir / "kube-proxy.json"
        cfg.write_text(json.dumps(kube_proxy_config(self.name, kubeconfig)))
        self._spawn(
            "kube-proxy", [str(self.cluster.bin_dir / "kube-proxy"), f"--config={cfg}", "--v=1"]
        )

    def new_boot_id(self) -> str:
        """Give the node a fresh boot ID (``BOOT_ID_FILE``), as the kernel does at boot; its
        containers started from now on read it as ``/proc/sys/kernel/random/boot_id``."""
        self.boot_id = str(uuid.uuid4())
        path = self.ns.path(BOOT_ID_FILE)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.boot_id + "\n")
        return self.boot_id

    def kill(self, component: str) -> None:
        """SIGKILL ``component`` (``containerd``, ``kubelet``, ``kube-proxy``) and its process
        group, as a crash would; what it started in groups of their own (containerd's shims,
        and with them every container) keeps running. :meth:`restart` starts it again."""
        proc = self.procs.pop(component, None)
        if proc is None:
            raise ClusterError(f"{self.name}: no {component} running")
        proc.kill()

    def restart(self, component: str) -> None:
        """Start ``component`` again (after :meth:`kill`) with the settings it had, as its
        systemd unit would; returns once it answers (kube-proxy: once started)."""
        if component in self.procs and self.procs[component].alive():
            raise ClusterError(f"{self.name}: {component} still runs")
        if component == "containerd":
            self.start_containerd(self.pause_image)
        elif component == "kubelet":
            self.start_kubelet()
        elif component == "kube-proxy":
            self.start_kube_proxy()
        else:
            raise ClusterError(f"{self.name}: no component {component!r}")

    def partition(self) -> None:
        """Cut the node off the network: its link to the bridge goes down (the node's own
        ``eth0`` loses its carrier). Every process keeps running. :meth:`heal` undoes it."""
        hostnet.run(["ip", "link", "set", self.ns.veth, "down"])

    def heal(self) -> None:
        """End a :meth:`partition`: the node's link comes up again."""
        hostnet.run(["ip", "link", "set", self.ns.veth, "up"])

    def reboot(self) -> None:
        """Power-cycle the node: every process in it dies at once (SIGKILL, no shutdown), its
        mount namespace and with it every mount (pod volumes, container rootfs) goes, ``/run``
        is emptied as a tmpfs is, ``/var/lib`` and ``/var/log`` are kept; then it boots with a
        new boot ID and starts containerd, the kubelet and kube-proxy (in that order, as their
        units would); returns once the kubelet answers. The Node object and its pods stay in
        the API: the kubelet finds them again, as after a real reboot."""
        for proc in reversed(list(self.procs.values())):
            proc.kill(2)
        self.procs.clear()
        self.ns.destroy()
        run_dir = self.node_dir / "root" / "run"
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        self.ns = hostnet.NodeNamespace.create(self.name, self.index, self.node_dir, self.log_dir)
        self.new_boot_id()
        self.start_containerd(self.pause_image)
        self.start_kubelet()
        self.start_kube_proxy()

    def stop(self) -> None:
        """Stop every component, kill everything in the node, remove its host state."""
        for proc in reversed(list(self.procs.values())):
            proc.stop(3)
        self.procs.clear()
        self.ns.destroy()


def _api(cluster: Cluster, method: str, path: str) -> dict[str, Any]:
    """``method`` on the API server as admin; the decoded answer (raises ``URLError``/``OSError``
    /``ValueError``; ``HTTPError`` for an error status)."""
    req = urllib.request.Request(
        f"{cluster.server}{path}",
        method=method,
        headers={"Authorization": f"Bearer {cluster.token('admin')}"},
    )
    ctx = ssl.create_default_context(cafile=str(cluster.ca_file))
    with urllib.request.urlopen(req, timeout=5, context=ctx) as resp:
        out: dict[str, Any] = json.load(resp)
    return out


def _node_ready(cluster: Cluster, name: str) -> bool:
    try:
        node = _api(cluster, "GET", f"/api/v1/nodes/{name}")
    except (urllib.error.URLError, OSError, ValueError):
        return False
    conds = node.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def _forget_node(cluster: Cluster, name: str) -> list[str]:
    """Delete the Node object of a stopped node and, at once, the pods bound to it (what the
    node lifecycle controller and pod GC would do after their grace periods); the errors."""
    errors: list[str] = []
    try:
        _api(cluster, "DELETE", f"/api/v1/nodes/{name}")
    except urllib.error.HTTPError as e:
        if e.code != 404:
            errors.append(f"DELETE node {name}: {e}")
    except (urllib.error.URLError, OSError, ValueError) as e:
        errors.append(f"DELETE node {name}: {e}")
    try:
        pods = _api(cluster, "GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{name}")
    except (urllib.error.URLError, OSError, ValueError) as e:
        return [*errors, f"list pods of {name}: {e}"]
    for pod in pods.get("items", []):
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}?gracePeriodSeconds=0"
        try:
            _api(cluster, "DELETE", path)
        except urllib.error.HTTPError as e:
            if e.code != 404:
                errors.append(f"DELETE pod {meta['namespace']}/{meta['name']}: {e}")
        except (urllib.error.URLError, OSError, ValueError) as e:
            errors.append(f"DELETE pod {meta['namespace']}/{meta['name']}: {e}")
    return errors


class RealNodes:
    """N real nodes joined to one cluster; :meth:`stop` leaves the host as it was found."""

    def __init__(self, cluster: Cluster, workdir: Path, nodes: list[RealNode]) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.nodes = nodes

    def __getitem__(self, name: str) -> RealNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    @classmethod
    def start(
        cls,
        cluster: Cluster,
        workdir: Path,
        names: Sequence[str],
        *,
        images: Sequence[Path],
        pause_image: str,
        prepare: Callable[[RealNode], None] | None = None,
        feature_gates: Mapping[str, bool] | None = None,
        labels: Mapping[str, str] | None = None,
        timeout: float = 120.0,
    ) -> RealNodes:
        """Sweep leftovers of an interrupted run, then start one real node per name.

        ``cluster`` must run with ``advertise_address=hostnet.HOST_IP`` and have a node
        identity per name. ``prepare(node)`` runs after the node's namespaces exist and before
        containerd starts (write node-private files, e.g. under ``node.ns.path('/var/lib/...')``).
        ``images``: OCI archives imported into every node. Returns once every Node is Ready."""
        missing = missing_prerequisites(cluster.bin_dir)
        if missing:
            raise ClusterError("real-node tier prerequisites missing: " + ", ".join(missing))
        hostnet.sweep()
        hostnet.record_host_state()
        workdir.mkdir(parents=True, exist_ok=True)
        fleet = cls(cluster, workdir, [])
        try:
            for index, name in enumerate(names, start=1):
                fleet._start_node(
                    name,
                    index,
                    arch=NATIVE_ARCH,
                    images=images,
                    pause_image=pause_image,
                    prepare=prepare,
                    feature_gates=feature_gates,
                    labels=labels,
                )
            fleet.wait_ready(timeout=timeout)
        except BaseException:
            fleet.stop()
            raise
        return fleet

    def _start_node(
        self,
        name: str,
        index: int,
        *,
        arch: str,
        images: Sequence[Path],
        pause_image: str,
        prepare: Callable[[RealNode], None] | None,
        feature_gates: Mapping[str, bool] | None,
        labels: Mapping[str, str] | None,
    ) -> RealNode:
        node_dir = self.workdir / name
        if node_dir.exists():
            shutil.rmtree(node_dir)
        node_dir.mkdir(parents=True)
        ns = hostnet.NodeNamespace.create(name, index, node_dir, self.cluster.log_dir)
        node = RealNode(name, index, ns, self.cluster, node_dir, self.cluster.log_dir, arch=arch)
        self.nodes.append(node)
        if prepare is not None:
            prepare(node)
        node.new_boot_id()
        node.start_containerd(pause_image)
        node.import_images(images)
        node.start_kubelet(feature_gates or {}, labels or {})
        node.start_kube_proxy()
        return node

    def add(
        self,
        name: str,
        *,
        arch: str = NATIVE_ARCH,
        images: Sequence[Path],
        pause_image: str,
        prepare: Callable[[RealNode], None] | None = None,
        feature_gates: Mapping[str, bool] | None = None,
        labels: Mapping[str, str] | None = None,
        timeout: float = 120.0,
    ) -> RealNode:
        """Start one more node, of architecture ``arch`` (OCI name), and join it to the cluster;
        returns once its Node is Ready. The other nodes are left alone.

        As :meth:`start` (``cluster`` needs a node identity for ``name``), with ``images`` the
        archives for this node: for a foreign ``arch`` each must hold a ``linux/<arch>`` image,
        ``pause_image`` included, and the qemu binfmt handler must be registered for as long as
        the node runs (``hostnet.foreign_arch``). On failure the node is removed again
        (:meth:`remove`) and :class:`ClusterError` raised."""
        if any(n.name == name for n in self.nodes):
            raise ClusterError(f"node {name} already runs")
        missing = missing_prerequisites(self.cluster.bin_dir, [arch])
        if missing:
            raise ClusterError(
                f"prerequisites of {arch} node {name} missing: " + ", ".join(missing)
            )
        if arch != NATIVE_ARCH and binfmt.handler_name(arch) not in binfmt.state():
            raise ClusterError(f"{arch} node {name}: register the qemu binfmt handler first")
        index = max((n.index for n in self.nodes), default=0) + 1
        try:
            node = self._start_node(
                name,
                index,
                arch=arch,
                images=images,
                pause_image=pause_image,
                prepare=prepare,
                feature_gates=feature_gates,
                labels=labels,
            )
            self.wait_ready([name], timeout=timeout)
        except BaseException:
            if any(n.name == name for n in self.nodes):
                self.remove(name)
            raise
        return node

    def remove(self, name: str) -> list[str]:
        """Stop node ``name`` alone, delete its Node object and the pods bound to it; returns
        what it left on the host or failed to delete (``[]`` = clean)."""
        node = self[name]
        errors: list[str] = []
        try:
            node.stop()
        except ClusterError as e:
            errors.append(str(e))
        self.nodes.remove(node)
        errors += _forget_node(self.cluster, name)
        return errors + hostnet.node_leftovers(name, node.index)

    def wait_ready(self, names: Sequence[str] | None = None, timeout: float = 120.0) -> None:
        """Wait until the named (default: all) Nodes report Ready=True."""
        want = list(names) if names is not None else [n.name for n in self.nodes]
        deadline = time.monotonic() + timeout
        while not all(_node_ready(self.cluster, n) for n in want):
            for node in self.nodes:
                for proc in node.procs.values():
                    if not proc.alive():
                        raise ClusterError(f"{proc.name} exited:\n{tail(proc.log_file, 40)}")
            if time.monotonic() > deadline:
                logs = "\n".join(
                    f"--- {p.name} ---\n{tail(p.log_file, 15)}"
                    for node in self.nodes
                    for p in node.procs.values()
                )
                raise ClusterError(f"nodes {want} not Ready after {timeout:.0f}s\n{logs}")
            time.sleep(0.5)

    def stop(self) -> list[str]:
        """Stop every node and sweep the host; returns what is left on it (``[]`` = clean)."""
        recorded = hostnet.recorded_tunables()
        handlers = hostnet.recorded_binfmt()
        binfmt_mounted = hostnet.recorded_binfmt_mounted()
        errors: list[str] = []
        for node in reversed(self.nodes):
            try:
                node.stop()
            except ClusterError as e:  # keep going: the sweep below retries
                errors.append(str(e))
        hostnet.sweep()
        return errors + hostnet.leftovers(
            self.workdir, tunables=recorded, binfmt_handlers=handlers, binfmt_mounted=binfmt_mounted
        )
