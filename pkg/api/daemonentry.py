"""One IMEX daemon's entry in its domain's membership list: the type and its JSON codec.

The membership list is a ComputeDomainClique's ``daemons[]`` (gate ``ComputeDomainCliques`` on)
or a ComputeDomain's ``status.nodes[]``. Both hold the same record; only the key of the node's
name differs (``nodeName`` in a clique, ``name`` in the status), and only clique entries carry
the peer report (``connectedPeers``, ``unreachablePeers``). This module is the one place that
spells those field names: the daemon (writer of its own entry), the controller (join, prune,
status aggregation, indexes), the kubelet plugin (readiness) and the CLI read and write entries
through it, and the CRD schema (:mod:`pkg.api.crds`) takes its property names from here.

Contract of the codec:

* decoding never raises: an item that is not an object or has no node name is skipped (the
  list decoders) or decodes to None (the item decoders); a missing or non-integer ``index``
  reads as -1, a missing ``status`` as ``NotReady`` (the CRD's default), a missing or
  malformed peer report as None ("not reported");
* encoding writes the five upstream fields always and the peer fields only for clique items and
  only when reported, so a status entry and an unreported clique entry are byte-for-byte what
  upstream writes;
* ``decode(encode(e)) == e`` for every entry with a non-empty node name.

Also here, because they depend on the item layout: the JSON-patch operations that append
entries to a clique guarded by the list's shape (:func:`guarded_append_ops`) and that change
one daemon's own entry guarded by its identity (:func:`own_entry_patch_ops`), and the raw-item
helpers the prune reconciler needs to edit an entry in place without dropping fields it does
not know (:func:`item_identity`, :func:`with_item_status`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pkg.api import constants as c
from pkg.base.types import JSON

NODE_NAME = "nodeName"
"""The node's name in a clique's ``daemons[]`` item (the list-map key)."""
STATUS_NODE_NAME = "name"
"""The node's name in a ComputeDomain's ``status.nodes[]`` item."""
IP_ADDRESS = "ipAddress"
CLIQUE_ID = "cliqueID"
INDEX = "index"
STATUS = "status"
CONNECTED_PEERS = "connectedPeers"
UNREACHABLE_PEERS = "unreachablePeers"
DAEMONS = "daemons"
"""The list of entries of a ComputeDomainClique (top level)."""
STATUS_NODES = "nodes"
"""The list of entries in a ComputeDomain's ``status``."""

# -- bounds (the CRD schema's ``maxLength``/``maxItems``; :mod:`pkg.api.crds`) -----------------

MAX_NODE_NAME_LENGTH = 253
"""A node's name is a DNS subdomain (what the API server accepts for a Node)."""
NODE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""A lowercase RFC 1123 subdomain, as every Node's name is (length checked apart)."""
MAX_IP_ADDRESS_LENGTH = 45
"""The longest textual IP address (an IPv6 address with an embedded IPv4 one)."""
MAX_CLIQUE_ID_LENGTH = 63
"""``<clusterUUID>.<cliqueId>`` (36 + 1 + at most 10 digits of a uint32 today); it is also the
value of the clique label on cliques and daemon pods, which Kubernetes caps at 63."""
MAX_CLIQUE_DAEMONS = 1024
"""Entries in one ComputeDomainClique: one per daemon of one IMEX domain, so at most the
controller's ``max-nodes-per-imex-domain`` (18 by default, the GB200/GB300 NVL72 rack of 18
compute trays); 1024 leaves room for NVLink domains far larger than any NVIDIA ships or has
announced, while one clique object stays well below etcd's 1.5 MiB request limit. The
controller refuses a larger ``max-nodes-per-imex-domain``."""

_NODE_NAME = re.compile(NODE_NAME_PATTERN)

Layout = Literal["clique", "status"]
"""Which list an item belongs to: a clique's ``daemons[]`` or a domain's ``status.nodes[]``."""

EntryId = tuple[str, str, int]
"""(node name, IP address, index): an entry as one daemon incarnation wrote it."""


