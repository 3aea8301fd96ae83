"""Node and daemon failures where the real control plane decides (node lifecycle on).

This module runs its own control plane: the session cluster turns the node-lifecycle and
taint-eviction controllers off (its fake Nodes would all go NotReady), this one runs them with
``--node-monitor-grace-period=10s``, and its simulated nodes renew their Lease every second.
The controller runs with ``NODE_LOSS_GRACE_PERIOD=5s``.

* the real DaemonSet controller's tolerations on a daemon pod: upstream's three wildcards plus
  its own infinite ``not-ready``/``unreachable`` ones (a bounded toleration in the template
  would be overwritten), so a daemon is never evicted;
* a daemon follows its workload onto a node with a custom ``NoExecute`` taint the workload
  tolerates;
* a node that dies (processes SIGKILLed, kubelet stand-in and heartbeats stopped) is marked
  ``Unknown`` and tainted unreachable by the node-lifecycle controller; its daemon pod stays
  bound, yet after the grace period the node leaves the domain (``status.nodes``, its clique,
  a ``NodeLost`` Event) and the domain is Ready with the survivors; revived, it rejoins;
* an IMEX daemon that is SIGKILLed again and again (crash loop): its clique entry and the
  domain turn NotReady while it is down, Ready again once it runs;
* ``numNodes`` above the maximum is refused by the real API server's CRD validation.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubeletsim import NodeFleet, SimulatedNode, config_from_cluster, layout
from localcluster import DEFAULT_CONTROLLERS, Cluster, bin_dir
from testsupport.e2e_support import (
    Driver,
    compute_domain,
    events_for,
    free_port,
    leak_report,
    teardown_namespace,
    wait_for,
    workload_pod,
)
from testsupport.workloads import (
    Workload,
    cd_status,
    create_cd,
    daemon_pods,
    start_pods,
    wait_bound,
    wait_cd_ready,
    wait_running,
)

from pkg.api import constants as c
from pkg.api.computedomain import MAX_NUM_NODES
from pkg.kube.client import KubeClient, RestClient
from pkg.kube.config import load_api_client
from pkg.kube.errors import InvalidError, NotFoundError
from pkg.kube.resources import COMPUTE_DOMAIN_CLIQUES, COMPUTE_DOMAINS, NAMESPACES, NODES, PODS

pytestmark = pytest.mark.e2e

REQUIRED = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "cdi-resolve")
CONTROLLERS = tuple(
    x
    for x in DEFAULT_CONTROLLERS
    if x not in ("-node-lifecycle-controller", "-taint-eviction-controller")
)
NODE_MONITOR_GRACE = 10
NODE_LOSS_GRACE = 5
SPECS = layout([0, 0, 0], prefix="nh-node", first_index=101)
NAMES = [s.name for s in SPECS]
UNREACHABLE = "node.kubernetes.io/unreachable"
NOT_READY = "node.kubernetes.io/not-ready"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if os.environ.get("SKIP_E2E") == "1":
        pytest.skip("SKIP_E2E=1")
    bins = bin_dir()
    missing = [b for b in REQUIRED if not (bins / b).is_file()]
    if missing:
        pytest.fail(
            f"e2e: control-plane binaries missing in {bins}: {', '.join(missing)}; "
            "run hack/build-control-plane.sh",
            pytrace=False,
        )
    workdir = Path(tempfile.mkdtemp(prefix="cdnh-", dir="/tmp"))
    c_ = Cluster.start(
        bins,
        workdir,
        node_names=NAMES,
        controllers=CONTROLLERS,
        controller_manager_args=[
            f"--node-monitor-grace-period={NODE_MONITOR_GRACE}s",
            "--node-monitor-period=1s",
        ],
    )
    yield c_
    c_.stop()
    if os.environ.get("E2E_KEEP") != "1":
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def admin(cluster: Cluster) -> KubeClient:
    return RestClient(load_api_client(str(cluster.kubeconfig("admin"))), user_agent="e2e")


@pytest.fixture(scope="module")
def driver(cluster: Cluster) -> Iterator[Driver]:
    d = Driver.deploy(cluster.kubeconfig("admin"))
    d.start_controller(
        kubeconfig=cluster.kubeconfig("compute-domain-controller"),
        log_file=cluster.log_path("controller"),
        http_port=free_port(),
        extra_env={"NODE_LOSS_GRACE_PERIOD": f"{NODE_LOSS_GRACE}s"},
    )
    yield d
    d.kill_controller()


@pytest.fixture(scope="module")
def fleet(cluster: Cluster, driver: Driver) -> Iterator[NodeFleet]:
    f = NodeFleet(config_from_cluster(cluster, cluster.workdir / "n", lease_period=1.0))
    f.add(SPECS)
    yield f
    f.stop()


@pytest.fixture
def ns(
    request: pytest.FixtureRequest, admin: KubeClient, fleet: NodeFleet, driver: Driver
) -> Iterator[str]:
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    name = f"{name}-{secrets.token_hex(2)}"
    admin.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    teardown_namespace(admin, name)
    try:
        wait_for(
            "no leaks",
            lambda: not leak_report(admin, fleet, driver.namespace, [name]),
            timeout=60,
            every=0.5,
        )
    except AssertionError:
        pytest.fail(f"leaked after test: {leak_report(admin, fleet, driver.namespace, [name])}")
    admin.delete(NAMESPACES, name)


# -- helpers -----------------------------------------------------------------------------------


def node_condition(client: KubeClient, name: str) -> str:
    node = client.get(NODES, name)
    conds = {x["type"]: x["status"] for x in node.get("status", {}).get("conditions") or []}
    return str(conds.get("Ready", ""))


def node_taints(client: KubeClient, name: str) -> set[str]:
    return {t["key"] for t in client.get(NODES, name).get("spec", {}).get("taints") or []}


def status_nodes(client: KubeClient, w: Workload) -> dict[str, str]:
    return {n["name"]: n["status"] for n in cd_status(client, w).get("nodes") or []}


def clique_entries(client: KubeClient, driver_ns: str, cd_uid: str) -> dict[str, str]:
    items = client.list(
        COMPUTE_DOMAIN_CLIQUES,
        namespace=driver_ns,
        label_selector=f"{c.COMPUTE_DOMAIN_LABEL}={cd_uid}",
    )["items"]
    return {d["nodeName"]: d["status"] for cl in items for d in cl.get("daemons") or []}


def daemon_pod_on(client: KubeClient, driver_ns: str, cd_uid: str, node: str) -> dict[str, Any]:
    pods = [p for p in daemon_pods(client, driver_ns, cd_uid) if p["spec"].get("nodeName") == node]
    assert len(pods) == 1, pods
    return pods[0]


def power_off(node: SimulatedNode) -> None:
    """The node dies at once: every process SIGKILLed (no clean IMEX leave), no more kubelet,
    no more heartbeats; nothing is written to the API on the way."""
    node.agent.stop()
    node.kill_processes()
    node.kubelet.stop()


def power_on(node: SimulatedNode) -> None:
    node.agent.start()
    node.start_plugin()
    node.wait_plugin_registered()
    node.kubelet.start()


# -- tests -------------------------------------------------------------------------------------


def test_daemons_tolerate_every_taint_and_follow_the_workload_onto_a_tainted_node(
    admin: KubeClient, fleet: NodeFleet, driver: Driver, ns: str
) -> None:
    tainted = NAMES[2]
    taint = {"key": "example.com/reserved", "value": "imex", "effect": "NoExecute"}
    node = admin.get(NODES, tainted)
    node["spec"]["taints"] = [*(node["spec"].get("taints") or []), taint]
    admin.update(NODES, node)
    try:
        w = create_cd(admin, ns, "tainted")
        pod = workload_pod(f"{w.cd_name}-0", ns, rct=w.rct, node=tainted)
        pod["spec"]["tolerations"] = [{"key": "example.com/reserved", "operator": "Exists"}]
        admin.create(PODS, pod)
        w.pods.append(pod["metadata"]["name"])
        wait_running(admin, fleet, w)
        wait_cd_ready(admin, w, 1)
        daemon = daemon_pod_on(admin, driver.namespace, w.cd_uid, tainted)
        tolerations = daemon["spec"]["tolerations"]
        # The template's (upstream's) wildcards ...
        for effect in ("NoSchedule", "NoExecute", "PreferNoSchedule"):
            assert {"operator": "Exists", "effect": effect} in tolerations
        # ... and the DaemonSet controller's own, forever: no daemon is ever evicted.
        for key in (NOT_READY, UNREACHABLE):
            mine = [t for t in tolerations if t.get("key") == key]
            assert mine == [{"key": key, "operator": "Exists", "effect": "NoExecute"}], mine
    finally:
        node = admin.get(NODES, tainted)
        node["spec"]["taints"] = [
            t for t in node["spec"].get("taints") or [] if t["key"] != taint["key"]
        ]
        admin.update(NODES, node)


def test_a_dead_node_leaves_the_domain_and_rejoins_when_it_returns(
    admin: KubeClient, fleet: NodeFleet, driver: Driver, ns: str
) -> None:
    survivor, victim = NAMES[0], NAMES[1]
    w = create_cd(admin, ns, "loss")
    start_pods(admin, w, 2, [survivor, victim])
    wait_bound(admin, w)
    wait_running(admin, fleet, w)
    wait_cd_ready(admin, w, 2)
    daemon_uid = daemon_pod_on(admin, driver.namespace, w.cd_uid, victim)["metadata"]["uid"]
    power_off(fleet[victim])
    try:
        # The real node-lifecycle controller notices the silence ...
        wait_for(
            "node Unknown and tainted unreachable",
            lambda: (
                node_condition(admin, victim) == "Unknown"
                and UNREACHABLE in node_taints(admin, victim)
            ),
            timeout=NODE_MONITOR_GRACE + 30,
        )
        # ... and after our grace the node has left the domain; the survivor carries on.
        wait_for(
            "victim out of the CD status",
            lambda: status_nodes(admin, w) == {survivor: "Ready"},
            timeout=NODE_LOSS_GRACE + 30,
        )
        st = cd_status(admin, w)
        assert st["status"] == c.STATUS_READY
        cond = next(x for x in st["conditions"] if x["type"] == "Ready")
        assert cond["reason"] == "AllNodesReady"
        wait_for(
            "victim out of its clique",
            lambda: clique_entries(admin, driver.namespace, w.cd_uid) == {survivor: "Ready"},
            timeout=30,
        )
        lost = [e for e in events_for(admin, ns, w.cd_name) if e["reason"] == "NodeLost"]
        assert lost and victim in lost[0]["message"], lost
        # Its daemon pod was not evicted: it still is the same, undeleted pod on the node.
        daemon = daemon_pod_on(admin, driver.namespace, w.cd_uid, victim)
        assert daemon["metadata"]["uid"] == daemon_uid
        assert not daemon["metadata"].get("deletionTimestamp")
    finally:
        power_on(fleet[victim])
    wait_for("node Ready again", lambda: node_condition(admin, victim) == "True", timeout=60)
    wait_cd_ready(admin, w, 2, timeout=120)


def test_a_crash_looping_daemon_is_not_ready_until_it_runs_again(
    admin: KubeClient, fleet: NodeFleet, driver: Driver, ns: str
) -> None:
    node = NAMES[0]
    w = create_cd(admin, ns, "crash")
    start_pods(admin, w, 1, [node])
    wait_bound(admin, w)
    wait_running(admin, fleet, w)
    wait_cd_ready(admin, w, 1)
    uid = daemon_pod_on(admin, driver.namespace, w.cd_uid, node)["metadata"]["uid"]
    worker = fleet[node].kubelet.workers()[uid]
    stop = threading.Event()

    def crash_loop() -> None:  # SIGKILL (an OOM kill looks the same) whenever it comes back
        while not stop.wait(0.05):
            worker.kill_processes()

    killer = threading.Thread(target=crash_loop, daemon=True)
    killed_at = time.monotonic()
    killer.start()
    try:
        wait_for(
            "clique entry NotReady",
            lambda: clique_entries(admin, driver.namespace, w.cd_uid) == {node: "NotReady"},
            timeout=10,
            every=0.05,
        )
        noticed = time.monotonic() - killed_at
        wait_for(
            "CD NotReady",
            lambda: cd_status(admin, w).get("status") == c.STATUS_NOT_READY,
            timeout=10,
            every=0.05,
        )
        cond = next(x for x in cd_status(admin, w)["conditions"] if x["type"] == "Ready")
        assert cond["reason"] in ("DaemonNotRunning", "DaemonsNotReady"), cond
        # No daemon process ran meanwhile: it was the controller that took Ready back.
        assert noticed < 8, noticed
        time.sleep(2)
        assert clique_entries(admin, driver.namespace, w.cd_uid) == {node: "NotReady"}
    finally:
        stop.set()
        killer.join(5)
    wait_cd_ready(admin, w, 1, timeout=90)
    assert clique_entries(admin, driver.namespace, w.cd_uid) == {node: "Ready"}
    restarts = daemon_pod_on(admin, driver.namespace, w.cd_uid, node)["status"][
        "containerStatuses"
    ][0]["restartCount"]
    assert restarts >= 1


def test_num_nodes_above_the_maximum_is_refused_by_the_api_server(
    admin: KubeClient, driver: Driver, ns: str
) -> None:
    with pytest.raises(InvalidError) as exc:
        admin.create(COMPUTE_DOMAINS, compute_domain("huge", ns, rct="r", num_nodes=2**62))
    assert "spec.numNodes" in exc.value.message and str(MAX_NUM_NODES) in exc.value.message
    ok = admin.create(COMPUTE_DOMAINS, compute_domain("max", ns, rct="r", num_nodes=MAX_NUM_NODES))
    assert ok["spec"]["numNodes"] == MAX_NUM_NODES
    admin.delete(COMPUTE_DOMAINS, "max", namespace=ns)
    wait_for("CD gone", lambda: _gone(admin, ns, "max"), timeout=60)


def _gone(client: KubeClient, ns: str, name: str) -> bool:
    try:
        client.get(COMPUTE_DOMAINS, name, namespace=ns)
    except NotFoundError:
        return True
    return False
