"""Benchmark: ComputeDomain time-to-ready and driver API requests per CD lifecycle.

For each node count (default 2, 18, 64) a fresh local cluster with that many simulated GPU nodes
(real kubelet plugin per node, simulated IMEX ready at once; cliques of at most 18 nodes, the
IMEX domain limit) runs ``--runs`` lifecycles of: ComputeDomain + one pod per node (spread by
hostname anti-affinity) -> **time-to-ready** = from the moment every pod is bound to the moment
every pod is Running/Ready *and* its container record shows ``channel0`` -> delete pods -> delete
CD -> wait until nothing is left. Prints p50/max and the API requests the driver's three
identities made per lifecycle, counted from the apiserver's audit log (a policy that records only
``system:serviceaccounts:<driver ns>`` requests, at Metadata level).

    .venv/bin/python hack/bench/time_to_ready.py [--nodes 2,18,64] [--runs 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
for p in (REPO, REPO / "hack", REPO / "test" / "e2e"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from e2e_support import Driver, channels_seen, free_port, leak_report, wait_for  # noqa: E402
from kubeletsim import NodeFleet, config_from_cluster, layout  # noqa: E402
from localcluster import Cluster, bin_dir  # noqa: E402
from workloads import create_cd, delete_cd, delete_pods, start_pods  # noqa: E402

from pkg.kube.client import KubeClient, RestClient  # noqa: E402
from pkg.kube.config import load_api_client  # noqa: E402
from pkg.kube.resources import NAMESPACES, PODS  # noqa: E402

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


def one_lifecycle(admin: KubeClient, fleet: NodeFleet, driver_ns: str, n: int, i: int
                  ) -> tuple[float, float]:  # fmt: skip
    """Returns (time-to-ready, lifecycle seconds)."""
    ns = f"bench-{n}-{i}"
    admin.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    start = time.monotonic()
    w = create_cd(admin, ns, "cd")
    start_pods(admin, w, n, list(fleet.nodes))
    selector = f"cd-workload={w.cd_name}"

    def pods() -> list[dict[str, Any]]:
        return list(admin.list(PODS, namespace=ns, label_selector=selector)["items"])

    wait_for("all bound", lambda: all(p["spec"].get("nodeName") for p in pods()), timeout=300,
             every=0.05)  # fmt: skip
    bound = time.monotonic()

    def ready() -> bool:
        for p in pods():
            conds = {x["type"]: x["status"] for x in p.get("status", {}).get("conditions", [])}
            if conds.get("Ready") != "True":
                return False
        return all(channels_seen(fleet, ns, p) == ["channel0"] for p in w.pods)

    wait_for("all running with channel0", ready, timeout=600, every=0.1)
    ttr = time.monotonic() - bound
    delete_pods(admin, w, timeout=300)
    delete_cd(admin, w, timeout=300)
    wait_for("clean", lambda: not leak_report(admin, fleet, driver_ns, [ns]), timeout=300,
             every=0.5)  # fmt: skip
    admin.delete(NAMESPACES, ns)
    return ttr, time.monotonic() - start


def bench(
    n: int, runs: int, workdir: Path, *, probe_scale: float, imex_probe: float
) -> dict[str, Any]:
    specs = layout([i // 18 for i in range(n)])
    audit_log = workdir / "audit.log"
    policy = workdir / "audit-policy.yaml"
    workdir.mkdir(parents=True, exist_ok=True)
    policy.write_text(AUDIT_POLICY.format(ns="nvidia-dra-driver"))
    log(f"{n} nodes: starting cluster")
    cluster = Cluster.start(bin_dir(), workdir, node_names=[s.name for s in specs],
                            apiserver_args=[f"--audit-policy-file={policy}",
                                            f"--audit-log-path={audit_log}",
                                            "--audit-log-mode=batch"])  # fmt: skip
    fleet: NodeFleet | None = None
    driver: Driver | None = None
    try:
        driver = Driver.deploy(cluster.kubeconfig("admin"))
        kubeconfig = cluster.kubeconfig("compute-domain-controller")
        log_file = cluster.log_path("controller")
        driver.start_controller(kubeconfig=kubeconfig, log_file=log_file, http_port=free_port())
        cfg = config_from_cluster(cluster, workdir / "n")
        cfg.commands = dataclasses.replace(
            cfg.commands,
            env={**cfg.commands.env, "IMEX_SIM_READY_DELAY": "0",
                 "IMEX_SIM_PROBE_INTERVAL": str(imex_probe)},
        )  # fmt: skip
        cfg.probe_period_scale = probe_scale
        fleet = NodeFleet(cfg)
        t = time.monotonic()
        fleet.add(specs)
        log(f"{n} nodes up in {time.monotonic() - t:.1f}s")
        admin = RestClient(load_api_client(str(cluster.kubeconfig("admin"))), user_agent="bench")
        ttrs, requests = [], []
        for i in range(runs):
            time.sleep(2)  # let the previous lifecycle's stragglers settle
            wall0 = time.time()
            ttr, total = one_lifecycle(admin, fleet, driver.namespace, n, i)
            time.sleep(3)  # audit batch flush
            counts = audit_counts(audit_log, wall0, time.time() - 3)
            ttrs.append(ttr)
            requests.append(counts)
            log(f"{n} nodes run {i + 1}/{runs}: time-to-ready {ttr:.2f}s, lifecycle {total:.1f}s, "
                f"driver requests {sum(counts.values())}")  # fmt: skip
        per_component: Counter[str] = Counter()
        for cnt in requests:
            for k, v in cnt.items():
                per_component[k.split()[0]] += v
        return {
            "nodes": n, "runs": runs, "cliques": len({s.clique_id for s in specs}),
            "probe_period_scale": probe_scale, "imex_sim_probe_interval": imex_probe,
            "p50": statistics.median(ttrs), "max": max(ttrs), "all": ttrs,
            "requests_per_lifecycle": statistics.median(sum(c.values()) for c in requests),
            "requests_by_component": {k: v / runs for k, v in sorted(per_component.items())},
            "requests_by_verb": dict(sum(requests, Counter()).most_common()),
        }  # fmt: skip
    finally:
        if fleet is not None:
            fleet.stop()
        if driver is not None:
            driver.kill_controller()
        cluster.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="2,18,64")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--imex-probe-interval", type=float, default=0.5,
                    help="simulated IMEX peer hello period (IMEX_SIM_PROBE_INTERVAL)")  # fmt: skip
    ap.add_argument("--keep", action="store_true", help="keep work dirs (logs) of passing sizes")
    ap.add_argument(
        "--probe-period-scale", type=float, default=1.0,
        help="stretch daemon readiness/liveness probe periods (see kubeletsim.localrun)",
    )  # fmt: skip
    args = ap.parse_args()
    results = []
    for n in (int(x) for x in args.nodes.split(",")):
        workdir = Path(tempfile.mkdtemp(prefix=f"cdb{n}-", dir="/tmp"))
        try:
            results.append(bench(n, args.runs, workdir, probe_scale=args.probe_period_scale,
                                 imex_probe=args.imex_probe_interval))  # fmt: skip
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
        except Exception as e:
            log(f"{n} nodes FAILED: {e!r} (logs in {workdir / 'logs'})")
            results.append({"nodes": n, "error": repr(e)})
    print("\n| nodes | cliques | runs | p50 (s) | max (s) | driver API requests / CD lifecycle |")
    print("|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['nodes']} | | | failed: {r['error'][:60]} | | |")
            continue
        comp = ", ".join(f"{k} {v:.0f}" for k, v in r["requests_by_component"].items())
        print(f"| {r['nodes']} | {r['cliques']} | {r['runs']} | {r['p50']:.2f} | {r['max']:.2f} "
              f"| {r['requests_per_lifecycle']:.0f} ({comp}) |")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
