"""CustomResourceDefinitions of ``resource.nvidia.com/v1beta1``: the single source of truth.

``config/crd/*.yaml`` is generated from :func:`custom_resource_definitions` by
``hack/gen-crds.py`` and checked for drift in ``hack/check.sh``. The schemas accept every manifest
the upstream CRDs accept (same fields, enums, defaults and minimums, spec immutability by CEL),
except a ``numNodes`` above :data:`pkg.api.computedomain.MAX_NUM_NODES` (upstream has no maximum
and such a domain waits forever) and a membership entry (clique ``daemons[]``, ``status.nodes[]``)
that no daemon writes: an ``ipAddress`` that is not a canonical IP literal without a
zone, a node name that is no DNS subdomain, a cliqueID that is no label value, and strings and
lists longer than the bounds in :mod:`pkg.api.daemonentry`. Every entry upstream's daemons and
controller write passes. They add what upstream lacks: the short name ``cd``, printer columns
and ``status.conditions``.
"""

from __future__ import annotations

from pkg.api import constants as c
from pkg.api import daemonentry as de
from pkg.api.computedomain import MAX_NUM_NODES
from pkg.base.types import JSON

_STATUS_ENUM: JSON = {
    "type": "string",
    "enum": [c.STATUS_READY, c.STATUS_NOT_READY],
}


LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
"""A label value (empty allowed; length checked apart)."""
CANONICAL_IP_RULE = "self == '' || (isIP(self) && ip.isCanonical(self))"
"""CEL (Kubernetes 1.31+): empty, or an IP literal exactly as Go's netip prints it; ``isIP``
refuses a zone (``fe80::1%eth0``) and IPv4-mapped IPv6. Python's ``ipaddress`` prints the same
canonical text (:func:`pkg.imex.nodesconfig.is_canonical_ip`)."""


def _node_name_schema(description: str) -> JSON:
    return {
        "type": "string",
        "maxLength": de.MAX_NODE_NAME_LENGTH,
        "pattern": de.NODE_NAME_PATTERN,
        "description": description,
    }


def _node_entry_schema(*, name_field: str, description: str) -> JSON:
    return {
        "type": "object",
        "description": description,
        "required": [name_field, de.IP_ADDRESS, de.CLIQUE_ID],
        "properties": {
            name_field: _node_name_schema("Kubernetes node name."),
            de.IP_ADDRESS: {
                "type": "string",
                "maxLength": de.MAX_IP_ADDRESS_LENGTH,
                "description": (
                    "Pod IP of the IMEX daemon on that node: a canonical IPv4 or IPv6 "
                    "literal without a zone."
                ),
                "x-kubernetes-validations": [
                    {
                        "rule": CANONICAL_IP_RULE,
                        "message": (
                            "must be a canonical IPv4 or IPv6 address without a zone "
                            "(for example 10.0.0.1 or fd00::1)"
                        ),
                    }
                ],
            },
            de.CLIQUE_ID: {
                "type": "string",
                "maxLength": de.MAX_CLIQUE_ID_LENGTH,
                "pattern": LABEL_VALUE_PATTERN,
                "description": (
                    "NVLink clique of the node, <clusterUUID>.<cliqueId>; empty on nodes "
                    "without a multi-node NVLink fabric."
                ),
            },
            de.INDEX: {
                "type": "integer",
                "minimum": -1,
                "maximum": de.MAX_CLIQUE_DAEMONS - 1,
                "description": (
                    "Stable slot of the daemon in its clique's IMEX node list "
                    "(unique per cliqueID; -1 for nodes without a clique)."
                ),
            },
            de.STATUS: {
                **_STATUS_ENUM,
                "default": c.STATUS_NOT_READY,
                "description": "Readiness of the IMEX daemon on that node.",
            },
        },
    }


_CONDITION_SCHEMA: JSON = {
    "type": "object",
    "description": "Standard Kubernetes condition (metav1.Condition).",
    "required": ["type", "status", "lastTransitionTime", "reason", "message"],
    "properties": {
        "type": {"type": "string", "maxLength": 316},
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
        "lastTransitionTime": {"type": "string", "format": "date-time"},
        "reason": {"type": "string", "maxLength": 1024},
        "message": {"type": "string", "maxLength": 32768},
    },
}


