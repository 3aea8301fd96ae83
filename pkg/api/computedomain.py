"""Typed, validated views of ComputeDomain and ComputeDomainClique objects held as raw JSON.

Caches hold raw dicts (see pkg.informers); components call :func:`parse_compute_domain` at the
edge to get a frozen, validated view. Validation covers what the CRD schema cannot express, and
every error names the field so it can be surfaced verbatim in an Event or condition.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pkg.api import constants as c
from pkg.base.types import JSON

MAX_NUM_NODES = 5000
"""Largest accepted ``spec.numNodes``: a ComputeDomain has at most one IMEX daemon per node,
and 5,000 nodes is the largest cluster Kubernetes supports (its documented scalability limit,
also the largest cluster it is tested at), so a larger value could never be satisfied and the
domain would wait forever. Far above any NVLink domain (18 nodes per GB200/GB300 NVL72 clique;
a domain may span several cliques). Enforced by the CRD schema and by :func:`parse_compute_
domain` (objects stored before the limit existed)."""

_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)


class InvalidComputeDomainError(ValueError):
    """A ComputeDomain that cannot be reconciled; the message names the field."""


@dataclass(frozen=True)
class ComputeDomain:
    """The fields of a ComputeDomain the driver acts on."""

    namespace: str
    name: str
    uid: str
    generation: int
    num_nodes: int
    resource_claim_template_name: str
    allocation_mode: str
    deleting: bool

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class NodeEntry:
    """One IMEX daemon: a ``status.nodes[]`` item or a clique's ``daemons[]`` item."""

    name: str
    ip_address: str
    clique_id: str
    index: int
    status: str
    connected_peers: int | None = None
    """Clique members this node's IMEX is connected to (clique entries only; None: unknown)."""
    unreachable_peers: tuple[str, ...] | None = None
    """Clique members this node's IMEX cannot reach (clique entries only; None: unknown)."""

    def to_status_node(self) -> JSON:
        return {
            "name": self.name,
            "ipAddress": self.ip_address,
            "cliqueID": self.clique_id,
            "index": self.index,
            "status": self.status,
        }

    @classmethod
    def from_clique_daemon(cls, item: JSON) -> NodeEntry:
        """The entry of a clique's ``daemons[]`` item, with its peer report if it has one."""
        connected = item.get("connectedPeers")
        unreachable = item.get("unreachablePeers")
        return cls(
            name=str(item.get("nodeName", "")),
            ip_address=str(item.get("ipAddress", "")),
            clique_id=str(item.get("cliqueID", "")),
            index=int(item.get("index", -1)),
            status=str(item.get("status") or c.STATUS_NOT_READY),
            connected_peers=connected if isinstance(connected, int) else None,
            unreachable_peers=(
                tuple(str(n) for n in unreachable) if isinstance(unreachable, list) else None
            ),
        )


def validate_name(value: str, *, field: str) -> None:
    if not value:
        raise InvalidComputeDomainError(f"{field}: Required value")
    if len(value) > 253 or not _DNS1123_SUBDOMAIN.match(value):
        raise InvalidComputeDomainError(
            f'{field}: Invalid value "{value}": must be a lowercase RFC 1123 subdomain '
            "(lowercase alphanumerics, '-' or '.', at most 253 characters)"
        )


def parse_compute_domain(obj: JSON) -> ComputeDomain:
    """Validate ``obj`` and return its view, or raise :class:`InvalidComputeDomainError`."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise InvalidComputeDomainError("spec: Required value")
    channel = spec.get("channel")
    if not isinstance(channel, dict):
        raise InvalidComputeDomainError("spec.channel: Required value")
    rct = channel.get("resourceClaimTemplate")
    rct_name = rct.get("name") if isinstance(rct, dict) else None
    if not isinstance(rct_name, str):
        raise InvalidComputeDomainError("spec.channel.resourceClaimTemplate.name: Required value")
    validate_name(rct_name, field="spec.channel.resourceClaimTemplate.name")
    mode = channel.get("allocationMode") or c.ALLOCATION_MODE_SINGLE
    if mode not in (c.ALLOCATION_MODE_SINGLE, c.ALLOCATION_MODE_ALL):
        raise InvalidComputeDomainError(
            f'spec.channel.allocationMode: Unsupported value "{mode}": '
            'supported values: "All", "Single"'
        )
    num_nodes = spec.get("numNodes", 0)
    if not isinstance(num_nodes, int) or isinstance(num_nodes, bool) or num_nodes < 0:
        raise InvalidComputeDomainError(
            f"spec.numNodes: Invalid value {num_nodes!r}: must be an integer >= 0"
        )
    if num_nodes > MAX_NUM_NODES:
        raise InvalidComputeDomainError(
            f"spec.numNodes: Invalid value {num_nodes}: must be less than or equal to "
            f"{MAX_NUM_NODES} (no cluster has more nodes)"
        )
    return ComputeDomain(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        generation=int(meta.get("generation", 0)),
        num_nodes=num_nodes,
        resource_claim_template_name=rct_name,
        allocation_mode=mode,
        deleting=bool(meta.get("deletionTimestamp")),
    )


def daemon_items(clique: JSON | None) -> list[JSON]:
    """The raw ``daemons[]`` items of a ComputeDomainClique that are objects."""
    return [d for d in (clique or {}).get("daemons") or [] if isinstance(d, dict)]


_TAIL_KEYS = ("nodeName", "ipAddress", "cliqueID", "index")


def guarded_append_ops(items: list[JSON], new: list[JSON]) -> list[JSON]:
    """JSON-patch operations appending ``new`` to a non-empty ``daemons[]`` list ``items`` only
    if the list still ends with ``items[-1]`` (``test`` of its node, IP, clique and index at
    that position) and each new entry lands right after it. Entries are only ever appended,
    changed in place or removed, so the guard holds only if no entry was added or removed
    since ``items`` was read; in-place status patches of other entries do not break it, and
    the API server's list-map key check refuses a second entry of a node."""
    n, last = len(items), items[-1]
    ops: list[JSON] = [
        {"op": "test", "path": f"/daemons/{n - 1}/{k}", "value": last[k]}
        for k in _TAIL_KEYS
        if k in last
    ]
    for i, entry in enumerate(new):
        ops.append({"op": "add", "path": "/daemons/-", "value": entry})
        ops.append({"op": "test", "path": f"/daemons/{n + i}/nodeName",
                    "value": entry["nodeName"]})  # fmt: skip
    return ops


