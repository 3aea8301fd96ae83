"""numNodes above the nodes that could ever join: Ready=False/NumNodesUnreachable and an Event.

Nodes that could ever join are those publishing this driver's ResourceSlices (the kubelet
plugin runs there) and existing, plus nodes already hosting a member (pkg.reconcilers.reachability).
"""

from __future__ import annotations

from collections.abc import Callable

from cdctl_fakes import (  # type: ignore[import-not-found, unused-ignore]
    RecordedEvents,
    clique,
    compute_domain,
    daemon_entry,
    daemon_pod,
    node,
    resource_slice,
)
from prometheus_client import CollectorRegistry

from pkg.base.types import JSON
from pkg.kube import resources as res
from pkg.kube.client import RestClient
from pkg.reconcilers.cache import Caches, index_by_slice_node
from pkg.reconcilers.computedomain import ComputeDomainReconciler
from pkg.reconcilers.conditions import REASON_NUM_NODES_UNREACHABLE
from pkg.reconcilers.config import ControllerConfig
from pkg.reconcilers.reachability import candidate_nodes, num_nodes_problem
from pkg.testing.clock import FakeClock
from pkg.testing.fakeapiserver import FakeApiServer


class Nodes:
    def __init__(self, *objs: JSON) -> None:
        self._by_name = {o["metadata"]["name"]: o for o in objs}

    def get_by_key(self, key: str) -> JSON | None:
        return self._by_name.get(key)


def test_candidates_are_existing_nodes_publishing_our_slices() -> None:
    foreign = resource_slice("c", clique_id=None)
    foreign["spec"]["driver"] = "gpu.nvidia.com"
    deleting = node("d")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    slices = [
        resource_slice("a", clique_id="cl.1"),
        resource_slice("a", clique_id="cl.1"),
        resource_slice("b", clique_id=None),
        foreign,
        resource_slice("d", clique_id=None),
        resource_slice("gone", clique_id=None),
    ]
    nodes = Nodes(node("a"), node("b", ready="False"), node("c"), deleting)
    named = sorted({n for s in slices for n in index_by_slice_node(s)})
    assert named == ["a", "b", "d", "gone"]
    assert candidate_nodes(named, nodes) == {"a", "b"}  # type: ignore[arg-type]


def test_problem_only_when_num_nodes_exceeds_candidates_and_members() -> None:
    assert num_nodes_problem(2, {"a", "b"}, []) is None
    assert num_nodes_problem(0, set(), []) is None
    assert num_nodes_problem(3, {"a"}, ["b", "c"]) is None  # members count although unpublished
    problem = num_nodes_problem(5, {"a", "b"}, ["b"])
    assert problem is not None and problem.reason == REASON_NUM_NODES_UNREACHABLE
    assert "numNodes is 5 but only 2 node(s)" in problem.message


def test_condition_and_event_then_recovery_when_nodes_join(
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
    for name in ("a", "b"):
        server.seed(res.NODES, node(name))
        server.seed(res.RESOURCE_SLICES, resource_slice(name, clique_id="cl.1"))
    uid = str(server.seed(res.COMPUTE_DOMAINS, compute_domain(numNodes=3))["metadata"]["uid"])
    for _ in range(2):  # level-triggered: one Event per cause
        reconciler.reconcile("team/cd1")
    cd = server.store.get(res.COMPUTE_DOMAINS, "team", "cd1")
    cond = next(x for x in cd["status"]["conditions"] if x["type"] == "Ready")
    assert (cd["status"]["status"], cond["status"], cond["reason"]) == (
        "NotReady",
        "False",
        REASON_NUM_NODES_UNREACHABLE,
    )
    assert "numNodes is 3 but only 2 node(s)" in cond["message"]
    assert events.reasons().count(REASON_NUM_NODES_UNREACHABLE) == 1

    server.seed(res.NODES, node("c"))  # a third node's plugin publishes its slice
    server.seed(res.RESOURCE_SLICES, resource_slice("c", clique_id="cl.1"))
    reconciler.reconcile("team/cd1")
    cd = server.store.get(res.COMPUTE_DOMAINS, "team", "cd1")
    cond = next(x for x in cd["status"]["conditions"] if x["type"] == "Ready")
    assert cond["reason"] == "WaitingForNodes", cond
    assert events.reasons().count(REASON_NUM_NODES_UNREACHABLE) == 1

    # A member whose node lost its slice still counts: no flapping while a plugin restarts.
    server.seed(res.PODS, daemon_pod(uid, "a", clique="cl.1", container="running"))
    server.seed(res.COMPUTE_DOMAIN_CLIQUES, clique(uid, "cl.1", [daemon_entry("a", index=0)]))
    server.store.delete(res.RESOURCE_SLICES, "", "a-cd")
    reconciler.reconcile("team/cd1")
    cd = server.store.get(res.COMPUTE_DOMAINS, "team", "cd1")
    cond = next(x for x in cd["status"]["conditions"] if x["type"] == "Ready")
    assert cond["reason"] != REASON_NUM_NODES_UNREACHABLE, cond
