"""Faults and bad input on the real control plane; every test ends with the leak check.

* SIGKILL of the controller mid-formation: a fresh controller finishes the job;
* SIGKILL of a node's kubelet plugin between Prepare and pod start: the stand-in retries like
  the kubelet, the restarted plugin (checkpoint) completes it;
* ResourceSlices deleted by hand come back (the plugin repairs drift);
* malformed opaque config in a hand-written claim -> a pod Event naming the unknown field.
"""

from __future__ import annotations

import signal
import time

import pytest
from kubeletsim import NodeFleet
from localcluster import Cluster
from testsupport.e2e_support import (
    Driver,
    channel_claim,
    channels_seen,
    events_for,
    free_port,
    wait_for,
    workload_pod,
)
from testsupport.workloads import (
    create_cd,
    daemon_pods,
    start_pods,
    wait_bound,
    wait_cd_ready,
    wait_running,
)

from pkg.api import constants as c
from pkg.kube.client import KubeClient
from pkg.kube.resources import PODS, RESOURCE_CLAIMS, RESOURCE_SLICES

pytestmark = pytest.mark.e2e


def restart_controller(cluster: Cluster, driver: Driver) -> None:
    driver.kill_controller(signal.SIGKILL)
    kubeconfig = cluster.kubeconfig("compute-domain-controller")
    log_file = cluster.log_path("controller")
    driver.start_controller(kubeconfig=kubeconfig, log_file=log_file, http_port=free_port())


def test_controller_sigkill_mid_formation(
    cluster: Cluster, admin: KubeClient, fleet: NodeFleet, driver: Driver, ns: str
) -> None:
    w = create_cd(admin, ns, "ctl")
    start_pods(admin, w, 2, ["gpu-node-1", "gpu-node-2"])
    wait_bound(admin, w)
    wait_for(
        "a daemon pod",
        lambda: daemon_pods(admin, driver.namespace, w.cd_uid),
        timeout=60,
        every=0.05,
    )
    restart_controller(cluster, driver)
    wait_running(admin, fleet, w)
    wait_cd_ready(admin, w, 2)
    assert driver.controller_alive()


def test_plugin_sigkill_between_prepare_and_start(
    admin: KubeClient, fleet: NodeFleet, driver: Driver, ns: str
) -> None:
    node = fleet["gpu-node-4"]
    w = create_cd(admin, ns, "plug")
    start_pods(admin, w, 1, [node.name])
    wait_bound(admin, w)
    # The workload's Prepare has labeled the node (the daemon follows it) but cannot finish
    # before the daemon is Ready: kill the plugin right there.
    wait_for(
        "daemon scheduled",
        lambda: daemon_pods(admin, driver.namespace, w.cd_uid),
        timeout=60,
        every=0.05,
    )
    node.kill_plugin()
    time.sleep(1.0)
    node.start_plugin()
    node.wait_plugin_registered()
    wait_running(admin, fleet, w, timeout=180)
    wait_cd_ready(admin, w, 1)
    assert channels_seen(fleet, ns, w.pods[0]) == ["channel0"]


def test_resourceslices_deleted_by_hand_come_back(admin: KubeClient, fleet: NodeFleet) -> None:
    before = {
        s["metadata"]["name"]
        for s in admin.list(RESOURCE_SLICES)["items"]
        if s["spec"]["driver"] == c.DRIVER_NAME
    }
    assert len(before) >= len(fleet.nodes)
    for name in before:
        admin.delete(RESOURCE_SLICES, name)

    def republished() -> bool:
        items = admin.list(RESOURCE_SLICES)["items"]
        nodes = {s["spec"]["nodeName"] for s in items if s["spec"]["driver"] == c.DRIVER_NAME}
        return nodes >= set(fleet.nodes)

    wait_for("every node's ResourceSlice back", republished, timeout=60)


def test_malformed_opaque_config_is_reported(admin: KubeClient, fleet: NodeFleet, ns: str) -> None:
    w = create_cd(admin, ns, "bad")
    params = {
        "apiVersion": c.API_VERSION,
        "kind": c.CHANNEL_CONFIG_KIND,
        "domainID": w.cd_uid,
        "unexpectedField": "x",
    }
    admin.create(RESOURCE_CLAIMS, channel_claim("bad-config", ns, params))
    admin.create(PODS, workload_pod("bad", ns, claim="bad-config", node="gpu-node-5"))
    event = wait_for(
        "FailedPrepareDynamicResources",
        lambda: next(
            (
                e
                for e in events_for(admin, ns, "bad")
                if e["reason"] == "FailedPrepareDynamicResources"
            ),
            None,
        ),
        timeout=60,
    )
    assert "unexpectedField" in event["message"], event["message"]
    assert channels_seen(fleet, ns, "bad") == []
