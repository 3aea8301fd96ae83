"""Benchmark: our compute-domain-controller side by side with upstream's Go controller.

Takes a checkout of the upstream repository (NVIDIA/k8s-dra-driver-gpu or
kubernetes-sigs/dra-driver-nvidia-gpu; nothing of it is committed here), builds its
``compute-domain-controller`` offline from the checkout's ``vendor/`` (``go build -overlay``
points its hard-coded ``/templates/*.tmpl.yaml`` paths at the checkout's ``templates/`` without
modifying the checkout or writing outside the work dir), starts one local 1.37 control plane
(``hack/localcluster``) with an audit log of the controller identity, deploys CRDs/RBAC from
``config/``, creates ``--nodes`` Node objects, then for each QPS setting runs the controllers
one after the other, interleaved (ours, Go, ours, Go, ... ``--runs`` each), against the same
workload: ``--cds`` ComputeDomains in ``--namespaces`` namespaces created at once. Measured:

* CD created -> its workload ResourceClaimTemplate exists (seen by an admin watch): p50, p99,
  all done;
* delete every CD -> every CD and dependent (RCTs, DaemonSets) gone;
* API requests of the controller identity per CD lifecycle (audit log), and writes;
* peak RSS (VmHWM) and idle CPU over ``--idle`` seconds after the burst settled.

    .venv/bin/python hack/bench/controller_vs_upstream.py /tmp/upstream \\
        [--nodes 1000] [--cds 200] [--namespaces 10] [--runs 2] [--qps default,100:200] \\
        [--who ours,go]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localcluster import Cluster, bin_dir, fake_node
from testsupport.e2e_support import Driver, free_port

from pkg.api import constants as c
from pkg.base.types import JSON
from pkg.kube.client import RestClient
from pkg.kube.config import load_api_client
from pkg.kube.errors import AlreadyExistsError, NotFoundError
from pkg.kube.resources import (
    COMPUTE_DOMAINS,
    DAEMONSETS,
    NAMESPACES,
    NODES,
    RESOURCE_CLAIM_TEMPLATES,
    Resource,
)

REPO = Path(__file__).resolve().parents[2]

POLICY_BINDINGS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "validatingadmissionpolicybindings",
    "ValidatingAdmissionPolicyBinding",
    namespaced=False,
)
# config/'s admission policy on the controller's DaemonSets holds them to our daemon's
# ServiceAccount and hardening (dropped capabilities, seccomp, ...). Upstream's DaemonSet
# template names its own ServiceAccount and sets neither, so while the Go controller runs that
# binding is taken away (and put back after), or every Go DaemonSet is refused and its
# reconciles retry for the whole run.
DAEMONSET_POLICY_BINDING = "compute-domain-controller-daemonsets"

CONTROLLER_USER = "system:serviceaccount:nvidia-dra-driver:compute-domain-controller"
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  users: ["{user}"]
- level: None
"""
TEMPLATE_FILES = (
    "cmd/compute-domain-controller/daemonset.go",
    "cmd/compute-domain-controller/resourceclaimtemplate.go",
)
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build_upstream(checkout: Path, out_dir: Path) -> Path:
    """Build upstream's controller from ``checkout/vendor`` with the template paths redirected."""
    binary = out_dir / "compute-domain-controller-go"
    if binary.exists():
        return binary
    overlay: dict[str, str] = {}
    for rel in TEMPLATE_FILES:
        src = checkout / rel
        patched = out_dir / "overlay" / rel.replace("/", "_")
        patched.parent.mkdir(parents=True, exist_ok=True)
        patched.write_text(src.read_text().replace('"/templates/', f'"{checkout}/templates/'))
        overlay[str(src.resolve())] = str(patched)
    overlay_file = out_dir / "overlay.json"
    overlay_file.write_text(json.dumps({"Replace": overlay}))
    env = {**os.environ, "GOFLAGS": "-mod=vendor", "CGO_ENABLED": "0", "GOTOOLCHAIN": "local"}
    log("building upstream compute-domain-controller (vendor/, ~2.5 min cold)")
    subprocess.run(
        [
            "go",
            "build",
            f"-overlay={overlay_file}",
            "-o",
            str(binary),
            "./cmd/compute-domain-controller",
        ],
        cwd=checkout,
        env=env,
        check=True,
    )
    return binary


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class RunResult:
    who: str
    qps: str
    p50: float = 0.0
    p99: float = 0.0
    all_done: float = 0.0
    delete: float = 0.0
    requests: float = 0.0
    writes: float = 0.0
    rss_mib: float = 0.0
    idle_cpu_pct: float = 0.0
    settled: float = 0.0  # burst start -> every domain has a status (idle window starts 5 s later)
    quiet_wait: float = 0.0  # --quiet-idle: how long until no Node event for 15 s
    quiet_idle_cpu_pct: float = 0.0  # --quiet-idle: idle CPU after that
    missing: int = 0
    verbs: dict[str, int] = field(default_factory=dict)


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def audit_counts(path: Path, since: float, until: float) -> dict[str, int]:
    counts: dict[str, int] = {}
    if not path.exists():
        return counts
    for line in path.read_text().splitlines():
        ev = json.loads(line)
        if ev.get("user", {}).get("username") != CONTROLLER_USER:
            continue
        ts = time.mktime(time.strptime(ev["requestReceivedTimestamp"][:19], "%Y-%m-%dT%H:%M:%S"))
        ts += float("0." + ev["requestReceivedTimestamp"][20:26].rstrip("Z") or "0")
        ts -= time.timezone
        if since <= ts <= until:
            key = f"{ev['verb']} {ev.get('objectRef', {}).get('resource', '')}"
            counts[key] = counts.get(key, 0) + 1
    return counts


