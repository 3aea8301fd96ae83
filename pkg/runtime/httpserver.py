"""The process's observability endpoint: ``/metrics``, ``/healthz`` and ``/readyz`` over HTTP.

Owns one threaded HTTP server, the named health checks behind the two probe paths and the
optional debug documents (``/debug/...``, JSON; served only when the process registers them,
which it does only when its debug endpoints are enabled: off by default). Invariants: a probe
answers 200 ``ok`` only when every registered check passes, otherwise 503 listing the failing
check names (as controller-runtime's healthz handler does); a check or debug document that
raises answers 503/500 and never takes the server down; ``stop()`` is idempotent and closes the
listening socket so a restarted process can bind the same port at once.

While no request comes the serving thread is blocked with no timer (no idle wakeups): it waits
in a selector on the listening socket and one end of a socketpair, and ``stop()`` wakes it by
writing to the other end. (``socketserver``'s ``serve_forever`` instead wakes every
``poll_interval``, 0.5 s, to look at its shutdown flag.)

Anyone who can reach the port (other pods, unless a NetworkPolicy keeps them out) must not be
able to starve the kubelet's probes or pile up threads: a connection that sends no complete
request within ``read_timeout`` seconds is closed, and at most ``max_connections`` are served at
once -- one beyond that is answered 503 and closed at once, without a thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import selectors
import socket
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

__all__ = ["HealthChecks", "ObservabilityServer", "parse_endpoint"]

log = logging.getLogger(__name__)

Check = Callable[[], bool]
DebugDocument = Callable[[], object]  # returns something json.dumps can render

READ_TIMEOUT = 10.0
"""Seconds a connection may take to send its request (probes and scrapes send it at once)."""
MAX_CONNECTIONS = 16
"""Connections served at once: the kubelet's probes and a scraper need a few."""
_BUSY = b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``":8080"`` → ``("", 8080)``; ``"127.0.0.1:0"`` → ``("127.0.0.1", 0)``."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f'invalid HTTP endpoint "{endpoint}", expected [host]:port')
    return host.strip("[]"), int(port)


class HealthChecks:
    """A thread-safe set of named boolean checks."""

    def __init__(self) -> None:
        self._checks: dict[str, Check] = {}
        self._lock = threading.Lock()

    def add(self, name: str, check: Check) -> None:
        with self._lock:
            self._checks[name] = check

    def failing(self) -> list[str]:
        """Names of the checks that fail now (a raising check fails)."""
        with self._lock:
            checks = list(self._checks.items())
        bad = []
        for name, check in checks:
            try:
                ok = check()
            except Exception:
                log.warning("health check raised check=%s", name, exc_info=True)
                ok = False
            if not ok:
                bad.append(name)
        return bad


