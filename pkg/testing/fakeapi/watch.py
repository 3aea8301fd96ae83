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

    def alive() -> bool:
        """Neither the server stopping nor `close_watches()` since the watch opened."""
        return not stopping() and generation() == opened_at

    deadline = time.monotonic() + req.timeout
    opened = _open_watch(out, req, store)
    if opened is None:
        return
    initial, pos = opened
    if initial:
        out.write_chunk(b"".join(initial))
    next_bookmark = time.monotonic() + bookmark_interval
    while True:
        taken = _take_events(out, store, pos, alive, min(deadline, next_bookmark))
        if taken is None:
            return
        events, sent_rv = taken
        pos += len(events)
        lines = [b for b in (_translate(ev, req) for ev in events) if b is not None]
        now = time.monotonic()
        if req.bookmarks and (now >= next_bookmark or now >= deadline):
            lines.append(_line("BOOKMARK", _bookmark_obj(req, sent_rv)))
        if now >= next_bookmark:
            next_bookmark = now + bookmark_interval
        if lines:
            out.write_chunk(b"".join(lines))
        if now >= deadline:
            out.end_chunks()
            return


def _bookmark_obj(req: WatchRequest, rv: int) -> JSON:
    """The object of a BOOKMARK event at ``rv`` for the watched resource."""
    return {
        "kind": req.resource.kind,
        "apiVersion": req.resource.api_version,
        "metadata": {"resourceVersion": str(rv)},
    }


def _end_with_error(out: ChunkWriter, obj: JSON) -> None:
    """Send an ERROR event and end the stream cleanly."""
    out.write_chunk(_line("ERROR", obj))
    out.end_chunks()


def _open_watch(
    out: ChunkWriter, req: WatchRequest, store: ObjectStore
) -> tuple[list[bytes], int] | None:
    """The lines to send first (synthetic ADDEDs, the initial-events-end BOOKMARK) and the
    event-log position to stream from, per the request's resourceVersion and
    sendInitialEvents; None once an ERROR for an unusable resourceVersion ended the stream."""
    initial: list[bytes] = []
    with store.cond:
        try:
            if req.send_initial_events or req.resource_version in ("", "0"):
                # "Any/most recent" semantics (no RV), or sendInitialEvents NotOlderThan a given
                # RV (replay nothing older; simplified): ADDED for current state, then live.
                _, objs = store.select(req.resource, req.namespace, req.match)
                initial = [_line("ADDED", o, req) for o in objs]
                pos = store.log_end
            else:
                pos = store.log_position(int(req.resource_version))
        except ApiError as err:
            _end_with_error(out, status_body(err))
            return None
        except ValueError:
            _end_with_error(out, {"code": 400, "reason": "BadRequest", "message": ""})
            return None
        sent_rv = store.rv
    if req.send_initial_events:
        end = _bookmark_obj(req, sent_rv)
        end["metadata"]["annotations"] = {"k8s.io/initial-events-end": "true"}
        initial.append(_line("BOOKMARK", end))
    return initial, pos


def _take_events(
    out: ChunkWriter,
    store: ObjectStore,
    pos: int,
    alive: Callable[[], bool],
    wake_at: float,
) -> tuple[list[Event], int] | None:
    """Wait (under the store's lock) for events past ``pos`` or until ``wake_at`` (the
    deadline or the next bookmark, whichever is first), then take the new events and the RV
    they bring the watcher to (every RV bump is logged, so all events <= rv are taken). None
    once the stream ended: dropped because the watch is no longer ``alive``, or an ERROR sent
    because the log was compacted."""
    with store.cond:
        while True:
            now = time.monotonic()
            if not alive():
                break
            if store.log_end > pos or now >= wake_at:
                break
            store.cond.wait(wake_at - now)
        if not alive():
            out.drop()
            return None
        try:
            events = store.events_from(pos)
        except ApiError as err:
            _end_with_error(out, status_body(err))
            return None
        return events, store.rv
