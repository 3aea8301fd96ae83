"""The driver's arm64 images on a real kubelet: one arm64 node joins the real-node lane.

For this module only, a third real node, ``ARM64_NODE``, runs next to ``REAL_NODES``: its own
namespaces, cgroups and fake GPUs as theirs (``prepare_node``, with an aarch64 fake driver
root), and containerd built for linux/arm64 (``hack/build-control-plane.sh``), which the kernel
runs through the qemu-user binfmt handler this module registers and removes again.  Its images
are the linux/arm64 images of the driver's multi-architecture indexes (``build_all``) and an
arm64 pause (``nodeimages.foreign``); the kubelet, kube-proxy, shim and runc are the host's amd64
ones, so the Node reports ``kubernetes.io/arch=amd64`` while every container process is aarch64.

What a user of an arm64 (Grace) cluster sees is checked: the plugin DaemonSet's pod on the node
runs aarch64 code, registers with the real kubelet and publishes the node's ResourceSlice; a
ComputeDomain of one node with a workload pinned there gets an aarch64 IMEX daemon, becomes
Ready and delivers the channel device into the workload container; deleting both removes
everything the driver created.  Teardown stops the node alone, deletes its Node object and pods,
unregisters the handler and checks that nothing of the node is left on the host.

Python under qemu-user runs 5-10x slower than natively: every wait here allows ``QEMU_TIMEOUT``
(300 s), where the amd64 tests allow 60-180 s, and the module's tests may take three times that.
Measured on 2 idle cores: the node is Ready ~3 s after its namespaces exist, the plugin
registers ~7 s later, the domain test takes ~16 s, the teardown ~26 s.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hostsys import binfmt
from localcluster import hostnet
from localcluster.realnode import RealNode, RealNodes, missing_prerequisites
from nodeimages import PAUSE_IMAGE, build_all, driver_image_refs, images_dir
from nodeimages.foreign import archive_platforms, build_pause
from testsupport.realsupport import (
    ARM64_NODE,
    CD_LABEL,
    GPU_NODE_LABELS,
    Kubectl,
    apply,
    channel_pod,
    daemon_pod,
    domain,
    phase,
    pod_ready,
    prepare_node,
    wait_for,
)

from pkg.api import constants as c

ARCH = "arm64"
PLATFORM = f"linux/{ARCH}"
QEMU_TIMEOUT = 300.0
PLUGIN_LABEL = "app.kubernetes.io/name=compute-domain-kubelet-plugin"
WORKLOAD_CMD = "ls -l /dev/nvidia-caps-imex-channels && sleep 3600"
pytestmark = pytest.mark.timeout(3 * QEMU_TIMEOUT)


def _driver_archives() -> list[Path]:
    """The archives of the driver's three images, each an index with a linux/arm64 image
    (fails the module, naming what lacks one)."""
    archives = build_all()
    refs = driver_image_refs()
    paths = sorted({archives[ref] for ref in refs.values()})
    platforms: dict[str, list[str]] = {}
    for p in paths:
        platforms.update(archive_platforms(p))
    lacking = {ref: platforms.get(ref, []) for ref in refs.values()}
    lacking = {ref: have for ref, have in lacking.items() if PLATFORM not in have}
    if lacking:
        pytest.fail(f"driver images without a {PLATFORM} image: {lacking}", pytrace=False)
    return paths


@pytest.fixture(scope="module")
def arm64_node(nodes: RealNodes, driver: str) -> Iterator[RealNode]:
    """``ARM64_NODE`` Ready in the cluster with the qemu handler registered, for the module."""
    missing = missing_prerequisites(nodes.cluster.bin_dir, [ARCH])
    if missing:
        pytest.fail(f"arm64 node: missing {', '.join(missing)}", pytrace=False)
    images = [*_driver_archives(), build_pause(images_dir(), ARCH)]
    before = binfmt.state()
    left: list[str] = []
    with hostnet.foreign_arch(ARCH):
        nodes.add(
            ARM64_NODE,
            arch=ARCH,
            images=images,
            pause_image=PAUSE_IMAGE,
            prepare=prepare_node,
            labels=GPU_NODE_LABELS,
            timeout=QEMU_TIMEOUT,
        )
        try:
            yield nodes[ARM64_NODE]
        finally:
            left = nodes.remove(ARM64_NODE)
    added = sorted(set(binfmt.state()) - set(before))
    assert not left and not added, f"the arm64 node left {left}, binfmt handlers {added}"


def _ready(pod: dict[str, Any] | None) -> dict[str, Any] | None:
    return pod if pod_ready(pod) else None


def _plugin_pod(kubectl: Kubectl, driver: str) -> dict[str, Any] | None:
    for p in kubectl.items("pods", "-n", driver, "-l", PLUGIN_LABEL):
        if p["spec"].get("nodeName") == ARM64_NODE:
            return p
    return None


def _ready_domain(kubectl: Kubectl, ns: str) -> dict[str, Any] | None:
    status: dict[str, Any] = kubectl.json("-n", ns, "get", "computedomain/cd").get("status", {})
    return status if status.get("status") == c.STATUS_READY else None


def _slice_of_node(kubectl: Kubectl) -> dict[str, Any] | None:
    for s in kubectl.items("resourceslices"):
        spec = s.get("spec", {})
        if spec.get("nodeName") == ARM64_NODE and spec.get("driver") == c.DRIVER_NAME:
            return s
    return None


def _machine(kubectl: Kubectl, namespace: str, pod: str) -> str:
    return kubectl("-n", namespace, "exec", pod, "--", "uname", "-m").strip()


def test_plugin_registers_with_the_kubelet_on_arm64(
    kubectl: Kubectl, driver: str, arm64_node: RealNode
) -> None:
    # Ready = the plugin's registration probe: the real kubelet confirmed the registration.
    plugin = wait_for(
        "the plugin pod on the arm64 node Ready",
        lambda: _ready(_plugin_pod(kubectl, driver)),
        timeout=QEMU_TIMEOUT,
        every=2,
    )
    assert _machine(kubectl, driver, plugin["metadata"]["name"]) == "aarch64"
    image = plugin["status"]["containerStatuses"][0]["image"].removeprefix("docker.io/")
    assert image == driver_image_refs()["compute-domain-kubelet-plugin"]
    published = wait_for(
        "the arm64 node's ResourceSlice", lambda: _slice_of_node(kubectl), timeout=QEMU_TIMEOUT
    )
    assert published["spec"].get("devices"), f"no devices published: {published['spec']}"


def _arm64_workload(ns: str) -> dict[str, Any]:
    """The channel workload pinned to the arm64 node, from the daemon image (busybox here is
    amd64 only; the daemon image has sh, ls and sleep for every architecture)."""
    pod = channel_pod(ns, "w", ARM64_NODE, WORKLOAD_CMD)
    container = pod["spec"]["containers"][0]
    container["image"] = driver_image_refs()["compute-domain-daemon"]
    container["imagePullPolicy"] = "Never"  # imported, never pulled
    return pod


def _left_of_domain(kubectl: Kubectl, driver: str, uid: str) -> list[str]:
    left = []
    for kind in ("daemonsets", "resourceclaimtemplates", "pods"):
        for o in kubectl.items(kind, "-n", driver):
            if uid in yaml.safe_dump(o.get("metadata", {}).get("labels", {})):
                left.append(f"{kind}/{o['metadata']['name']}")
    node = kubectl.json("get", "node", ARM64_NODE)
    if node["metadata"].get("labels", {}).get(CD_LABEL) == uid:
        left.append(f"node label on {ARM64_NODE}")
    for clique in kubectl.items("computedomaincliques.resource.nvidia.com", "-n", driver):
        if uid in clique["metadata"]["name"]:
            left.append(f"clique/{clique['metadata']['name']}")
    return left


def _clique_daemon(kubectl: Kubectl, driver: str, uid: str) -> dict[str, Any] | None:
    for clique in kubectl.items("computedomaincliques.resource.nvidia.com", "-n", driver):
        if uid in clique["metadata"]["name"]:
            for d in clique.get("daemons") or []:
                if d.get("nodeName") == ARM64_NODE and d.get("status") == c.STATUS_READY:
                    return dict(d)
    return None


def test_domain_forms_with_an_arm64_daemon_and_delivers_the_channel(
    kubectl: Kubectl, driver: str, arm64_node: RealNode, ns: str
) -> None:
    cd = domain(ns)
    cd["spec"]["numNodes"] = 1
    apply(kubectl, cd, _arm64_workload(ns))
    uid = wait_for(
        "the domain's uid",
        lambda: kubectl.json("-n", ns, "get", "computedomain/cd")["metadata"]["uid"],
    )
    wait_for("the workload to run", lambda: phase(kubectl, ns, "w") == "Running", QEMU_TIMEOUT, 2)
    assert "channel0" in kubectl(
        "-n", ns, "exec", "w", "--", "ls", "/dev/nvidia-caps-imex-channels"
    )
    logs = kubectl("-n", ns, "logs", "w")
    line = next((ln for ln in logs.splitlines() if ln.rstrip().endswith("channel0")), "")
    assert line.startswith("c"), f"channel0 is not a character device in the workload:\n{logs}"
    assert _machine(kubectl, ns, "w") == "aarch64"

    daemon = wait_for(
        "the daemon pod on the arm64 node Ready",
        lambda: _ready(daemon_pod(kubectl, driver, uid, ARM64_NODE)),
        timeout=QEMU_TIMEOUT,
        every=2,
    )
    assert _machine(kubectl, driver, daemon["metadata"]["name"]) == "aarch64"
    wait_for(
        "the clique's daemon entry of the arm64 node Ready",
        lambda: _clique_daemon(kubectl, driver, uid),
        timeout=QEMU_TIMEOUT,
    )
    status = wait_for("the domain Ready", lambda: _ready_domain(kubectl, ns), QEMU_TIMEOUT)
    assert [n["name"] for n in status["nodes"]] == [ARM64_NODE], status

    for obj in ("pod/w", "computedomain/cd"):
        kubectl("-n", ns, "delete", obj, "--wait=true", "--timeout=300s", timeout=330)
    wait_for(
        "every object of the domain to be gone",
        lambda: not _left_of_domain(kubectl, driver, uid),
        timeout=QEMU_TIMEOUT,
    )