def _compute_domain_schema() -> JSON:
    spec: JSON = {
        "type": "object",
        "description": "Desired state; immutable after creation.",
        "required": ["channel"],
        "x-kubernetes-validations": [
            {"rule": "self == oldSelf", "message": "A computeDomain.spec is immutable"}
        ],
        "properties": {
            "numNodes": {
                "type": "integer",
                "minimum": 0,
                "maximum": MAX_NUM_NODES,
                "default": 0,
                "description": (
                    "Deprecated. Minimum number of nodes that must be Ready before the "
                    "ComputeDomain reports Ready; 0 means no minimum beyond at least one node. "
                    f"At most {MAX_NUM_NODES}, the largest cluster Kubernetes supports."
                ),
            },
            "channel": {
                "type": "object",
                "description": "The IMEX channel workloads receive.",
                "required": ["resourceClaimTemplate"],
                "properties": {
                    "resourceClaimTemplate": {
                        "type": "object",
                        "description": (
                            "The ResourceClaimTemplate the driver creates in this namespace "
                            "for the workload's pods to reference."
                        ),
                        "required": ["name"],
                        "properties": {
                            "name": {
                                "type": "string",
                                "description": "Name of the ResourceClaimTemplate.",
                            }
                        },
                    },
                    "allocationMode": {
                        "type": "string",
                        "enum": [c.ALLOCATION_MODE_ALL, c.ALLOCATION_MODE_SINGLE],
                        "default": c.ALLOCATION_MODE_SINGLE,
                        "description": (
                            "Single injects one IMEX channel; All injects all 2048 channels."
                        ),
                    },
                },
            },
        },
    }
    status: JSON = {
        "type": "object",
        "description": "Observed state, written by the controller.",
        "required": ["status"],
        "properties": {
            "status": {
                **_STATUS_ENUM,
                "default": c.STATUS_NOT_READY,
                "description": "Ready once every member node's IMEX daemon is Ready.",
            },
            de.STATUS_NODES: {
                "type": "array",
                "description": "One entry per node running an IMEX daemon of this domain.",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": [de.STATUS_NODE_NAME],
                "maxItems": MAX_NUM_NODES,
                "items": _node_entry_schema(
                    name_field=de.STATUS_NODE_NAME, description="An IMEX daemon of this domain."
                ),
            },
            "readyNodes": {
                "type": "integer",
                "minimum": 0,
                "description": "Number of entries in nodes whose status is Ready.",
            },
            "nodeCount": {
                "type": "integer",
                "minimum": 0,
                "description": "Number of entries in nodes.",
            },
            "conditions": {
                "type": "array",
                "description": (
                    "Ready (with the reason it is not), SingleClique (False: the nodes span "
                    "several NVLink cliques), IMEXConnected (False: some IMEX daemons "
                    "cannot reach their clique peers) and CliqueEntriesValid (False: "
                    "malformed clique entries, skipped)."
                ),
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
                "items": _CONDITION_SCHEMA,
            },
        },
    }
    return {
        "type": "object",
        "description": (
            "ComputeDomain forms a multi-node NVLink (IMEX) domain around the pods that "
            "reference its ResourceClaimTemplate."
        ),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


_PEER_FIELDS: JSON = {
    de.CONNECTED_PEERS: {
        "type": "integer",
        "minimum": 0,
        "maximum": de.MAX_CLIQUE_DAEMONS,
        "description": (
            "Members of this clique the node's IMEX is connected to (nvidia-imex-ctl -N); "
            "absent until the daemon reported."
        ),
    },
    de.UNREACHABLE_PEERS: {
        "type": "array",
        "maxItems": de.MAX_CLIQUE_DAEMONS,
        "items": _node_name_schema("Node name of a clique member."),
        "description": (
            "Node names of clique members the node's IMEX is not connected to "
            "(nvidia-imex-ctl -N); absent until the daemon reported."
        ),
    },
}


def _clique_schema() -> JSON:
    daemon = _node_entry_schema(
        name_field=de.NODE_NAME, description="An IMEX daemon in this clique."
    )
    daemon["properties"].update(_PEER_FIELDS)
    return {
        "type": "object",
        "description": (
            "ComputeDomainClique records the IMEX daemons of one ComputeDomain on one NVLink "
            "clique; written by the daemons, read by the controller and kubelet plugin."
        ),
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            de.DAEMONS: {
                "type": "array",
                "description": (
                    "One entry per daemon, keyed by node name; at most "
                    f"{de.MAX_CLIQUE_DAEMONS} (an IMEX domain's daemons)."
                ),
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": [de.NODE_NAME],
                "maxItems": de.MAX_CLIQUE_DAEMONS,
                "items": daemon,
            },
        },
    }


def _crd(
    *,
    kind: str,
    plural: str,
    schema: JSON,
    short_names: list[str],
    status: bool,
    columns: list[JSON],
) -> JSON:
    version: JSON = {
        "name": c.VERSION,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": schema},
    }
    if status:
        version["subresources"] = {"status": {}}
    if columns:
        version["additionalPrinterColumns"] = columns
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{c.GROUP}"},
        "spec": {
            "group": c.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short_names,
                "categories": ["nvidia"],
            },
            "versions": [version],
        },
    }


def custom_resource_definitions() -> list[JSON]:
    """Both CRDs, ready to apply."""
    cd_columns: list[JSON] = [
        {"name": "Status", "type": "string", "jsonPath": ".status.status"},
        {"name": "Ready", "type": "integer", "jsonPath": ".status.readyNodes"},
        {"name": "Nodes", "type": "integer", "jsonPath": ".status.nodeCount"},
        {"name": "Min-Nodes", "type": "integer", "jsonPath": ".spec.numNodes", "priority": 1},
        {
            "name": "Single-Clique",
            "type": "string",
            "jsonPath": ".status.conditions[?(@.type=='SingleClique')].status",
        },
        {
            "name": "IMEX-Connected",
            "type": "string",
            "jsonPath": ".status.conditions[?(@.type=='IMEXConnected')].status",
            "priority": 1,
        },
        {
            "name": "Reason",
            "type": "string",
            "jsonPath": ".status.conditions[?(@.type=='Ready')].reason",
            "priority": 1,
        },
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return [
        _crd(
            kind=c.COMPUTE_DOMAIN_KIND,
            plural="computedomains",
            schema=_compute_domain_schema(),
            short_names=["cd"],
            status=True,
            columns=cd_columns,
        ),
        _crd(
            kind=c.COMPUTE_DOMAIN_CLIQUE_KIND,
            plural="computedomaincliques",
            schema=_clique_schema(),
            short_names=["cdclique"],
            status=False,
            columns=[{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}],
        ),
    ]
