"""Benchmark: start-up of each binary in its image on a real node.

Brings up the real-node lane (control plane with an audit log of the driver's three
ServiceAccounts, two nodes running containerd and the kubelet, the driver from
``config/overlays/e2e-real-nodes``, a sample ComputeDomain with its 2-pod Job running), then
restarts each binary ``--starts`` times by deleting its pod (the DaemonSet or Deployment
creates the next one) and measures, per start:

* **start**, two references per start:
  - *containerd start* (the primary one): the container's ``StartedAt`` that containerd's CRI
    plugin records in its on-disk status (``<root>/io.containerd.grpc.v1.cri/containers/<id>/
    status``, nanoseconds) right after the runtime's start returned, i.e. just after runc
    released the container's init to exec the entry point;
  - *process created*: the start time of the container's main process (``/proc/<pid>/stat``,
    clock ticks since boot, converted to wall time with an offset measured here; 10 ms
    resolution). runc forks that process at *create*, before the kubelet's separate
    ``StartContainer`` call, so this reference also counts the kubelet's and containerd's work
    between the two calls (the figures before 2026-11-27 14:00 used only this one);
* **first API request**: the earliest ``requestReceivedTimestamp`` in the audit log of a
  request by that pod (the bound token's ``pod-name`` in ``user.extra``);
* **serving** (plugin): its log line ``serving DRA on`` (both sockets listening, so the
  kubelet's plugin watcher can register it);
* **ready**: plugin -- its log line ``kubelet registered plugin`` (the kubelet called
  ``NotifyRegistrationStatus``; the kubelet's plugin manager reconciles every second, so this
  adds 0-1 s after *serving* for any plugin, Go or Python); daemon -- its first write of the
  domain's clique (audit);
  controller -- its log line ``caches synced`` (the controller runs one replica for the
  measurement, and the leader lease is released by the old pod on SIGTERM).

Prints p50/min/max per binary and stage. The Go binaries are not in this run (no image of them
is built here); ``docs/benchmarks.md`` holds the figures.

    .venv/bin/python hack/bench/startup_real.py [--starts 10] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from localcluster import Cluster, bin_dir
from localcluster.hostnet import HOST_IP
from localcluster.realnode import RealNodes, missing_prerequisites
from nodeimages import PAUSE_IMAGE, build_all
from testsupport.realsupport import (
    DRIVER_NAMESPACE,
    GPU_NODE_LABELS,
    REAL_NODES,
    Kubectl,
    container_pids,
    deploy_driver,
    prepare_node,
    sample_workload,
    wait_for,
)

REPO = Path(__file__).resolve().parents[2]

NS = "startup-bench"
SA = f"system:serviceaccount:{DRIVER_NAMESPACE}:"
AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  users: ["{SA}compute-domain-controller", "{SA}compute-domain-kubelet-plugin",
          "{SA}compute-domain-daemon"]
- level: None
"""
PLUGIN_PODS = "app.kubernetes.io/name=compute-domain-kubelet-plugin"
CONTROLLER_PODS = "app.kubernetes.io/name=compute-domain-controller"
POD_NAME = "authentication.kubernetes.io/pod-name"
GLOG = re.compile(r"^[IWEF](\d\d)(\d\d) (\d\d:\d\d:\d\d\.\d+)")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def boot_offset() -> float:
    """Wall-clock time minus CLOCK_BOOTTIME, sampled tightly (to turn process start ticks into
    wall time)."""
    best: tuple[float, float] | None = None
    for _ in range(20):
        a = time.time()
        b = time.clock_gettime(time.CLOCK_BOOTTIME)
        c = time.time()
        if best is None or c - a < best[0]:
            best = (c - a, (a + c) / 2 - b)
    assert best is not None
    return best[1]


