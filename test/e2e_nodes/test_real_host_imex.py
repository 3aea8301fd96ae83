"""Host-managed IMEX on real kubelets: the node's own IMEX service, no driver-run daemon.

Each node runs the simulated ``nvidia-imex.service`` (`hostimex.HostImex`), and the driver is
switched to ``config/overlays/e2e-real-nodes-host-imex`` (``config/components/host-managed-imex``
on the lane's overlay) for this module, then back to the lane's overlay. What is checked is
what a user sees: the ComputeDomain turns Ready at once without any daemon, a workload pod gets
``/dev/nvidia-caps-imex-channels/channel0`` through the kubelet's real DRA call into the plugin
(which asked the host IMEX with ``chroot <driver root> nvidia-imex-ctl -q --u=<socket>``); and
while the host IMEX is not ready, the pod waits in ``ContainerCreating`` with the kubelet's
``FailedPrepareDynamicResources`` event naming the readiness check, then starts once it is.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from localcluster.realnode import RealNodes
from testsupport.hostimex import HostImex
from testsupport.realsupport import (
    CD_LABEL,
    DRIVER_NAMESPACE,
    OVERLAY,
    REAL_NODES,
    REPO,
    Kubectl,
    apply,
    channel_pod,
    domain,
    install_monitoring_crds,
    phase,
    wait_for,
)

# The module switches the driver to host-managed mode and back (four rollouts); run alone, its
# first test also waits for the session's image build and nodes.
pytestmark = pytest.mark.timeout(600)
HOST_OVERLAY = REPO / "config" / "overlays" / "e2e-real-nodes-host-imex"
ROLLOUTS = ("deployment/compute-domain-controller", "daemonset/compute-domain-kubelet-plugin")
CHANNEL_CMD = "ls -l /dev/nvidia-caps-imex-channels && sleep 600"


def _deploy(kubectl: Kubectl, overlay: Any, *, mode: str) -> None:
    """Apply ``overlay`` and wait until the controller and every plugin run with ``mode``."""
    kubectl("apply", "--server-side", "--force-conflicts", "-k", str(overlay))
    for obj in ROLLOUTS:
        kubectl("-n", DRIVER_NAMESPACE, "rollout", "status", obj, "--timeout=180s")

    def switched() -> bool:
        pods = kubectl.items("pods", "-n", DRIVER_NAMESPACE)
        plugins = [p for p in pods if "kubelet-plugin" in p["metadata"]["name"]]
        for pod in pods:
            if pod["metadata"].get("deletionTimestamp"):
                return False
            for ctr in pod["spec"]["containers"]:
                env = {e["name"]: e.get("value") for e in ctr.get("env", [])}
                if env.get("IMEX_MODE", "driverManaged") != mode:
                    return False
        ready = [
            p
            for p in plugins
            if all(s.get("ready") for s in p["status"].get("containerStatuses", []))
        ]
        return len(ready) == len(REAL_NODES)

    wait_for(f"controller and plugins in {mode} mode", switched, timeout=180)


@pytest.fixture(scope="module")
def host_imex(nodes: RealNodes, kubectl: Kubectl) -> Iterator[HostImex]:
    """Host IMEX services on every node and the driver in host-managed mode; afterwards the
    lane's driver-managed overlay and driver roots again."""
    services = HostImex(nodes, REAL_NODES)
    services.start()
    try:
        install_monitoring_crds(kubectl)
        _deploy(kubectl, HOST_OVERLAY, mode="hostManaged")
        yield services
    finally:
        try:
            _deploy(kubectl, OVERLAY, mode="driverManaged")
        finally:
            services.stop()


@pytest.fixture
def namespace(kubectl: Kubectl, host_imex: HostImex) -> Iterator[str]:
    name = f"host-imex-{secrets.token_hex(2)}"
    kubectl("create", "namespace", name)
    yield name
    kubectl("delete", "namespace", name, "--wait=true", "--timeout=180s")