class RctWatcher:
    """Records when each workload RCT (``<ns>/<name>``) is first seen, from an admin watch."""

    def __init__(self, client: RestClient) -> None:
        self.seen: dict[str, float] = {}
        self._client = client
        self._stop = threading.Event()
        rv = client.list(RESOURCE_CLAIM_TEMPLATES, limit=1)["metadata"]["resourceVersion"]
        self._stream = client.watch(
            RESOURCE_CLAIM_TEMPLATES, resource_version=rv, timeout_seconds=3600
        )
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for ev in self._stream:
                meta = ev.object.get("metadata") or {}
                if ev.type == "ADDED":
                    self.seen.setdefault(f"{meta.get('namespace')}/{meta.get('name')}", time.time())
        except Exception:
            pass

    def stop(self) -> None:
        self._stream.stop()


class QuietWatcher:
    """Time of the last Node event an admin watch saw (kube-controller-manager's TTL controller
    annotates every Node for minutes after thousands were created)."""

    def __init__(self, client: RestClient) -> None:
        self.last = time.monotonic()
        rv = client.list(NODES, limit=1)["metadata"]["resourceVersion"]
        self._stream = client.watch(
            NODES, resource_version=rv, timeout_seconds=3600, allow_watch_bookmarks=False
        )
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        with contextlib.suppress(Exception):
            for _ev in self._stream:
                self.last = time.monotonic()

    def wait_quiet(self, quiet: float, limit: float) -> float:
        """Wait until no Node event for ``quiet`` s (at most ``limit`` s); returns the wait."""
        t0 = time.monotonic()
        while time.monotonic() - self.last < quiet and time.monotonic() - t0 < limit:
            time.sleep(1.0)
        return time.monotonic() - t0

    def stop(self) -> None:
        self._stream.stop()


def cd_body(ns: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.COMPUTE_DOMAIN_KIND,
        "metadata": {"name": name, "namespace": ns},
        "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": f"{name}-chan"}}},
    }


def leftovers(admin: RestClient, driver_ns: str, namespaces: list[str]) -> int:
    n = len(admin.list(COMPUTE_DOMAINS)["items"])
    n += len(admin.list(RESOURCE_CLAIM_TEMPLATES, label_selector=c.COMPUTE_DOMAIN_LABEL)["items"])
    n += len(
        admin.list(DAEMONSETS, namespace=driver_ns, label_selector=c.COMPUTE_DOMAIN_LABEL)["items"]
    )
    return n