def is_node_name(value: object) -> bool:
    """True iff ``value`` could be a Node's name (:data:`NODE_NAME_PATTERN`, length)."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_NODE_NAME_LENGTH
        and _NODE_NAME.fullmatch(value) is not None
    )


def name_key(layout: Layout) -> str:
    """The key of the node's name in an item of ``layout``."""
    return NODE_NAME if layout == "clique" else STATUS_NODE_NAME


@dataclass(frozen=True)
class DaemonEntry:
    """One IMEX daemon of a domain: a clique's ``daemons[]`` or the ``status.nodes[]`` item."""

    node_name: str
    ip_address: str
    clique_id: str
    index: int
    """Stable slot in the clique's IMEX node list; -1 for members without a clique."""
    status: str = c.STATUS_NOT_READY
    connected_peers: int | None = None
    """Clique members this daemon's IMEX is connected to (clique entries only; None: not
    reported)."""
    unreachable_peers: tuple[str, ...] | None = None
    """Node names of clique members this daemon's IMEX cannot reach (clique entries only;
    None: not reported)."""

    @property
    def identity(self) -> EntryId:
        """(node, IP, index): equal for two reads of the same incarnation's entry."""
        return self.node_name, self.ip_address, self.index

    def encode(self, layout: Layout = "clique") -> JSON:
        """The item of ``layout`` for this entry (see the module's codec contract)."""
        out: JSON = {
            name_key(layout): self.node_name,
            IP_ADDRESS: self.ip_address,
            CLIQUE_ID: self.clique_id,
            INDEX: self.index,
            STATUS: self.status,
        }
        if layout == "clique":  # status.nodes keeps upstream's fields
            if self.connected_peers is not None:
                out[CONNECTED_PEERS] = self.connected_peers
            if self.unreachable_peers is not None:
                out[UNREACHABLE_PEERS] = list(self.unreachable_peers)
        return out

    @classmethod
    def decode(cls, item: object, layout: Layout = "clique") -> DaemonEntry | None:
        """The entry of an item of ``layout``; None if it is not an object or names no node."""
        if not isinstance(item, dict) or not item.get(name_key(layout)):
            return None
        connected = item.get(CONNECTED_PEERS)
        unreachable = item.get(UNREACHABLE_PEERS)
        return cls(
            node_name=str(item[name_key(layout)]),
            ip_address=str(item.get(IP_ADDRESS) or ""),
            clique_id=str(item.get(CLIQUE_ID) or ""),
            index=_index(item),
            status=str(item.get(STATUS) or c.STATUS_NOT_READY),
            connected_peers=connected if isinstance(connected, int) else None,
            unreachable_peers=(
                tuple(str(n) for n in unreachable) if isinstance(unreachable, list) else None
            ),
        )


def _index(item: JSON) -> int:
    index = item.get(INDEX, -1)
    return index if isinstance(index, int) else -1


# -- lists ----------------------------------------------------------------------------------------


def _items(obj: JSON | None, key: str) -> list[object]:
    """``obj[key]`` if it is a list, else ``[]`` (a list of another type reads as empty)."""
    items = (obj or {}).get(key)
    return items if isinstance(items, list) else []


def daemon_items(clique: JSON | None) -> list[JSON]:
    """The raw ``daemons[]`` items of a ComputeDomainClique that are objects (for writers that
    must keep fields this version does not know)."""
    return [d for d in _items(clique, DAEMONS) if isinstance(d, dict)]


def clique_daemons(clique: JSON | None) -> list[DaemonEntry]:
    """The ``daemons[]`` of a ComputeDomainClique, skipping malformed items."""
    items = _items(clique, DAEMONS)
    return [e for e in (DaemonEntry.decode(i, "clique") for i in items) if e is not None]


def status_nodes(status: JSON | None) -> list[DaemonEntry]:
    """The ``status.nodes[]`` of a ComputeDomain (its ``status``), skipping malformed items."""
    items = _items(status, STATUS_NODES)
    return [e for e in (DaemonEntry.decode(i, "status") for i in items) if e is not None]


