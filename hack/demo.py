"""``make demo``: a ComputeDomain job on a local Kubernetes 1.37, on real or simulated nodes.

On real nodes when this machine can run them (root, the Debian packages of
``hack/node-deps.sh``): see ``hack/demo_realnodes.py`` -- 2 real kubelets + containerd, the
driver and a busybox Job as containers from our images.

Otherwise on simulated nodes, each step printed as it happens: build (or reuse) the
control-plane binaries; start etcd, kube-apiserver, kube-scheduler and kube-controller-manager
on 127.0.0.1; deploy the driver from ``config/`` (the controller runs as a local process); bring
up 4 simulated GPU nodes in 2 NVLink cliques, each with the real kubelet plugin; create a
ComputeDomain and a 2-pod Indexed Job that keeps its pods on one clique (podAffinity on
``nvidia.com/gpu.clique``, as in the seed example); show ``kubectl get computedomains`` until
Ready and what the containers received; tear everything down.

    .venv/bin/python hack/demo.py [--nodes auto|real|simulated] [--keep-dir] [--timeout 180]

The first line it prints says which kind of node it used, and why.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import demo_realnodes
from kubeletsim import NodeFleet, config_from_cluster, layout
from localcluster import Cluster, bin_dir
from testsupport.e2e_support import Driver, channels_seen, free_port, kubectl, wait_for

from pkg.api import constants as c
from pkg.kube.client import RestClient
from pkg.kube.config import load_api_client
from pkg.kube.resources import COMPUTE_DOMAINS, NAMESPACES, NODES, PODS, Resource

REPO = Path(__file__).resolve().parent.parent

JOBS = Resource("batch", "v1", "jobs", "Job", namespaced=True)
NS = "demo"
T0 = time.monotonic()


def step(msg: str) -> None:
    print(f"\n[{time.monotonic() - T0:6.1f}s] ==> {msg}", flush=True)


def show(text: str) -> None:
    print("    " + text.rstrip().replace("\n", "\n    "), flush=True)


def job_manifest() -> dict[str, Any]:
    """Two pods of one Indexed Job sharing one ComputeDomain, kept on one NVLink clique."""
    label = {"job-name": "mnnvl-job"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "mnnvl-job", "namespace": NS},
        "spec": {
            "parallelism": 2,
            "completions": 2,
            "completionMode": "Indexed",
            "template": {
                "metadata": {"labels": label},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "affinity": {
                        "podAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "topologyKey": c.GPU_CLIQUE_NODE_LABEL,
                                    "labelSelector": {"matchLabels": label},
                                }
                            ]
                        },
                        "podAntiAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "topologyKey": "kubernetes.io/hostname",
                                    "labelSelector": {"matchLabels": label},
                                }
                            ]
                        },
                    },
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "nvcr.io/nvidia/pytorch:24.01-py3",
                            "command": [
                                "bash",
                                "-c",
                                "ls -la /dev/nvidia-caps-imex-channels && sleep infinity",
                            ],
                            "resources": {"claims": [{"name": "compute-domain"}]},
                        }
                    ],
                    "resourceClaims": [
                        {"name": "compute-domain", "resourceClaimTemplateName": "demo-channel"}
                    ],
                },
            },
        },
    }


def run(workdir: Path, timeout: float) -> None:
    step("control-plane binaries (hack/build-control-plane.sh: builds only what is missing)")
    bins = bin_dir(build=True)
    show(f"binaries in {bins}")

    specs = layout([0, 0, 1, 1])
    step("starting etcd, kube-apiserver (Node,RBAC), kube-scheduler, kube-controller-manager")
    cluster = Cluster.start(bins, workdir, node_names=[s.name for s in specs])
    admin_kc = cluster.kubeconfig("admin")
    show(cluster.describe())
    admin = RestClient(load_api_client(str(admin_kc)), user_agent="demo")
    fleet: NodeFleet | None = None
    driver: Driver | None = None
    try:
        step("deploying the driver from config/ (CRDs, RBAC, DeviceClasses, admission policies)")
        driver = Driver.deploy(admin_kc)
        driver.start_controller(
            kubeconfig=cluster.kubeconfig("compute-domain-controller"),
            log_file=cluster.log_path("controller"),
            http_port=free_port(),
        )
        show(f"controller running as a local process (log {driver.controller_log})")

        step("4 simulated GPU nodes, 2 NVLink cliques, each running the real kubelet plugin")
        fleet = NodeFleet(config_from_cluster(cluster, workdir / "n"))
        fleet.add(specs)
        for s in specs:
            show(f"{s.name:<12} {s.ip:<12} clique {s.clique_id}")
        wait_for(
            "clique node labels",
            lambda: all(
                c.GPU_CLIQUE_NODE_LABEL in n["metadata"].get("labels", {})
                for n in admin.list(NODES)["items"]
            ),
            timeout=60,
        )
        show(kubectl(admin_kc, "get", "nodes", "-L", c.GPU_CLIQUE_NODE_LABEL))

        step("ComputeDomain demo-cd + a 2-pod Indexed Job referencing its claim template")
        admin.create(
            NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
        )
        admin.create(
            COMPUTE_DOMAINS,
            {
                "apiVersion": c.API_VERSION,
                "kind": c.COMPUTE_DOMAIN_KIND,
                "metadata": {"name": "demo-cd", "namespace": NS},
                "spec": {
                    "numNodes": 2,
                    "channel": {"resourceClaimTemplate": {"name": "demo-channel"}},
                },
            },
        )
        admin.create(JOBS, job_manifest())
        step("waiting for the ComputeDomain to become Ready")
        deadline = time.monotonic() + timeout
        while True:
            cd = admin.get(COMPUTE_DOMAINS, "demo-cd", namespace=NS)
            show(kubectl(admin_kc, "get", "computedomains", "-n", NS))
            if (cd.get("status") or {}).get("status") == c.STATUS_READY:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"ComputeDomain not Ready after {timeout:.0f}s")
            time.sleep(2)
        show(json.dumps(cd["status"], indent=1))
        show(kubectl(admin_kc, "get", "pods", "-A", "-o", "wide"))

        step("what the workload containers received (CDI edits resolved by the real CDI library)")
        pods = admin.list(PODS, namespace=NS)["items"]
        for pod in pods:
            name = pod["metadata"]["name"]
            wait_for(f"{name} channel", partial(channels_seen, fleet, NS, name, "trainer"))
            rec = fleet.container_record(NS, name, "trainer") or {}
            devices = [d["path"] for d in rec.get("deviceNodes", [])]
            show(f"{name} on {pod['spec']['nodeName']}: devices {devices}")
            show(f"  CDI devices {rec.get('cdiDevices')}")

        step("tearing down: Job, ComputeDomain, then the cluster")
        admin.delete(JOBS, "mnnvl-job", namespace=NS, propagation_policy="Foreground")
        wait_for("job pods gone", lambda: not admin.list(PODS, namespace=NS)["items"], timeout=90)
        admin.delete(COMPUTE_DOMAINS, "demo-cd", namespace=NS)
        wait_for(
            "ComputeDomain gone", lambda: not admin.list(COMPUTE_DOMAINS, namespace=NS)["items"]
        )
        show("ComputeDomain, its DaemonSet, claim templates and node labels removed")
    finally:
        if fleet is not None:
            fleet.stop()
        if driver is not None:
            driver.kill_controller()
        cluster.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep-dir", action="store_true", help="keep the work dir (logs)")
    ap.add_argument("--timeout", type=float, default=180.0)
    ap.add_argument("--nodes", choices=("auto", "real", "simulated"), default="auto")
    args = ap.parse_args()
    why_not = demo_realnodes.unavailable() if args.nodes != "simulated" else ["--nodes simulated"]
    if args.nodes == "real" and why_not:
        print(f"demo: real nodes unavailable: {'; '.join(why_not)}", file=sys.stderr)
        return 1
    real = not why_not
    if real:
        print("demo: using REAL nodes (kubelet + containerd; the driver runs as containers)")
    else:
        print(f"demo: using SIMULATED nodes (real nodes unavailable: {'; '.join(why_not)})")
    # Short path: Unix socket paths of the simulated nodes must stay under 108 bytes.
    workdir = Path(tempfile.mkdtemp(prefix="cd-demo-", dir="/tmp"))
    try:
        if real:
            demo_realnodes.run(workdir, args.timeout, step, show)
        else:
            run(workdir, args.timeout)
    except (subprocess.CalledProcessError, AssertionError) as e:
        print(f"demo failed: {e}", file=sys.stderr)
        return 1
    finally:
        if args.keep_dir:
            show(f"work dir (component logs in logs/) kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    step("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