class _WakeableHTTPServer(ThreadingHTTPServer):
    """A threaded HTTP server whose serving loop blocks with no timeout until a request or
    `stop_serving`; use `serve_until_stopped` instead of ``serve_forever``/``shutdown``."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        *,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(max_connections)
        self.socket.setblocking(False)  # a connection reset before accept() must not block
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stop_requested = threading.Event()
        self._loop_done = threading.Event()

    def get_request(self) -> tuple[socket.socket, Any]:  # Any: the peer's address tuple
        """Accept one connection; the connection itself blocks (its handler thread reads it)."""
        conn, addr = self.socket.accept()
        conn.setblocking(True)
        return conn, addr

    def serve_until_stopped(self) -> None:
        """Serve on the calling thread until `stop_serving`; blocked (no timer) while idle."""
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self.socket, selectors.EVENT_READ)
                selector.register(self._wake_r, selectors.EVENT_READ)
                while not self._stop_requested.is_set():
                    ready = selector.select()  # no timeout: only a connection or stop wakes it
                    if self._stop_requested.is_set():
                        break
                    if any(key.fileobj is self.socket for key, _ in ready):
                        self._accept_one()
        finally:
            self._loop_done.set()

    def _accept_one(self) -> None:
        """What ``socketserver`` does per readable event: accept, verify, hand to a thread."""
        try:
            request, client_address = self.get_request()
        except OSError:  # nothing to accept any more (the peer gave up), or closed meanwhile
            return
        if not self.verify_request(request, client_address):
            self.shutdown_request(request)
            return
        if not self._slots.acquire(blocking=False):
            log.debug("http connection refused: %s connections busy", client_address)
            request.setblocking(False)
            with contextlib.suppress(OSError):  # the peer is gone, or its window is full
                request.send(_BUSY)
            self.shutdown_request(request)
            return
        try:
            self.process_request(request, client_address)
        except Exception:
            self._slots.release()
            self.handle_error(request, client_address)
            self.shutdown_request(request)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """Serve one connection on its own thread, then give its slot back."""
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def stop_serving(self, timeout: float) -> None:
        """Wake `serve_until_stopped` and wait (at most ``timeout``) until it returned, if it
        is running; idempotent."""
        self._stop_requested.set()
        with contextlib.suppress(OSError):  # closed already, or its buffer full: woken anyway
            self._wake_w.send(b"x")
        self._loop_done.wait(timeout)

    def server_close(self) -> None:
        """Close the listening socket and the wake-up pair."""
        super().server_close()
        self._wake_r.close()
        self._wake_w.close()


class ObservabilityServer:
    """Serves Prometheus metrics and liveness/readiness probes on one endpoint."""

    def __init__(
        self,
        endpoint: str,
        *,
        registry: CollectorRegistry,
        metrics_path: str = "/metrics",
        liveness: HealthChecks,
        readiness: HealthChecks,
        debug: Mapping[str, DebugDocument] | None = None,
        read_timeout: float = READ_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        """``debug``: path (``/debug/...``) -> document served as JSON; none by default.
        ``read_timeout`` and ``max_connections`` bound what one client can hold (module doc)."""
        if read_timeout <= 0 or max_connections < 1:
            raise ValueError("read_timeout must be > 0 and max_connections >= 1")
        self._read_timeout = read_timeout
        self._max_connections = max_connections
        self._address = parse_endpoint(endpoint)
        self._debug = dict(debug or {})
        bad = [p for p in self._debug if not p.startswith("/debug/")]
        if bad:
            raise ValueError(f"debug paths must start with /debug/: {bad}")
        self._registry = registry
        self._metrics_path = metrics_path
        self._liveness = liveness
        self._readiness = readiness
        self._server: _WakeableHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("server not started")
        return int(self._server.server_address[1])

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            # The connection's socket timeout: a read that waits longer ends the connection.
            timeout = outer._read_timeout

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == outer._metrics_path:
                    self._send(200, generate_latest(outer._registry), CONTENT_TYPE_LATEST)
                elif path in ("/healthz", "/livez"):
                    self._probe(outer._liveness)
                elif path == "/readyz":
                    self._probe(outer._readiness)
                elif path in outer._debug:
                    self._document(outer._debug[path])
                else:
                    self._send(404, b"not found\n", "text/plain")

            def _probe(self, checks: HealthChecks) -> None:
                bad = checks.failing()
                if bad:
                    body = "".join(f"[-]{name} failed\n" for name in bad).encode()
                    self._send(503, body, "text/plain")
                else:
                    self._send(200, b"ok", "text/plain")

            def _document(self, render: DebugDocument) -> None:
                try:
                    body = json.dumps(render(), sort_keys=True).encode()
                except Exception as exc:
                    log.warning("debug document failed path=%s", self.path, exc_info=True)
                    self._send(500, f"{type(exc).__name__}: {exc}\n".encode(), "text/plain")
                    return
                self._send(200, body, "application/json")

            def _send(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                # Probes hit this every few seconds; keep them out of the info log.
                log.debug("http " + format, *args)

        return Handler

    def start(self) -> None:
        """Bind the endpoint and serve on a daemon thread; `OSError` if it cannot be bound."""
        server = _WakeableHTTPServer(
            self._address, self._handler(), max_connections=self._max_connections
        )
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_until_stopped, name="http-server", daemon=True
        )
        self._thread.start()
        log.info("http server listening address=%s:%d", self._address[0], self.port)

    @property
    def serving_thread(self) -> threading.Thread | None:
        """The thread accepting connections while started (tests check it sleeps when idle)."""
        return self._thread

    def stop(self) -> None:
        """Stop accepting, close the listening socket and end the serving thread; requests in
        flight finish on their own (daemon) threads. Idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        server.stop_serving(timeout=5)
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