def clique_daemons(clique: JSON) -> list[NodeEntry]:
    """The ``daemons[]`` of a ComputeDomainClique, skipping malformed items."""
    out = []
    for item in clique.get("daemons") or []:
        if isinstance(item, dict) and item.get("nodeName"):
            out.append(NodeEntry.from_clique_daemon(item))
    return out


# -- status helpers (pure) ----------------------------------------------------------------------

CONDITION_READY = "Ready"
CONDITION_SINGLE_CLIQUE = "SingleClique"
CONDITION_IMEX_CONNECTED = "IMEXConnected"


def required_nodes(num_nodes: int) -> int:
    """Nodes needed before a domain can be Ready: ``numNodes``, but never fewer than one.

    Upstream reports a domain with ``numNodes: 0`` and no nodes as Ready; a domain that has
    no IMEX daemon anywhere cannot serve a workload, so at least one member is required.
    """
    return max(num_nodes, 1)


def global_status(nodes: list[NodeEntry], *, num_nodes: int) -> str:
    """``Ready`` iff enough nodes joined and every one of them is Ready."""
    if len(nodes) < required_nodes(num_nodes):
        return c.STATUS_NOT_READY
    if any(node.status != c.STATUS_READY for node in nodes):
        return c.STATUS_NOT_READY
    return c.STATUS_READY


def find_condition(conditions: list[JSON], type_: str) -> JSON | None:
    for cond in conditions:
        if isinstance(cond, dict) and cond.get("type") == type_:
            return cond
    return None


def set_condition(
    conditions: list[JSON],
    *,
    type_: str,
    status: bool | str,
    reason: str,
    message: str,
    observed_generation: int,
    now: str,
) -> list[JSON]:
    """A copy of ``conditions`` with ``type_`` set (``metav1.Condition`` semantics).

    ``lastTransitionTime`` only moves when the status flips, so it tells how long the domain
    has been in its current state, not when the message last changed. ``status`` is a bool or
    one of ``"True"``, ``"False"``, ``"Unknown"``.
    """
    value = status if isinstance(status, str) else ("True" if status else "False")
    old = find_condition(conditions, type_)
    transition = now if old is None or old.get("status") != value else old["lastTransitionTime"]
    new: JSON = {
        "type": type_,
        "status": value,
        "observedGeneration": observed_generation,
        "lastTransitionTime": transition,
        "reason": reason,
        # The CRD caps messages at 32 KiB; a long node list must not make the write invalid.
        "message": message if len(message) <= 32000 else message[:31997] + "...",
    }
    out = [cond for cond in conditions if cond is not old]
    out.append(new)
    return sorted(out, key=lambda cond: str(cond.get("type")))


def status_nodes(status: JSON | None) -> list[NodeEntry]:
    """The ``status.nodes[]`` of a ComputeDomain as entries, skipping malformed items."""
    out = []
    for item in (status or {}).get("nodes") or []:
        if isinstance(item, dict) and item.get("name"):
            out.append(
                NodeEntry(
                    name=str(item["name"]),
                    ip_address=str(item.get("ipAddress", "")),
                    clique_id=str(item.get("cliqueID", "")),
                    index=int(item.get("index", -1)),
                    status=str(item.get("status") or c.STATUS_NOT_READY),
                )
            )
    return out
