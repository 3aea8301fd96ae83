"""``make demo`` on real nodes: kubelet + containerd, the driver and a busybox Job as containers.

Steps, each printed as it happens: build (or reuse) the Kubernetes, containerd and image
artifacts; start the control plane with the nodes' bridge address; bring up 2 real nodes
(``localcluster.RealNodes``: own network + mount namespace, containerd, kubelet, kube-proxy,
fake GPUs, fake driver root); ``kubectl apply -k config/overlays/e2e-real-nodes``; run the
sample ComputeDomain and its 2-pod Job; show the domain Ready and ``kubectl logs`` of the
workers (their ``/dev/nvidia-caps-imex-channels``); tear everything down and show that the host
is as it was. Used by ``hack/demo.py`` when :func:`unavailable` returns nothing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from localcluster import Cluster, bin_dir
from localcluster.hostnet import HOST_IP
from localcluster.realnode import RealNodes, missing_prerequisites
from nodeimages import PAUSE_IMAGE, build_all
from testsupport.realsupport import (
    GPU_NODE_LABELS,
    REAL_NODES,
    Kubectl,
    deploy_driver,
    prepare_node,
    sample_workload,
)
from testsupport.realsupport import wait_for as wait

NS = "demo"
WORKER_CMD = "ls -l /dev/nvidia-caps-imex-channels && sleep 15"


def unavailable() -> list[str]:
    """Why real nodes cannot run here (``[]``: they can). Builds nothing."""
    if os.geteuid() != 0:
        return ["real nodes need root (namespaces, cgroups, containerd)"]
    return missing_prerequisites(bin_dir())


def run(
    workdir: Path, timeout: float, step: Callable[[str], None], show: Callable[[str], None]
) -> None:
    """The demo on real nodes (see the module docstring); raises on failure after teardown."""
    step("Kubernetes, containerd (hack/build-control-plane.sh) and images (hack/nodeimages)")
    bins = bin_dir(build=True)
    images = build_all()
    show(f"binaries in {bins}; images: {', '.join(sorted(images))}")
    step("control plane: etcd, kube-apiserver (also on the nodes' bridge), scheduler, kcm")
    cluster = Cluster.start(bins, workdir, node_names=REAL_NODES, advertise_address=HOST_IP)
    fleet: RealNodes | None = None
    kubectl = Kubectl(cluster.kubeconfig("admin"))
    try:
        step(
            f"{len(REAL_NODES)} real nodes: containerd, kubelet, kube-proxy in their own namespaces"
        )
        fleet = RealNodes.start(
            cluster,
            workdir / "nodes",
            REAL_NODES,
            images=list(images.values()),
            pause_image=PAUSE_IMAGE,
            prepare=prepare_node,
            labels=GPU_NODE_LABELS,
        )
        show(kubectl("get", "nodes", "-o", "wide"))
        step("kubectl apply --server-side -k config/overlays/e2e-real-nodes")
        driver_ns = deploy_driver(kubectl)
        show(kubectl("-n", driver_ns, "get", "pods", "-o", "wide"))
        step("the sample ComputeDomain and its 2-pod Job (busybox)")
        kubectl("create", "namespace", NS)
        kubectl("apply", "-f", "-", stdin=sample_workload(NS, WORKER_CMD))
        deadline = time.monotonic() + timeout
        while True:
            out = kubectl("-n", NS, "get", "computedomains")
            show(out)
            if " Ready" in out:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"ComputeDomain not Ready after {timeout:.0f}s")
            time.sleep(2)
        show(kubectl("get", "pods", "-A", "-o", "wide"))
        step("kubectl logs of the workers: the channel containerd injected through CDI")
        wait(
            "the Job to complete",
            lambda: (
                kubectl.json("-n", NS, "get", "job/training-job").get("status", {}).get("succeeded")
                == 2
            ),
            timeout=timeout,
            every=1,
        )
        for pod in kubectl.items("pods", "-n", NS):
            show(f"{pod['metadata']['name']} on {pod['spec']['nodeName']}:")
            show("  " + kubectl("-n", NS, "logs", pod["metadata"]["name"]).replace("\n", "\n  "))
        show(kubectl("-n", NS, "get", "job"))
        step("tearing down: Job, ComputeDomain, driver, nodes, control plane")
        kubectl("-n", NS, "delete", "job/training-job", "--cascade=foreground", "--wait=true")
        kubectl("-n", NS, "delete", "computedomain/training-domain", "--wait=true")
        show("ComputeDomain, its DaemonSet, claim templates and node labels removed")
    finally:
        if fleet is not None:
            left = fleet.stop()
            show("host as found: yes" if not left else f"LEFT ON THE HOST: {left}")
        cluster.stop()