def _cd(kubectl: Kubectl, ns: str) -> dict[str, Any]:
    return kubectl.json("-n", ns, "get", "computedomain/cd")


def test_domain_ready_without_daemons_and_pod_gets_its_channel(
    kubectl: Kubectl, host_imex: HostImex, namespace: str
) -> None:
    node = REAL_NODES[0]
    apply(kubectl, domain(namespace))
    cd = wait_for(
        "the ComputeDomain Ready",
        lambda: (
            c if (c := _cd(kubectl, namespace)).get("status", {}).get("status") == "Ready" else None
        ),
        timeout=60,
    )
    assert "nodes" not in cd["status"]
    uid = cd["metadata"]["uid"]
    apply(kubectl, channel_pod(namespace, "w", node, CHANNEL_CMD))
    wait_for(
        "the workload Running", lambda: phase(kubectl, namespace, "w") == "Running", timeout=120
    )
    logs = wait_for(
        "the workload's listing",
        lambda: out if "channel" in (out := kubectl("-n", namespace, "logs", "w")) else None,
        timeout=30,
    )
    lines = [ln for ln in logs.splitlines() if "channel" in ln]
    assert len(lines) == 1 and lines[0].rstrip().endswith("channel0"), logs
    assert lines[0].startswith("c"), f"channel0 is not a character device: {lines[0]}"
    # No daemon machinery at all: no DaemonSet, daemon pod or clique, no node label.
    assert kubectl.items("daemonsets", "-n", DRIVER_NAMESPACE, "-l", CD_LABEL) == []
    assert kubectl.items("pods", "-n", DRIVER_NAMESPACE, "-l", f"{CD_LABEL}={uid}") == []
    assert kubectl.items("computedomaincliques.resource.nvidia.com", "-n", DRIVER_NAMESPACE) == []
    labels = kubectl.json("get", "node", node)["metadata"].get("labels", {})
    assert CD_LABEL not in labels
    # Each plugin publishes channel-0 only.
    for s in kubectl.items("resourceslices"):
        if s["spec"].get("driver") == "compute-domain.nvidia.com":
            assert [d["name"] for d in s["spec"]["devices"]] == ["channel-0"], s["metadata"]


def test_host_imex_not_ready_keeps_the_pod_creating(
    kubectl: Kubectl, host_imex: HostImex, namespace: str
) -> None:
    node = REAL_NODES[1]
    hold = host_imex.hold_file(node)
    hold.touch()
    try:
        apply(kubectl, domain(namespace), channel_pod(namespace, "w", node, CHANNEL_CMD))

        def failed_prepare() -> str | None:
            events = kubectl.items(
                "events", "-n", namespace, "--field-selector", "involvedObject.name=w"
            )
            for ev in events:
                if ev.get("reason") == "FailedPrepareDynamicResources":
                    return str(ev.get("message", ""))
            return None

        message = wait_for("FailedPrepareDynamicResources", failed_prepare, timeout=90)
        assert "host nvidia-imex daemon readiness check failed" in message, message
        assert "host nvidia-imex daemon not ready: UNAVAILABLE" in message, message

        def waiting_reason() -> str | None:
            pod = kubectl.json("-n", namespace, "get", "pod", "w")
            assert pod["status"]["phase"] == "Pending", pod["status"]
            statuses = pod["status"].get("containerStatuses") or []
            return str(statuses[0]["state"].get("waiting", {}).get("reason")) if statuses else None

        reason = wait_for("the workload's container state", waiting_reason, timeout=30)
        assert reason == "ContainerCreating", reason
    finally:
        hold.unlink(missing_ok=True)
    # The kubelet's next retry finds the host IMEX ready.
    wait_for(
        "the workload Running once the host IMEX is ready",
        lambda: phase(kubectl, namespace, "w") == "Running",
        timeout=120,
    )
