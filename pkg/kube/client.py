"""Raw-JSON Kubernetes client: the `KubeClient` Protocol and its HTTP implementation.

Owns every byte the project sends to the API server. Objects are plain `dict`s decoded from the
wire (never the generated models, which drop unknown fields and are ~16x slower to build).
Invariants:
* HTTP failures become `pkg.kube.errors.ApiError` subclasses; transport failures become
  `ConnectionFailedError` (chained with `raise ... from`).
* Bodies are serialized here, so the generated client's content-type rewriting (a dict body sent
  as JSON patch silently becomes strategic merge) can never apply.
* Every request has a client-side timeout; watches get one longer than their server timeout so a
  half-dead TCP connection cannot hang a reflector forever.
* Callers always use the v1 ``resource.k8s.io`` resources and shapes; a cluster serving an older
  version is spoken to through the `ResourceApi` given to `RestClient.use_resource_api` (paths,
  bodies, answers and watch events converted here, at the edge). Without one, or with v1,
  requests go out unchanged.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator
from typing import Any, Literal, Protocol
from urllib.parse import urlencode

import urllib3

from pkg.base.types import JSON
from pkg.base.verbosity import V
from pkg.kube.errors import ConnectionFailedError, error_from_status
from pkg.kube.resourceapi import ResourceApi
from pkg.kube.resources import Resource
from pkg.kube.watch import HttpWatchStream, WatchEvent, WatchStream

__all__ = [
    "INITIAL_EVENTS_END",
    "JSON",
    "PARTIAL_OBJECT_METADATA",
    "PARTIAL_OBJECT_METADATA_LIST",
    "ApiConnection",
    "HttpWatchStream",
    "KubeClient",
    "PatchBody",
    "PatchType",
    "RestClient",
    "WatchEvent",
    "WatchStream",
]

log = logging.getLogger(__name__)
# client-go's round_trippers: one "Response" line per API request at klog V(6).
_ROUND_TRIPS = V(6)

# A JSON-patch body is a list of operations; every other patch type is an object.
PatchBody = JSON | list[JSON]
PatchType = Literal["merge", "json", "strategic", "apply"]

_PATCH_CONTENT_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",
}
# Accept header of client-go's metadata client (JSON flavour): objects come back as
# meta.k8s.io/v1 PartialObjectMetadata(List), i.e. apiVersion, kind and metadata only.
# Lists must ask for the List kind (kube-apiserver answers 406 to as=PartialObjectMetadata).
PARTIAL_OBJECT_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
PARTIAL_OBJECT_METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
# Annotation on the BOOKMARK that ends the initial events of a streaming watch-list.
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
# Seconds added to a watch's server timeout to form the client read timeout.
_WATCH_READ_SLACK = 30.0
# How long a watch with bookmarks may stay silent before the client calls it dead and watches
# again from its last resourceVersion. kube-apiserver sends every such watch a BOOKMARK at least
# once a minute (its watch cache's bookmark frequency), so silence this long means a connection
# that no longer delivers: a node cut off the network, a peer that forgot the connection. This
# is what client-go's HTTP/2 health check (ReadIdleTimeout 30 s + PingTimeout 15 s) does for
# its watches; an HTTP/1.1 stream has no ping, so its read deadline plays that part.
WATCH_IDLE_TIMEOUT = 90.0


class KubeClient(Protocol):
    """The API verbs the project uses, over raw JSON objects."""

    def get(
        self,
        resource: Resource,
        name: str,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> JSON:
        """The object ``name`` (or its ``subresource``). Raises `NotFoundError` if absent, other
        `ApiError` subclasses on failure.
        """
        ...

    def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        resource_version: str | None = None,
    ) -> JSON:
        """One LIST page as the API returns it (``items``, ``metadata.continue``,
        ``metadata.resourceVersion``). Pass ``continue_token`` to get the next page.
        """
        ...

    def create(self, resource: Resource, obj: JSON, *, namespace: str | None = None) -> JSON:
        """Create ``obj``; returns it as stored. `AlreadyExistsError` if the name is taken."""
        ...

    def update(self, resource: Resource, obj: JSON, *, subresource: str | None = None) -> JSON:
        """Replace ``obj`` (PUT; its ``metadata.resourceVersion`` is the precondition);
        `ConflictError` if it changed meanwhile: re-read and retry.
        """
        ...

    def patch(
        self,
        resource: Resource,
        name: str,
        body: PatchBody,
        *,
        namespace: str | None = None,
        patch_type: PatchType = "merge",
        subresource: str | None = None,
        field_manager: str | None = None,
        force: bool = False,
    ) -> JSON:
        """Patch ``name`` with ``body`` (``patch_type``: merge, json, strategic or apply; apply
        needs ``field_manager``, ``force`` takes fields over). Returns the patched object.
        """
        ...

    def delete(
        self,
        resource: Resource,
        name: str,
        *,
        namespace: str | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
        propagation_policy: str | None = None,
        grace_period_seconds: int | None = None,
    ) -> JSON | None:
        """Delete ``name`` with optional preconditions (``uid``, ``resource_version``); returns
        the server's answer. `NotFoundError` if already gone.
        """
        ...

    def watch(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resource_version: str,
        timeout_seconds: int,
        allow_watch_bookmarks: bool = True,
    ) -> WatchStream:
        """A WATCH from ``resource_version`` that ends after ``timeout_seconds`` at the latest.
        The stream may be stopped from another thread; a ``410 Gone`` surfaces as an ERROR event.
        """
        ...


def _selectors(label_selector: str | None, field_selector: str | None) -> dict[str, str]:
    """Query parameters of the selectors that are set (list and watch share them)."""
    query: dict[str, str] = {}
    if label_selector:
        query["labelSelector"] = label_selector
    if field_selector:
        query["fieldSelector"] = field_selector
    return query


def _decode(data: bytes) -> Any:
    try:
        return json.loads(data) if data else None
    except ValueError:
        return None


class _Throttle:
    """Client-side token bucket (client-go's QPS/Burst) so a busy controller cannot flood."""

    def __init__(
        self,
        qps: float,
        burst: int,
        *,
        monotonic: Callable[[], float] | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self._qps = qps
        self._burst = float(max(burst, 1))
        self._tokens = self._burst
        self._monotonic = monotonic or time.monotonic
        self._sleep = sleep or time.sleep
        self._last = self._monotonic()
        self._lock = threading.Lock()

    def wait(self) -> None:
        """Take one token, sleeping until it is due (tokens are reserved in call order)."""
        with self._lock:
            now = self._monotonic()
            self._tokens = min(self._burst, self._tokens + (now - self._last) * self._qps)
            self._last = now
            self._tokens -= 1.0
            delay = -self._tokens / self._qps if self._tokens < 0 else 0.0
        if delay > 0:
            self._sleep(delay)


class ApiConnection(Protocol):
    """What `RestClient` uses of the official client: its ``Configuration`` (``host``), the
    urllib3 pool of its ``rest.RESTClientObject`` (TLS, proxies, keepalive) and the credential
    step (bearer token, refreshed by the configuration's hook). `pkg.kube.config.Connection`
    (what `pkg.kube.config.load_api_client` returns) and ``kubernetes.client.ApiClient`` both
    provide it."""

    @property
    def configuration(self) -> Any:
        """The official client's ``Configuration`` (only ``host`` is read here)."""
        ...

    @property
    def rest_client(self) -> Any:
        """The official client's ``rest.RESTClientObject`` (only ``pool_manager`` is used)."""
        ...

    def update_params_for_auth(  # noqa: PLR0917 -- the official ApiClient's signature
        self,
        headers: dict[str, str],
        queries: list[tuple[str, str]],
        auth_settings: list[str],
        resource_path: str,
        method: str,
        body: Any,
    ) -> None:
        """Add the credentials named in ``auth_settings`` to ``headers`` / ``queries``."""
        ...


class RestClient:
    """`KubeClient` over a configured `ApiConnection` (host, TLS, auth, pool)."""

    def __init__(
        self,
        api_client: ApiConnection,
        *,
        request_timeout: tuple[float, float] = (10.0, 60.0),
        user_agent: str = "compute-domain-driver",
        qps: float | None = None,
        burst: int = 10,
        separate_groups: Collection[str] = (),
        watch_idle_timeout: float = WATCH_IDLE_TIMEOUT,
        monotonic: Callable[[], float] | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        """``qps``/``burst``: the client-side token bucket (None: unlimited), one for every
        request of this client, as a client-go clientset shares one limiter among all its
        group clients; each API group in ``separate_groups`` gets a bucket of the same size of
        its own, as a second clientset would (the Go driver's generated clientset for
        ``resource.nvidia.com`` beside its Kubernetes one). ``watch_idle_timeout``: see
        `WATCH_IDLE_TIMEOUT`. ``monotonic``/``sleep``: the limiter's clock (default: real time)."""
        self._api = api_client
        self._host = str(api_client.configuration.host).rstrip("/")
        self._pool: urllib3.PoolManager = api_client.rest_client.pool_manager
        self._timeout = request_timeout
        self._user_agent = user_agent
        self._throttle: _Throttle | None = None
        self._group_limits: dict[str, _Throttle] = {}
        if qps:
            self._throttle = _Throttle(qps, burst, monotonic=monotonic, sleep=sleep)
            self._group_limits = {
                group: _Throttle(qps, burst, monotonic=monotonic, sleep=sleep)
                for group in separate_groups
            }
        self._watch_idle = watch_idle_timeout
        self._resource_api = ResourceApi()

    def use_resource_api(self, api: ResourceApi) -> None:
        """Speak ``api``'s resource.k8s.io version from now on (`pkg.kube.resourceapi`); call
        it before other threads use this client (at start, after discovery)."""
        self._resource_api = api

    @property
    def resource_api(self) -> ResourceApi:
        """The resource.k8s.io version in use (v1 unless `use_resource_api` said otherwise)."""
        return self._resource_api

    def api_group(self, group: str) -> JSON:
        """See `pkg.kube.resourceapi.GroupDiscovery.api_group`."""
        out: JSON = self._call("GET", f"/apis/{group}")
        return out

    def close(self) -> None:
        """Close pooled connections (open watches are ended by their own `stop()`)."""
        self._pool.clear()

    def _throttle_for(self, path: str) -> _Throttle:
        """The bucket a request to ``path`` spends: its group's own, or the client's."""
        assert self._throttle is not None
        parts = path.split("/", 4)  # "", "apis", group, version, ...
        group = parts[2] if len(parts) > 2 and parts[1] == "apis" else ""
        return self._group_limits.get(group, self._throttle)

    # -- transport ---------------------------------------------------------------------------

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        read_timeout: float | None = None,
        accept: str = "application/json",
    ) -> urllib3.BaseHTTPResponse:
        """Issue one request; returns the unread (streaming) response or raises."""
        if self._throttle is not None:
            self._throttle_for(path).wait()
        headers = {"Accept": accept, "User-Agent": self._user_agent}
        queries: list[tuple[str, str]] = list((query or {}).items())
        self._api.update_params_for_auth(headers, queries, ["BearerToken"], path, method, body)
        payload: bytes | None = None
        if body is not None:
            headers["Content-Type"] = content_type
            payload = json.dumps(body, separators=(",", ":")).encode()
        url = self._host + path + ("?" + urlencode(queries) if queries else "")
        timeout = urllib3.Timeout(
            connect=self._timeout[0], read=read_timeout if read_timeout else self._timeout[1]
        )
        started = time.monotonic()
        try:
            resp = self._pool.request(
                method, url, body=payload, headers=headers, timeout=timeout, preload_content=False
            )
        except urllib3.exceptions.HTTPError as exc:
            raise ConnectionFailedError(f"{method} {path}: {exc}") from exc
        if log.isEnabledFor(_ROUND_TRIPS):
            log.log(
                _ROUND_TRIPS,
                "Response",
                extra={
                    "verb": method,
                    "url": url,
                    "status": f"{resp.status} {resp.reason or ''}".strip(),
                    "milliseconds": int((time.monotonic() - started) * 1000),
                },
            )
        return resp

    @staticmethod
    def _raise_for_status(resp: urllib3.BaseHTTPResponse) -> None:
        if resp.status < 400:
            return
        try:
            body = _decode(resp.read())
        except urllib3.exceptions.HTTPError:
            body = None
        finally:
            resp.release_conn()
        raise error_from_status(resp.status, body if isinstance(body, dict) else None)

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> Any:
        resp = self._send(
            method, path, query=query, body=body, content_type=content_type, accept=accept
        )
        self._raise_for_status(resp)
        try:
            data = resp.read()
        except urllib3.exceptions.HTTPError as exc:
            raise ConnectionFailedError(f"{method} {path}: {exc}") from exc
        finally:
            resp.release_conn()
        return _decode(data)

    # -- verbs -------------------------------------------------------------------------------

    def get(
        self,
        resource: Resource,
        name: str,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> JSON:
        """See `KubeClient.get`."""
        wire = self._resource_api.wire(resource)
        out: JSON = self._call("GET", wire.path(namespace, name, subresource))
        return self._resource_api.incoming(resource, out)

    def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        resource_version: str | None = None,
        metadata_only: bool = False,
    ) -> JSON:
        """One LIST page; ``metadata_only`` asks for a PartialObjectMetadataList."""
        query = _selectors(label_selector, field_selector)
        if limit:
            query["limit"] = str(limit)
        if continue_token:
            query["continue"] = continue_token
        if resource_version is not None:
            query["resourceVersion"] = resource_version
        accept = PARTIAL_OBJECT_METADATA_LIST if metadata_only else "application/json"
        wire = self._resource_api.wire(resource)
        out: JSON = self._call("GET", wire.path(namespace), query=query, accept=accept)
        return out if metadata_only else self._resource_api.incoming(resource, out)

    def create(self, resource: Resource, obj: JSON, *, namespace: str | None = None) -> JSON:
        """See `KubeClient.create`."""
        ns = namespace if namespace is not None else obj.get("metadata", {}).get("namespace")
        api, wire = self._resource_api, self._resource_api.wire(resource)
        path = wire.path(ns if resource.namespaced else None)
        out: JSON = self._call("POST", path, body=api.outgoing(resource, obj))
        return api.incoming(resource, out)

    def update(self, resource: Resource, obj: JSON, *, subresource: str | None = None) -> JSON:
        """See `KubeClient.update`."""
        meta = obj.get("metadata", {})
        ns = meta.get("namespace") if resource.namespaced else None
        api, wire = self._resource_api, self._resource_api.wire(resource)
        path = wire.path(ns, meta["name"], subresource)
        out: JSON = self._call("PUT", path, body=api.outgoing(resource, obj))
        return api.incoming(resource, out)

    def patch(
        self,
        resource: Resource,
        name: str,
        body: PatchBody,
        *,
        namespace: str | None = None,
        patch_type: PatchType = "merge",
        subresource: str | None = None,
        field_manager: str | None = None,
        force: bool = False,
    ) -> JSON:
        """See `KubeClient.patch`. The body goes out as given (no resource.k8s.io conversion:
        the project patches no such object); the answer comes back in v1 shape."""
        query: dict[str, str] = {}
        if field_manager:
            query["fieldManager"] = field_manager
        if force:
            if patch_type != "apply":
                raise ValueError("force is only valid for apply patches")
            query["force"] = "true"
        if patch_type == "apply" and not field_manager:
            raise ValueError("apply patches need a field_manager")
        out: JSON = self._call(
            "PATCH",
            self._resource_api.wire(resource).path(namespace, name, subresource),
            query=query,
            body=body,
            content_type=_PATCH_CONTENT_TYPES[patch_type],
        )
        return self._resource_api.incoming(resource, out)

    def delete(
        self,
        resource: Resource,
        name: str,
        *,
        namespace: str | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
        propagation_policy: str | None = None,
        grace_period_seconds: int | None = None,
    ) -> JSON | None:
        """See `KubeClient.delete`."""
        opts: JSON = {"kind": "DeleteOptions", "apiVersion": "v1"}
        pre = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        if pre:
            opts["preconditions"] = pre
        if propagation_policy:
            opts["propagationPolicy"] = propagation_policy
        if grace_period_seconds is not None:
            opts["gracePeriodSeconds"] = grace_period_seconds
        path = self._resource_api.wire(resource).path(namespace, name)
        out = self._call("DELETE", path, body=opts)
        # The server answers with the object (finalizers pending or deleted) or a Status.
        if isinstance(out, dict) and out.get("kind") != "Status":
            return self._resource_api.incoming(resource, out)
        return None

    def watch(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resource_version: str,
        timeout_seconds: int,
        allow_watch_bookmarks: bool = True,
        metadata_only: bool = False,
        send_initial_events: bool = False,
    ) -> WatchStream:
        """A WATCH stream. ``send_initial_events`` makes it a streaming watch-list
        (``sendInitialEvents=true``, ``resourceVersionMatch=NotOlderThan``, bookmarks on): the
        current state arrives as ADDED events, ended by a BOOKMARK annotated
        :data:`INITIAL_EVENTS_END`. ``metadata_only`` streams PartialObjectMetadata."""
        query = _selectors(label_selector, field_selector)
        query.update(watch="true", timeoutSeconds=str(timeout_seconds))
        if resource_version:
            query["resourceVersion"] = resource_version
        if allow_watch_bookmarks or send_initial_events:
            query["allowWatchBookmarks"] = "true"
        if send_initial_events:
            query["sendInitialEvents"] = "true"
            query["resourceVersionMatch"] = "NotOlderThan"
        path = self._resource_api.wire(resource).path(namespace)
        accept = PARTIAL_OBJECT_METADATA if metadata_only else "application/json"
        # The read deadline is per read: with bookmarks a healthy stream is never silent for
        # long, so a silent one is dropped after `watch_idle_timeout` (see WATCH_IDLE_TIMEOUT).
        read_timeout = timeout_seconds + _WATCH_READ_SLACK
        if allow_watch_bookmarks or send_initial_events:
            read_timeout = min(read_timeout, self._watch_idle)

        def opener() -> urllib3.BaseHTTPResponse:
            resp = self._send(
                "GET",
                path,
                query=query,
                read_timeout=read_timeout,
                accept=accept,
            )
            self._raise_for_status(resp)
            return resp

        stream = HttpWatchStream(opener, path=path, timeout_seconds=timeout_seconds)
        if metadata_only or not self._resource_api.converts(resource):
            return stream
        return _ConvertingWatchStream(stream, self._resource_api, resource)


class _ConvertingWatchStream:
    """A `WatchStream` whose event objects come back in v1 shape (`ResourceApi.incoming`)."""

    def __init__(self, inner: WatchStream, api: ResourceApi, resource: Resource) -> None:
        self._inner, self._api, self._resource = inner, api, resource

    def __iter__(self) -> Iterator[WatchEvent]:
        return self

    def __next__(self) -> WatchEvent:
        event = next(self._inner)
        if event.type in ("ADDED", "MODIFIED", "DELETED"):
            return WatchEvent(event.type, self._api.incoming(self._resource, event.object))
        return event

    def stop(self) -> None:
        """See `WatchStream.stop`."""
        self._inner.stop()
