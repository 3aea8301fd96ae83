"""The membership entry codec (pkg.api.daemonentry): field names, defaults, round trips, and the
guarded JSON patches built from entries."""

from __future__ import annotations

import pytest

from pkg.api.daemonentry import (
    DaemonEntry,
    Layout,
    clique_daemons,
    guarded_append_ops,
    item_identity,
    item_position,
    own_entry_patch_ops,
    status_nodes,
    with_item_status,
)

REPORTED = DaemonEntry("n0", "10.0.0.1", "cl.1", 0, "Ready", 2, ("n2",))
PLAIN = DaemonEntry("n1", "10.0.0.2", "cl.1", 1)


@pytest.mark.parametrize("layout", ["clique", "status"])
@pytest.mark.parametrize("entry", [REPORTED, PLAIN], ids=["reported", "plain"])
def test_round_trip(layout: Layout, entry: DaemonEntry) -> None:
    decoded = DaemonEntry.decode(entry.encode(layout), layout)
    if layout == "status":  # status.nodes[] never carries the peer report
        entry = DaemonEntry(
            entry.node_name, entry.ip_address, entry.clique_id, entry.index, entry.status
        )
    assert decoded == entry


def test_wire_shape_is_upstreams_plus_the_peer_report_in_cliques_only() -> None:
    assert REPORTED.encode("clique") == {
        "nodeName": "n0",
        "ipAddress": "10.0.0.1",
        "cliqueID": "cl.1",
        "index": 0,
        "status": "Ready",
        "connectedPeers": 2,
        "unreachablePeers": ["n2"],
    }
    assert REPORTED.encode("status") == {
        "name": "n0",
        "ipAddress": "10.0.0.1",
        "cliqueID": "cl.1",
        "index": 0,
        "status": "Ready",
    }
    assert "connectedPeers" not in PLAIN.encode("clique")


def test_decoding_defaults_and_malformed_items() -> None:
    legacy = DaemonEntry.decode({"nodeName": "n0", "ipAddress": "10.0.0.1", "cliqueID": "cl.1"})
    assert legacy == DaemonEntry("n0", "10.0.0.1", "cl.1", -1, "NotReady")
    assert legacy.unreachable_peers is None and legacy.connected_peers is None
    odd = DaemonEntry.decode({"nodeName": "n0", "index": "3", "connectedPeers": "x"})
    assert odd is not None and (odd.index, odd.connected_peers) == (-1, None)
    clique = {"daemons": [{"nodeName": "a"}, {"noname": True}, "junk", {"nodeName": ""}]}
    assert [e.node_name for e in clique_daemons(clique)] == ["a"]
    status = {
        "nodes": [
            {"name": "a", "ipAddress": "1", "cliqueID": "", "index": -1},
            {"noname": True},
            "junk",
        ]
    }
    (a,) = status_nodes(status)
    assert (a.node_name, a.status, a.index) == ("a", "NotReady", -1)
    assert status_nodes(None) == [] and clique_daemons(None) == []


def test_raw_item_helpers_keep_unknown_fields() -> None:
    item = {**REPORTED.encode("clique"), "futureField": 1}
    assert item_identity(item) == REPORTED.identity == ("n0", "10.0.0.1", 0)
    assert item_identity({"index": 2}) == ("", "", 2)
    assert with_item_status(item, "NotReady") == {**item, "status": "NotReady"}
    assert item["status"] == "Ready"  # a copy
    items = [PLAIN.encode("clique"), item]
    assert (item_position(items, "n0"), item_position(items, "zz")) == (1, None)
    assert item_position([item, item], "n0") is None  # ambiguous: no position


def test_guarded_patches() -> None:
    items = [REPORTED.encode("clique")]
    ops = guarded_append_ops(items, [PLAIN])
    assert ops[:4] == [
        {"op": "test", "path": "/daemons/0/nodeName", "value": "n0"},
        {"op": "test", "path": "/daemons/0/ipAddress", "value": "10.0.0.1"},
        {"op": "test", "path": "/daemons/0/cliqueID", "value": "cl.1"},
        {"op": "test", "path": "/daemons/0/index", "value": 0},
    ]
    assert ops[4:] == [
        {"op": "add", "path": "/daemons/-", "value": PLAIN.encode("clique")},
        {"op": "test", "path": "/daemons/1/nodeName", "value": "n1"},
    ]
    own = own_entry_patch_ops(3, PLAIN, REPORTED)
    assert own[4:] == [
        {"op": "add", "path": "/daemons/3/status", "value": "Ready"},
        {"op": "add", "path": "/daemons/3/connectedPeers", "value": 2},
        {"op": "add", "path": "/daemons/3/unreachablePeers", "value": ["n2"]},
    ]
    assert [op["op"] for op in own[:4]] == ["test"] * 4
    assert [op["op"] for op in own_entry_patch_ops(0, PLAIN, PLAIN)] == ["test"] * 4 + ["add"]