def start_contender(
    who: str,
    driver: Driver,
    cluster: Cluster,
    *,
    go_binary: Path,
    env_extra: dict[str, str],
    workdir: Path,
    tag: str,
) -> subprocess.Popen[bytes]:
    """Start one side of the comparison with the same env: ours through the e2e suite's
    ``Driver.start_controller``; upstream's Go binary, which takes no flags, here."""
    kubeconfig = cluster.kubeconfig("compute-domain-controller")
    log_file = workdir / f"controller-{tag}.log"
    if who == "ours":
        driver.start_controller(
            kubeconfig=kubeconfig, log_file=log_file, http_port=free_port(), extra_env=env_extra
        )
        assert driver.controller is not None
        return driver.controller
    env = driver.controller_env(kubeconfig=kubeconfig, http_port=free_port())
    env.update(env_extra)
    with log_file.open("ab") as out:
        return subprocess.Popen(
            [str(go_binary)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_controller(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def suspend_binding(admin: RestClient, name: str) -> JSON | None:
    """Delete the cluster's ValidatingAdmissionPolicyBinding ``name``; what to re-create."""
    try:
        binding = admin.get(POLICY_BINDINGS, name)
    except NotFoundError:
        return None
    admin.delete(POLICY_BINDINGS, name)
    meta = binding["metadata"]
    binding["metadata"] = {k: meta[k] for k in ("name", "labels", "annotations") if k in meta}
    return binding


def all_have_status(admin: RestClient, namespaces: list[str], cds: int) -> bool:
    """Every benchmark domain has a ``status.status`` (its controller finished its passes)."""
    done = 0
    for ns in namespaces:
        items = admin.list(COMPUTE_DOMAINS, namespace=ns).get("items", [])
        done += sum(1 for cd in items if (cd.get("status") or {}).get("status"))
    return done >= cds


def one_run(
    who: str,
    qps: str,
    *,
    admin: RestClient,
    driver: Driver,
    cluster: Cluster,
    go_binary: Path,
    namespaces: list[str],
    cds: int,
    idle: float,
    audit_log: Path,
    workdir: Path,
    tag: str,
    quiet_idle: bool = False,
) -> RunResult:
    env_extra: dict[str, str] = {}
    if qps != "default":
        q, b = qps.split(":")
        env_extra = {"KUBE_API_QPS": q, "KUBE_API_BURST": b}
    suspended = suspend_binding(admin, DAEMONSET_POLICY_BINDING) if who == "go" else None
    proc = start_contender(
        who, driver, cluster, go_binary=go_binary, env_extra=env_extra, workdir=workdir, tag=tag
    )
    result = RunResult(who=who, qps=qps)
    try:
        # warm-up: one CD through its whole life proves the controller is up and leading
        warm_ns = namespaces[0]
        watcher = RctWatcher(admin)
        admin.create(COMPUTE_DOMAINS, cd_body(warm_ns, "warmup"))
        deadline = time.time() + 180
        while f"{warm_ns}/warmup-chan" not in watcher.seen and time.time() < deadline:
            time.sleep(0.1)
        admin.delete(COMPUTE_DOMAINS, "warmup", namespace=warm_ns)
        while leftovers(admin, driver.namespace, namespaces) and time.time() < deadline + 120:
            time.sleep(0.5)
        watcher.stop()
        time.sleep(2)

        names = [(namespaces[i % len(namespaces)], f"cd-{i}") for i in range(cds)]
        watcher = RctWatcher(admin)
        created: dict[str, float] = {}
        t0 = time.time()

        def create(ns_name: tuple[str, str]) -> None:
            ns, name = ns_name
            admin.create(COMPUTE_DOMAINS, cd_body(ns, name))
            created[f"{ns}/{name}-chan"] = time.time()

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(create, names))
        deadline = time.time() + 1800
        while len([k for k in created if k in watcher.seen]) < cds and time.time() < deadline:
            time.sleep(0.2)
        watcher.stop()
        lat = [watcher.seen[k] - created[k] for k in created if k in watcher.seen]
        result.missing = cds - len(lat)
        result.p50, result.p99 = percentile(lat, 0.5), percentile(lat, 0.99)
        result.all_done = max(watcher.seen[k] for k in created if k in watcher.seen) - t0
        # Idle starts once every domain has its status (the second passes are done; at 1,000
        # domains they outlast the templates by ~10 s), plus 5 s for stragglers.
        while time.time() < deadline and not all_have_status(admin, namespaces, cds):
            time.sleep(1.0)
        result.settled = time.time() - t0
        time.sleep(5)
        cpu0, w0 = proc_cpu_seconds(proc.pid), time.monotonic()
        time.sleep(idle)
        result.idle_cpu_pct = 100 * (proc_cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - w0)
        if quiet_idle:
            # The same once no Node has changed for 15 s (what "idle" means on a settled
            # cluster: no foreign write sweeps, only the lease renewals).
            quiet = QuietWatcher(admin)
            result.quiet_wait = quiet.wait_quiet(15.0, 900.0)
            cpu0, w0 = proc_cpu_seconds(proc.pid), time.monotonic()
            time.sleep(idle)
            result.quiet_idle_cpu_pct = (
                100 * (proc_cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - w0)
            )
            quiet.stop()
        d0 = time.time()

        def delete(ns_name: tuple[str, str]) -> None:
            ns, name = ns_name
            with contextlib.suppress(NotFoundError):
                admin.delete(COMPUTE_DOMAINS, name, namespace=ns)

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(delete, names))
        deadline = time.time() + 1800
        while leftovers(admin, driver.namespace, namespaces) and time.time() < deadline:
            time.sleep(0.5)
        result.delete = time.time() - d0
        result.rss_mib = proc_hwm_mib(proc.pid)
        time.sleep(3)  # audit batch flush
        # Lease renewals are per second, not per CD: left out (the idle CPU figure has them).
        counts = audit_counts(audit_log, t0, d0 + result.delete)
        busy = {k: v for k, v in counts.items() if not k.endswith(" leases")}
        result.verbs = dict(sorted(busy.items(), key=lambda kv: -kv[1]))
        result.requests = sum(busy.values()) / cds
        result.writes = sum(v for k, v in busy.items() if k.split()[0] in WRITE_VERBS) / cds
    finally:
        stop_controller(proc)
        if suspended is not None:
            admin.create(POLICY_BINDINGS, suspended)
        for ns, name in [(namespaces[0], "warmup")]:
            with contextlib.suppress(NotFoundError):
                admin.delete(COMPUTE_DOMAINS, name, namespace=ns)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("upstream", type=Path, help="checkout of the upstream repository")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--cds", type=int, default=200)
    ap.add_argument("--namespaces", type=int, default=10)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--qps", default="default,100:200", help="'default' and/or QPS:BURST")
    ap.add_argument("--idle", type=float, default=60.0, help="idle CPU window (s)")
    ap.add_argument(
        "--quiet-idle",
        action="store_true",
        help="also measure idle CPU once no Node changed for 15 s",
    )
    ap.add_argument("--who", default="ours,go", help="controllers to run: ours and/or go")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="cd-vs-upstream-"))
    workdir.mkdir(parents=True, exist_ok=True)
    who_list = [w for w in ("ours", "go") if w in args.who.split(",")]
    go_binary = (
        build_upstream(args.upstream.resolve(), workdir)
        if "go" in who_list
        else workdir / "compute-domain-controller-go"
    )  # not run
    audit_log, policy = workdir / "audit.log", workdir / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY.format(user=CONTROLLER_USER))
    log(f"starting cluster ({args.nodes} nodes)")
    cluster = Cluster.start(
        bin_dir(),
        workdir / "cluster",
        node_count=0,
        apiserver_args=[
            f"--audit-policy-file={policy}",
            f"--audit-log-path={audit_log}",
            "--audit-log-mode=batch",
            "--audit-log-batch-max-wait=1s",
        ],
    )
    results: list[RunResult] = []
    try:
        driver = Driver.deploy(cluster.kubeconfig("admin"))
        admin = RestClient(load_api_client(str(cluster.kubeconfig("admin"))))
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: admin.create(NODES, fake_node(f"node-{i}")), range(args.nodes)))
        namespaces = [f"bench-{i}" for i in range(args.namespaces)]
        for ns in namespaces:
            with contextlib.suppress(AlreadyExistsError):
                admin.create(
                    NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
                )
        for qps in args.qps.split(","):
            for run in range(args.runs):
                for who in who_list:
                    tag = f"{who}-{qps.replace(':', '_')}-{run}"
                    log(f"run {tag}")
                    r = one_run(
                        who,
                        qps,
                        admin=admin,
                        driver=driver,
                        cluster=cluster,
                        go_binary=go_binary,
                        namespaces=namespaces,
                        cds=args.cds,
                        idle=args.idle,
                        audit_log=audit_log,
                        workdir=workdir,
                        tag=tag,
                        quiet_idle=args.quiet_idle,
                    )
                    log(json.dumps(r.__dict__))
                    results.append(r)
    finally:
        cluster.stop()
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in results], indent=1))
    if args.workdir is None:
        shutil.rmtree(workdir / "cluster", ignore_errors=True)
    return 0


def print_table(results: list[RunResult]) -> None:
    cols = ("p50", "p99", "all_done", "delete", "requests", "writes", "rss_mib", "idle_cpu_pct")
    print("| qps | figure | Go | ours | ours/Go |")
    print("|---|---|---|---|---|")
    for qps in dict.fromkeys(r.qps for r in results):
        for col in cols:
            go = [getattr(r, col) for r in results if r.qps == qps and r.who == "go"]
            ours = [getattr(r, col) for r in results if r.qps == qps and r.who == "ours"]
            if not go or not ours:
                continue
            g, o = statistics.median(go), statistics.median(ours)
            ratio = f"{o / g:.2f}x" if g else "-"
            print(f"| {qps} | {col} | {g:.2f} | {o:.2f} | {ratio} |")


if __name__ == "__main__":
    sys.exit(main())
