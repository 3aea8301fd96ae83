"""Pure status aggregation: membership, readiness rules, conditions and transition events."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from cdctl_fakes import clique, daemon_entry, daemon_pod, node  # type: ignore[import-not-found, unused-ignore]
from prometheus_client import CollectorRegistry

from pkg.api.computedomain import global_status, parse_compute_domain, set_condition
from pkg.base.types import JSON
from pkg.reconcilers.metrics import DomainMetrics, parse_timestamp
from pkg.reconcilers.status import (
    Problem,
    aggregate,
    collect_members,
    daemon_not_running,
    render_status,
    status_events,
)


def cd(num_nodes: int = 0) -> Any:
    return parse_compute_domain(
        {
            "metadata": {"namespace": "t", "name": "cd", "uid": "u", "generation": 3},
            "spec": {"numNodes": num_nodes, "channel": {"resourceClaimTemplate": {"name": "r"}}},
        }
    )


def members(entries: list[JSON], nodes: dict[str, JSON] | None = None) -> Any:
    pods = [daemon_pod("u", e["nodeName"], clique="cl.1") for e in entries]
    return collect_members(cliques=[clique("u", "cl.1", entries)], pods=pods, nodes=nodes or {})


@pytest.mark.parametrize(
    ("num_nodes", "statuses", "expected", "reason"),
    [
        (0, [], "NotReady", "WaitingForNodes"),
        (0, ["Ready"], "Ready", "AllNodesReady"),
        (2, ["Ready"], "NotReady", "WaitingForNodes"),
        (2, ["Ready", "Ready"], "Ready", "AllNodesReady"),
        (1, ["Ready", "NotReady"], "NotReady", "DaemonsNotReady"),
    ],
    ids=["zero-empty", "zero-one", "short", "enough", "one-not-ready"],
)
def test_readiness_rules(num_nodes: int, statuses: list[str], expected: str, reason: str) -> None:
    ms = members([daemon_entry(f"n{i}", index=i, status=s) for i, s in enumerate(statuses)])
    status = render_status(cd(num_nodes), members=ms, previous=None, problem=None, now="T1")
    assert status["status"] == expected
    cond = next(x for x in status["conditions"] if x["type"] == "Ready")
    assert (cond["reason"], cond["status"], cond["observedGeneration"]) == (
        reason,
        "True" if expected == "Ready" else "False",
        3,
    )


def test_rendering_is_stable_and_transition_time_moves_only_on_flips() -> None:
    ms = members([daemon_entry("a", index=0)])
    first = render_status(cd(), members=ms, previous=None, problem=None, now="T1")
    again = render_status(cd(), members=ms, previous=first, problem=None, now="T2")
    assert again == first
    broken = render_status(cd(), members=ms, previous=first, problem=Problem("X", "y"), now="T3")
    assert broken["conditions"][0]["lastTransitionTime"] == "T3"
    assert broken["status"] == "NotReady"


def test_node_problems_override_clique_entries() -> None:
    nodes = {
        "a": node("a", ready="False"),
        "b": node("b", taints=[{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}]),
        "c": node("c"),
    }
    ms = members([daemon_entry(n, index=i) for i, n in enumerate("abc")], nodes)
    assert [(m.entry.status, m.problem) for m in ms] == [
        ("NotReady", "NodeNotReady"),
        ("NotReady", "NodeUnreachable"),
        ("Ready", ""),
    ]
    status = render_status(cd(), members=ms, previous=None, problem=None, now="T")
    assert status["conditions"][0]["reason"] == "NodesNotReady"


def test_terminating_daemon_pod_is_not_ready() -> None:
    pod = daemon_pod("u", "a", clique="cl.1")
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    (m,) = collect_members(
        cliques=[clique("u", "cl.1", [daemon_entry("a", index=0)])], pods=[pod], nodes={}
    )
    assert (m.entry.status, m.problem) == ("NotReady", "DaemonTerminating")


def test_events_for_joins_leaves_and_readiness() -> None:
    one = render_status(
        cd(), members=members([daemon_entry("a", index=0)]), previous=None, problem=None, now="T"
    )
    ms = members([daemon_entry("b", index=1, status="NotReady")])
    two = render_status(cd(), members=ms, previous=one, problem=None, now="T")
    reasons = [(e.type, e.reason) for e in status_events(one, two, members=ms)]
    assert reasons == [("Normal", "NodeJoined"), ("Normal", "NodeLeft"), ("Warning", "NotReady")]
    assert [e.reason for e in status_events(None, one, members=[])] == ["NodeJoined", "Ready"]


def test_api_helpers() -> None:
    assert global_status([], num_nodes=0) == "NotReady"
    conds = set_condition(
        [],
        type_="Ready",
        status=True,
        reason="R",
        message="m" * 40000,
        observed_generation=1,
        now="T",
    )
    assert len(conds[0]["message"]) == 32000


def test_domain_metrics_count_by_status_and_time_to_ready() -> None:
    registry = CollectorRegistry()
    m = DomainMetrics(registry)
    created = parse_timestamp("2026-01-01T00:00:00Z")
    assert created is not None and parse_timestamp("garbage") is None
    observe = functools.partial(m.observe_status, namespace="team-a", created=created, nodes=2)
    waiting = "nvidia_dra_compute_domain_workload_waiting"
    assert registry.get_sample_value(waiting) == 0
    assert not observe("u1", status="NotReady", previous=None, now=created + 1)
    assert registry.get_sample_value(waiting) == 1
    assert observe("u1", status="Ready", previous="NotReady", now=created + 7)
    assert not observe("u1", status="Ready", previous="Ready", now=created + 9)
    assert not observe("u2", status="Ready", previous="Ready", now=created + 99)

    def value(name: str, labels: dict[str, str] | None = None) -> float | None:
        return registry.get_sample_value(name, labels or {})

    assert value("nvidia_dra_compute_domain_info", {"status": "Ready"}) == 2
    assert value("nvidia_dra_compute_domain_info", {"status": "NotReady"}) == 0
    ttr = "nvidia_dra_compute_domain_time_to_ready_seconds"
    assert value(f"{ttr}_count", {"namespace": "team-a"}) == 1
    assert value(f"{ttr}_sum", {"namespace": "team-a"}) == 7
    assert value(f"{ttr}_count", {"namespace": "team-b"}) is None
    m.forget("u1")
    m.forget("u1")
    assert value("nvidia_dra_compute_domain_info", {"status": "Ready"}) == 1
    assert value(waiting) == 0  # u1 is Ready


def test_workload_waiting_counts_not_ready_domains_with_nodes() -> None:
    registry = CollectorRegistry()
    m = DomainMetrics(registry)
    observe = functools.partial(m.observe_status, namespace="ns", created=None, now=0.0)

    def waiting() -> float | None:
        return registry.get_sample_value("nvidia_dra_compute_domain_workload_waiting")

    observe("early", status="NotReady", previous=None, nodes=0)  # created ahead of its job
    assert waiting() == 0
    observe("early", status="NotReady", previous="NotReady", nodes=1)  # a pod landed
    observe("early", status="NotReady", previous="NotReady", nodes=2)
    observe("lost", status="NotReady", previous="Ready", nodes=3)
    assert waiting() == 2
    observe("early", status="Ready", previous="NotReady", nodes=2)
    assert waiting() == 1
    m.forget("lost")
    assert waiting() == 0
    assert registry.get_sample_value("nvidia_dra_compute_domain_info", {"status": "NotReady"}) == 0


# -- node loss, dead daemons, capacity (pure) --------------------------------------------------

T0 = 1_700_000_000.0


def test_lost_node_leaves_the_domain_after_the_grace_period() -> None:
    entries = [daemon_entry("a", index=0), daemon_entry("b", index=1)]
    pods = [daemon_pod("u", n, clique="cl.1") for n in ("a", "b")]
    nodes = {"a": node("a"), "b": node("b", ready="Unknown", since=T0)}

    def at(now: float) -> Any:
        return aggregate(
            cliques=[clique("u", "cl.1", entries)],
            pods=pods,
            nodes=nodes,
            now=now,
            node_loss_grace=60.0,
        )

    early = at(T0 + 59)
    assert [(m.entry.node_name, m.entry.status, m.problem) for m in early.members] == [
        ("a", "Ready", ""),
        ("b", "NotReady", "NodeUnreachable"),
    ]
    assert early.lost == {} and early.recheck == pytest.approx(1.0)
    late = at(T0 + 60)
    assert [m.entry.node_name for m in late.members] == ["a"]
    assert late.lost == {"b": "NodeUnreachable"} and late.recheck is None
    before = render_status(cd(), members=early.members, previous=None, problem=None, now="T")
    after = render_status(cd(), members=late.members, previous=before, problem=None, now="T")
    assert [n["name"] for n in after["nodes"]] == ["a"] and after["status"] == "Ready"
    events = status_events(before, after, members=late.members, lost=late.lost, node_loss_grace=60)
    assert [(e.type, e.reason) for e in events] == [("Warning", "NodeLost"), ("Normal", "Ready")]
    assert "NodeUnreachable for more than 60s" in events[0].message


def test_a_node_without_a_transition_time_is_never_judged_lost() -> None:
    found = aggregate(
        cliques=[clique("u", "cl.1", [daemon_entry("a", index=0)])],
        pods=[daemon_pod("u", "a", clique="cl.1")],
        nodes={"a": node("a", ready="False")},
        now=T0,
        node_loss_grace=0.0,
    )
    assert [m.problem for m in found.members] == ["NodeNotReady"] and found.lost == {}


@pytest.mark.parametrize(
    ("pod", "down"),
    [
        (daemon_pod("u", "a", clique="cl.1", container="running"), False),
        (daemon_pod("u", "a", clique="cl.1", container="terminated"), True),  # OOM, SIGKILL
        (daemon_pod("u", "a", clique="cl.1", container="waiting"), True),  # CrashLoopBackOff
        (daemon_pod("u", "a", clique="cl.1"), False),  # no container status yet: no evidence
        (daemon_pod("u", "a", clique="cl.1", ip="10.1.0.1"), False),  # the entry's own pod
        (daemon_pod("u", "a", clique="cl.1", ip="10.7.7.7"), True),  # a newer pod
    ],
    ids=["running", "terminated", "waiting", "no-status", "same-ip", "other-ip"],
)
def test_a_daemon_that_is_not_running_is_not_ready(pod: JSON, down: bool) -> None:
    (m,) = collect_members(
        cliques=[clique("u", "cl.1", [daemon_entry("a", index=0)])], pods=[pod], nodes={}
    )
    assert (m.entry.status, m.problem) == (
        ("NotReady", "DaemonNotRunning") if down else ("Ready", "")
    )
    pending = dict(pod, status={**pod["status"], "phase": "Pending"})
    assert daemon_not_running(pending)


def test_a_full_clique_names_the_nodes_it_leaves_out() -> None:
    entries = [daemon_entry("a", index=0), daemon_entry("b", index=1)]
    pods = [daemon_pod("u", n, clique="cl.1") for n in ("a", "b", "c", "d")]
    pods.append(daemon_pod("u", "e", clique="cl.2"))  # another clique: room there
    found = aggregate(cliques=[clique("u", "cl.1", entries)], pods=pods, nodes={}, max_nodes=2)
    (short,) = found.shortfalls
    assert (short.clique_id, short.left_out) == ("cl.1", ("c", "d"))
    assert [p["metadata"]["name"] for p in short.pods] == ["daemon-c", "daemon-d"]
    problem = found.capacity_problem()
    assert problem is not None and problem.reason == "CapacityExceeded"
    assert problem.message == (
        "clique cl.1 is full: it already holds 2 IMEX daemons (MAX_NODES_PER_IMEX_DOMAIN=2); "
        "nodes left out: c, d"
    )
    roomy = aggregate(cliques=[clique("u", "cl.1", entries)], pods=pods, nodes={}, max_nodes=3)
    assert roomy.shortfalls == [] and roomy.capacity_problem() is None
