"""Several pods of one ComputeDomain on one node, on real kubelets and containerd.

A domain on both nodes with two pods per node, each pod with its own claim from the domain's
template: the real scheduler gives every claim its node's ``channel-0`` (published with
``allowMultipleAllocations``, tainted for the domain once used), each pod receives the channel
device, and each node runs one IMEX daemon under one node label. One pod is deleted while the
others run: they keep running, unrestarted, with their channel device still there, and the node
keeps its label and daemon. A pod of another domain pinned to one of these nodes stays
unscheduled while the domain uses it (the taint), and runs there once the domain's pods are
gone. Deleting the workloads and the domains leaves nothing: no claim, daemon, template, node
label or clique, and no taint on either node's channel.
"""

from __future__ import annotations

from typing import Any

from testsupport.realsupport import (
    CD_LABEL,
    DRIVER_NAMESPACE,
    REAL_NODES,
    Kubectl,
    apply,
    channel_devices,
    channel_pod,
    daemon_pod,
    domain,
    pod_ready,
    wait_for,
)

CHANNEL = "/dev/nvidia-caps-imex-channels/channel0"
WORKLOAD_CMD = f"ls -l {CHANNEL} && sleep 3600"
# Two pods per node: (pod name, node).
PODS = tuple((f"w-{n[-1]}-{i}", n) for n in REAL_NODES for i in (0, 1))


def _running(kubectl: Kubectl, ns: str, names: list[str]) -> dict[str, dict[str, Any]] | None:
    """The pods ``names`` if every one is Running and its log lists the channel device."""
    pods = {p["metadata"]["name"]: p for p in kubectl.items("pods", "-n", ns)}
    if any(pods.get(n, {}).get("status", {}).get("phase") != "Running" for n in names):
        return None
    for n in names:
        log = kubectl("-n", ns, "logs", n, check=False)
        if not log.startswith("c") or "channel0" not in log:  # a character device
            return None
    return {n: pods[n] for n in names}


def _unschedulable(kubectl: Kubectl, ns: str, name: str) -> bool:
    """Whether the pod is unscheduled and the scheduler said why (``Unschedulable``)."""
    pod = kubectl.json("-n", ns, "get", "pod", name)
    if pod["spec"].get("nodeName"):
        return False
    conds = pod.get("status", {}).get("conditions", [])
    return any(
        c["type"] == "PodScheduled"
        and c["status"] == "False"
        and c.get("reason") == "Unschedulable"
        for c in conds
    )


def _left(kubectl: Kubectl, ns: str, uid: str) -> list[str]:
    """Everything of the domain still there."""
    left = [f"claim/{c['metadata']['name']}" for c in kubectl.items("resourceclaims", "-n", ns)]
    for kind in ("daemonsets", "resourceclaimtemplates", "pods", "resourceclaims"):
        for o in kubectl.items(kind, "-n", DRIVER_NAMESPACE, "-l", f"{CD_LABEL}={uid}"):
            left.append(f"{kind}/{o['metadata']['name']}")
    for n in kubectl.items("nodes"):
        if n["metadata"].get("labels", {}).get(CD_LABEL) == uid:
            left.append(f"node label on {n['metadata']['name']}")
    for c in kubectl.items("computedomaincliques.resource.nvidia.com", "-n", DRIVER_NAMESPACE):
        if c["metadata"]["name"].startswith(uid):
            left.append(f"clique/{c['metadata']['name']}")
    for node, device in channel_devices(kubectl).items():
        if device.get("taints"):
            left.append(f"taint on {node}'s channel-0: {device['taints']}")
    return left


