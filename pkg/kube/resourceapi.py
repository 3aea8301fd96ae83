"""Which ``resource.k8s.io`` version this cluster serves, and the edge that speaks it.

Owns the one decision both the controller and the kubelet plugin make at start: Kubernetes
1.34+ serves ``resource.k8s.io/v1``, 1.33 ``v1beta2`` (and v1beta1), 1.32 ``v1beta1``. The
project's code always works in v1 shapes and with the v1 `Resource` constants of
`pkg.kube.resources`; a `ResourceApi` given to `pkg.kube.client.RestClient` maps those onto the
served version on the wire (paths, ``apiVersion``, the shape differences of
`pkg.kube.resourceconvert`).

Upstream (``k8s.io/dynamic-resource-allocation/client``, used by the Go driver for every
resource.k8s.io call) decides per call instead: it tries its last working version (v1 first)
and, on a 404, the next one of v1 → v1beta2 → v1beta1. Here the choice is made once, from the
group's discovery document (``GET /apis/resource.k8s.io``), so a cluster without a supported
version is refused at start with the versions it does serve named, and a 404 for a missing
object never costs extra requests.

Invariants: the preference is v1 > v1beta2 > v1beta1 whatever order the server lists them in;
with v1 chosen `ResourceApi` changes nothing (same paths, same bodies, same objects);
`wait_for_resource_api` retries only what may pass (connection failures, 5xx, 429) and gives
up at once on a definite answer (group or versions not served, 401/403).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from typing import Protocol

from pkg.base.clock import Clock
from pkg.base.types import JSON
from pkg.kube.errors import ApiError, ConnectionFailedError, NotFoundError
from pkg.kube.resourceconvert import GROUP, from_served, to_served
from pkg.kube.resources import Resource

__all__ = [
    "GROUP",
    "SUPPORTED_VERSIONS",
    "V1",
    "GroupDiscovery",
    "ResourceApi",
    "UnsupportedResourceApiError",
    "choose_version",
    "discover_resource_api",
    "use_served_resource_api",
    "wait_for_resource_api",
]

log = logging.getLogger(__name__)

V1 = "v1"
# Most preferred first (upstream's order).
SUPPORTED_VERSIONS = (V1, "v1beta2", "v1beta1")
# Retry delays of `wait_for_resource_api`: doubling from the first, capped at the last.
_FIRST_RETRY = 1.0
_MAX_RETRY = 30.0


class UnsupportedResourceApiError(Exception):
    """The cluster serves no resource.k8s.io version this driver speaks (Kubernetes < 1.32,
    or DRA turned off)."""


class GroupDiscovery(Protocol):
    """The one discovery call needed: an API group's document."""

    def api_group(self, group: str) -> JSON:
        """``GET /apis/<group>``: the APIGroup (``versions[].version``). `NotFoundError` when
        the server does not serve the group; other `ApiError`s or `ConnectionFailedError` on
        failure."""
        ...


class ResourceApiClient(GroupDiscovery, Protocol):
    """A client that discovers the version and then speaks it (`pkg.kube.client.RestClient`)."""

    def use_resource_api(self, api: ResourceApi) -> None:
        """Speak ``api``'s version from now on; called before other threads use the client."""
        ...


def choose_version(served: list[str]) -> str:
    """The most preferred of `SUPPORTED_VERSIONS` in ``served``; `UnsupportedResourceApiError`
    naming ``served`` when none is."""
    for version in SUPPORTED_VERSIONS:
        if version in served:
            return version
    found = ", ".join(f"{GROUP}/{v}" for v in served) if served else "none"
    raise UnsupportedResourceApiError(
        f"the cluster serves no supported {GROUP} version (found: {found}; supported: "
        f"{', '.join(SUPPORTED_VERSIONS)}, i.e. Kubernetes 1.32 or newer with DRA enabled)"
    )


@dataclass(frozen=True)
class ResourceApi:
    """The served resource.k8s.io ``version`` and the mapping of v1 requests onto it."""

    version: str = V1

    def converts(self, resource: Resource) -> bool:
        """Whether requests for ``resource`` (a v1 `Resource`) go out differently."""
        return self.version != V1 and resource.group == GROUP and resource.version == V1

    def wire(self, resource: Resource) -> Resource:
        """The `Resource` to address on the wire for ``resource`` (itself unless converted)."""
        return replace(resource, version=self.version) if self.converts(resource) else resource

    def outgoing(self, resource: Resource, obj: JSON) -> JSON:
        """The v1-shaped body ``obj`` as the served version expects it."""
        if not self.converts(resource):
            return obj
        return to_served(resource.kind, obj, self.version)

    def incoming(self, resource: Resource, obj: JSON) -> JSON:
        """An object or list of ``resource`` from the served version, in v1 shape; any other
        answer (a Status, a PartialObjectMetadata) unchanged."""
        if not self.converts(resource):
            return obj
        kind = obj.get("kind")
        if kind == resource.list_kind:
            items = [from_served(resource.kind, i, self.version) for i in obj.get("items") or []]
            return {**obj, "apiVersion": f"{GROUP}/{V1}", "items": items}
        if kind not in (None, resource.kind):
            return obj
        return from_served(resource.kind, obj, self.version)


def discover_resource_api(client: GroupDiscovery) -> ResourceApi:
    """One discovery request: the `ResourceApi` of the version to use. Raises
    `UnsupportedResourceApiError` when the group or every supported version is missing,
    `ApiError`/`ConnectionFailedError` when the request fails."""
    try:
        doc = client.api_group(GROUP)
    except NotFoundError as err:
        raise UnsupportedResourceApiError(
            f"the cluster does not serve the {GROUP} API group (Kubernetes 1.32 or newer with "
            f"DRA enabled is needed): {err}"
        ) from err
    served = [str(v.get("version")) for v in doc.get("versions") or [] if isinstance(v, dict)]
    return ResourceApi(choose_version(served))


def _transient(err: Exception) -> bool:
    if isinstance(err, ConnectionFailedError):
        return True
    return isinstance(err, ApiError) and (err.status >= 500 or err.status == 429)


def wait_for_resource_api(
    client: GroupDiscovery, *, clock: Clock, stop: threading.Event
) -> ResourceApi | None:
    """`discover_resource_api`, retried with doubling delays (1 s → 30 s) while the API server
    is unreachable or answers 5xx/429; ``None`` when ``stop`` is set first. Logs the chosen
    version once. Raises `UnsupportedResourceApiError` and other `ApiError`s at once."""
    delay = _FIRST_RETRY
    while not stop.is_set():
        try:
            api = discover_resource_api(client)
        except (ApiError, ConnectionFailedError) as err:
            if not _transient(err):
                raise
            log.warning("discovering %s failed (retrying in %.0fs): %s", GROUP, delay, err)
            if clock.wait(stop, delay):
                return None
            delay = min(delay * 2, _MAX_RETRY)
            continue
        log.info("using %s/%s", GROUP, api.version)
        return api
    return None


def use_served_resource_api(
    client: ResourceApiClient, *, clock: Clock, stop: threading.Event
) -> bool:
    """`wait_for_resource_api`, then make ``client`` speak the version found. False when
    ``stop`` was set first (nothing applied); raises as `wait_for_resource_api` does."""
    api = wait_for_resource_api(client, clock=clock, stop=stop)
    if api is None:
        return False
    client.use_resource_api(api)
    return True
