"""A daemon whose node's driver root lacks IMEX: the ComputeDomain says DriverRootIncomplete.

The daemon exits before it joins its clique, with the termination message
``DriverRootIncomplete: <detail>`` (pkg.daemon.daemon); the kubelet copies it into the pod
status, which is all the controller sees.
"""

from __future__ import annotations

from collections.abc import Callable

from cdctl_fakes import (  # type: ignore[import-not-found, unused-ignore]
    RecordedEvents,
    clique,
    compute_domain,
    daemon_entry,
    daemon_pod,
)
from prometheus_client import CollectorRegistry

from pkg.api import constants as c
from pkg.api.computedomain import parse_compute_domain
from pkg.base.types import JSON
from pkg.kube import resources as res
from pkg.kube.client import RestClient
from pkg.reconcilers.cache import Caches
from pkg.reconcilers.computedomain import ComputeDomainReconciler
from pkg.reconcilers.config import ControllerConfig
from pkg.reconcilers.status import aggregate, render_status
from pkg.testing.clock import FakeClock
from pkg.testing.fakeapiserver import FakeApiServer

DETAIL = (
    "nvidia-imex not found in the container on node b: the IMEX binaries come only from the "
    "kubelet plugin's driver root (nvidiaDriverRoot) through CDI"
)


def crash_looping(uid: str, node_name: str) -> JSON:
    pod: JSON = daemon_pod(uid, node_name, clique="cl.1", ip="10.0.0.2", ready=False)
    pod["status"]["containerStatuses"] = [
        {
            "name": c.DAEMON_CONTAINER_NAME,
            "ready": False,
            "restartCount": 2,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {
                "terminated": {
                    "exitCode": 3,
                    "reason": "Error",
                    "message": f"DriverRootIncomplete: {DETAIL}",
                }
            },
        }
    ]
    return pod


def test_a_daemon_that_never_joined_is_a_not_ready_member_with_the_reason() -> None:
    crashing = crash_looping("u", "b")
    pods = [daemon_pod("u", "a", clique="cl.1", container="running"), crashing]
    found = aggregate(
        cliques=[clique("u", "cl.1", [daemon_entry("a", index=0)])], pods=pods, nodes={}
    )
    assert [(m.entry.node_name, m.entry.status, m.problem) for m in found.members] == [
        ("a", "Ready", ""),
        ("b", "NotReady", c.REASON_DRIVER_ROOT_INCOMPLETE),
    ]
    problem = found.driver_root_problem()
    assert problem is not None and problem.message == DETAIL
    assert crashing["status"]["containerStatuses"][0]["lastState"]
    running_again = crash_looping("u", "b")
    running_again["status"]["containerStatuses"][0]["state"] = {"running": {}}
    fixed = aggregate(cliques=[], pods=[running_again], nodes={})
    assert fixed.driver_root_problem() is None


def test_condition_and_event_name_the_node_and_the_missing_binary(
    server: FakeApiServer,
    client: RestClient,
    caches: Caches,
    config: ControllerConfig,
    events: RecordedEvents,
    clock: FakeClock,
    registry: CollectorRegistry,
    make_reconciler: Callable[..., ComputeDomainReconciler],
) -> None:
    reconciler = make_reconciler()
    uid = str(server.seed(res.COMPUTE_DOMAINS, compute_domain())["metadata"]["uid"])
    reconciler.reconcile("team/cd1")
    server.seed(res.PODS, crash_looping(uid, "b"))
    for _ in range(2):  # level-triggered: the Event once per cause
        reconciler.reconcile("team/cd1")
    cd = next(o for o in server.objects(res.COMPUTE_DOMAINS) if o["metadata"]["name"] == "cd1")
    cond = next(x for x in cd["status"]["conditions"] if x["type"] == "Ready")
    assert (cond["status"], cond["reason"], cond["message"]) == (
        "False",
        c.REASON_DRIVER_ROOT_INCOMPLETE,
        DETAIL,
    )
    assert cd["status"]["status"] == "NotReady"
    assert [(n["name"], n["status"]) for n in cd["status"]["nodes"]] == [("b", "NotReady")]
    warned = [i for i in events.items if i[2] == c.REASON_DRIVER_ROOT_INCOMPLETE]
    assert warned == [("cd1", "Warning", c.REASON_DRIVER_ROOT_INCOMPLETE, DETAIL)]


def test_render_uses_the_problem_as_the_condition() -> None:
    found = aggregate(cliques=[], pods=[crash_looping("u", "b")], nodes={})
    cd = parse_compute_domain(
        {
            "metadata": {"namespace": "t", "name": "cd", "uid": "u", "generation": 1},
            "spec": {"channel": {"resourceClaimTemplate": {"name": "r"}}},
        }
    )
    status = render_status(
        cd, members=found.members, previous=None, problem=found.driver_root_problem(), now="T"
    )
    assert status["conditions"][0]["reason"] == c.REASON_DRIVER_ROOT_INCOMPLETE
