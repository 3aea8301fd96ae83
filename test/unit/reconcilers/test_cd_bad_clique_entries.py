"""Malformed clique entries: skipped, reported on the domain, never a stall.

The fake API server evaluates no CRD schema, so the entries the real one refuses
(``test/e2e/test_adversarial_entries.py``) can be planted here, as an older CRD or an API server
without the CEL rule would let them through.
"""

from __future__ import annotations

from typing import Any

from cdctl_fakes import (  # type: ignore[import-not-found, unused-ignore]
    DRIVER_NS,
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
from pkg.imex.nodesconfig import SENTINEL_ADDRESS
from pkg.kube import resources as res
from pkg.reconcilers.computedomain import ComputeDomainReconciler
from pkg.reconcilers.entrycheck import MAX_DESCRIBED, check_clique
from pkg.reconcilers.status import aggregate, condition_events, render_status
from pkg.testing.clock import FakeClock
from pkg.testing.fakeapiserver import FakeApiServer

SCOPE_ID = "fe80::1%a\n10.0.0.9\tcompute-domain-daemon-x-0000"


def entry(name: str, index: int, **fields: Any) -> JSON:
    return {**daemon_entry(name, index=index), **fields}


def whys(daemons: list[Any], *, max_nodes: int = 18) -> list[tuple[int, bool, str]]:
    checked = check_clique(clique("u", "cl.1", daemons), max_nodes=max_nodes)
    return [(b.position, b.skipped, b.why) for b in checked.bad]


def test_what_the_daemons_skip_is_a_bad_entry() -> None:
    good = entry("a", 0)
    assert whys([good]) == []
    bad = [
        good,
        entry("b", 1, ipAddress=SCOPE_ID),
        entry("c", 2, ipAddress="FD00::1"),
        entry("d", 3, ipAddress=""),
        entry("e", 4, ipAddress=SENTINEL_ADDRESS),
        entry("f", 5, cliqueID="cl.2"),
        entry("g", 18),
        entry("h", -1),
        entry("i", 6, status="Ready\n"),
        {k: v for k, v in entry("j", 7).items() if k != "nodeName"},
        entry("K_upper", 8),
        entry("n" * 254, 9),
        entry("a", 10),  # a second entry of node a
        "not an object",
        entry("m", 0),  # index 0 is a's: reported, kept
    ]
    found = whys(bad)
    assert [p for p, _, _ in found] == list(range(1, len(bad)))
    assert [s for _, s, _ in found] == [True] * (len(bad) - 2) + [False]
    text = "\n".join(w for _, _, w in found)
    assert (
        "ipAddress 'fe80::1%a\\n10.0.0.9\\tcompute-domain-daemon-x-0000' is not a canonical" in text
    )
    assert "cliqueID 'cl.2' is not the clique's 'cl.1'" in text
    assert "index 18 is outside 0..17" in text and "index -1 is outside" in text
    assert "reserved for empty slots" in text and "a second entry of node a" in text
    assert "index 0 is also held by node a" in text
    # The members: a and m (the index tie is the daemons' to resolve), nobody else.
    checked = check_clique(clique("u", "cl.1", bad), max_nodes=18)
    assert [e.node_name for e in checked.entries] == ["a", "m"]


def test_daemons_that_are_no_list_read_as_one_bad_entry() -> None:
    obj = {**clique("u", "cl.1", []), "daemons": 5}
    checked = check_clique(obj)
    assert checked.entries == [] and [b.why for b in checked.bad] == ["daemons is not a list"]


def test_the_condition_appears_only_with_a_bad_entry_and_stays_bounded() -> None:
    cd = parse_compute_domain(compute_domain())
    daemons = [entry(f"n{i}", i % 18, ipAddress=f"010.0.0.{i}") for i in range(2000)]
    pods = [daemon_pod("u", f"n{i}", clique="cl.1") for i in range(3)]
    found = aggregate(cliques=[clique("u", "cl.1", daemons)], pods=pods, nodes={}, max_nodes=18)
    assert found.members == [] and len(found.bad_entries) == 2000
    status = render_status(
        cd, members=[], previous=None, problem=None, now="T0", bad_entries=found.bad_entries
    )
    [cond] = [x for x in status["conditions"] if x["type"] == "CliqueEntriesValid"]
    assert (cond["status"], cond["reason"]) == ("False", "InvalidCliqueEntry")
    assert cond["message"].count("daemons[") == MAX_DESCRIBED
    assert cond["message"].endswith(f"and {2000 - MAX_DESCRIBED} more")
    assert len(cond["message"]) < 2000 and "\n" not in cond["message"]
    clean = render_status(cd, members=[], previous=None, problem=None, now="T0")
    assert "CliqueEntriesValid" not in {x["type"] for x in clean["conditions"]}
    fixed = render_status(cd, members=[], previous=status, problem=None, now="T1")
    [cond] = [x for x in fixed["conditions"] if x["type"] == "CliqueEntriesValid"]
    assert (cond["status"], cond["reason"]) == ("True", "AllCliqueEntriesValid")
    assert [(e.type, e.reason) for e in condition_events(status, fixed)] == [
        ("Normal", "AllCliqueEntriesValid")
    ]


def test_reconciler_skips_reports_once_and_clears(
    server: FakeApiServer,
    reconciler: ComputeDomainReconciler,
    events: RecordedEvents,
    clock: FakeClock,
) -> None:
    uid = str(server.seed(res.COMPUTE_DOMAINS, compute_domain())["metadata"]["uid"])
    reconciler.reconcile("team/cd1")
    for n in ("a", "b"):
        server.seed(res.NODES, node(n, labels={c.COMPUTE_DOMAIN_LABEL: uid}))
        server.seed(res.PODS, daemon_pod(uid, n, clique="cl.1"))
    bad_b = entry("b", 1, ipAddress=SCOPE_ID)
    server.seed(res.COMPUTE_DOMAIN_CLIQUES, clique(uid, "cl.1", [entry("a", 0), bad_b]))

    def cd() -> JSON:
        return dict(next(o for o in server.objects(res.COMPUTE_DOMAINS)))

    def cond() -> JSON:
        return dict(
            next(x for x in cd()["status"]["conditions"] if x["type"] == "CliqueEntriesValid")
        )

    def warnings() -> list[str]:
        return [m for _, t, r, m in events.items if (t, r) == ("Warning", "InvalidCliqueEntry")]

    reconciler.reconcile("team/cd1")
    assert [n["name"] for n in cd()["status"]["nodes"]] == ["a"]  # b is skipped
    assert SCOPE_ID not in str(cd()["status"]["nodes"])
    assert (cond()["status"], cond()["reason"]) == ("False", "InvalidCliqueEntry")
    name = c.clique_object_name(uid, "cl.1")
    assert f"clique {name} daemons[1] (node 'b'): ipAddress" in cond()["message"]
    assert len(warnings()) == 1 and f"clique {name} daemons[1] (node 'b')" in warnings()[0]
    for _ in range(3):  # nothing changed: no new Event, however often the domain is reconciled
        clock.step(30)
        reconciler.reconcile("team/cd1")
    assert len(warnings()) == 1

    # The daemon writes its entry again, well-formed: the condition turns True, b is a member.
    server.seed(res.COMPUTE_DOMAIN_CLIQUES, clique(uid, "cl.1", [entry("a", 0), entry("b", 1)]))
    reconciler.reconcile("team/cd1")
    assert (cond()["status"], cond()["reason"]) == ("True", "AllCliqueEntriesValid")
    assert [n["name"] for n in cd()["status"]["nodes"]] == ["a", "b"]
    assert ("cd1", "Normal", "AllCliqueEntriesValid") in [i[:3] for i in events.items]
    assert len(warnings()) == 1


def test_garbage_in_a_clique_never_stalls_the_domain(
    server: FakeApiServer, reconciler: ComputeDomainReconciler, events: RecordedEvents
) -> None:
    uid = str(server.seed(res.COMPUTE_DOMAINS, compute_domain())["metadata"]["uid"])
    reconciler.reconcile("team/cd1")
    server.seed(res.NODES, node("a", labels={c.COMPUTE_DOMAIN_LABEL: uid}))
    server.seed(res.PODS, daemon_pod(uid, "a", clique="cl.1"))
    server.seed(
        res.COMPUTE_DOMAIN_CLIQUES,
        clique(
            uid,
            "cl.1",
            [
                entry("a", 0),
                7,
                None,
                "x",
                [],
                {"nodeName": {"x": 1}, "index": "0"},
                {
                    "nodeName": "q",
                    "ipAddress": 10,
                    "cliqueID": None,
                    "index": True,
                    "status": 3,
                    "connectedPeers": "x",
                    "unreachablePeers": 5,
                },
            ],
        ),
    )
    other = clique(uid, "cl.2", [])
    other["daemons"] = {"not": "a list"}
    server.seed(res.COMPUTE_DOMAIN_CLIQUES, other)
    reconciler.reconcile("team/cd1")
    status = next(o for o in server.objects(res.COMPUTE_DOMAINS))["status"]
    assert status["status"] == "Ready" and [n["name"] for n in status["nodes"]] == ["a"]
    conds = {x["type"]: x for x in status["conditions"]}
    assert conds["CliqueEntriesValid"]["reason"] == "InvalidCliqueEntry"
    assert conds["CliqueEntriesValid"]["message"].startswith("7 malformed clique entries")
    assert [o["metadata"]["namespace"] for o in server.objects(res.COMPUTE_DOMAIN_CLIQUES)] == [
        DRIVER_NS,
        DRIVER_NS,
    ]
