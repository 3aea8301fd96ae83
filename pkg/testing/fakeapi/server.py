"""`FakeApiServer`: an in-process, threaded HTTP server speaking the Kubernetes REST wire format.

Owns routing (`/api/v1/...`, `/apis/<group>/<version>/...`), request decoding, error injection,
the request log and pagination; object semantics live in `store.py`, watches in `watch.py`.
Invariants: each connection is served by its own thread; every request is logged before it is
answered; `stop()` closes every open connection and joins the handler threads.
Error injection verbs are HTTP methods plus "LIST" and "WATCH" (GETs on a collection). An
outage (:meth:`FakeApiServer.set_available`) drops every connection, like an API server that is
restarting; a stall (:meth:`FakeApiServer.inject_stall`) holds a request so the client times out.
``resource.k8s.io`` is served in the versions given as ``resource_api_versions`` (default v1
only, as Kubernetes 1.34+ with the beta versions off); each version is a separate store (no
conversion between them), writes are checked against that version's shape
(`pkg.testing.fakeapi.draschema`), and ``GET /apis/<group>`` answers the group's discovery
document (APIGroup).
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from kubernetes.client.configuration import Configuration

from pkg.base.types import JSON
from pkg.kube import resources as res
from pkg.kube.client import RestClient
from pkg.kube.config import Connection
from pkg.kube.errors import ApiError, BadRequestError, GoneError, NotFoundError, error_from_status
from pkg.kube.resources import Resource
from pkg.testing.fakeapi.draschema import check_shape
from pkg.testing.fakeapi.handlers import decode_body, handle_write
from pkg.testing.fakeapi.httpd import Handler, Httpd
from pkg.testing.fakeapi.selectors import parse_field_selector, parse_label_selector
from pkg.testing.fakeapi.store import ObjectStore
from pkg.testing.fakeapi.watch import (
    WatchRequest,
    partial_object_metadata,
    serve_watch,
    status_body,
)

__all__ = ["FakeApiServer", "LoggedRequest"]


_DRA_GROUP = "resource.k8s.io"
_STATUS_RESOURCES = (
    res.PODS,
    res.NODES,
    res.NAMESPACES,
    res.DAEMONSETS,
    res.RESOURCE_CLAIMS,
    res.CUSTOM_RESOURCE_DEFINITIONS,
    res.COMPUTE_DOMAINS,
)


@dataclass(frozen=True, slots=True)
class LoggedRequest:
    method: str
    path: str
    query: dict[str, str]


@dataclass
class _Injection:
    verb: str
    resource: Resource
    status: int
    count: int
    name: str | None


@dataclass
class _Stall:
    verb: str
    resource: Resource
    seconds: float
    count: int


@dataclass(frozen=True, slots=True)
class _Route:
    resource: Resource
    namespace: str | None
    name: str | None
    subresource: str | None


class FakeApiServer:
    """A scriptable API server on 127.0.0.1 (see docs/contracts.md for the semantics)."""

    def __init__(
        self,
        *,
        gc: bool = False,
        bookmark_interval: float = 1.0,
        page_snapshots: int = 64,
        now: Callable[[], float] = time.time,
        resource_api_versions: Sequence[str] = ("v1",),
    ) -> None:
        self.store = ObjectStore(now=now, gc=gc)
        for r in res.WELL_KNOWN:
            status = r in _STATUS_RESOURCES
            if r.group != _DRA_GROUP:
                self.register(r, status_subresource=status)
                continue
            for version in resource_api_versions:
                self.register(replace(r, version=version), status_subresource=status)
        self.bookmark_interval = bookmark_interval
        # Streaming watch-list (sendInitialEvents) served; False answers such watches 400,
        # as an API server without the WatchList feature does.
        self.watch_list = True
        self.request_log: list[tuple[str, str]] = []
        self.requests: list[LoggedRequest] = []
        self._lock = threading.Lock()
        self._injections: list[_Injection] = []
        self._stalls: list[_Stall] = []
        self._available = True
        self._generation = 0
        self._stopping = False
        self._snapshots: dict[str, tuple[int, list[JSON]]] = {}
        self._snapshot_limit = page_snapshots
        self._snapshot_seq = 0
        self._httpd: Httpd | None = None
        self._thread: threading.Thread | None = None
        self._clients: list[RestClient] = []

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> FakeApiServer:
        httpd = Httpd(("127.0.0.1", 0), Handler)
        httpd.fake = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="fakeapi", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        with self.store.cond:
            self._stopping = True
            self.store.cond.notify_all()
        for c in self._clients:
            c.close()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.close_all()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._httpd is not None, "start() first"
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def client(self, **kwargs: Any) -> RestClient:
        cfg = Configuration()
        cfg.host = self.url
        cfg.connection_pool_maxsize = 64
        c = RestClient(Connection(cfg), **kwargs)
        self._clients.append(c)
        return c

    # -- test hooks --------------------------------------------------------------------------

    def register(self, resource: Resource, *, status_subresource: bool = False) -> None:
        self.store.register(resource, status_subresource=status_subresource)

    def seed(self, resource: Resource, obj: JSON) -> JSON:
        return self.store.seed(resource, obj)

    def objects(self, resource: Resource) -> list[JSON]:
        return self.store.all_objects(resource)

    def inject_error(
        self,
        method: str,
        resource: Resource,
        status: int,
        *,
        count: int = 1,
        name: str | None = None,
    ) -> None:
        """Fail the next `count` matching requests with `status` (0 = drop the connection)."""
        with self._lock:
            self._injections.append(_Injection(method.upper(), resource, status, count, name))

    def inject_stall(
        self, method: str, resource: Resource, seconds: float, *, count: int = 1
    ) -> None:
        """Hold the next ``count`` matching requests ``seconds`` before serving them (a client
        with a shorter read timeout sees a timeout)."""
        with self._lock:
            self._stalls.append(_Stall(method.upper(), resource, seconds, count))

    def set_available(self, available: bool) -> None:
        """``False``: drop every request and open watch until called with ``True`` (an outage).

        Requests are still logged, so a test can see that clients kept trying.
        """
        with self._lock:
            self._available = available
        if not available:
            self.close_watches()

    @property
    def available(self) -> bool:
        with self._lock:
            return self._available

    def compact(self) -> None:
        self.store.compact()
        with self._lock:
            self._snapshots.clear()

    def close_watches(self) -> None:
        with self.store.cond:
            self._generation += 1
            self.store.cond.notify_all()

    def clear_log(self) -> None:
        with self._lock:
            self.request_log.clear()
            self.requests.clear()

    # -- request handling (called from handler threads) --------------------------------------

    def _log(self, method: str, path: str, query: dict[str, str]) -> None:
        with self._lock:
            self.request_log.append((method, path))
            self.requests.append(LoggedRequest(method, path, query))

    def _injected(self, verb: str, route: _Route) -> int | None:
        with self._lock:
            for inj in self._injections:
                hit = inj.verb == verb and inj.resource == route.resource and inj.count > 0
                if hit and (inj.name is None or inj.name == route.name):
                    inj.count -= 1
                    return inj.status
        return None

    def _stalled(self, verb: str, route: _Route) -> float:
        with self._lock:
            for stall in self._stalls:
                if stall.verb == verb and stall.resource == route.resource and stall.count > 0:
                    stall.count -= 1
                    return stall.seconds
        return 0.0

    def _route(self, path: str) -> _Route:
        segs = [s for s in path.split("/") if s]
        if len(segs) >= 2 and segs[0] == "api":
            group, version, rest = "", segs[1], segs[2:]
        elif len(segs) >= 3 and segs[0] == "apis":
            group, version, rest = segs[1], segs[2], segs[3:]
        else:
            raise NotFoundError(404, "NotFound", f"no route for {path}")
        by_plural = {
            r.plural: r for r in self.store.resources() if (r.group, r.version) == (group, version)
        }
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] in by_plural:
            namespace, rest = rest[1], rest[2:]
        if not rest or rest[0] not in by_plural or len(rest) > 3:
            raise NotFoundError(404, "NotFound", f"no route for {path}")
        resource = by_plural[rest[0]]
        if namespace is not None and not resource.namespaced:
            raise NotFoundError(404, "NotFound", f"{resource.plural} is cluster-scoped")
        return _Route(
            resource,
            namespace,
            rest[1] if len(rest) > 1 else None,
            rest[2] if len(rest) > 2 else None,
        )

    def _api_group(self, path: str) -> JSON | None:
        """The APIGroup document for ``/apis/<group>``, None for any other path; `NotFoundError`
        for a group nothing is registered in."""
        segs = [s for s in path.split("/") if s]
        if len(segs) != 2 or segs[0] != "apis":
            return None
        versions: list[str] = []
        for r in self.store.resources():
            if r.group == segs[1] and r.version not in versions:
                versions.append(r.version)
        if not versions:
            raise NotFoundError(404, "NotFound", f"the server could not find {path}")
        order = {v: i for i, v in enumerate(("v1", "v1beta2", "v1beta1", "v1alpha3"))}
        versions.sort(key=lambda v: order.get(v, len(order)))
        entries = [{"groupVersion": f"{segs[1]}/{v}", "version": v} for v in versions]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": segs[1],
            "versions": entries,
            "preferredVersion": entries[0],
        }

    def handle(self, h: Handler) -> None:
        split = urlsplit(h.path)
        query = dict(parse_qsl(split.query, keep_blank_values=True))
        # Captured before logging: once a test sees the request, close_watches() drops it.
        generation = self._generation
        self._log(h.command, split.path, query)
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        if not self.available:
            h.drop()
            return
        try:
            group_doc = self._api_group(split.path) if h.command == "GET" else None
            if group_doc is not None:
                h.reply(200, group_doc)
                return
            route = self._route(split.path)
            verb = h.command
            if verb == "GET" and route.name is None:
                verb = "WATCH" if query.get("watch") in ("true", "1") else "LIST"
            stall = self._stalled(verb, route)
            if stall:
                time.sleep(stall)
            injected = self._injected(verb, route)
            if injected == 0:
                h.drop()
                return
            if injected is not None:
                if verb == "WATCH" and injected == 410:
                    raise GoneError(410, "Expired", "too old resource version (injected)")
                raise error_from_status(injected, {"reason": "Injected", "message": "injected"})
            body = decode_body(raw, h.headers.get("Content-Type"))
            if verb in ("POST", "PUT") and route.subresource is None:
                check_shape(route.resource, body)
            metadata_only = _wants_metadata(h.headers.get("Accept"), verb)
            if verb == "WATCH":
                self._watch(h, route, query, generation, metadata_only=metadata_only)
                return
            code, out = self._dispatch(verb, route, query, body, h.headers.get("Content-Type"))
            if metadata_only and verb in ("GET", "LIST") and isinstance(out, dict):
                out = _as_metadata(out, verb)
        except ApiError as err:
            if split.query and "watch=true" in split.query and isinstance(err, GoneError):
                h.start_chunks()
                h.write_chunk(json.dumps({"type": "ERROR", "object": status_body(err)}).encode())
                h.end_chunks()
                return
            h.reply(err.status, status_body(err))
            return
        except ValueError as exc:
            h.reply(400, status_body(BadRequestError(400, "BadRequest", str(exc))))
            return
        h.reply(code, out)

    def _dispatch(
        self, verb: str, route: _Route, query: dict[str, str], body: Any, ctype: str | None
    ) -> tuple[int, Any]:
        r, ns, name = route.resource, route.namespace, route.name
        if verb == "GET":
            assert name is not None
            return 200, self.store.get(r, ns, name)
        if verb == "LIST":
            return 200, self._list(route, query)
        return handle_write(
            self.store,
            verb,
            resource=r,
            namespace=ns,
            name=name,
            subresource=route.subresource,
            body=body,
            query=query,
            content_type=ctype,
        )

    def _list(self, route: _Route, query: dict[str, str]) -> JSON:
        r = route.resource
        limit = int(query.get("limit") or 0)
        token = query.get("continue")
        if token:
            try:
                snap_id, offset = json.loads(base64.urlsafe_b64decode(token))
            except (ValueError, TypeError) as exc:
                raise BadRequestError(400, "BadRequest", "invalid continue token") from exc
            with self._lock:
                snap = self._snapshots.get(snap_id)
            if snap is None:
                raise GoneError(410, "Expired", "The provided continue parameter is too old")
            rv, items = snap
        else:
            match_l = parse_label_selector(query.get("labelSelector"))
            match_f = parse_field_selector(query.get("fieldSelector"))
            rv, items = self.store.select(r, route.namespace, lambda o: match_l(o) and match_f(o))
            offset, snap_id = 0, ""
        meta: JSON = {"resourceVersion": str(rv)}
        page = items[offset : offset + limit] if limit else items[offset:]
        if limit and offset + limit < len(items):
            if not snap_id:
                with self._lock:
                    self._snapshot_seq += 1
                    snap_id = str(self._snapshot_seq)
                    self._snapshots[snap_id] = (rv, items)
                    while len(self._snapshots) > self._snapshot_limit:
                        self._snapshots.pop(next(iter(self._snapshots)))
            nxt = json.dumps([snap_id, offset + limit]).encode()
            meta["continue"] = base64.urlsafe_b64encode(nxt).decode()
            meta["remainingItemCount"] = len(items) - offset - limit
        # Built-in kinds omit apiVersion/kind on list items, as the real server does.
        builtin = not r.group.endswith("nvidia.com")
        return {
            "kind": r.list_kind,
            "apiVersion": r.api_version,
            "metadata": meta,
            "items": [
                {k: v for k, v in o.items() if k not in ("apiVersion", "kind")} if builtin else o
                for o in page
            ],
        }

    def _watch(
        self,
        h: Handler,
        route: _Route,
        query: dict[str, str],
        generation: int,
        *,
        metadata_only: bool = False,
    ) -> None:
        send_initial = query.get("sendInitialEvents") == "true"
        if send_initial:
            # kube-apiserver's validation of a streaming watch-list request.
            if not self.watch_list:
                raise BadRequestError(400, "BadRequest", "sendInitialEvents is not supported")
            if query.get("resourceVersionMatch") != "NotOlderThan":
                raise BadRequestError(
                    400,
                    "BadRequest",
                    "sendInitialEvents requires resourceVersionMatch=NotOlderThan",
                )
            if query.get("allowWatchBookmarks") != "true":
                raise BadRequestError(
                    400, "BadRequest", "sendInitialEvents requires allowWatchBookmarks=true"
                )
        match_l = parse_label_selector(query.get("labelSelector"))
        match_f = parse_field_selector(query.get("fieldSelector"))
        req = WatchRequest(
            resource=route.resource,
            namespace=route.namespace,
            match=lambda o: match_l(o) and match_f(o),
            resource_version=query.get("resourceVersion", ""),
            timeout=float(query.get("timeoutSeconds") or 1800),
            bookmarks=query.get("allowWatchBookmarks") == "true",
            send_initial_events=send_initial,
            metadata_only=metadata_only,
        )
        h.start_chunks()
        serve_watch(
            h,
            req,
            self.store,
            opened_at=generation,
            generation=lambda: self._generation,
            stopping=lambda: self._stopping,
            bookmark_interval=self.bookmark_interval,
        )


def _wants_metadata(accept: str | None, verb: str) -> bool:
    """The first media type of ``accept`` asks for metadata only: ``as=PartialObjectMetadata``
    for GET and WATCH, ``as=PartialObjectMetadataList`` for LIST. The wrong one of the two is a
    406, as kube-apiserver answers it."""
    first = (accept or "").split(",")[0].replace(" ", "")
    params = dict(p.split("=", 1) for p in first.split(";")[1:] if "=" in p)
    wanted = params.get("as")
    if wanted is None:
        return False
    expected = "PartialObjectMetadataList" if verb == "LIST" else "PartialObjectMetadata"
    if wanted != expected:
        raise error_from_status(
            406,
            {
                "reason": "NotAcceptable",
                "message": f"you requested {wanted}, but the "
                f"requested object is {'a list' if verb == 'LIST' else 'an object'}",
            },
        )
    return True


def _as_metadata(out: JSON, verb: str) -> JSON:
    if verb == "GET":
        return partial_object_metadata(out)
    return {
        "kind": "PartialObjectMetadataList",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": out.get("metadata", {}),
        "items": [partial_object_metadata(o) for o in out.get("items") or []],
    }


# Old private name; hack/bench/prepare_latency.py still patches it (harmless now).
_Handler = Handler
