"""Typed, validated views of ComputeDomain and ComputeDomainClique objects held as raw JSON.

Caches hold raw dicts (see pkg.informers); components call :func:`parse_compute_domain` at the
edge to get a frozen, validated view. Validation covers what the CRD schema cannot express, and
every error names the field so it can be surfaced verbatim in an Event or condition. The
membership entries (``status.nodes[]``, a clique's ``daemons[]``) are :mod:`pkg.api.daemonentry`'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pkg.api import constants as c
from pkg.api.daemonentry import DaemonEntry
from pkg.api.placement import PLACEMENT_ANNOTATION, PLACEMENTS, SINGLE_CLIQUE
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
    # The opt-in of `pkg.api.placement` (annotation ``resource.nvidia.com/placement``).
    single_clique: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def validate_name(value: str, *, field: str) -> None:
    if not value:
        raise InvalidComputeDomainError(f"{field}: Required value")
    if len(value) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(value):
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
    annotations = meta.get("annotations") or {}
    placement = annotations.get(PLACEMENT_ANNOTATION) if isinstance(annotations, dict) else None
    if placement is not None and placement not in PLACEMENTS:
        supported = ", ".join(f'"{p}"' for p in PLACEMENTS)
        raise InvalidComputeDomainError(
            f'metadata.annotations[{PLACEMENT_ANNOTATION}]: Unsupported value "{placement}": '
            f"supported values: {supported} (or no annotation: upstream's placement)"
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
        single_clique=placement == SINGLE_CLIQUE,
    )


# -- status helpers (pure) ----------------------------------------------------------------------

CONDITION_READY = "Ready"
CONDITION_SINGLE_CLIQUE = "SingleClique"
CONDITION_IMEX_CONNECTED = "IMEXConnected"
CONDITION_CLIQUE_ENTRIES_VALID = "CliqueEntriesValid"


def required_nodes(num_nodes: int) -> int:
    """Nodes needed before a domain can be Ready: ``numNodes``, but never fewer than one.

    Upstream reports a domain with ``numNodes: 0`` and no nodes as Ready; a domain that has
    no IMEX daemon anywhere cannot serve a workload, so at least one member is required.
    """
    return max(num_nodes, 1)


def global_status(nodes: list[DaemonEntry], *, num_nodes: int) -> str:
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
