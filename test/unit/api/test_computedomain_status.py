"""Pure status helpers of pkg.api.computedomain: readiness rule and metav1.Condition updates."""

from __future__ import annotations

import pytest

from pkg.api.computedomain import (
    find_condition,
    global_status,
    required_nodes,
    set_condition,
)
from pkg.api.daemonentry import DaemonEntry


def entry(name: str, status: str = "Ready") -> DaemonEntry:
    return DaemonEntry(name, "10.0.0.1", "c.1", 0, status)


@pytest.mark.parametrize(
    ("num_nodes", "nodes", "expected"),
    [
        (0, [], "NotReady"),  # upstream says Ready here; a domain needs at least one node
        (0, [entry("a")], "Ready"),
        (2, [entry("a")], "NotReady"),
        (1, [entry("a"), entry("b", "NotReady")], "NotReady"),
    ],
    ids=["zero-empty", "zero-one", "below-numNodes", "one-not-ready"],
)
def test_global_status(num_nodes: int, nodes: list[DaemonEntry], expected: str) -> None:
    assert global_status(nodes, num_nodes=num_nodes) == expected


def test_required_nodes_is_at_least_one() -> None:
    assert (required_nodes(0), required_nodes(3)) == (1, 3)


def test_set_condition_moves_transition_time_only_on_flips() -> None:
    one = set_condition(
        [], type_="Ready", status=False, reason="A", message="m", observed_generation=1, now="T1"
    )
    two = set_condition(
        one, type_="Ready", status=False, reason="B", message="n", observed_generation=2, now="T2"
    )
    three = set_condition(
        two, type_="Ready", status=True, reason="C", message="o", observed_generation=2, now="T3"
    )
    assert [c["lastTransitionTime"] for c in (one[0], two[0], three[0])] == ["T1", "T1", "T3"]
    assert (two[0]["reason"], two[0]["observedGeneration"]) == ("B", 2)
    other = set_condition(
        three,
        type_="Degraded",
        status=False,
        reason="X",
        message="",
        observed_generation=2,
        now="T4",
    )
    assert [c["type"] for c in other] == ["Degraded", "Ready"]
    assert find_condition(other, "Ready") == three[0]


def test_long_messages_are_truncated_to_fit_the_crd() -> None:
    (cond,) = set_condition(
        [],
        type_="Ready",
        status=True,
        reason="R",
        message="m" * 40000,
        observed_generation=1,
        now="T",
    )
    assert len(cond["message"]) == 32000