def process_start(pid: int, offset: float) -> float:
    """Wall time at which ``pid`` started (10 ms resolution)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[19]) / CLK_TCK + offset  # field 22 overall: starttime


def audit_events(path: Path) -> list[dict[str, Any]]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def wall(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def first_request(events: list[dict[str, Any]], pod: str, *, writes_to: str = "") -> float | None:
    """Earliest request by ``pod`` (optionally: a write to resource ``writes_to``)."""
    times = []
    for ev in events:
        extra = (ev.get("user") or {}).get("extra") or {}
        if pod not in (extra.get(POD_NAME) or []):
            continue
        ref = ev.get("objectRef") or {}
        if writes_to and (
            ref.get("resource") != writes_to or ev.get("verb") not in ("create", "update", "patch")
        ):
            continue
        times.append(wall(ev["requestReceivedTimestamp"]))
    return min(times) if times else None


def log_time(kubectl: Kubectl, pod: str, needle: str) -> float | None:
    """Wall time of the first log line of ``pod`` containing ``needle`` (glog header)."""
    text = kubectl("-n", DRIVER_NAMESPACE, "logs", pod, check=False)
    year = datetime.now(UTC).year
    for line in text.splitlines():
        m = GLOG.match(line)
        if m and needle in line:
            month, day, clock = m.groups()
            stamp = f"{year}-{month}-{day}T{clock}+00:00"
            return datetime.fromisoformat(stamp).timestamp()
    return None


def pods(kubectl: Kubectl, selector: str, node: str | None = None) -> list[dict[str, Any]]:
    items = kubectl.items("pods", "-n", DRIVER_NAMESPACE, "-l", selector)
    return [p for p in items if node is None or p["spec"].get("nodeName") == node]


def restart(
    kubectl: Kubectl,
    fleet: RealNodes,
    selector: str,
    node: str | None,
    *,
    needle: str,
    offset: float,
) -> tuple[str, float, float | None]:
    """Delete the pod(s) of ``selector`` (on ``node``), wait for the replacement to run; its
    name, the start time of its main process (found by ``needle`` in the command line) and
    containerd's start stamp of that container (None if unreadable)."""
    old = {p["metadata"]["name"] for p in pods(kubectl, selector, node)}
    for name in old:  # one may be terminating already (a replica deleted earlier)
        kubectl("-n", DRIVER_NAMESPACE, "delete", "pod", name, "--wait=false", check=False)

    def new_running() -> dict[str, Any] | None:
        for p in pods(kubectl, selector, node):
            statuses = p.get("status", {}).get("containerStatuses") or [{}]
            running = all("running" in (s.get("state") or {}) for s in statuses)
            if p["metadata"]["name"] not in old and running:
                return p
        return None

    pod = wait_for("a new pod running", new_running, timeout=180, every=0.2)
    name, where, uid = pod["metadata"]["name"], pod["spec"]["nodeName"], pod["metadata"]["uid"]
    pids = wait_for(f"the process of {name}", lambda: pod_pids(where, uid, needle), timeout=60)
    started = [containerd_started(fleet, where, s) for s in pod["status"]["containerStatuses"]]
    stamps = [t for t, pid in (x for x in started if x is not None) if pid in pids]
    return name, min(process_start(pid, offset) for pid in pids), min(stamps, default=None)


def containerd_started(
    fleet: RealNodes, node: str, status: dict[str, Any]
) -> tuple[float, int] | None:
    """(StartedAt as wall time, init PID) of a container from containerd's CRI status file on
    ``node``; None when it cannot be read."""
    cid = (status.get("containerID") or "").removeprefix("containerd://")
    if not cid:
        return None
    cri = "/var/lib/containerd/io.containerd.grpc.v1.cri/containers"
    path = fleet[node].ns.path(f"{cri}/{cid}/status")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not data.get("StartedAt"):
        return None
    return data["StartedAt"] / 1e9, int(data.get("Pid") or 0)


def pod_pids(node: str, uid: str, needle: str) -> list[int]:
    """PIDs of pod ``uid`` on ``node`` whose command line contains ``needle`` (the old pod of
    the same name may still be terminating beside it)."""
    marks = (f"pod{uid}", f"pod{uid.replace('-', '_')}")
    return [
        pid
        for pid in container_pids(node, needle)
        if any(m in Path(f"/proc/{pid}/cgroup").read_text() for m in marks)
    ]


Stages = dict[str, float | None]


def measure(what: str, starts: int, once: Callable[[], Stages]) -> dict[str, list[float]]:
    """Run ``once`` ``starts`` times; each stage's durations (seconds), in first-seen order."""
    got: dict[str, list[float]] = {}
    for i in range(starts):
        stages = once()
        log(f"{what} start {i + 1}: " + ", ".join(f"{k} {_ms(v)}" for k, v in stages.items()))
        for stage, value in stages.items():
            got.setdefault(stage, [])
            if value is not None:
                got[stage].append(value)
    return got