def test_two_pods_per_node_share_the_channel_and_outlive_a_sibling(
    kubectl: Kubectl, driver: str, ns: str
) -> None:
    apply(kubectl, domain(ns))
    apply(kubectl, *(channel_pod(ns, name, node, WORKLOAD_CMD) for name, node in PODS))
    names = [name for name, _ in PODS]
    before = wait_for(
        "four pods Running with their channel",
        lambda: _running(kubectl, ns, names),
        timeout=180,
        every=1,
    )
    [cd] = kubectl.items("computedomains.resource.nvidia.com", "-n", ns)
    uid = cd["metadata"]["uid"]

    # Four claims, each allocated its node's one channel-0 (a share of it).
    claims = kubectl.items("resourceclaims", "-n", ns)
    assert len(claims) == 4
    for claim in claims:
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert result["device"] == "channel-0" and result.get("shareID"), result
    # One daemon and one label per node; the channel tainted for this domain on both.
    daemons = kubectl.items("pods", "-n", driver, "-l", f"{CD_LABEL}={uid}")
    assert sorted(d["spec"]["nodeName"] for d in daemons) == sorted(REAL_NODES)
    labels = {
        n["metadata"]["name"]: n["metadata"]["labels"].get(CD_LABEL)
        for n in kubectl.items("nodes")
        if n["metadata"]["name"] in REAL_NODES
    }
    assert labels == dict.fromkeys(REAL_NODES, uid)
    taints = {node: d.get("taints") for node, d in channel_devices(kubectl).items()}
    for node in REAL_NODES:
        [taint] = taints[node] or [{}]
        assert (taint.get("key"), taint.get("value"), taint.get("effect")) == (
            CD_LABEL,
            uid,
            "NoSchedule",
        ), taints

    # A pod of another domain pinned to a node in use is kept away by the channel's taint: it
    # stays unscheduled (as with upstream's exclusive channel), it never waits on the node.
    apply(kubectl, domain(ns, "other"))
    outsider = channel_pod(ns, "outsider", REAL_NODES[0], WORKLOAD_CMD, rct="other-rct")
    apply(kubectl, outsider)
    wait_for(
        "the other domain's pod unschedulable",
        lambda: _unschedulable(kubectl, ns, "outsider"),
        timeout=60,
    )

    # One pod deleted mid-run: its sibling on the node and the other node's pods run on.
    victim, node = PODS[0]
    daemon_before = daemon_pod(kubectl, driver, uid, node)
    kubectl("-n", ns, "delete", "pod", victim, "--wait=true", "--timeout=120s")
    wait_for(
        f"{victim}'s claim to be released",
        lambda: len(kubectl.items("resourceclaims", "-n", ns)) == 4,
        timeout=60,
    )
    survivors = [n for n in names if n != victim]
    after = _running(kubectl, ns, survivors)
    assert after is not None, "a sibling stopped running when one pod was deleted"
    for n in survivors:
        assert after[n]["metadata"]["uid"] == before[n]["metadata"]["uid"]
        restarts = [s.get("restartCount", 0) for s in after[n]["status"]["containerStatuses"]]
        assert restarts == [0], (n, restarts)
        # The device is still in the container (not only in the log of its start).
        listing = kubectl("-n", ns, "exec", n, "--", "ls", "-l", CHANNEL)
        assert listing.startswith("c"), listing
    node_obj = kubectl.json("get", "node", node)
    assert node_obj["metadata"]["labels"].get(CD_LABEL) == uid, f"{node} lost its label"
    daemon_after = daemon_pod(kubectl, driver, uid, node)
    assert daemon_after is not None and pod_ready(daemon_after), f"{node} lost its daemon"
    assert daemon_before is not None
    assert daemon_after["metadata"]["uid"] == daemon_before["metadata"]["uid"]

    assert _unschedulable(kubectl, ns, "outsider"), "the other domain's pod got a used node"

    # The domain's last pods gone, the node is free: the other domain's pod runs there.
    kubectl("-n", ns, "delete", "pods", *survivors, "--wait=true", "--timeout=120s")
    wait_for(
        "the other domain's pod Running with its channel",
        lambda: _running(kubectl, ns, ["outsider"]),
        timeout=120,
        every=1,
    )

    # Deletion leaves nothing.
    kubectl("-n", ns, "delete", "pod", "outsider", "--wait=true", "--timeout=120s")
    other_uid = kubectl.json("-n", ns, "get", "computedomain/other")["metadata"]["uid"]
    kubectl(
        "-n",
        ns,
        "delete",
        "computedomain/cd",
        "computedomain/other",
        "--wait=true",
        "--timeout=120s",
    )
    wait_for(
        "nothing of either domain left",
        lambda: not _left(kubectl, ns, uid) and not _left(kubectl, ns, other_uid),
        timeout=120,
    )
