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
  nodes and the pods Running with their channel, or, in the deletion phases (which also wait
  for kube-controller-manager, see ``DELETION_RECOVERY``), the pods, the daemons and finally
  the domain gone; the figures are printed;
* the ``ns`` fixture's leak report comes back empty.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from e2e_support import Driver, channels_seen, leak_report, wait_for
from faults import driver_pids, exited
from kubeletsim import NodeFleet
from localcluster import Cluster
from workloads import (
    cd_status,
    create_cd,
    daemon_pods,
    start_pods,
    wait_bound,
    wait_cd_ready,
    wait_running,
)

from pkg.kube.client import KubeClient
from pkg.kube.errors import NotFoundError
from pkg.kube.resources import COMPUTE_DOMAINS, PODS

pytestmark = pytest.mark.e2e

DOWN_FOR = 3.0
RECOVERY = 20.0  # generous for a loaded 2-core CI machine; typical figures are printed
# Deletion runs through kube-controller-manager (resourceclaim, DaemonSet, garbage collector),
# whose client-go reflectors back off up to 30 s and reset only after 2 quiet minutes: a second
# restart within that time can cost it more than the driver's own recovery.
DELETION_RECOVERY = 60.0
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

    def restart(phase: str, pending: Callable[[], list[str]], timeout: float = RECOVERY) -> None:
        before = driver_pids(driver, fleet)
        back = cluster.restart_apiserver(DOWN_FOR)
        left: list[str] = []

        def recovered() -> bool:
            left[:] = pending()
            return not left

        try:
            wait_for(f"recovery ({phase})", recovered, timeout=timeout, every=0.1)
        except AssertionError as e:
            raise AssertionError(f"{e}; still pending: {left}") from None
        recovery[phase] = time.monotonic() - back
        bad = exited(before, driver_pids(driver, fleet), allowed=set())
        assert not bad, f"{phase}: binaries exited across the apiserver restart: {bad}"

    def ready() -> bool:
        st = cd_status(admin, w)
        return st.get("status") == "Ready" and st.get("readyNodes") == len(NODES)

    def not_ready() -> list[str]:
        return [] if ready() else [f"CD status {cd_status(admin, w)}"]

    def pods_left() -> list[str]:
        left = [f"pod {p}" for p in w.pods if not _gone(admin, PODS, p, ns)]
        left += [f"daemon {d['metadata']['name']}"
                 for d in daemon_pods(admin, driver.namespace, w.cd_uid)]  # fmt: skip
        if cd_status(admin, w).get("nodes"):
            left.append("CD status.nodes")
        return left

    def cd_left() -> list[str]:
        left = [] if _gone(admin, COMPUTE_DOMAINS, w.cd_name, ns) else ["CD"]
        return left + sorted(leak_report(admin, fleet, driver.namespace, [ns]))

    w = create_cd(admin, ns, "apirestart", num_nodes=len(NODES))
    start_pods(admin, w, len(NODES), NODES)
    wait_bound(admin, w)
    wait_for("daemon pods", lambda: len(daemon_pods(admin, driver.namespace, w.cd_uid)) ==
             len(NODES), timeout=60, every=0.05)  # fmt: skip
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
    restart("pod-deletion", pods_left, DELETION_RECOVERY)

    admin.delete(COMPUTE_DOMAINS, w.cd_name, namespace=ns)
    restart("cd-deletion", cd_left, DELETION_RECOVERY)
    print("recovery after the apiserver's return (s): "
          + ", ".join(f"{k}={v:.1f}" for k, v in recovery.items()))  # fmt: skip
