"""Benchmark: ComputeDomain time-to-ready and driver API requests per CD lifecycle.

For each node count (default 2, 18, 64) a fresh local cluster with that many simulated GPU nodes
(real kubelet plugin per node, simulated IMEX ready at once; cliques of at most 18 nodes, the
IMEX domain limit) runs ``--runs`` lifecycles of: ComputeDomain + one pod per node (spread by
hostname anti-affinity) -> **time-to-ready** = from the moment every pod is bound to the moment
every pod is Running/Ready *and* its container record shows ``channel0`` -> delete pods -> delete
CD -> wait until nothing is left. Prints p50/max and the API requests the driver's three
identities made per lifecycle, counted from the apiserver's audit log (a policy that records only
``system:serviceaccounts:<driver ns>`` requests, at Metadata level).

Per stage: every component exports the formation trace to a file; with an admin watch on all
pods and the kubelet stand-in's own records, each node's formation is cut into stages owned by
the driver, Kubernetes or the simulation (``kubeletsim.formation``), printed per size (median node
and last node to be Ready), with the load average and machine CPU use during formation. The
daemons, their exec probes and the simulated IMEX programs are forked from a fork server
(``kubeletsim.zygote``; ``--no-zygote`` starts interpreters as before). ``--go-controller BIN``
runs upstream's Go controller (built by ``controller_vs_upstream.py``) instead of ours, same
harness (no formation trace then: time-to-ready, CD -> RCT and pods Ready -> CD Ready only).
``--controller-env NAME=VALUE`` (repeatable) sets a variable of our controller's environment over
the manifest's, e.g. ``KUBE_API_BURST=30``, to compare settings.

    .venv/bin/python hack/bench/time_to_ready.py [--nodes 2,18,64] [--runs 5] [--json out.json]
        [--imex-probe-interval 5] [--go-controller BIN] [--no-zygote] [--keep]
        [--controller-env NAME=VALUE ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from kubeletsim import NodeFleet, config_from_cluster, layout
from kubeletsim.formation import OWNERS, PodTimes, formations, read_spans, summarize
from kubeletsim.zygote import ZYGOTE_ENV, Zygote
from localcluster import Cluster, bin_dir
from testsupport.e2e_support import Driver, channels_seen, free_port, leak_report, wait_for
from testsupport.workloads import create_cd, delete_cd, delete_pods, start_pods

from pkg.api import constants as c
from pkg.imex.config import DEFAULT_SERVER_PORT
from pkg.kube.client import KubeClient, RestClient
from pkg.kube.config import load_api_client
from pkg.kube.resources import (
    COMPUTE_DOMAINS,
    DAEMONSETS,
    NAMESPACES,
    NODES,
    PODS,
    Resource,
)
from pkg.runtime.tracing import FILE_PATH_VAR, parse_traceparent

REPO = Path(__file__).resolve().parents[2]

AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  userGroups: ["system:serviceaccounts:{ns}"]
- level: None
"""
IDENTITIES = {
    "compute-domain-controller": "controller",
    "compute-domain-kubelet-plugin": "plugin",
    "compute-domain-daemon": "daemon",
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def audit_counts(path: Path, since: float, until: float) -> Counter[str]:
    """Driver requests by '<component> <verb>' between two wall-clock times."""
    counts: Counter[str] = Counter()
    if not path.exists():
        return counts
    for line in path.read_text().splitlines():
        ev = json.loads(line)
        ts = time.mktime(time.strptime(ev["requestReceivedTimestamp"][:19], "%Y-%m-%dT%H:%M:%S"))
        ts -= time.timezone
        if not since <= ts <= until:
            continue
        sa = ev["user"]["username"].rsplit(":", 1)[-1]
        counts[f"{IDENTITIES.get(sa, sa)} {ev['verb']}"] += 1
    return counts


class PodWatcher:
    """Admin watches that timestamp what each formation is made of: per pod when it was first
    seen, bound, given an IP, Running and Ready; per node when it first carried each value of
    the domain label; per driver DaemonSet when it was first seen."""

    def __init__(self, admin: KubeClient, driver_ns: str = "") -> None:
        self._admin = admin
        self._stop = threading.Event()
        self.pods: dict[tuple[str, str], PodTimes] = {}
        self.node_labels: dict[tuple[str, str], float] = {}  # (node, domain UID) -> first seen
        self.daemon_sets: dict[str, float] = {}  # domain UID -> its DaemonSet first seen
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(
                target=self._run, args=(res, ns, observe), name=f"watch-{res.plural}", daemon=True
            )
            for res, ns, observe in (
                (PODS, "", self._observe),
                (NODES, "", self._observe_node),
                (DAEMONSETS, driver_ns, self._observe_daemon_set),
            )
        ]

    def start(self) -> PodWatcher:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self, res: Resource, ns: str, observe: Any) -> None:
        rv = ""
        while not self._stop.is_set():
            try:
                if not rv:
                    rv = self._admin.list(res, namespace=ns or None)["metadata"]["resourceVersion"]
                for ev in self._admin.watch(
                    res, namespace=ns or None, resource_version=rv, timeout_seconds=60
                ):
                    if self._stop.is_set():
                        return
                    obj = ev.object
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    if ev.type in ("ADDED", "MODIFIED"):
                        observe(obj, time.time())
            except Exception as e:  # re-list on 410 or a dropped stream
                log(f"{res.plural} watch: {e!r}; re-listing")
                rv = ""
                time.sleep(0.2)

    def _observe_node(self, node: dict[str, Any], now: float) -> None:
        meta = node["metadata"]
        uid = (meta.get("labels") or {}).get(c.COMPUTE_DOMAIN_LABEL)
        if uid:
            with self._lock:
                self.node_labels.setdefault((meta["name"], uid), now)

    def _observe_daemon_set(self, ds: dict[str, Any], now: float) -> None:
        selector = ((ds.get("spec") or {}).get("template") or {}).get("spec", {}).get(
            "nodeSelector"
        ) or {}
        uid = selector.get(c.COMPUTE_DOMAIN_LABEL)
        if uid:
            with self._lock:
                self.daemon_sets.setdefault(uid, now)

    def labelled(self, uid: str) -> dict[str, float]:
        """Per node, when it was first seen labelled for domain ``uid``."""
        with self._lock:
            return {n: t for (n, u), t in self.node_labels.items() if u == uid}

    def daemon_set(self, uid: str) -> float | None:
        """When domain ``uid``'s DaemonSet was first seen."""
        with self._lock:
            return self.daemon_sets.get(uid)

    def _observe(self, pod: dict[str, Any], now: float) -> None:
        meta, spec, status = pod["metadata"], pod.get("spec", {}), pod.get("status", {})
        key = (meta["namespace"], meta["name"])
        with self._lock:
            t = self.pods.get(key)
            if t is None:
                t = self.pods[key] = PodTimes(meta["namespace"], meta["name"], seen=now)
            if spec.get("nodeName") and t.bound is None:
                t.node, t.bound = spec["nodeName"], now
            if status.get("podIP") and t.ip is None:
                t.ip = now
            if status.get("phase") == "Running" and t.running is None:
                t.running = now
            conds = {x["type"]: x["status"] for x in status.get("conditions") or []}
            if conds.get("Ready") == "True" and t.ready is None:
                t.ready = now

    def in_namespace(self, ns: str, prefix: str = "") -> list[PodTimes]:
        with self._lock:
            return [t for (n, name), t in self.pods.items() if n == ns and name.startswith(prefix)]

    def forget(self, ns: str) -> None:
        with self._lock:
            for key in [k for k in self.pods if k[0] == ns]:
                del self.pods[key]


