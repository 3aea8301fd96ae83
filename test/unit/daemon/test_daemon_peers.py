"""Peer report: clique members only, CONNECTED only, unlisted members count as unreachable."""

from __future__ import annotations

from dataclasses import replace

from pkg.api.daemonentry import DaemonEntry
from pkg.daemon.membership import Identity, upsert
from pkg.daemon.peers import clique_peers, peer_report

ME = Identity("uid", "cd", "team", "cl.1", "n0", "10.0.0.1", "p", "pu", "ns")


def test_peer_report() -> None:
    entries = [
        DaemonEntry("n0", "10.0.0.1", "cl.1", 0),
        DaemonEntry("n2", "10.0.0.3", "cl.1", 2),
        DaemonEntry("n1", "10.0.0.2", "cl.1", 1),
        DaemonEntry("n3", "10.0.0.4", "cl.1", 3),
        DaemonEntry("x9", "10.0.0.9", "cl.2", 0),  # another clique: never a peer
        DaemonEntry("n4", "", "cl.1", 4),  # no address yet
    ]
    peers = clique_peers(entries, ME)
    assert [p.node_name for p in peers] == ["n1", "n2", "n3"]
    table = {"10.0.0.2": "CONNECTED", "10.0.0.3": "DISCONNECTED", "10.0.0.9": "CONNECTED"}
    assert peer_report(peers, table) == (1, ("n2", "n3"))  # n3: not listed by IMEX at all


def test_a_new_ip_resets_the_peer_report() -> None:
    entry = DaemonEntry("n0", "10.0.0.1", "cl.1", 0, "Ready", 2, ("n2",))
    moved = upsert([entry], replace(ME, pod_ip="10.0.0.7"), max_nodes=4)
    assert moved is not None and moved[0].unreachable_peers is None
