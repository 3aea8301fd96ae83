"""HTTP plumbing of the fake API server: a threaded server that tracks its connections.

Owns sockets and framing only (JSON replies, chunked streams, abrupt drops); every request is
handed to the `RequestSink` (the `FakeApiServer`). Invariants: `close_all()` shuts down every
open connection so handler threads exit; errors from vanished clients are swallowed.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

__all__ = ["Handler", "Httpd", "RequestSink"]


class RequestSink(Protocol):
    def handle(self, h: Handler) -> None: ...


class Httpd(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the default backlog of 5 resets bursts of concurrent clients
    fake: RequestSink

    def __init__(self, addr: tuple[str, int], handler: type[Handler]) -> None:
        super().__init__(addr, handler)
        self._conns: set[socket.socket] = set()
        self._conn_lock = threading.Lock()

    def track(self, sock: socket.socket, *, add: bool) -> None:
        with self._conn_lock:
            (self._conns.add if add else self._conns.discard)(sock)

    def close_all(self) -> None:
        with self._conn_lock:
            conns = list(self._conns)
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients vanishing mid-response are routine in tests


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body are separate sends; without NODELAY, Nagle + delayed ACK add ~40 ms.
    disable_nagle_algorithm = True
    server: Httpd

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, add=True)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.server.track(self.connection, add=False)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _serve(self) -> None:
        try:
            self.server.fake.handle(self)
        except OSError:
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve  # noqa: N815

    def reply(self, code: int, body: Any) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def start_chunks(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")

    def drop(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)