class LoadSampler:
    """Load average and whole-machine CPU use (from /proc/stat) over a window."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self.max_load1 = 0.0
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)
        self._cpu0 = _cpu_times()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.max_load1 = max(self.max_load1, os.getloadavg()[0])

    def start(self) -> LoadSampler:
        self._cpu0 = _cpu_times()
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        self._stop.set()
        busy0, total0 = self._cpu0
        busy1, total1 = _cpu_times()
        return {
            "load1_end": os.getloadavg()[0],
            "load1_max": self.max_load1,
            "cpu_busy_pct": 100.0 * (busy1 - busy0) / max(1, total1 - total0),
        }


def _cpu_times() -> tuple[int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


LISTENING = re.compile(r"^imex-sim\[[^]]*\] listening at ([0-9.]+);", re.M)


def harness_milestones(fleet: NodeFleet, ns: str, driver_ns: str) -> dict[str, dict[str, float]]:
    """Per node, what the kubelet stand-in recorded: Prepare calls, daemon start, IMEX listen."""
    out: dict[str, dict[str, float]] = {}
    for node in fleet:
        m = out.setdefault(node.name, {})
        for worker in node.kubelet.workers().values():
            pod_ns, pod_name = worker.key.split("/", 1)
            if pod_ns not in (ns, driver_ns):
                continue
            prefix = "" if pod_ns == ns else "daemon_"
            calls = list(worker.prepare_calls)
            ok = [x for x in calls if x[2]]
            if calls:
                m[f"{prefix}prepare_start"] = calls[0][0]
            if ok:
                m[f"{prefix}prepare_end"] = ok[0][1]
                if not prefix:
                    m["final_attempt_start"] = ok[0][0]
            if prefix:
                started = worker.container_started_at().get("compute-domain-daemon")
                if started is not None:
                    m["daemon_process"] = started
                log_file = node.dirs.logs / f"{pod_name}_compute-domain-daemon.log"
                try:
                    found = LISTENING.findall(log_file.read_text(errors="replace"))
                except OSError:
                    found = []
                if found:
                    m["imex_listening"] = float(found[-1])
    return out


def imex_listening(fleet: NodeFleet) -> list[str]:
    """Nodes where something still accepts connections on the IMEX server port."""
    busy = []
    for node in fleet:
        with socket.socket() as sock:
            sock.settimeout(1.0)
            if sock.connect_ex((node.ip, DEFAULT_SERVER_PORT)) == 0:
                busy.append(node.name)
    return busy


def one_lifecycle(
    admin: KubeClient,
    fleet: NodeFleet,
    driver_ns: str,
    n: int,
    i: int,
    *,
    pods_seen: PodWatcher,
    spans_file: Path | None,
) -> dict[str, Any]:
    """One create -> Ready -> delete cycle; time-to-ready, its stages and the load meanwhile."""
    ns = f"bench-{n}-{i}"
    admin.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    start = time.monotonic()
    w = create_cd(admin, ns, "cd")
    rct_seconds = time.monotonic() - start
    load = LoadSampler().start()
    start_pods(admin, w, n, list(fleet.nodes))
    selector = f"cd-workload={w.cd_name}"

    def pods() -> list[dict[str, Any]]:
        return list(admin.list(PODS, namespace=ns, label_selector=selector)["items"])

    wait_for(
        "all bound", lambda: all(p["spec"].get("nodeName") for p in pods()), timeout=300, every=0.05
    )
    bound = time.monotonic()

    def ready() -> bool:
        for p in pods():
            conds = {x["type"]: x["status"] for x in p.get("status", {}).get("conditions", [])}
            if conds.get("Ready") != "True":
                return False
        return all(channels_seen(fleet, ns, p) == ["channel0"] for p in w.pods)

    wait_for("all running with channel0", ready, timeout=600, every=0.1)
    ttr = time.monotonic() - bound
    machine = load.stop()
    all_ready = time.monotonic()

    def cd_ready() -> bool:
        cd = admin.get(COMPUTE_DOMAINS, w.cd_name, namespace=ns)
        return (cd.get("status") or {}).get("status") == "Ready"

    wait_for("CD status Ready", cd_ready, timeout=120, every=0.05)
    cd_ready_lag = time.monotonic() - all_ready
    stages: dict[str, Any] = {}
    if spans_file is not None:
        cd = admin.get(COMPUTE_DOMAINS, w.cd_name, namespace=ns)
        ids = parse_traceparent(cd["metadata"].get("annotations", {}).get(c.TRACEPARENT_ANNOTATION))
        if ids is None:
            stages = {"error": "no traceparent annotation"}
        else:
            daemons = pods_seen.in_namespace(driver_ns)  # forgotten after each lifecycle

            def have_all() -> list[Any] | None:
                spans = read_spans(spans_file, ids.trace_id)
                got = {(s["name"], s["attributes"].get("k8s.node.name")) for s in spans}
                want = {("IMEX ready", q) for q in fleet.nodes}
                return spans if want <= got else None

            try:
                spans = wait_for("formation spans", have_all, timeout=30, every=0.5)
            except AssertionError:
                spans = read_spans(spans_file, ids.trace_id)
            workload = pods_seen.in_namespace(ns, prefix=f"{w.cd_name}-")
            harness = harness_milestones(fleet, ns, driver_ns)
            uid = str(cd["metadata"]["uid"])
            stages = summarize(
                formations(
                    spans,
                    workload,
                    daemons,
                    harness,
                    labelled=pods_seen.labelled(uid),
                    daemon_set=pods_seen.daemon_set(uid),
                )
            )
    delete_pods(admin, w, timeout=300)
    delete_cd(admin, w, timeout=300)
    wait_for(
        "clean", lambda: not leak_report(admin, fleet, driver_ns, [ns]), timeout=300, every=0.5
    )
    # The previous domain's simulated IMEX must be gone: every "pod" of a node shares the node's
    # IP here, so a lingering one would answer the next daemon's readiness query.
    wait_for(
        "simulated IMEX daemons gone", lambda: not imex_listening(fleet), timeout=120, every=0.2
    )
    admin.delete(NAMESPACES, ns)
    pods_seen.forget(ns)
    pods_seen.forget(driver_ns)
    return {
        "ttr": ttr,
        "lifecycle": time.monotonic() - start,
        "machine": machine,
        "stages": stages,
        "cd_to_rct": rct_seconds,
        "pods_ready_to_cd_ready": cd_ready_lag,
    }


def start_go_controller(
    driver: Driver, binary: Path, kubeconfig: Path, log_file: Path
) -> subprocess.Popen[bytes]:
    """Upstream's Go controller (see controller_vs_upstream.py) with our Deployment's env."""
    env = driver.controller_env(kubeconfig=kubeconfig, http_port=free_port())
    with log_file.open("ab") as out:
        return subprocess.Popen(
            [str(binary)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


UPSTREAM_DAEMON_SA = "compute-domain-daemon-service-account"  # upstream's DaemonSet template


def alias_daemon_service_account(admin: KubeClient, ns: str) -> None:
    """Upstream's DaemonSet names its own ServiceAccount: create it with our daemon's bindings."""
    sa = Resource("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True)
    admin.create(
        sa,
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": UPSTREAM_DAEMON_SA, "namespace": ns},
        },
        namespace=ns,
    )
    rbac = "rbac.authorization.k8s.io"
    for res, where in (
        (Resource(rbac, "v1", "rolebindings", "RoleBinding", namespaced=True), ns),
        (Resource(rbac, "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False), None),
    ):
        for binding in admin.list(res, namespace=where)["items"]:
            subjects = binding.get("subjects") or []
            if any(
                x.get("kind") == "ServiceAccount" and x.get("name") == "compute-domain-daemon"
                for x in subjects
            ):
                binding["subjects"] = [
                    *subjects,
                    {"kind": "ServiceAccount", "name": UPSTREAM_DAEMON_SA, "namespace": ns},
                ]
                admin.update(res, binding)


def bench(
    n: int,
    runs: int,
    workdir: Path,
    *,
    probe_scale: float,
    imex_probe: float,
    use_zygote: bool,
    trace: bool,
    go_controller: Path | None = None,
    controller_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    specs = layout([i // 18 for i in range(n)])
    audit_log = workdir / "audit.log"
    policy = workdir / "audit-policy.yaml"
    workdir.mkdir(parents=True, exist_ok=True)
    policy.write_text(AUDIT_POLICY.format(ns="nvidia-dra-driver"))
    spans_file = workdir / "spans.jsonl" if trace else None
    tracing = {"OTEL_TRACES_EXPORTER": "file", FILE_PATH_VAR: str(spans_file)} if trace else {}
    log(f"{n} nodes: starting cluster")
    cluster = Cluster.start(
        bin_dir(),
        workdir,
        node_names=[s.name for s in specs],
        apiserver_args=[
            f"--audit-policy-file={policy}",
            f"--audit-log-path={audit_log}",
            "--audit-log-mode=batch",
        ],
    )
    fleet: NodeFleet | None = None
    driver: Driver | None = None
    zygote: Zygote | None = None
    watcher: PodWatcher | None = None
    go_proc: subprocess.Popen[bytes] | None = None
    try:
        driver = Driver.deploy(cluster.kubeconfig("admin"))
        kubeconfig = cluster.kubeconfig("compute-domain-controller")
        log_file = cluster.log_path("controller")
        if go_controller is None:
            driver.start_controller(
                kubeconfig=kubeconfig,
                log_file=log_file,
                http_port=free_port(),
                extra_env={**tracing, **(controller_env or {})},
            )
        else:  # upstream's controller, same identity and env (it has no formation trace)
            go_proc = start_go_controller(driver, go_controller, kubeconfig, log_file)
            alias_daemon_service_account(
                RestClient(load_api_client(str(cluster.kubeconfig("admin")))), driver.namespace
            )
        sim_env: dict[str, str] = {}
        zclient: Path | None = None
        if use_zygote:
            zygote = Zygote(workdir / "zygote.sock").start(cluster.log_dir / "zygote.log")
            zclient = Zygote.build_client(workdir / "bin")  # None without a C compiler
            sim_env[ZYGOTE_ENV] = str(zygote.socket_path)
        cfg = config_from_cluster(
            cluster,
            workdir / "n",
            plugin_env=dict(tracing),
            zipapp_interpreter=str(zclient) if zclient else None,
        )
        cfg.commands = dataclasses.replace(
            cfg.commands,
            env={
                **cfg.commands.env,
                **tracing,
                **sim_env,
                "IMEX_SIM_READY_DELAY": "0",
                "IMEX_SIM_PROBE_INTERVAL": str(imex_probe),
            },
            zygote=zygote,
        )
        cfg.probe_period_scale = probe_scale
        fleet = NodeFleet(cfg)
        t = time.monotonic()
        fleet.add(specs)
        log(f"{n} nodes up in {time.monotonic() - t:.1f}s")
        admin = RestClient(load_api_client(str(cluster.kubeconfig("admin"))), user_agent="bench")
        watcher = PodWatcher(admin, driver.namespace).start()
        time.sleep(10)  # the plugins' and the nodes' start-up settles
        idle_load = os.getloadavg()
        results, requests = [], []
        for i in range(runs):
            time.sleep(2)  # let the previous lifecycle's stragglers settle
            wall0 = time.time()
            r = one_lifecycle(
                admin, fleet, driver.namespace, n, i, pods_seen=watcher, spans_file=spans_file
            )
            time.sleep(3)  # audit batch flush
            counts = audit_counts(audit_log, wall0, time.time() - 3)
            results.append(r)
            requests.append(counts)
            st = r["stages"]
            share = st.get("last_node_by_owner", {})
            log(
                f"{n} nodes run {i + 1}/{runs}: time-to-ready {r['ttr']:.2f}s "
                f"(last node: "
                + ", ".join(f"{o} {share.get(o, 0):.2f}s" for o in OWNERS)
                + f"), load1 max {r['machine']['load1_max']:.1f}, "
                f"CPU {r['machine']['cpu_busy_pct']:.0f}%, lifecycle {r['lifecycle']:.1f}s, "
                f"driver requests {sum(counts.values())}"
            )
        per_component: Counter[str] = Counter()
        for cnt in requests:
            for k, v in cnt.items():
                per_component[k.split()[0]] += v
        ttrs = [r["ttr"] for r in results]
        return {
            "nodes": n,
            "runs": runs,
            "cliques": len({s.clique_id for s in specs}),
            "probe_period_scale": probe_scale,
            "imex_sim_probe_interval": imex_probe,
            "zygote": use_zygote,
            "idle_load": idle_load,
            "controller": "go" if go_controller else "ours",
            "p50": statistics.median(ttrs),
            "max": max(ttrs),
            "all": ttrs,
            "lifecycles": results,
            "requests_per_lifecycle": statistics.median(sum(x.values()) for x in requests),
            "requests_by_component": {k: v / runs for k, v in sorted(per_component.items())},
            "requests_by_verb": dict(sum(requests, Counter()).most_common()),
        }
    finally:
        if watcher is not None:
            watcher.stop()
        if fleet is not None:
            fleet.stop()
        if driver is not None:
            driver.kill_controller()
        if go_proc is not None and go_proc.poll() is None:
            os.killpg(go_proc.pid, signal.SIGKILL)
            go_proc.wait(timeout=10)
        if zygote is not None:
            zygote.stop()
        cluster.stop()


def stage_table(r: dict[str, Any]) -> list[str]:
    """Per stage: p50 over nodes and the last node, p50 over the runs' lifecycles."""
    runs = [x["stages"] for x in r["lifecycles"] if "stages" in x and "error" not in x["stages"]]
    if not runs:
        return [f"(no stage breakdown for {r['nodes']} nodes)"]

    def med(values: list[float | None]) -> str:
        got = [v for v in values if v is not None]
        return f"{statistics.median(got) * 1000:.0f}" if got else "-"

    lines = [
        f"\n{r['nodes']} nodes: per stage, ms (median over {len(runs)} runs of: the median "
        "node, the last node to be Ready)",
        "",
        "| stage | owner | median node | last node |",
        "|---|---|---|---|",
    ]
    for name in runs[0]["stages"]:
        owner = runs[0]["stages"][name]["owner"]
        lines.append(
            f"| {name} | {owner} | {med([x['stages'][name]['p50'] for x in runs])} "
            f"| {med([x['stages'][name]['last_node'] for x in runs])} |"
        )
    for o in OWNERS:
        lines.append(
            f"| **{o} total** | | {med([x['p50_node_by_owner'][o] for x in runs])} "
            f"| {med([x['last_node_by_owner'][o] for x in runs])} |"
        )
    machine = [x["machine"] for x in r["lifecycles"]]
    lines.append(
        f"\nload average (1 min) before the runs {r['idle_load'][0]:.2f}; during formation: "
        f"max {max(m['load1_max'] for m in machine):.2f}, CPU busy "
        f"{statistics.median(m['cpu_busy_pct'] for m in machine):.0f}% (median of runs); "
        f"missing milestones: {sorted({k for x in runs for k in x.get('missing', [])})}"
    )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="2,18,64")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--imex-probe-interval",
        type=float,
        default=0.5,
        help="simulated IMEX peer hello period (IMEX_SIM_PROBE_INTERVAL)",
    )
    ap.add_argument("--keep", action="store_true", help="keep work dirs (logs) of passing sizes")
    ap.add_argument(
        "--probe-period-scale",
        type=float,
        default=1.0,
        help="stretch daemon readiness/liveness probe periods (see kubeletsim.localrun)",
    )
    ap.add_argument(
        "--no-zygote",
        action="store_true",
        help="start every daemon and probe as a new interpreter (no fork server)",
    )
    ap.add_argument("--no-trace", action="store_true", help="no formation trace, no stages")
    ap.add_argument(
        "--go-controller",
        type=Path,
        default=None,
        help="run this upstream Go compute-domain-controller binary instead of ours "
        "(built by controller_vs_upstream.py; no formation trace, so no stages)",
    )
    ap.add_argument(
        "--controller-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a variable of our controller's environment (over the manifest's); repeatable",
    )
    args = ap.parse_args()
    controller_env: dict[str, str] = {}
    for item in args.controller_env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            ap.error(f"--controller-env {item!r}: expected NAME=VALUE")
        controller_env[name] = value
    results = []
    for n in (int(x) for x in args.nodes.split(",")):
        workdir = Path(tempfile.mkdtemp(prefix=f"cdb{n}-", dir="/tmp"))
        try:
            results.append(
                bench(
                    n,
                    args.runs,
                    workdir,
                    probe_scale=args.probe_period_scale,
                    imex_probe=args.imex_probe_interval,
                    use_zygote=not args.no_zygote,
                    trace=not args.no_trace,
                    go_controller=args.go_controller,
                    controller_env=controller_env,
                )
            )
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
        except Exception as e:
            log(f"{n} nodes FAILED: {e!r} (logs in {workdir / 'logs'})")
            results.append({"nodes": n, "error": repr(e)})
    print(
        "\n| controller | nodes | cliques | runs | p50 (s) | max (s) | CD -> RCT p50 (s) "
        "| pods Ready -> CD Ready p50 (s) | driver API requests / CD lifecycle |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| | {r['nodes']} | | | failed: {r['error'][:60]} | | | | |")
            continue
        comp = ", ".join(f"{k} {v:.0f}" for k, v in r["requests_by_component"].items())
        rct = statistics.median(x["cd_to_rct"] for x in r["lifecycles"])
        lag = statistics.median(x["pods_ready_to_cd_ready"] for x in r["lifecycles"])
        print(
            f"| {r['controller']} | {r['nodes']} | {r['cliques']} | {r['runs']} "
            f"| {r['p50']:.2f} | {r['max']:.2f} | {rct:.2f} | {lag:.2f} "
            f"| {r['requests_per_lifecycle']:.0f} ({comp}) |"
        )
    for r in results:
        if "error" not in r:
            print("\n".join(stage_table(r)))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
