"""Read-only views of the informer caches the reconcilers work from, and their index functions.

Owns the index names and the pure functions that compute them, so the manager can build the
informers with exactly the indexes the reconcilers query. Reconcilers never list from the API
server in their hot path; they read these caches and write through the client. Invariants:
objects returned by a cache are shared with the informer and must never be mutated (copy
first); a cache answers from its last synced state, so writes carry resourceVersion
preconditions and a 409 simply means "look again".
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from pkg.api import constants as c
from pkg.api.daemonentry import clique_daemons
from pkg.base.types import JSON

__all__ = [
    "BY_DOMAIN",
    "BY_NODE",
    "BY_UID",
    "Caches",
    "MergedCache",
    "ObjectCache",
    "allocated_node",
    "channel_domain_id",
    "index_by_allocated_node",
    "index_by_claim_domain",
    "index_by_clique_nodes",
    "index_by_domain_label",
    "index_by_pod_node",
    "index_by_slice_node",
    "index_by_uid",
    "slice_clique_ids",
]

IndexFunc = Callable[[JSON], list[str]]

BY_UID = "uid"
BY_DOMAIN = "computeDomain"
BY_NODE = "node"


class ObjectCache(Protocol):
    """A synced, indexed store of one resource (keys are ``namespace/name`` or ``name``)."""

    def get_by_key(self, key: str) -> JSON | None: ...

    def list(self) -> list[JSON]: ...

    def by_index(self, index: str, value: str) -> builtins.list[JSON]: ...

    def index_values(self, index: str) -> builtins.list[str]: ...


def index_by_uid(obj: JSON) -> list[str]:
    uid = obj.get("metadata", {}).get("uid")
    return [str(uid)] if uid else []


def index_by_domain_label(obj: JSON) -> list[str]:
    """The ComputeDomain UID an object belongs to, from its ``computeDomain`` label."""
    value = (obj.get("metadata", {}).get("labels") or {}).get(c.COMPUTE_DOMAIN_LABEL)
    return [str(value)] if value else []


def allocated_node(claim: JSON) -> str | None:
    """The node a claim is allocated on (``matchFields metadata.name`` of its node selector)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    selector = allocation.get("nodeSelector") or {}
    for term in selector.get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            values = field.get("values") or []
            if field.get("key") == "metadata.name" and field.get("operator") == "In" and values:
                return str(values[0])
    return None


def channel_domain_id(claim: JSON) -> str | None:
    """The ComputeDomain UID of an allocated channel claim of this driver, else ``None``."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    devices = allocation.get("devices") or {}
    requests = {
        r.get("request")
        for r in devices.get("results") or []
        if r.get("driver") == c.DRIVER_NAME and r.get("device") == c.CHANNEL_DEVICE_NAME
    }
    if not requests:
        return None
    for cfg in reversed(devices.get("config") or []):
        opaque = cfg.get("opaque") or {}
        params = opaque.get("parameters") or {}
        if opaque.get("driver") != c.DRIVER_NAME or params.get("kind") != c.CHANNEL_CONFIG_KIND:
            continue
        applies = cfg.get("requests") or []
        if (not applies or requests & {r.split("/")[0] for r in applies}) and params.get(
            "domainID"
        ):
            return str(params["domainID"])
    return None


def index_by_allocated_node(claim: JSON) -> list[str]:
    node = allocated_node(claim)
    return [node] if node and channel_domain_id(claim) else []


def index_by_claim_domain(claim: JSON) -> list[str]:
    uid = channel_domain_id(claim)
    return [uid] if uid else []


def index_by_pod_node(pod: JSON) -> list[str]:
    """The node a pod is bound to."""
    node = (pod.get("spec") or {}).get("nodeName")
    return [str(node)] if node else []


def index_by_clique_nodes(clique: JSON) -> list[str]:
    """The nodes a ComputeDomainClique has ``daemons[]`` entries for."""
    return sorted({e.node_name for e in clique_daemons(clique)})


def index_by_slice_node(slice_: JSON) -> list[str]:
    spec = slice_.get("spec") or {}
    if spec.get("driver") != c.DRIVER_NAME or not spec.get("nodeName"):
        return []
    return [str(spec["nodeName"])]


_CLIQUE_ATTRIBUTE_KEYS = ("cliqueID", f"{c.DRIVER_NAME}/cliqueID")


def slice_clique_ids(slice_: JSON) -> set[str]:
    """Non-empty ``cliqueID`` string attributes of the devices in a slice (the clique label
    and the controller's clique joins both read them)."""
    out = set()
    for device in (slice_.get("spec") or {}).get("devices") or []:
        attributes = device.get("attributes") or {}
        for key in _CLIQUE_ATTRIBUTE_KEYS:
            value = (attributes.get(key) or {}).get("string")
            if value:
                out.add(str(value))
    return out


class MergedCache:
    """One :class:`ObjectCache` over several, e.g. one informer per managed namespace.

    Keys are ``namespace/name``, so at most one part holds a key; ``list`` and ``by_index``
    concatenate the parts' answers in the order the parts were given. No parts: always
    empty (a resource the controller does not watch in this mode)."""

    def __init__(self, *parts: ObjectCache) -> None:
        self._parts = parts

    def get_by_key(self, key: str) -> JSON | None:
        """The object at ``key`` in the first part that holds it."""
        for part in self._parts:
            obj = part.get_by_key(key)
            if obj is not None:
                return obj
        return None

    def list(self) -> builtins.list[JSON]:
        """Every part's objects."""
        return [obj for part in self._parts for obj in part.list()]

    def by_index(self, index: str, value: str) -> builtins.list[JSON]:
        """Every part's objects whose ``index`` yields ``value``."""
        return [obj for part in self._parts for obj in part.by_index(index, value)]

    def index_values(self, index: str) -> builtins.list[str]:
        """The values ``index`` yields for some object of some part, sorted."""
        return sorted({v for part in self._parts for v in part.index_values(index)})


@dataclass(frozen=True)
class Caches:
    """Every cache the controller reads, with the indexes each must provide.

    ``compute_domains`` (all namespaces; BY_UID), ``daemonsets``/``pods``/``cliques`` (driver
    namespace and the additional ones, label ``computeDomain`` exists; cliques only with gate
    ``ComputeDomainCliques``; BY_DOMAIN, pods and cliques also BY_NODE: the
    pod's node, the nodes of a clique's entries), ``rcts`` (all namespaces, label
    exists; BY_DOMAIN), ``nodes`` (all; BY_DOMAIN), ``claims`` (all; BY_NODE, BY_DOMAIN),
    ``slices`` (all; BY_NODE).
    """

    compute_domains: ObjectCache
    daemonsets: ObjectCache
    pods: ObjectCache
    cliques: ObjectCache
    rcts: ObjectCache
    nodes: ObjectCache
    claims: ObjectCache
    slices: ObjectCache


INDEXES: dict[str, dict[str, IndexFunc]] = {
    "compute_domains": {BY_UID: index_by_uid},
    "daemonsets": {BY_DOMAIN: index_by_domain_label},
    "pods": {BY_DOMAIN: index_by_domain_label, BY_NODE: index_by_pod_node},
    "cliques": {BY_DOMAIN: index_by_domain_label, BY_NODE: index_by_clique_nodes},
    "rcts": {BY_DOMAIN: index_by_domain_label},
    "nodes": {BY_DOMAIN: index_by_domain_label},
    "claims": {BY_NODE: index_by_allocated_node, BY_DOMAIN: index_by_claim_domain},
    "slices": {BY_NODE: index_by_slice_node},
}
