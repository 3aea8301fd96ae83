"""SingleClique and IMEXConnected: pure rules, and the reconciler's writes and Events."""

from __future__ import annotations

from typing import Any

from cdctl_fakes import (  # type: ignore[import-not-found, unused-ignore]
    RecordedEvents,
    clique,
    compute_domain,
    daemon_entry,
    daemon_pod,
    node,
)

from pkg.api import constants as c
from pkg.api.computedomain import parse_compute_domain
from pkg.base.types import JSON
from pkg.kube import resources as res
from pkg.reconcilers.computedomain import ComputeDomainReconciler
from pkg.reconcilers.conditions import clique_condition, connectivity_condition
from pkg.reconcilers.status import collect_members, condition_events, render_status
from pkg.testing.fakeapiserver import FakeApiServer


def entry(
    name: str,
    index: int,
    *,
    cl: str = "cl.1",
    status: str = "Ready",
    unreachable: list[str] | None = None,
) -> JSON:
    out: JSON = daemon_entry(name, index=index, status=status, clique_id=cl)
    if unreachable is not None:
        out["unreachablePeers"] = unreachable
        out["connectedPeers"] = 0
    return out


def members(entries: list[JSON]) -> Any:
    by_clique: dict[str, list[JSON]] = {}
    for e in entries:
        by_clique.setdefault(e["cliqueID"], []).append(e)
    pods = [daemon_pod("u", e["nodeName"], clique=e["cliqueID"]) for e in entries]
    cliques = [clique("u", cid, es) for cid, es in by_clique.items()]
    return collect_members(cliques=cliques, pods=pods, nodes={})


def test_single_clique_rule() -> None:
    assert clique_condition(members([])) is None
    one = clique_condition(members([entry("a", 0), entry("b", 1)]))
    assert one == ("True", "SingleClique", "all 2 nodes are in clique cl.1")
    two = clique_condition(members([entry("a", 0), entry("b", 1), entry("e", 0, cl="cl.2")]))
    assert two is not None and two[:2] == ("False", "MultipleCliques")
    assert "span 2 NVLink cliques (clique cl.1: a, b; clique cl.2: e)" in two[2]


def test_imex_connected_rule() -> None:
    assert connectivity_condition(members([entry("a", 0), entry("b", 1)])) is None  # no report
    good = connectivity_condition(members([entry("a", 0, unreachable=[]), entry("b", 1)]))
    assert good is not None and good[:2] == ("True", "AllPeersConnected")
    bad = connectivity_condition(
        members(
            [
                entry("a", 0, unreachable=["b", "c"]),
                entry("b", 1, unreachable=["a"]),
                entry("c", 2, status="NotReady"),  # not Ready: the Ready condition names it already
                entry("x", 0, cl="cl.2", unreachable=["a"]),  # another clique is never a peer
            ]
        )
    )
    assert bad == (
        "False",
        "PeersUnreachable",
        "a cannot reach b; b cannot reach a (IMEX connection state from nvidia-imex-ctl -N)",
    )


def conds(status: JSON) -> dict[str, tuple[str, str]]:
    return {x["type"]: (x["status"], x["reason"]) for x in status["conditions"]}


def test_conditions_appear_go_unknown_and_leave_ready_alone() -> None:
    cd = parse_compute_domain(
        {
            "metadata": {"namespace": "t", "name": "cd", "uid": "u", "generation": 1},
            "spec": {"channel": {"resourceClaimTemplate": {"name": "r"}}},
        }
    )
    empty = render_status(cd, members=[], previous=None, problem=None, now="T0")
    assert set(conds(empty)) == {"Ready"}
    split = members(
        [entry("a", 0, unreachable=["b"]), entry("b", 1, unreachable=[]), entry("e", 0, cl="cl.2")]
    )
    bad = render_status(cd, members=split, previous=empty, problem=None, now="T1")
    assert conds(bad) == {
        "Ready": ("True", "AllNodesReady"),
        "SingleClique": ("False", "MultipleCliques"),
        "IMEXConnected": ("False", "PeersUnreachable"),
    }
    assert [(e.type, e.reason) for e in condition_events(empty, bad)] == [
        ("Warning", "MultipleCliques"),
        ("Warning", "PeersUnreachable"),
    ]
    gone = render_status(cd, members=[], previous=bad, problem=None, now="T2")
    assert conds(gone)["SingleClique"] == ("Unknown", "NoNodes")
    assert conds(gone)["IMEXConnected"] == ("Unknown", "NotReported")
    assert [(e.type, e.reason) for e in condition_events(bad, gone)] == [
        ("Normal", "NoNodes"),
        ("Normal", "NotReported"),
    ]
    healthy = render_status(
        cd, members=members([entry("a", 0)]), previous=None, problem=None, now="T3"
    )
    assert conds(healthy)["SingleClique"] == ("True", "SingleClique")
    assert condition_events(None, healthy) == []  # appearing True is no transition


def test_reconciler_writes_conditions_with_one_event_per_transition(
    server: FakeApiServer, reconciler: ComputeDomainReconciler, events: RecordedEvents
) -> None:
    uid = str(server.seed(res.COMPUTE_DOMAINS, compute_domain())["metadata"]["uid"])
    reconciler.reconcile("team/cd1")
    for n, cl in (("a", "cl.1"), ("b", "cl.1"), ("e", "cl.2")):
        server.seed(res.NODES, node(n, labels={c.COMPUTE_DOMAIN_LABEL: uid}))
        server.seed(res.PODS, daemon_pod(uid, n, clique=cl))
    server.seed(
        res.COMPUTE_DOMAIN_CLIQUES,
        clique(uid, "cl.1", [entry("a", 0, unreachable=["b"]), entry("b", 1, unreachable=[])]),
    )
    server.seed(res.COMPUTE_DOMAIN_CLIQUES, clique(uid, "cl.2", [entry("e", 0, cl="cl.2")]))

    def cond(type_: str) -> JSON:
        cd = next(o for o in server.objects(res.COMPUTE_DOMAINS))
        return dict(next(x for x in cd["status"]["conditions"] if x["type"] == type_))

    def warnings(reason: str) -> list[str]:
        return [m for _, t, r, m in events.items if r == reason and t == "Warning"]

    reconciler.reconcile("team/cd1")
    assert cond("SingleClique")["status"] == "False"
    assert "clique cl.1: a, b; clique cl.2: e" in cond("SingleClique")["message"]
    assert cond("IMEXConnected")["message"].startswith("a cannot reach b")
    assert len(warnings("MultipleCliques")) == 1 and len(warnings("PeersUnreachable")) == 1
    reconciler.reconcile("team/cd1")  # nothing changed: no new Event
    assert len(warnings("MultipleCliques")) == 1 and len(warnings("PeersUnreachable")) == 1

    # The link comes back: IMEXConnected=True with a Normal Event.
    server.seed(
        res.COMPUTE_DOMAIN_CLIQUES,
        clique(uid, "cl.1", [entry("a", 0, unreachable=[]), entry("b", 1, unreachable=[])]),
    )
    reconciler.reconcile("team/cd1")
    assert cond("IMEXConnected")["status"] == "True"
    assert ("cd1", "Normal", "AllPeersConnected") in [i[:3] for i in events.items]