def stages(t_proc: float, t_start: float | None, marks: dict[str, float | None]) -> Stages:
    """Each mark measured from containerd's start stamp and from process creation."""
    out: Stages = {}
    for mark, at in marks.items():
        out[f"{mark} (containerd start)"] = None if at is None or t_start is None else at - t_start
        out[f"{mark} (process created)"] = None if at is None else at - t_proc
    return out


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--starts", type=int, default=10)
    ap.add_argument("--workdir", type=Path)
    args = ap.parse_args()
    missing = missing_prerequisites(bin_dir())
    if os.geteuid() != 0 or missing:
        print(f"real nodes unavailable: {missing or ['needs root']}", file=sys.stderr)
        return 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="cd-startup-"))
    audit, policy = workdir / "audit.log", workdir / "audit-policy.yaml"
    workdir.mkdir(parents=True, exist_ok=True)
    policy.write_text(AUDIT_POLICY)
    images = build_all()
    cluster = Cluster.start(
        bin_dir(build=True),
        workdir / "cluster",
        node_names=REAL_NODES,
        advertise_address=HOST_IP,
        apiserver_args=[
            f"--audit-policy-file={policy}",
            f"--audit-log-path={audit}",
            "--audit-log-mode=blocking",
        ],
    )
    kubectl = Kubectl(cluster.kubeconfig("admin"))
    fleet: RealNodes | None = None
    results: dict[str, dict[str, list[float]]] = {}
    try:
        fleet = RealNodes.start(
            cluster,
            workdir / "nodes",
            REAL_NODES,
            images=list(images.values()),
            pause_image=PAUSE_IMAGE,
            prepare=prepare_node,
            labels=GPU_NODE_LABELS,
        )
        deploy_driver(kubectl)
        kubectl("create", "namespace", NS)
        kubectl("apply", "-f", "-", stdin=sample_workload(NS, "sleep 3600"))
        wait_for(
            "domain Ready",
            lambda: " Ready" in kubectl("-n", NS, "get", "computedomains"),
            timeout=300,
            every=1,
        )
        offset = boot_offset()
        node = REAL_NODES[0]

        assert fleet is not None
        nodes = fleet

        def plugin() -> Stages:
            needle = "compute-domain-kubelet-plugin"
            name, t0, t1 = restart(kubectl, nodes, PLUGIN_PODS, node, needle=needle, offset=offset)
            ready = wait_for(
                "registration",
                lambda: log_time(kubectl, name, "kubelet registered plugin"),
                timeout=120,
            )
            serving = log_time(kubectl, name, "serving DRA on")
            first = first_request(audit_events(audit), name)
            return stages(
                t0, t1, {"first API request": first, "serving": serving, "registered": ready}
            )

        def daemon() -> Stages:
            name, t0, t1 = restart(
                kubectl,
                nodes,
                "resource.nvidia.com/computeDomain",
                node,
                needle="compute-domain-daemon",
                offset=offset,
            )

            def wrote() -> float | None:
                return first_request(audit_events(audit), name, writes_to="computedomaincliques")

            write = wait_for("clique write", wrote, timeout=120)
            first = first_request(audit_events(audit), name)
            return stages(t0, t1, {"first API request": first, "clique write": write})

        def controller() -> Stages:
            name, t0, t1 = restart(
                kubectl,
                nodes,
                CONTROLLER_PODS,
                None,
                needle="compute-domain-controller",
                offset=offset,
            )
            synced = wait_for(
                "caches synced", lambda: log_time(kubectl, name, "caches synced"), timeout=120
            )
            first = first_request(audit_events(audit), name)
            return stages(t0, t1, {"first API request": first, "caches synced": synced})

        kubectl(
            "-n", DRIVER_NAMESPACE, "scale", "deployment/compute-domain-controller", "--replicas=1"
        )
        for what, once in (("plugin", plugin), ("daemon", daemon), ("controller", controller)):
            results[what] = measure(what, args.starts, once)
    finally:
        if fleet is not None:
            left = fleet.stop()
            log("host as found" if not left else f"LEFT ON THE HOST: {left}")
        cluster.stop()
    print("\nbinary      stage                                   p50      min      max   (n)")
    for what, got in results.items():
        for stage, values in got.items():
            if values:
                print(
                    f"{what:<11} {stage:<38} {_ms(statistics.median(values)):>8} "
                    f"{_ms(min(values)):>8} {_ms(max(values)):>8}   ({len(values)})"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
