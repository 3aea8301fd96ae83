"""Domain semantics on the real control plane: channel counts, isolation, placement limits.

* ``allocationMode: All`` -> the container receives all 2048 IMEX channels;
* two CDs in two namespaces on the same clique never peer (disjoint cliques objects, CD status
  and simulated-IMEX connections);
* a claim naming another namespace's CD is refused with an Event that says why;
* a non-NVLink node in a CD: its pod runs without a channel device, the CD still turns Ready;
* one CD per node: a second CD's pod on an occupied node waits, then runs once the node frees.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from kubeletsim import NodeFleet
from testsupport.e2e_support import (
    Driver,
    channel_claim,
    channels_seen,
    events_for,
    pod_phase,
    teardown_namespace,
    wait_for,
    workload_pod,
)
from testsupport.workloads import (
    cd_status,
    create_cd,
    delete_pods,
    start_pods,
    wait_bound,
    wait_cd_ready,
    wait_running,
)

from pkg.api import constants as c
from pkg.api import localready
from pkg.kube.client import KubeClient
from pkg.kube.resources import COMPUTE_DOMAIN_CLIQUES, NAMESPACES, PODS, RESOURCE_CLAIMS

pytestmark = pytest.mark.e2e


def imex_peers(fleet: NodeFleet, node: str, cd_uid: str) -> list[str]:
    """Peer addresses the simulated IMEX of ``cd_uid`` on ``node`` is connected to."""
    cfg = fleet[node].dirs.plugins / c.DRIVER_NAME / "domains" / cd_uid / "imexd.cfg"
    out = subprocess.run(
        [sys.executable, "-m", "pkg.imex.sim.ctl", "-c", str(cfg), "-N", "-j"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return list(json.loads(out).get("connected", []))


def test_allocation_mode_all_gives_2048_channels(
    admin: KubeClient, fleet: NodeFleet, ns: str
) -> None:
    w = create_cd(admin, ns, "all", mode="All")
    start_pods(admin, w, 1, ["gpu-node-5"])
    wait_bound(admin, w)
    wait_running(admin, fleet, w, channels=2048)
    seen = channels_seen(fleet, ns, w.pods[0])
    assert len(seen) == 2048
    assert {"channel0", "channel222", "channel2047"} <= set(seen)


def test_two_namespaces_same_clique_never_peer(
    admin: KubeClient, fleet: NodeFleet, driver: Driver, ns: str
) -> None:
    other = f"{ns}-b"
    admin.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other}})
    try:
        a, b = create_cd(admin, ns, "a"), create_cd(admin, other, "b")
        start_pods(admin, a, 2, ["gpu-node-1", "gpu-node-2"])
        start_pods(admin, b, 2, ["gpu-node-3", "gpu-node-4"])
        for w in (a, b):
            wait_bound(admin, w)
        for w in (a, b):
            wait_running(admin, fleet, w)
            wait_cd_ready(admin, w, 2)
        nodes_a = {e["name"] for e in cd_status(admin, a)["nodes"]}
        nodes_b = {e["name"] for e in cd_status(admin, b)["nodes"]}
        assert nodes_a == {"gpu-node-1", "gpu-node-2"} and nodes_b == {"gpu-node-3", "gpu-node-4"}
        cliques = admin.list(COMPUTE_DOMAIN_CLIQUES, namespace=driver.namespace)["items"]
        members = {
            q["metadata"]["name"]: {d["nodeName"] for d in q.get("daemons") or []} for q in cliques
        }
        clique = fleet["gpu-node-1"].spec.clique_id
        assert members[c.clique_object_name(a.cd_uid, clique)] == nodes_a
        assert members[c.clique_object_name(b.cd_uid, clique)] == nodes_b
        ips = {n.name: n.ip for n in fleet}
        wait_for("A's IMEX peers", lambda: imex_peers(fleet, "gpu-node-1", a.cd_uid))
        for node, w, mine in (("gpu-node-1", a, nodes_a), ("gpu-node-3", b, nodes_b)):
            peers = set(imex_peers(fleet, node, w.cd_uid))
            assert peers <= {ips[n] for n in mine}, (node, peers)
        # Each running daemon stands behind its node-local readiness record (the plugin's
        # shortcut to Ready), for its own domain only.
        for w, mine in ((a, nodes_a), (b, nodes_b)):
            for node in mine:
                folder = fleet[node].dirs.plugins / c.DRIVER_NAME / "domains" / w.cd_uid
                assert localready.read(folder) == localready.LocalReady(
                    w.cd_uid, node, ips[node]
                ), node
    finally:
        teardown_namespace(admin, other)
        admin.delete(NAMESPACES, other)


def test_claim_for_other_namespaces_cd_is_refused(
    admin: KubeClient, fleet: NodeFleet, ns: str
) -> None:
    other = f"{ns}-x"
    admin.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other}})
    try:
        w = create_cd(admin, ns, "home")
        params = {
            "apiVersion": c.API_VERSION,
            "kind": c.CHANNEL_CONFIG_KIND,
            "domainID": w.cd_uid,
            "allocationMode": "Single",
        }
        admin.create(RESOURCE_CLAIMS, channel_claim("stolen", other, params))
        admin.create(PODS, workload_pod("thief", other, claim="stolen", node="gpu-node-5"))
        event = wait_for(
            "FailedPrepareDynamicResources",
            lambda: next(
                (
                    e
                    for e in events_for(admin, other, "thief")
                    if e["reason"] == "FailedPrepareDynamicResources"
                ),
                None,
            ),
        )
        assert "namespace" in event["message"], event["message"]
        assert pod_phase(admin, other, "thief") == "Pending"
        assert channels_seen(fleet, other, "thief") == []
    finally:
        teardown_namespace(admin, other)
        admin.delete(NAMESPACES, other)


def test_non_nvlink_node_in_a_cd(admin: KubeClient, fleet: NodeFleet, ns: str) -> None:
    w = create_cd(admin, ns, "mixed")
    start_pods(admin, w, 2, ["gpu-node-5", "gpu-node-6"])
    placement = wait_bound(admin, w)
    wait_running(admin, fleet, w, channels=0)
    status = wait_cd_ready(admin, w, 2)
    by_node = {e["name"]: e for e in status["nodes"]}
    assert by_node["gpu-node-6"]["cliqueID"] == ""
    assert by_node["gpu-node-5"]["cliqueID"] == fleet["gpu-node-5"].spec.clique_id
    for pod, node in placement.items():
        expected = [] if node == "gpu-node-6" else ["channel0"]
        assert channels_seen(fleet, ns, pod) == expected, (pod, node)


def test_one_cd_per_node(admin: KubeClient, fleet: NodeFleet, ns: str) -> None:
    first, second = create_cd(admin, ns, "first"), create_cd(admin, ns, "second")
    start_pods(admin, first, 1, ["gpu-node-5"])
    wait_bound(admin, first)
    wait_running(admin, fleet, first)
    start_pods(admin, second, 1, ["gpu-node-5"])
    waiting = second.pods[0]
    for _ in range(10):  # it must keep waiting while the first CD holds the node
        assert pod_phase(admin, ns, waiting) == "Pending"
        assert channels_seen(fleet, ns, waiting) == []
        time.sleep(1)
    delete_pods(admin, first)
    wait_bound(admin, second, timeout=90)
    wait_running(admin, fleet, second, timeout=120)
    assert channels_seen(fleet, ns, waiting) == ["channel0"]