def encode_daemons(entries: list[DaemonEntry]) -> list[JSON]:
    """The ``daemons[]`` list of a ComputeDomainClique holding ``entries``."""
    return [e.encode("clique") for e in entries]


def encode_status_nodes(entries: list[DaemonEntry]) -> list[JSON]:
    """The ``status.nodes[]`` list of a ComputeDomain holding ``entries``."""
    return [e.encode("status") for e in entries]


# -- raw items (edits that keep unknown fields) ---------------------------------------------------


def item_identity(item: JSON) -> EntryId:
    """:attr:`DaemonEntry.identity` of a raw ``daemons[]`` item, also of a malformed one
    (missing node name or IP read as ``""``, so it never matches a decoded entry)."""
    return str(item.get(NODE_NAME) or ""), str(item.get(IP_ADDRESS) or ""), _index(item)


def with_item_status(item: JSON, status: str) -> JSON:
    """A copy of the raw item with ``status`` set; every other field, known or not, kept."""
    return {**item, STATUS: status}


def item_position(items: list[JSON], node_name: str) -> int | None:
    """The position of ``node_name``'s item in a raw ``daemons[]`` list; None unless exactly
    one item names it."""
    mine = [
        i
        for i, item in enumerate(items)
        if isinstance(item, dict) and item.get(NODE_NAME) == node_name
    ]
    return mine[0] if len(mine) == 1 else None


# -- guarded JSON patches of a clique --------------------------------------------------------------

_TAIL_KEYS = (NODE_NAME, IP_ADDRESS, CLIQUE_ID, INDEX)


def guarded_append_ops(items: list[JSON], new: list[DaemonEntry]) -> list[JSON]:
    """JSON-patch operations appending ``new`` to a non-empty ``daemons[]`` list ``items`` only
    if the list still ends with ``items[-1]`` (``test`` of its node, IP, clique and index at
    that position) and each new entry lands right after it. Entries are only ever appended,
    changed in place or removed, so the guard holds only if no entry was added or removed
    since ``items`` was read; in-place status patches of other entries do not break it, and
    the API server's list-map key check refuses a second entry of a node."""
    n, last = len(items), items[-1]
    ops: list[JSON] = [
        {"op": "test", "path": f"/{DAEMONS}/{n - 1}/{k}", "value": last[k]}
        for k in _TAIL_KEYS
        if k in last
    ]
    for i, entry in enumerate(new):
        ops.append({"op": "add", "path": f"/{DAEMONS}/-", "value": entry.encode("clique")})
        ops.append(
            {"op": "test", "path": f"/{DAEMONS}/{n + i}/{NODE_NAME}", "value": entry.node_name}
        )
    return ops


def own_entry_patch_ops(position: int, old: DaemonEntry, new: DaemonEntry) -> list[JSON]:
    """JSON-patch operations that set ``new``'s status and (reported) peer fields on the item at
    ``position`` only if it still is ``old`` (``test`` of its node, IP, clique and index).
    Removing a peer report is not expressible here (the caller writes the whole list)."""
    at = f"/{DAEMONS}/{position}"
    ops: list[JSON] = [
        {"op": "test", "path": f"{at}/{NODE_NAME}", "value": old.node_name},
        {"op": "test", "path": f"{at}/{IP_ADDRESS}", "value": old.ip_address},
        {"op": "test", "path": f"{at}/{CLIQUE_ID}", "value": old.clique_id},
        {"op": "test", "path": f"{at}/{INDEX}", "value": old.index},
        {"op": "add", "path": f"{at}/{STATUS}", "value": new.status},
    ]
    if new.connected_peers is not None:
        ops.append({"op": "add", "path": f"{at}/{CONNECTED_PEERS}", "value": new.connected_peers})
    if new.unreachable_peers is not None:
        peers = list(new.unreachable_peers)
        ops.append({"op": "add", "path": f"{at}/{UNREACHABLE_PEERS}", "value": peers})
    return ops
