"""Kubernetes resource descriptors: how a kind maps to REST paths.

Owns the `Resource` value type and the constants for every API the project talks to. A
`Resource` is immutable and hashable so it can key informer factories and fake-server tables.
Invariant: `path()` never returns a trailing slash and only adds `namespaces/<ns>` for
namespaced resources when a namespace is given (omitting it means "all namespaces").
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "COMPUTE_DOMAINS",
    "COMPUTE_DOMAIN_CLIQUES",
    "CUSTOM_RESOURCE_DEFINITIONS",
    "DAEMONSETS",
    "DEVICE_CLASSES",
    "EVENTS",
    "LEASES",
    "NAMESPACES",
    "NODES",
    "PODS",
    "RESOURCE_CLAIMS",
    "RESOURCE_CLAIM_TEMPLATES",
    "RESOURCE_SLICES",
    "SECRETS",
    "SELF_SUBJECT_REVIEWS",
    "WELL_KNOWN",
    "Resource",
]


@dataclass(frozen=True)
class Resource:
    """One REST resource (group/version/plural) and the kind its objects carry."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        """The `apiVersion` field value: "v1" for the core group, else "group/version"."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        """The ``kind`` of this resource's list objects (``<Kind>List``)."""
        return f"{self.kind}List"

    @property
    def prefix(self) -> str:
        """The API root: `/api/v1` or `/apis/<group>/<version>`."""
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def path(
        self,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
    ) -> str:
        """The URL path of the collection, an object or an object's subresource."""
        if subresource is not None and name is None:
            raise ValueError("a subresource needs an object name")
        if namespace is not None and not self.namespaced:
            raise ValueError(f"{self.plural} is cluster-scoped; no namespace allowed")
        parts = [self.prefix]
        if namespace is not None:
            parts += ["namespaces", namespace]
        parts.append(self.plural)
        if name is not None:
            parts.append(name)
        if subresource is not None:
            parts.append(subresource)
        return "/".join(parts)


PODS = Resource("", "v1", "pods", "Pod", namespaced=True)
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
EVENTS = Resource("", "v1", "events", "Event", namespaced=True)
DAEMONSETS = Resource("apps", "v1", "daemonsets", "DaemonSet", namespaced=True)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)
RESOURCE_SLICES = Resource(
    "resource.k8s.io", "v1", "resourceslices", "ResourceSlice", namespaced=False
)
RESOURCE_CLAIMS = Resource(
    "resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", namespaced=True
)
RESOURCE_CLAIM_TEMPLATES = Resource(
    "resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", namespaced=True
)
DEVICE_CLASSES = Resource("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", namespaced=False)
CUSTOM_RESOURCE_DEFINITIONS = Resource(
    "apiextensions.k8s.io",
    "v1",
    "customresourcedefinitions",
    "CustomResourceDefinition",
    namespaced=False,
)
COMPUTE_DOMAINS = Resource(
    "resource.nvidia.com", "v1beta1", "computedomains", "ComputeDomain", namespaced=True
)
COMPUTE_DOMAIN_CLIQUES = Resource(
    "resource.nvidia.com", "v1beta1", "computedomaincliques", "ComputeDomainClique", namespaced=True
)
# Only the local cluster's self-check (hack/localcluster/smoke.py) uses these two: whom a
# credential authenticates as (create-only, never stored) and what RBAC denies a node.
SECRETS = Resource("", "v1", "secrets", "Secret", namespaced=True)
SELF_SUBJECT_REVIEWS = Resource(
    "authentication.k8s.io", "v1", "selfsubjectreviews", "SelfSubjectReview", namespaced=False
)

# The kinds the fake API server stores.
WELL_KNOWN: tuple[Resource, ...] = (
    PODS,
    NODES,
    NAMESPACES,
    EVENTS,
    DAEMONSETS,
    LEASES,
    RESOURCE_SLICES,
    RESOURCE_CLAIMS,
    RESOURCE_CLAIM_TEMPLATES,
    DEVICE_CLASSES,
    CUSTOM_RESOURCE_DEFINITIONS,
    COMPUTE_DOMAINS,
    COMPUTE_DOMAIN_CLIQUES,
)
