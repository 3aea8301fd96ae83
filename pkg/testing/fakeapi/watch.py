"""Serving one watch request from the fake API server's event log.

Owns the wire format of a watch: HTTP/1.1 chunked transfer, one JSON event per line, selector
transitions (an object that stops matching is sent as DELETED, one that starts matching as
ADDED), BOOKMARK events and the `timeoutSeconds` deadline. Invariants: events reach a watcher in
RV order with none skipped; a bookmark's RV never passes an event the watcher has not been sent;
`close_watches()` drops the TCP connection without the terminating chunk (a network failure),
while a timeout ends the stream cleanly.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from pkg.base.types import JSON
from pkg.kube.errors import ApiError
from pkg.kube.resources import Resource
from pkg.testing.fakeapi.store import Event, ObjectStore

__all__ = ["WatchRequest", "serve_watch"]


class ChunkWriter(Protocol):
    def write_chunk(self, data: bytes) -> None: ...

    def end_chunks(self) -> None: ...

    def drop(self) -> None: ...


@dataclass(frozen=True)
class WatchRequest:
    resource: Resource
    namespace: str | None
    match: Callable[[JSON], bool]
    resource_version: str
    timeout: float
    bookmarks: bool
    # sendInitialEvents=true: the current state as ADDED, then a BOOKMARK annotated
    # k8s.io/initial-events-end (streaming watch-list, as kube-apiserver >= 1.32 serves it).
    send_initial_events: bool = False
    # Accept: ...;as=PartialObjectMetadata: objects reduced to apiVersion/kind/metadata.
    metadata_only: bool = False


def partial_object_metadata(obj: JSON) -> JSON:
    """``obj`` as a meta.k8s.io/v1 PartialObjectMetadata (what the metadata client gets)."""
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata", {}),
    }


def status_body(err: ApiError) -> JSON:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": err.message,
        "reason": err.reason,
        "code": err.status,
        **({"details": err.body["details"]} if err.body and "details" in err.body else {}),
    }


def _line(type_: str, obj: JSON, req: WatchRequest | None = None) -> bytes:
    if req is not None and req.metadata_only and type_ != "ERROR":
        obj = partial_object_metadata(obj)
    return json.dumps({"type": type_, "object": obj}, separators=(",", ":")).encode() + b"\n"


def _translate(ev: Event, req: WatchRequest) -> bytes | None:
    line = _translate_raw(ev, req)
    if line is None or not req.metadata_only:
        return line
    decoded = json.loads(line)
    return _line(decoded["type"], decoded["object"], req)


def _translate_raw(ev: Event, req: WatchRequest) -> bytes | None:
    if ev.resource != req.resource:
        return None
    if req.namespace and ev.obj["metadata"].get("namespace") != req.namespace:
        return None
    now_match = req.match(ev.obj)
    was_match = ev.old is not None and ev.type == "MODIFIED" and req.match(ev.old)
    if ev.type == "MODIFIED":
        if now_match and was_match:
            return _line("MODIFIED", ev.obj)
        if now_match:
            return _line("ADDED", ev.obj)
        if was_match:
            return _line("DELETED", ev.obj)
        return None
    return _line(ev.type, ev.obj) if now_match else None


def serve_watch(
    out: ChunkWriter,
    req: WatchRequest,
    store: ObjectStore,
    *,
    opened_at: int,
    generation: Callable[[], int],
    stopping: Callable[[], bool],
    bookmark_interval: float,
) -> None:
    """Stream events until timeout, `close_watches()`, server stop or client disconnect."""
    gen = opened_at
    deadline = time.monotonic() + req.timeout
    bookmark_obj: Callable[[int], JSON] = lambda rv: {  # noqa: E731
        "kind": req.resource.kind,
        "apiVersion": req.resource.api_version,
        "metadata": {"resourceVersion": str(rv)},
    }
    with store.cond:
        initial: list[bytes] = []
        try:
            if req.send_initial_events and req.resource_version not in ("", "0"):
                # NotOlderThan a given RV: replay nothing older, state as of now (simplified).
                _, objs = store.select(req.resource, req.namespace, req.match)
                initial = [_line("ADDED", o, req) for o in objs]
                pos = store.log_end
            elif req.resource_version in ("", "0"):
                # "Any/most recent" semantics: synthetic ADDED for current state, then live.
                _, objs = store.select(req.resource, req.namespace, req.match)
                initial = [_line("ADDED", o, req) for o in objs]
                pos = store.log_end
            else:
                pos = store.log_position(int(req.resource_version))
        except ApiError as err:
            out.write_chunk(_line("ERROR", status_body(err)))
            out.end_chunks()
            return
        except ValueError:
            out.write_chunk(_line("ERROR", {"code": 400, "reason": "BadRequest", "message": ""}))
            out.end_chunks()
            return
        sent_rv = store.rv
    if req.send_initial_events:
        end = bookmark_obj(sent_rv)
        end["metadata"]["annotations"] = {"k8s.io/initial-events-end": "true"}
        initial.append(_line("BOOKMARK", end))
    if initial:
        out.write_chunk(b"".join(initial))
    next_bookmark = time.monotonic() + bookmark_interval
    while True:
        with store.cond:
            while True:
                now = time.monotonic()
                if stopping() or generation() != gen:
                    break
                if store.log_end > pos or now >= deadline or now >= next_bookmark:
                    break
                store.cond.wait(min(deadline, next_bookmark) - now)
            if stopping() or generation() != gen:
                out.drop()
                return
            try:
                events = store.events_from(pos)
            except ApiError as err:
                out.write_chunk(_line("ERROR", status_body(err)))
                out.end_chunks()
                return
            pos += len(events)
            sent_rv = store.rv  # every RV bump is logged, so all events <= rv are taken
        lines = [b for b in (_translate(ev, req) for ev in events) if b is not None]
        now = time.monotonic()
        if req.bookmarks and (now >= next_bookmark or now >= deadline):
            lines.append(_line("BOOKMARK", bookmark_obj(sent_rv)))
        if now >= next_bookmark:
            next_bookmark = now + bookmark_interval
        if lines:
            out.write_chunk(b"".join(lines))
        if now >= deadline:
            out.end_chunks()
            return
