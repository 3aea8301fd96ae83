"""Which entries of a ComputeDomainClique are malformed, and why.

Every daemon of a clique may write its ``daemons[]``, and the CRD schema (:mod:`pkg.api.crds`)
is not the only thing between them: an older CRD, an API server without the CEL rule, or an
entry the schema cannot judge (an index held twice, another clique's ID) still reaches the
readers. The daemon skips such entries (:mod:`pkg.daemon.imexsync`); the controller skips the
same ones when it aggregates members (:func:`pkg.reconcilers.status.aggregate`), so a bad entry
never reaches ``status.nodes`` (whose schema would refuse the whole status write), and reports
them on the domain (condition ``CliqueEntriesValid``, :mod:`pkg.reconcilers.conditions`).

An entry is **skipped** when it is not an object, names no node or a string that is no node
name, its ``ipAddress`` is not a canonical IP literal without a zone
(:func:`pkg.imex.nodesconfig.is_canonical_ip`) or is the empty-slot sentinel, its ``cliqueID``
is not its clique's, its ``index`` is not an integer in ``0..max_nodes-1``, its ``status`` is
neither ``Ready`` nor ``NotReady``, or an earlier entry already names its node. An entry whose
``index`` an earlier entry holds is **reported** but kept: the daemons resolve the tie (each
prefers its own entry), so the domain's view of who is a member stays as it was.

Pure functions; the messages quote untrusted text with ``repr`` and cut it short, so an entry
can never add a line or an unbounded string to a condition or Event.
"""

from __future__ import annotations

from dataclasses import dataclass

from pkg.api import constants as c
from pkg.api import daemonentry as de
from pkg.base.types import JSON
from pkg.imex.nodesconfig import SENTINEL_ADDRESS, is_canonical_ip

__all__ = ["BadEntry", "CheckedClique", "check_clique", "describe"]

_QUOTE_LIMIT = 64
MAX_DESCRIBED = 5
"""Bad entries named in one message; the rest are counted (messages stay short)."""


def quote(value: object) -> str:
    """``repr`` of untrusted ``value``, cut to a bounded length."""
    text = repr(value)
    return text if len(text) <= _QUOTE_LIMIT else text[: _QUOTE_LIMIT - 3] + "..."


@dataclass(frozen=True)
class BadEntry:
    """One malformed entry: where it is and why."""

    clique: str
    """The ComputeDomainClique's name."""
    position: int
    """Its position in ``daemons[]``."""
    node: str
    """The node it names, quoted (``repr``, cut short) as it is untrusted."""
    why: str
    skipped: bool = True
    """False: reported only (an index held twice)."""

    def describe(self) -> str:
        return f"clique {self.clique} daemons[{self.position}] (node {self.node}): {self.why}"


@dataclass(frozen=True)
class CheckedClique:
    """A clique's entries the readers use, and the bad ones."""

    entries: list[de.DaemonEntry]
    bad: list[BadEntry]


def _clique_id(clique: JSON) -> str | None:
    meta = clique.get("metadata") or {}
    labels = meta.get("labels") or {}
    if isinstance(labels.get(c.CLIQUE_ID_LABEL), str):
        return str(labels[c.CLIQUE_ID_LABEL])
    name = str(meta.get("name") or "")
    return name.split(".", 1)[1] if "." in name else None


def _why(item: object, *, clique_id: str | None, max_nodes: int | None, seen: set[str]) -> str:
    """Why the daemons skip ``item`` (``""``: they use it)."""
    if not isinstance(item, dict):
        return "not an object"
    name = item.get(de.NODE_NAME)
    if not de.is_node_name(name):
        return f"{de.NODE_NAME} {quote(name)} is not a node name"
    if name in seen:
        return f"a second entry of node {name}"
    ip = item.get(de.IP_ADDRESS)
    if not isinstance(ip, str) or not is_canonical_ip(ip):
        return f"{de.IP_ADDRESS} {quote(ip)} is not a canonical IP address without a zone"
    if ip == SENTINEL_ADDRESS:
        return f"{de.IP_ADDRESS} {ip} is reserved for empty slots"
    if clique_id is not None and item.get(de.CLIQUE_ID) != clique_id:
        return f"{de.CLIQUE_ID} {quote(item.get(de.CLIQUE_ID))} is not the clique's {clique_id!r}"
    index = item.get(de.INDEX)
    top = max_nodes if max_nodes is not None else de.MAX_CLIQUE_DAEMONS
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < top:
        return f"{de.INDEX} {quote(index)} is outside 0..{top - 1}"
    status = item.get(de.STATUS, c.STATUS_NOT_READY)
    if status not in (c.STATUS_READY, c.STATUS_NOT_READY):
        return f"{de.STATUS} {quote(status)} is neither {c.STATUS_READY} nor {c.STATUS_NOT_READY}"
    return ""


def check_clique(clique: JSON, *, max_nodes: int | None = None) -> CheckedClique:
    """The usable entries of ``clique`` (decoded, in list order) and its bad ones; ``max_nodes``
    (the controller's ``max-nodes-per-imex-domain``) bounds the index, else the CRD's bound."""
    name = str((clique.get("metadata") or {}).get("name") or "")
    items = clique.get(de.DAEMONS)
    if items is None:
        return CheckedClique([], [])
    if not isinstance(items, list):
        return CheckedClique([], [BadEntry(name, 0, "-", f"{de.DAEMONS} is not a list")])
    clique_id = _clique_id(clique)
    entries: list[de.DaemonEntry] = []
    bad: list[BadEntry] = []
    seen: set[str] = set()
    holder: dict[int, str] = {}
    for position, item in enumerate(items):
        why = _why(item, clique_id=clique_id, max_nodes=max_nodes, seen=seen)
        node = quote(item.get(de.NODE_NAME) if isinstance(item, dict) else None)
        if why:
            bad.append(BadEntry(name, position, node, why))
            continue
        entry = de.DaemonEntry.decode(item, "clique")
        if entry is None:  # unreachable: _why checked the node name
            continue
        seen.add(entry.node_name)
        if entry.index in holder:
            why = f"{de.INDEX} {entry.index} is also held by node {holder[entry.index]}"
            bad.append(BadEntry(name, position, node, why, skipped=False))
        else:
            holder[entry.index] = entry.node_name
        entries.append(entry)
    return CheckedClique(entries, bad)


def describe(bad: list[BadEntry]) -> str:
    """One line naming the first :data:`MAX_DESCRIBED` bad entries and counting the rest."""
    shown = "; ".join(b.describe() for b in bad[:MAX_DESCRIBED])
    more = len(bad) - MAX_DESCRIBED
    return shown + (f"; and {more} more" if more > 0 else "")
