"""Helpers of the real-node lane (and ``make demo`` on real nodes).

``kubectl`` as a user runs it, polling with a deadline, watching one pod's every version
(:class:`PodWatch`, for states that last a second), the simulated IMEX's hold file
(:func:`imex_hold_file`), the per-node fake GPU files and fake driver root
(:func:`prepare_node`), and deploying ``config/overlays/e2e-real-nodes`` (:func:`deploy_driver`,
which first installs the Prometheus Operator CRDs the overlay's monitoring component needs,
:func:`install_monitoring_crds`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from localcluster.realnode import RealNode, RealNodes
from nodeimages import driver_image_refs

from pkg.api import constants as c
from pkg.imex.sim.imexd import HOLD_FILE
from pkg.kubeletplugin.checkpoint import CHECKPOINT_FILE
from pkg.kubeletplugin.checkpointformat import ClaimState, decode_checkpoint
from pkg.kubeletplugin.state import domain_dir
from pkg.testing.eventually import eventually
from pkg.testing.fakedriverroot import FakeDriverRoot, host_arch

REPO = Path(__file__).resolve().parents[2]
REAL_NODES = ("real-1", "real-2")
# The arm64 node (test_real_arm64): it runs only during that module, so no other test's pod may
# land on it, and it is not in REAL_NODES; the cluster still needs its identity from the start.
ARM64_NODE = "real-arm64"
GPU_NODE_LABELS = {"nvidia.com/gpu.present": "true"}
# Every node in one NVLink clique (as hack/kind/nodes/worker{,2}).
FAKE_GPUS = {
    "driverVersion": "580.65.06",
    "gpuCount": 2,
    "clusterUUID": "00000000-0000-0000-0000-0000000000e2",
    "cliqueId": 1,
    "fabric": {"state": "COMPLETED", "status": 0},
}
OVERLAY = REPO / "config" / "overlays" / "e2e-real-nodes"
DRIVER_NAMESPACE = "nvidia-dra-driver"
CD_LABEL = "resource.nvidia.com/computeDomain"
KUBECTL = REPO / ".venv" / "bin" / "kubectl"
# The Prometheus Operator release whose PodMonitor / PrometheusRule CRDs validate the
# monitoring component (config/components/monitoring) on the real apiserver. The CRD YAML comes
# from the Go module proxy (its module zip carries example/prometheus-operator-crd/).
PROMETHEUS_OPERATOR_MODULE = "github.com/prometheus-operator/prometheus-operator@v0.85.0"
MONITORING_CRDS = ("podmonitors", "prometheusrules")
T = TypeVar("T")


class Kubectl:
    """``kubectl --kubeconfig=<admin>``; raises with stderr when a command fails."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig

    def __call__(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 240
    ) -> str:
        """Run kubectl; returns stdout (plus stderr when ``check`` is False)."""
        done = subprocess.run(
            [str(KUBECTL), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout + ("" if check else done.stderr)

    def json(self, *args: str) -> dict[str, Any]:
        """``kubectl <args> -o json`` decoded."""
        out: dict[str, Any] = json.loads(self(*args, "-o", "json"))
        return out

    def items(self, *args: str) -> list[dict[str, Any]]:
        """``kubectl get <args> -o json`` items."""
        items: list[dict[str, Any]] = self.json("get", *args)["items"]
        return items


class PodWatch:
    """Every version of one pod, as ``kubectl get pod -w -o json`` streams them.

    A poll can miss a state the kubelet writes and overwrites within a second; a watch sees
    every written version. Use as a context manager; :meth:`wait` returns the first version
    (from the start of the watch) that ``match`` accepts."""

    def __init__(self, kubectl: Kubectl, ns: str, pod: str) -> None:
        self._proc = subprocess.Popen(
            [
                str(KUBECTL),
                f"--kubeconfig={kubectl.kubeconfig}",
                "-n",
                ns,
                "get",
                "pod",
                pod,
                "-w",
                "-o",
                "json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._seen: list[tuple[float, dict[str, Any]]] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        decoder = json.JSONDecoder()
        buf = ""
        for line in self._proc.stdout:
            buf += line
            while buf.strip():
                try:
                    obj, end = decoder.raw_decode(buf.lstrip())
                except json.JSONDecodeError:
                    break  # an incomplete document: read on
                buf = buf.lstrip()[end:]
                with self._cond:
                    self._seen.append((time.monotonic(), obj))
                    self._cond.notify_all()

    def wait(
        self, what: str, match: Callable[[dict[str, Any]], T | None], timeout: float
    ) -> tuple[float, T]:
        """``(monotonic time seen, match(version))`` of the first version that matches."""
        deadline = time.monotonic() + timeout
        i = 0
        with self._cond:
            while True:
                for at, obj in self._seen[i:]:
                    i += 1
                    value = match(obj)
                    if value:
                        return at, value
                left = deadline - time.monotonic()
                if left <= 0 or self._proc.poll() is not None:
                    raise AssertionError(
                        f"{what} not seen in {len(self._seen)} versions of the pod within "
                        f"{timeout:.0f}s (watch exited: {self._proc.poll() is not None})"
                    )
                self._cond.wait(left)

    def versions(self) -> list[tuple[float, dict[str, Any]]]:
        """Every ``(monotonic time seen, version)`` so far, oldest first."""
        with self._cond:
            return list(self._seen)

    def __enter__(self) -> PodWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self._proc.kill()
        self._proc.wait()
        self._reader.join(timeout=5)


def wait_for(what: str, fn: Callable[[], T | None], timeout: float = 60, every: float = 0.5) -> T:
    """Poll ``fn`` until it returns a truthy value; fail naming ``what`` after ``timeout``. A
    failing kubectl (AssertionError) keeps polling and is reported if it is the last word."""
    value = eventually(fn, timeout, what=what, every=every, ignore=(AssertionError,))
    assert value is not None  # truthy
    return value


def prepare_node(node: RealNode) -> None:
    """Node-private files the overlay's hostPaths expect: fake GPUs, /proc/devices, driver root.

    The driver root (``NVIDIA_DRIVER_ROOT`` of the overlay) holds the simulated IMEX as
    ``nvidia-imex``: the daemons reach it only through the plugin's CDI spec. It is laid out
    for the node's architecture (``usr/lib/aarch64-linux-gnu`` and an aarch64 kernel module
    banner on an arm64 node)."""
    fake = node.ns.path("/var/lib/compute-domain-fake")
    fake.mkdir(parents=True)
    (fake / "fake-gpus.json").write_text(json.dumps(FAKE_GPUS))
    shutil.copy(REPO / "hack" / "kind" / "nodes" / "worker" / "proc-devices", fake / "proc-devices")
    FakeDriverRoot.create(fake / "driver-root", arch=host_arch(node.arch))


def monitoring_crd_files() -> list[Path]:
    """The PodMonitor and PrometheusRule CRDs of ``PROMETHEUS_OPERATOR_MODULE``, downloaded
    with ``go mod download`` into the Go module cache (nothing of it enters the repository)."""
    with tempfile.TemporaryDirectory(prefix="promop-") as scratch:  # outside any go.mod
        out = subprocess.run(
            ["go", "mod", "download", "-json", PROMETHEUS_OPERATOR_MODULE],
            cwd=scratch,
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, "GOFLAGS": "-mod=mod"},
        )
    crd_dir = Path(json.loads(out.stdout)["Dir"]) / "example" / "prometheus-operator-crd"
    return [crd_dir / f"monitoring.coreos.com_{name}.yaml" for name in MONITORING_CRDS]


def install_monitoring_crds(kubectl: Kubectl) -> None:
    """Apply the Prometheus Operator's PodMonitor and PrometheusRule CRDs; wait until the API
    server serves them."""
    for path in monitoring_crd_files():
        kubectl("apply", "--server-side", "-f", str(path))
    names = [f"crd/{n}.monitoring.coreos.com" for n in MONITORING_CRDS]
    kubectl("wait", "--for=condition=Established", "--timeout=60s", *names)


def deploy_driver(kubectl: Kubectl, *, nodes: int = len(REAL_NODES)) -> str:
    """Install the monitoring CRDs, ``kubectl apply --server-side -k`` the overlay (the driver
    plus its monitoring component); wait for the controller Deployment and a Ready plugin pod
    on each of ``nodes`` nodes; check every driver container runs one of our images. Returns
    the driver namespace."""
    install_monitoring_crds(kubectl)
    kubectl("apply", "--server-side", "-k", str(OVERLAY))
    ns = DRIVER_NAMESPACE
    for obj in ("deployment/compute-domain-controller", "daemonset/compute-domain-kubelet-plugin"):
        kubectl("-n", ns, "rollout", "status", obj, "--timeout=180s")

    def plugins_ready() -> bool:
        ds = kubectl.json("-n", ns, "get", "daemonset/compute-domain-kubelet-plugin")
        return int(ds.get("status", {}).get("numberReady", 0)) == nodes

    wait_for("a Ready plugin pod per node", plugins_ready, timeout=120)
    ours = set(driver_image_refs().values())
    for pod in kubectl.items("pods", "-n", ns):
        for status in pod["status"].get("containerStatuses", []):
            assert status["image"].removeprefix("docker.io/") in ours, (
                f"{pod['metadata']['name']} runs {status['image']}, not one of our images {ours}"
            )
    return ns


def sample_workload(ns: str, command: str, *, mode: str = "Single") -> str:
    """``config/samples`` (ComputeDomain + 2-pod Job) in ``ns`` as YAML, the Job's worker running
    ``sh -c command`` and the domain's channel in ``mode`` (``Single`` or ``All``)."""
    out: list[dict[str, Any]] = []
    for f in ("computedomain.yaml", "job.yaml"):
        for d in yaml.safe_load_all((REPO / "config" / "samples" / f).read_text()):
            if not d:
                continue
            d["metadata"]["namespace"] = ns
            if d["kind"] == "ComputeDomain":
                d["spec"]["channel"]["allocationMode"] = mode
            if d["kind"] == "Job":
                d["spec"]["template"]["spec"]["containers"][0]["command"] = ["sh", "-c", command]
            out.append(d)
    return yaml.safe_dump_all(out)


def domain(ns: str, name: str = "cd") -> dict[str, Any]:
    """A ComputeDomain without ``numNodes`` whose claim template is ``<name>-rct``."""
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": f"{name}-rct"}}},
    }


def channel_pod(
    ns: str, name: str, node: str, cmd: str, rct: str = "cd-rct", *, restart: str = "Never"
) -> dict[str, Any]:
    """A busybox pod pinned to ``node`` running ``sh -c cmd`` with a claim from ``rct``
    (``restart``: its ``restartPolicy``)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "w",
                    "image": "busybox:1.37",
                    "command": ["sh", "-c", cmd],
                    "resources": {"claims": [{"name": "ch"}]},
                }
            ],
            "resourceClaims": [{"name": "ch", "resourceClaimTemplateName": rct}],
        },
    }


def apply(kubectl: Kubectl, *objs: dict[str, Any]) -> None:
    """``kubectl apply`` the objects."""
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objs))


def phase(kubectl: Kubectl, ns: str, pod: str) -> str:
    """The pod's ``status.phase``."""
    return str(kubectl.json("-n", ns, "get", "pod", pod).get("status", {}).get("phase", ""))


def daemon_pod(kubectl: Kubectl, driver: str, uid: str, node: str) -> dict[str, Any] | None:
    """The IMEX daemon pod of domain ``uid`` on ``node``, if any."""
    for p in kubectl.items("pods", "-n", driver, "-l", f"{CD_LABEL}={uid}"):
        if p["spec"].get("nodeName") == node:
            return p
    return None


def pod_ready(pod: dict[str, Any] | None) -> bool:
    """True if the pod's Ready condition is True."""
    conds = (pod or {}).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def pod_summary(pod: dict[str, Any]) -> str:
    """One line on where a pod is: namespace/name, node, phase, readiness, and each container's
    restarts and state (what a failure message needs when a pod did not get Ready)."""
    meta, status = pod["metadata"], pod.get("status", {})
    containers = [
        f"{cs.get('name')} restarts={cs.get('restartCount', 0)} {cs.get('state', {})}"
        for cs in status.get("containerStatuses", [])
    ]
    deleting = " deleting" if meta.get("deletionTimestamp") else ""
    return (
        f"{meta.get('namespace')}/{meta['name']} on {pod['spec'].get('nodeName')}: "
        f"{status.get('phase')}{deleting}, ready={pod_ready(pod)}, "
        f"{'; '.join(containers) or 'no container status'}"
    )


def ready_daemon(kubectl: Kubectl, driver: str, uid: str, node: str) -> dict[str, Any] | None:
    """The daemon pod of domain ``uid`` on ``node`` if it is Ready, else None."""
    d = daemon_pod(kubectl, driver, uid, node)
    return d if pod_ready(d) else None


def imex_hold_file(nodes: RealNodes, node: str, uid: str) -> Path:
    """The simulated IMEX's hold file of domain ``uid`` on ``node``: while it exists, the IMEX
    of that domain's daemon answers ``NOT_READY`` (``pkg.imex.sim.imexd``). Create it right
    after killing the daemon to keep the restarted one not Ready; remove it in a ``finally``."""
    plugin_dir = nodes[node].ns.path(f"/var/lib/kubelet/plugins/{c.DRIVER_NAME}")
    return domain_dir(plugin_dir, uid) / HOLD_FILE


def container_pids(node: str, needle: str) -> list[int]:
    """PIDs in ``node``'s pod cgroups whose command line contains ``needle``."""
    root = Path("/sys/fs/cgroup/pids") / f"cde2e-{node}"
    pids: list[int] = []
    for d, _, _ in os.walk(root):
        try:
            procs = (Path(d) / "cgroup.procs").read_text().split()
        except OSError:
            continue
        for p in procs:
            try:
                cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if needle in cmd:
                pids.append(int(p))
    return pids


def scrape(nodes: RealNodes, pod: dict[str, Any], port: int, path: str = "/metrics") -> str:
    """``GET http://<pod IP>:<port><path>`` from inside the pod's node, as Prometheus would."""
    node = nodes[pod["spec"]["nodeName"]]
    return node.ns.run(
        ["curl", "-sf", "--max-time", "5", f"http://{pod['status']['podIP']}:{port}{path}"]
    )


def prepared_claims(node: RealNode) -> tuple[set[str], list[str]]:
    """What ``node``'s plugin holds prepared: the claim UIDs of its checkpoint (without the
    PrepareAborted tombstones, which hold no devices and expire) and the names of its per-claim
    CDI specs (each ends in ``_<claim UID>.yaml``)."""
    plugin_dir = node.ns.path(f"/var/lib/kubelet/plugins/{c.DRIVER_NAME}")
    claims: set[str] = set()
    with contextlib.suppress(OSError, ValueError):
        decoded = decode_checkpoint((plugin_dir / CHECKPOINT_FILE).read_bytes())
        live = decoded.entries.items()
        claims = {u for u, e in live if e.state != ClaimState.PREPARE_ABORTED}
    cdi = node.ns.path("/var/run/cdi")
    specs = sorted(p.name for p in cdi.glob("*claim*")) if cdi.is_dir() else []
    return claims, specs


def channel_devices(kubectl: Kubectl) -> dict[str, dict[str, Any]]:
    """Each node's published ``channel-0`` device (from its ResourceSlice of our driver)."""
    out = {}
    for s in kubectl.items("resourceslices"):
        if s["spec"].get("driver") != c.DRIVER_NAME:
            continue
        for d in s["spec"].get("devices") or []:
            if d["name"] == c.CHANNEL_DEVICE_NAME:
                out[s["spec"]["nodeName"]] = d
    return out
