"""The real kube-apiserver crashes (SIGKILL) and comes back in every phase of a lifecycle.

One ComputeDomain with two pods on clique 0 goes through its whole life while the apiserver is
SIGKILLed and restarted (``Cluster.restart_apiserver``, down ``DOWN_FOR`` s, then its startup
time) four times: before the domain is Ready (daemons scheduled, not joined), after it is
Ready, right after the workload pods were deleted (the kubelets finalize them during the
outage) and right after the domain was deleted (the controller tears it down during the
outage). After each restart:

* no binary exited: the controller, every node's kubelet plugin and every IMEX daemon keep
  their PIDs (daemons whose pod was deleted on purpose excepted);
* the domain recovers within ``RECOVERY`` s of the apiserver's ``/readyz``: Ready with both
  nodes and the pods Running with their channel; in the deletion phases the driver's part (pods
  finalized by the kubelets, node labels dropped by the plugins' Unprepare; the DaemonSet
  deleted by the controller), then, within ``DELETION_RECOVERY`` because it also waits for
  kube-controller-manager, the daemons, ``status.nodes`` and finally the domain gone; the
  figures are printed;
* the ``ns`` fixture's leak report comes back empty.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from kubeletsim import NodeFleet
from localcluster import Cluster
from testsupport.e2e_support import Driver, channels_seen, leak_report, wait_for
from testsupport.faults import driver_pids, exited
from testsupport.workloads import (
    cd_status,
    create_cd,
    daemon_pods,
    daemonset,
    start_pods,
    wait_bound,
    wait_cd_ready,
    wait_running,
)

from pkg.api import constants as c
from pkg.kube.client import KubeClient
from pkg.kube.errors import NotFoundError
from pkg.kube.resources import COMPUTE_DOMAINS, PODS
from pkg.kube.resources import NODES as NODE_OBJECTS

pytestmark = pytest.mark.e2e

DOWN_FOR = 3.0
RECOVERY = 20.0  # generous for a loaded 2-core CI machine; typical figures are printed
# Deletion also runs through kube-controller-manager (DaemonSet controller, garbage collector),
# whose client-go reflectors back off up to 30 s (plus jitter) and reset only after 2 quiet
# minutes: by the third restart within 2 minutes it can lag the driver by up to a minute. The
# driver's own part of a deletion phase is held to RECOVERY; what waits for kcm to this.
DELETION_RECOVERY = 120.0
NODES = ["gpu-node-1", "gpu-node-2"]


def _gone(client: KubeClient, res: object, name: str, ns: str) -> bool:
    try:
        client.get(res, name, namespace=ns)  # type: ignore[arg-type]
    except NotFoundError:
        return True
    return False


def test_apiserver_restart_in_every_phase(
    cluster: Cluster, admin: KubeClient, fleet: NodeFleet, driver: Driver, ns: str
) -> None:
    recovery: dict[str, float] = {}

    def settle(what: str, pending: Callable[[], list[str]], timeout: float, since: float) -> None:
        left: list[str] = []

        def recovered() -> bool:
            left[:] = pending()
            return not left

        try:
            wait_for(what, recovered, timeout=timeout, every=0.1)
        except AssertionError as e:
            raise AssertionError(f"{e}; still pending: {left}") from None
        recovery[what] = time.monotonic() - since

    def restart(
        phase: str, pending: Callable[[], list[str]], kcm: Callable[[], list[str]] | None = None
    ) -> None:
        before = driver_pids(driver, fleet)
        back = cluster.restart_apiserver(DOWN_FOR)
        settle(phase, pending, RECOVERY, back)
        if kcm is not None:
            settle(f"{phase}+kcm", kcm, DELETION_RECOVERY, back)
        bad = exited(before, driver_pids(driver, fleet), allowed=set())
        assert not bad, f"{phase}: binaries exited across the apiserver restart: {bad}"

    def ready() -> bool:
        st = cd_status(admin, w)
        return st.get("status") == "Ready" and st.get("readyNodes") == len(NODES)

    def not_ready() -> list[str]:
        return [] if ready() else [f"CD status {cd_status(admin, w)}"]

    def pods_left() -> list[str]:  # the kubelets and plugins (Unprepare drops the node label)
        left = [f"pod {p}" for p in w.pods if not _gone(admin, PODS, p, ns)]
        labeled = admin.list(NODE_OBJECTS, label_selector=f"{c.COMPUTE_DOMAIN_LABEL}={w.cd_uid}")
        return left + [f"label on {n['metadata']['name']}" for n in labeled["items"]]

    def daemons_left() -> list[str]:  # the DaemonSet controller, then kubelets and controller
        left = [
            f"daemon {d['metadata']['name']}"
            for d in daemon_pods(admin, driver.namespace, w.cd_uid)
        ]
        return left + (["CD status.nodes"] if cd_status(admin, w).get("nodes") else [])

    def dependents_left() -> list[str]:  # the controller's teardown
        return [] if daemonset(admin, driver.namespace, w.cd_uid) is None else ["DaemonSet"]

    def cd_left() -> list[str]:  # the garbage collector, then the controller's finalizer
        left = [] if _gone(admin, COMPUTE_DOMAINS, w.cd_name, ns) else ["CD"]
        return left + sorted(leak_report(admin, fleet, driver.namespace, [ns]))

    w = create_cd(admin, ns, "apirestart", num_nodes=len(NODES))
    start_pods(admin, w, len(NODES), NODES)
    wait_bound(admin, w)
    wait_for(
        "daemon pods",
        lambda: len(daemon_pods(admin, driver.namespace, w.cd_uid)) == len(NODES),
        timeout=60,
        every=0.05,
    )
    assert not ready()

    restart("before-ready", not_ready)
    wait_running(admin, fleet, w, timeout=RECOVERY)
    wait_cd_ready(admin, w, len(NODES))

    restart("after-ready", not_ready)
    wait_running(admin, fleet, w, timeout=RECOVERY)
    for p in w.pods:
        assert channels_seen(fleet, ns, p) == ["channel0"], p

    for p in w.pods:
        admin.delete(PODS, p, namespace=ns)
    restart("pod-deletion", pods_left, daemons_left)

    admin.delete(COMPUTE_DOMAINS, w.cd_name, namespace=ns)
    restart("cd-deletion", dependents_left, cd_left)
    print(
        "recovery after the apiserver's return (s): "
        + ", ".join(f"{k}={v:.1f}" for k, v in recovery.items())
    )
