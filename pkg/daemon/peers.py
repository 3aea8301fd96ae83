"""What this daemon's IMEX sees of its clique peers, as published in its clique entry.

Owns the mapping from IMEX's connection table (addresses, :func:`pkg.imex.ctl.peer_connections`)
to node names: a peer is a *member of our clique* other than us that has an IP; it is reachable
iff IMEX reports its address ``CONNECTED``. A member IMEX does not list at all (not in its node
config yet, or not resolved) counts as unreachable. Other nodes-config slots (empty DNS slots,
departed members) are not peers and are ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pkg.api.daemonentry import DaemonEntry
from pkg.daemon.membership import Identity
from pkg.imex.ctl import CONNECTED


def clique_peers(entries: Iterable[DaemonEntry], me: Identity) -> list[DaemonEntry]:
    """The other members of our clique that have an address, sorted by node name."""
    return sorted(
        (
            e
            for e in entries
            if e.clique_id == me.clique_id and e.node_name != me.node_name and e.ip_address
        ),
        key=lambda e: e.node_name,
    )


def peer_report(
    peers: Iterable[DaemonEntry], connections: Mapping[str, str]
) -> tuple[int, tuple[str, ...]]:
    """(number of peers connected, names of the peers not connected, sorted)."""
    connected, unreachable = 0, []
    for peer in peers:
        if connections.get(peer.ip_address) == CONNECTED:
            connected += 1
        else:
            unreachable.append(peer.node_name)
    return connected, tuple(sorted(unreachable))
