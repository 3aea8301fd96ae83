"""Happy path on 2 and on 4 nodes of one NVLink clique, end to end on the real control plane.

ComputeDomain -> controller creates the workload RCT -> the real resourceclaim controller and
scheduler allocate ``channel-0`` on spread nodes -> the plugin labels the nodes -> the real
DaemonSet controller schedules the per-CD IMEX daemons -> the daemons (local processes with the
simulated IMEX) join the clique and turn Ready -> CD ``Ready`` with one entry per node -> every
workload container received ``/dev/nvidia-caps-imex-channels/channel0``. Deleting the pods
empties the CD; deleting the CD removes everything (checked by the ``ns`` fixture's leak check).
"""

from __future__ import annotations

import pytest
from kubeletsim import NodeFleet
from testsupport.e2e_support import Driver, channels_seen, wait_for
from testsupport.workloads import (
    cd_status,
    create_cd,
    daemon_pods,
    daemonset,
    delete_cd,
    delete_pods,
    start_pods,
    wait_bound,
    wait_cd_ready,
    wait_running,
)

from pkg.api import constants as c
from pkg.kube.client import KubeClient
from pkg.kube.resources import RESOURCE_CLAIM_TEMPLATES

pytestmark = pytest.mark.e2e

CLIQUE0 = ["gpu-node-1", "gpu-node-2", "gpu-node-3", "gpu-node-4"]


@pytest.mark.parametrize("n", [2, 4])
def test_cd_forms_runs_and_tears_down(
    admin: KubeClient, fleet: NodeFleet, driver: Driver, ns: str, n: int
) -> None:
    w = create_cd(admin, ns, "cd")
    start_pods(admin, w, n, CLIQUE0)
    placement = wait_bound(admin, w)
    assert len(set(placement.values())) == n, placement
    wait_running(admin, fleet, w)
    print(f"time to ready on {n} nodes: {w.time_to_ready:.2f}s")

    status = wait_cd_ready(admin, w, n)
    entries = {e["name"]: e for e in status["nodes"]}
    assert set(entries) == set(placement.values())
    clique = fleet[CLIQUE0[0]].spec.clique_id
    for name, e in entries.items():
        assert e["ipAddress"] == fleet[name].ip
        assert e["cliqueID"] == clique
    assert sorted(e["index"] for e in entries.values()) == list(range(n))

    ds = daemonset(admin, driver.namespace, w.cd_uid)
    assert ds is not None
    daemons = daemon_pods(admin, driver.namespace, w.cd_uid)
    assert {p["spec"]["nodeName"] for p in daemons} == set(placement.values())
    assert all(p["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet" for p in daemons)

    def daemons_ready() -> bool:  # the stand-in ran their startup/readiness `check` probes
        pods = daemon_pods(admin, driver.namespace, w.cd_uid)
        return len(pods) == n and all(
            {x["type"]: x["status"] for x in p["status"].get("conditions", [])}.get("Ready")
            == "True"
            for p in pods
        )

    wait_for("daemon pods Ready", daemons_ready, timeout=60)
    for p in w.pods:
        assert channels_seen(fleet, ns, p) == ["channel0"], p

    delete_pods(admin, w)
    wait_for("CD emptied", lambda: not cd_status(admin, w).get("nodes"), timeout=60)
    wait_for("daemons gone", lambda: not daemon_pods(admin, driver.namespace, w.cd_uid), timeout=60)

    delete_cd(admin, w)
    assert not admin.list(RESOURCE_CLAIM_TEMPLATES, namespace=ns)["items"]
    assert daemonset(admin, driver.namespace, w.cd_uid) is None
    assert c.daemon_object_name(w.cd_uid)
