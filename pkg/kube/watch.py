"""Watch streams: raw-dict watch events framed by `kubernetes.watch.Watch`.

Owns the one long-lived request of a watch and its prompt, thread-safe cancellation. Invariants:
an ERROR event becomes an `ApiError` (410 -> `GoneError`); a broken connection becomes
`ConnectionFailedError` unless `stop()` was called, in which case iteration just ends; a
connection that carried a watch goes back to the client's pool only closed (never mid-stream,
where another request would read watch chunks as its response); no reconnects happen here (the
Reflector owns that policy).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import urllib3
from kubernetes import client as k8s_client

from pkg.base.types import JSON
from pkg.kube.errors import ApiError, ConnectionFailedError, error_from_status

__all__ = ["HttpWatchStream", "WatchEvent", "WatchStream"]


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One watch event: type is ADDED, MODIFIED, DELETED or BOOKMARK."""

    type: str
    object: JSON


class WatchStream(Protocol):
    """An iterator of watch events that another thread may `stop()` at any time."""

    def __iter__(self) -> Iterator[WatchEvent]: ...

    def __next__(self) -> WatchEvent: ...

    def stop(self) -> None:
        """End the stream: a blocked ``next`` returns (StopIteration) promptly. Idempotent; safe
        from any thread.
        """
        ...


# The official watch module is untyped; its two entry points get types once, here. It is
# imported on the first watch, not with this module: it loads ``pydoc`` (~5 ms), and a daemon's
# first request (a PATCH) should not wait for that.
def _new_watch() -> Any:
    from kubernetes import watch as k8s_watch  # noqa: PLC0415

    new: Callable[[], Any] = k8s_watch.Watch
    return new()


def _stream(watch: Any, opener: Callable[..., Any], **kwargs: Any) -> Iterator[Any]:
    events: Iterator[Any] = watch.stream(opener, **kwargs)
    return events


class _StoppedError(Exception):
    """Raised inside the opener when `stop()` won the race against connection set-up."""


class HttpWatchStream:
    """A single watch request, framed by `kubernetes.watch.Watch` into raw dict events.

    `Watch.stream` is given an opener with no return type, so it only `json.loads` each line (no
    model deserialization). `deserialize=False` is *not* used: in kubernetes 37 that path
    indexes a missing `raw_object` key on ERROR events and raises KeyError instead of the status.
    Passing `timeout_seconds` disables Watch's own reconnect/410-retry: reconnect policy belongs
    to the Reflector. The stream ends when the server closes it or `stop()` is called.
    """

    def __init__(
        self,
        opener: Callable[[], urllib3.BaseHTTPResponse],
        *,
        path: str,
        timeout_seconds: int,
    ) -> None:
        self._opener = opener
        self._path = path
        self._timeout_seconds = timeout_seconds
        self._lock = threading.Lock()
        self._stopped = False
        self._resp: urllib3.BaseHTTPResponse | None = None
        self._watch = _new_watch()
        self._events: Iterator[Any] | None = None

    def _open(self, **_kwargs: Any) -> Any:
        if self._is_stopped():
            raise _StoppedError
        resp = self._opener()
        with self._lock:
            self._resp = resp
        if self._is_stopped():
            # stop() ran while the request was in flight and found no response to shut down.
            # The server is already streaming on this connection: close it before it goes back
            # to the pool, or the next request sent on it reads watch chunks as its response
            # (and the server reads that request only when the watch ends, if ever).
            resp.close()
            resp.release_conn()
            raise _StoppedError
        return resp

    def _is_stopped(self) -> bool:
        with self._lock:
            return self._stopped

    def __iter__(self) -> Iterator[WatchEvent]:
        return self

    def __next__(self) -> WatchEvent:
        try:
            return self._next()
        except BaseException:
            # Ended or failed: the response was closed and returned to the pool, so a late
            # stop() must not shut down a socket that another request may now own.
            with self._lock:
                self._resp = None
            raise

    def _next(self) -> WatchEvent:
        if self._events is None:
            # Any timeout_seconds kwarg disables Watch's retries; the real one is in the query.
            self._events = _stream(self._watch, self._open, timeout_seconds=self._timeout_seconds)
        while True:
            try:
                raw = next(self._events)
            except (StopIteration, _StoppedError):
                raise StopIteration from None
            except k8s_client.ApiException as exc:
                # Watch folds an ERROR event's Status into "Reason: message".
                reason, _, message = str(exc.reason or "").partition(": ")
                raise error_from_status(
                    int(exc.status or 500), {"reason": reason, "message": message}
                ) from exc
            except ApiError:
                raise
            except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                if self._is_stopped():
                    self._close()
                    raise StopIteration from None
                raise ConnectionFailedError(f"watch {self._path}: {exc}") from exc
            if self._is_stopped():
                self._close()
                raise StopIteration
            if isinstance(raw, dict) and isinstance(raw.get("raw_object"), dict):
                return WatchEvent(str(raw.get("type")), raw["raw_object"])

    def _close(self) -> None:
        # Runs on the consuming thread, so closing the suspended generator is safe; its
        # `finally` releases the response.
        if self._events is not None:
            close = getattr(self._events, "close", None)
            if close is not None:
                close()

    def stop(self) -> None:
        """Idempotent and thread-safe: unblocks a reader stuck in a socket read."""
        with self._lock:
            self._stopped = True
            resp = self._resp
        if resp is None:
            return
        conn = getattr(resp, "connection", None)
        sock = getattr(conn, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):  # already closed by the peer
                sock.shutdown(socket.SHUT_RDWR)
