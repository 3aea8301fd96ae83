"""Upstream's failover scenarios on real kubelets and containerd, under a running 2-node job.

The scenarios of upstream's own end-to-end suite, each on the sample Job (two Indexed workers,
one per node, each with the domain's channel) while it runs:

* a worker pod force-deleted (``--force --grace-period=0``): the Job replaces it, the
  replacement gets its channel once the kubelet has unprepared the old claim on that node, and
  the domain is Ready with both nodes again;
* a worker pod deleted normally: the same;
* every IMEX daemon pod of the domain force-deleted: the DaemonSet starts new ones, the domain
  is Ready with both nodes again, and the workers keep running untouched (same pods, no
  restart).
"""

from __future__ import annotations

from typing import Any

from testsupport.realsupport import (
    CD_LABEL,
    REAL_NODES,
    Kubectl,
    pod_ready,
    pod_summary,
    sample_workload,
    wait_for,
)

WORKLOAD_CMD = "ls -l /dev/nvidia-caps-imex-channels && sleep 3600"


def _domain(kubectl: Kubectl, ns: str) -> dict[str, Any]:
    [cd] = kubectl.items("computedomains.resource.nvidia.com", "-n", ns)
    return cd


def _ready_on_both(kubectl: Kubectl, ns: str) -> dict[str, Any] | None:
    cd = _domain(kubectl, ns)
    status = cd.get("status") or {}
    nodes = sorted(n.get("name", "") for n in status.get("nodes") or [])
    return cd if status.get("status") == "Ready" and nodes == sorted(REAL_NODES) else None


def _workers(kubectl: Kubectl, ns: str) -> list[dict[str, Any]]:
    return kubectl.items("pods", "-n", ns, "-l", "job=training-job")


def _running_workers(kubectl: Kubectl, ns: str) -> list[dict[str, Any]] | None:
    """Both workers Running with the channel listed in their log, one per node; else None."""
    pods = [p for p in _workers(kubectl, ns) if not p["metadata"].get("deletionTimestamp")]
    if len(pods) != 2 or any(p["status"].get("phase") != "Running" for p in pods):
        return None
    if sorted(p["spec"].get("nodeName", "") for p in pods) != sorted(REAL_NODES):
        return None
    for p in pods:
        if "channel0" not in kubectl("-n", ns, "logs", p["metadata"]["name"], check=False):
            return None
    return pods


def _start(kubectl: Kubectl, ns: str) -> list[dict[str, Any]]:
    kubectl("apply", "-f", "-", stdin=sample_workload(ns, WORKLOAD_CMD))
    pods = wait_for(
        "both workers running with their channel", lambda: _running_workers(kubectl, ns), 240, 1
    )
    wait_for("the domain Ready with both nodes", lambda: _ready_on_both(kubectl, ns), 120)
    return pods


def _replace_worker(kubectl: Kubectl, ns: str, *delete_args: str) -> None:
    before = _start(kubectl, ns)
    victim = before[0]["metadata"]
    kubectl("-n", ns, "delete", "pod", victim["name"], *delete_args, "--wait=false")

    def replaced() -> list[dict[str, Any]] | None:
        pods = _running_workers(kubectl, ns)
        if pods is None or victim["uid"] in {p["metadata"]["uid"] for p in pods}:
            return None
        return pods

    after = wait_for(
        f"the Job to replace {victim['name']} and the new worker to get its channel",
        replaced,
        300,
        1,
    )
    survivor = before[1]["metadata"]["uid"]
    assert survivor in {p["metadata"]["uid"] for p in after}, "the other worker was replaced too"
    wait_for("the domain Ready with both nodes again", lambda: _ready_on_both(kubectl, ns), 180)


def test_force_deleted_worker_is_replaced_and_gets_its_channel(kubectl: Kubectl, ns: str) -> None:
    _replace_worker(kubectl, ns, "--force", "--grace-period=0")


def test_deleted_worker_is_replaced_and_gets_its_channel(kubectl: Kubectl, ns: str) -> None:
    _replace_worker(kubectl, ns)


def test_force_deleted_daemons_come_back_under_a_running_job(
    kubectl: Kubectl, ns: str, driver: str
) -> None:
    before = _start(kubectl, ns)
    uid = _domain(kubectl, ns)["metadata"]["uid"]
    daemons = kubectl.items("pods", "-n", driver, "-l", f"{CD_LABEL}={uid}")
    assert sorted(d["spec"]["nodeName"] for d in daemons) == sorted(REAL_NODES)
    old = {d["metadata"]["uid"] for d in daemons}
    kubectl(
        "-n",
        driver,
        "delete",
        "pod",
        "-l",
        f"{CD_LABEL}={uid}",
        "--force",
        "--grace-period=0",
        "--wait=false",
    )

    seen: list[str] = []  # the new pods as last polled: the failure message says where each was

    def new_daemons_ready() -> list[dict[str, Any]] | None:
        pods = kubectl.items("pods", "-n", driver, "-l", f"{CD_LABEL}={uid}")
        fresh = [p for p in pods if p["metadata"]["uid"] not in old]
        seen[:] = [pod_summary(p) for p in fresh]
        ok = len(fresh) == len(REAL_NODES) and all(pod_ready(p) for p in fresh)
        return fresh if ok else None

    try:
        wait_for("new daemon pods Ready on both nodes", new_daemons_ready, 240, 1)
    except AssertionError as err:
        raise AssertionError(f"{err}; new daemon pods: {seen}") from None
    wait_for("the domain Ready with both nodes again", lambda: _ready_on_both(kubectl, ns), 180)
    after = _running_workers(kubectl, ns)
    assert after is not None, "a worker stopped running while the daemons were replaced"
    assert {p["metadata"]["uid"] for p in after} == {p["metadata"]["uid"] for p in before}
    for p in after:
        restarts = [c.get("restartCount", 0) for c in p["status"].get("containerStatuses", [])]
        assert restarts == [0], (p["metadata"]["name"], restarts)
