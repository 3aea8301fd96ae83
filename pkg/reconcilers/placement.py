"""Which NVLink clique a ``SingleClique`` ComputeDomain is pinned to (`pkg.api.placement`).

Owns the choice the controller makes once, before it creates such a domain's workload
ResourceClaimTemplate. Reads only the caches: the nodes' ResourceSlices of this driver (each
node's ``channel-0`` and its ``cliqueID`` attribute, and the taint of the domain that uses
it), the Nodes (which domain a node is labelled for), the ComputeDomains and the workload
templates already pinned.

A node has room for the domain when it publishes a ``channel-0`` of a clique (``cliqueID`` not
empty and well-formed), its Node exists and is not being deleted, and neither its label nor its
channel's taint names another domain. Room a clique still owes to the other ``SingleClique``
domains pinned to it (their ``numNodes`` less the nodes already theirs there) is subtracted, so
two domains created together are not both sent to a clique that holds only one of them.
The clique with the most room wins (ties: the smaller clique ID, so a choice is repeatable); a
domain with ``numNodes`` > 0 is pinned only to a clique with room for all of them, and
otherwise waits with `REASON_NO_CLIQUE_FITS`, re-checked every `RECHECK` seconds. Pure
functions over the caches; nothing here writes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pkg.api import constants as c
from pkg.api.computedomain import ComputeDomain, InvalidComputeDomainError, parse_compute_domain
from pkg.api.placement import pinned_clique, valid_clique_id
from pkg.base.types import JSON
from pkg.reconcilers.cache import BY_DOMAIN, BY_NODE, Caches
from pkg.reconcilers.conditions import REASON_NO_CLIQUE_FITS
from pkg.reconcilers.status import Problem

__all__ = [
    "REASON_PINNED_TO_CLIQUE",
    "RECHECK",
    "CliqueRoom",
    "choose_clique",
    "clique_rooms",
]

REASON_PINNED_TO_CLIQUE = "PinnedToClique"  # the Normal Event of the choice
RECHECK = 15.0  # seconds: nodes and slices change without an event for the waiting domain


@dataclass(frozen=True)
class CliqueRoom:
    """One clique's nodes with room for the domain, and what other pinned domains still need."""

    clique: str
    free: int
    reserved: int

    @property
    def room(self) -> int:
        return self.free - self.reserved


def _channel(slice_: JSON) -> JSON | None:
    """This driver's ``channel-0`` in ``slice_`` (None: another driver's or none)."""
    spec = slice_.get("spec") or {}
    if spec.get("driver") != c.DRIVER_NAME:
        return None
    for device in spec.get("devices") or []:
        if isinstance(device, dict) and device.get("name") == c.CHANNEL_DEVICE_NAME:
            return device
    return None


def _clique_of(device: JSON) -> str:
    """The device's ``cliqueID`` (short or driver-qualified attribute name; ``""`` if absent or
    malformed)."""
    attrs = device.get("attributes") or {}
    if not isinstance(attrs, dict):
        return ""
    attr = attrs.get("cliqueID") or attrs.get(f"{c.DRIVER_NAME}/cliqueID") or {}
    value = attr.get("string", "") if isinstance(attr, dict) else ""
    return value if isinstance(value, str) and valid_clique_id(value) else ""


def _used_by_other(device: JSON, uid: str) -> bool:
    return any(
        isinstance(taint, dict)
        and taint.get("key") == c.COMPUTE_DOMAIN_LABEL
        and taint.get("value") != uid
        for taint in device.get("taints") or []
    )


def _pinned_domains(
    caches: Caches, uid: str, recent: Mapping[str, str]
) -> Iterable[tuple[ComputeDomain, str]]:
    """The other existing domains with a workload template pinned to a clique (``recent``:
    domain UID -> clique of templates created but maybe not in the cache yet)."""
    for obj in caches.compute_domains.list():
        try:
            other = parse_compute_domain(obj)
        except InvalidComputeDomainError:
            continue
        if other.uid == uid or other.deleting or not other.single_clique:
            continue
        clique = recent.get(other.uid, "")
        for rct in caches.rcts.by_index(BY_DOMAIN, other.uid):
            # Only the domain's own workload template pins it: another namespace's template
            # carrying its label is a stranger's object.
            if rct["metadata"].get("namespace") == other.namespace:
                clique = pinned_clique(rct) or clique
        if clique:
            yield other, clique


def clique_rooms(
    cd: ComputeDomain, caches: Caches, *, recent: Mapping[str, str] | None = None
) -> list[CliqueRoom]:
    """Every clique with a node that publishes a ``channel-0`` of it, with its room for
    ``cd`` (see the module docstring), in no particular order; ``recent`` as
    :func:`choose_clique`'s."""
    free: dict[str, int] = defaultdict(int)
    node_clique: dict[str, str] = {}
    for node_name in caches.slices.index_values(BY_NODE):
        node = caches.nodes.get_by_key(node_name)
        if node is None or node.get("metadata", {}).get("deletionTimestamp"):
            continue
        for slice_ in caches.slices.by_index(BY_NODE, node_name):
            device = _channel(slice_)
            clique = _clique_of(device) if device is not None else ""
            if not clique or device is None:
                continue
            node_clique[node_name] = clique
            labelled = (node.get("metadata", {}).get("labels") or {}).get(c.COMPUTE_DOMAIN_LABEL)
            if labelled not in (None, cd.uid) or _used_by_other(device, cd.uid):
                free.setdefault(clique, 0)
                break
            free[clique] += 1
            break
    reserved: dict[str, int] = defaultdict(int)
    for other, clique in _pinned_domains(caches, cd.uid, recent or {}):
        have = sum(
            1
            for n in caches.nodes.by_index(BY_DOMAIN, other.uid)
            if node_clique.get(str(n.get("metadata", {}).get("name", ""))) == clique
        )
        reserved[clique] += max(0, other.num_nodes - have)
    return [CliqueRoom(k, free[k], reserved.get(k, 0)) for k in free]


def choose_clique(
    cd: ComputeDomain, caches: Caches, *, recent: Mapping[str, str] | None = None
) -> tuple[str, Problem | None]:
    """``(clique, None)`` for the clique to pin ``cd`` to, or ``("", problem)`` while none has
    room for it (``REASON_NO_CLIQUE_FITS``, naming each clique's room). ``recent``: domain UID
    -> clique of the templates this controller pinned that the cache may not show yet."""
    rooms = clique_rooms(cd, caches, recent=recent)
    need = max(cd.num_nodes, 1)
    fits = sorted((r for r in rooms if r.room >= need), key=lambda r: (-r.room, r.clique))
    if fits:
        return fits[0].clique, None
    return "", Problem(REASON_NO_CLIQUE_FITS, _no_fit_message(need, rooms))


def _no_fit_message(need: int, rooms: Iterable[CliqueRoom]) -> str:
    listed = sorted(rooms, key=lambda r: (-r.room, r.clique))
    if not listed:
        where = "no node publishes a channel of an NVLink clique"
    else:
        where = "; ".join(
            f"clique {r.clique}: {max(r.room, 0)} free"
            + (f" ({r.reserved} held for other SingleClique domains)" if r.reserved else "")
            for r in listed[:8]
        )
        if len(listed) > 8:
            where += f"; {len(listed) - 8} more"
    return (
        f"placement SingleClique needs {need} node(s) with a free IMEX channel in one NVLink "
        f"clique and no clique has them ({where}); the workload ResourceClaimTemplate is "
        f"created once one does (free nodes, fewer numNodes, or remove the annotation "
        f"resource.nvidia.com/placement)"
    )
