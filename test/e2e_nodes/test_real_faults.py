"""Faults on real nodes, where the real kubelet and node lifecycle controller decide.

* a kubelet-plugin pod deleted while a domain forms: the DaemonSet's new pod re-registers with
  the real kubelet and the workload still gets its channel;
* an IMEX daemon container SIGKILLed while the domain forms: the workload that needs it waits
  until the real kubelet has restarted it and IMEX is Ready; SIGKILLed under a running
  workload: the domain leaves Ready and returns once the kubelet has restarted it;
* a node's kubelet stopped: the real node lifecycle controller marks the Node NotReady and the
  ComputeDomain's status follows; restarted, the node rejoins.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

from localcluster.realnode import RealNodes
from testsupport.realsupport import (
    REAL_NODES,
    Kubectl,
    apply,
    channel_pod,
    container_pids,
    domain,
    imex_hold_file,
    phase,
    ready_daemon,
    wait_for,
)


def _cd_status(kubectl: Kubectl, ns: str, name: str = "cd") -> dict[str, Any]:
    st: dict[str, Any] = kubectl.json("-n", ns, "get", f"computedomain/{name}").get("status", {})
    return st


def test_plugin_pod_restarted_mid_formation(
    kubectl: Kubectl, nodes: RealNodes, driver: str, ns: str
) -> None:
    node = REAL_NODES[0]
    apply(kubectl, domain(ns), channel_pod(ns, "w", node, "ls /dev/nvidia-caps-imex-channels"))
    wait_for(
        "the workload's claim to be allocated",
        lambda: any(
            c.get("status", {}).get("allocation") for c in kubectl.items("resourceclaims", "-n", ns)
        ),
        timeout=60,
    )
    old = [
        p["metadata"]["name"]
        for p in kubectl.items(
            "pods", "-n", driver, "-l", "app.kubernetes.io/name=compute-domain-kubelet-plugin"
        )
        if p["spec"]["nodeName"] == node
    ]
    assert old, "no plugin pod on the node"
    kubectl("-n", driver, "delete", "pod", old[0], "--wait=false")
    wait_for("the workload to succeed", lambda: phase(kubectl, ns, "w") == "Succeeded", 180)
    assert "channel0" in kubectl("-n", ns, "logs", "w")
    kubectl("-n", ns, "delete", "pod", "w", "--wait=true")
    kubectl("-n", ns, "delete", "computedomain/cd", "--wait=true", "--timeout=120s")


def test_daemon_killed_kubelet_restarts_it_and_workload_waits(
    kubectl: Kubectl, nodes: RealNodes, driver: str, ns: str
) -> None:
    node = REAL_NODES[0]
    # Part 1: the node's IMEX daemon dies again and again while the domain forms (SIGKILL of
    # every daemon process in the node's pod cgroups). One channel per node and domain, so the
    # workload that triggered the daemon is the one that must wait: it may not start until
    # the real kubelet has restarted the daemon and IMEX is Ready.
    apply(
        kubectl,
        domain(ns),
        channel_pod(ns, "w", node, "ls /dev/nvidia-caps-imex-channels; sleep 3600"),
    )
    uid = wait_for(
        "the domain's uid",
        lambda: kubectl.json("-n", ns, "get", "computedomain/cd")["metadata"]["uid"],
    )
    killed = 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for pid in container_pids(node, "compute-domain-daemon"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        assert phase(kubectl, ns, "w") != "Running", "the workload started while IMEX was down"
        time.sleep(0.1)
    assert killed, "no daemon process appeared on the node within 10 s"
    wait_for("the workload to run", lambda: phase(kubectl, ns, "w") == "Running", 180, 1)
    # The plugin releases the workload on the daemon's own word (its clique entry: IMEX is up);
    # the pod's Ready condition follows with the next readiness probe.
    nodes_ready = [
        n["name"] for n in _cd_status(kubectl, ns).get("nodes", []) if n.get("status") == "Ready"
    ]
    assert node in nodes_ready, "the workload runs but the domain lists its node as not Ready"
    daemon = wait_for("the daemon pod Ready", lambda: ready_daemon(kubectl, driver, uid, node), 60)
    restarts = daemon["status"]["containerStatuses"][0]["restartCount"]
    assert restarts >= 1, "the real kubelet did not restart the killed daemon"

    # Part 2: the daemon dies under a running workload: the domain leaves Ready (the dead
    # daemon does not count) and comes back once the kubelet has restarted it.
    wait_for("the domain Ready", lambda: _cd_status(kubectl, ns).get("status") == "Ready", 60)
    # The restarted daemon's simulated IMEX is held not ready until the domain has left Ready:
    # unheld, the daemon was Ready again within ~1 s, a window a poll can miss.
    hold = imex_hold_file(nodes, node, uid)
    try:
        for pid in container_pids(node, "compute-domain-daemon"):
            os.kill(pid, signal.SIGKILL)
        hold.write_text("held by test_real_faults\n")
        wait_for(
            "the domain to leave Ready",
            lambda: _cd_status(kubectl, ns).get("status") != "Ready",
            timeout=30,
        )
    finally:
        hold.unlink(missing_ok=True)
    d = wait_for("the daemon Ready again", lambda: ready_daemon(kubectl, driver, uid, node), 120)
    assert d["status"]["containerStatuses"][0]["restartCount"] > restarts
    wait_for("the domain Ready again", lambda: _cd_status(kubectl, ns).get("status") == "Ready", 60)
    assert phase(kubectl, ns, "w") == "Running"
    kubectl("-n", ns, "delete", "pod", "w", "--wait=true")
    kubectl("-n", ns, "delete", "computedomain/cd", "--wait=true", "--timeout=120s")


def test_kubelet_stopped_node_not_ready_and_domain_follows(
    kubectl: Kubectl, nodes: RealNodes, driver: str, ns: str
) -> None:
    a, b = REAL_NODES
    cd = domain(ns)
    cd["spec"]["numNodes"] = 2
    apply(
        kubectl,
        cd,
        channel_pod(ns, "wa", a, "sleep 3600"),
        channel_pod(ns, "wb", b, "sleep 3600"),
    )
    wait_for(
        "both workloads running",
        lambda: all(phase(kubectl, ns, p) == "Running" for p in ("wa", "wb")),
        180,
    )
    wait_for("the domain Ready", lambda: _cd_status(kubectl, ns).get("status") == "Ready", 60)

    nodes[b].stop_kubelet()
    try:

        def node_not_ready() -> bool:
            n = kubectl.json("get", "node", b)
            return any(
                c["type"] == "Ready" and c["status"] != "True" for c in n["status"]["conditions"]
            )

        wait_for(f"{b} NotReady", node_not_ready, timeout=90, every=1)
        wait_for(
            "the domain to leave Ready",
            lambda: _cd_status(kubectl, ns).get("status") != "Ready",
            timeout=120,
            every=1,
        )
    finally:
        nodes[b].start_kubelet()
    nodes.wait_ready([b], timeout=90)
    wait_for(
        "the domain Ready again", lambda: _cd_status(kubectl, ns).get("status") == "Ready", 180, 1
    )
    kubectl("-n", ns, "delete", "pod", "wa", "wb", "--wait=true", "--timeout=120s")
    kubectl("-n", ns, "delete", "computedomain/cd", "--wait=true", "--timeout=120s")
