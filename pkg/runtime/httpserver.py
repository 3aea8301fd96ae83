"""The process's observability endpoint: ``/metrics``, ``/healthz`` and ``/readyz`` over HTTP.

Owns one threaded HTTP server, the named health checks behind the two probe paths and the
optional debug documents (``/debug/...``, JSON; served only when the process registers them,
which it does only when its debug endpoints are enabled: off by default). Invariants: a probe
answers 200 ``ok`` only when every registered check passes, otherwise 503 listing the failing
check names (as controller-runtime's healthz handler does); a check or debug document that
raises answers 503/500 and never takes the server down; ``stop()`` is idempotent and closes the
listening socket so a restarted process can bind the same port at once.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

__all__ = ["HealthChecks", "ObservabilityServer", "parse_endpoint"]

log = logging.getLogger(__name__)

Check = Callable[[], bool]
DebugDocument = Callable[[], object]  # returns something json.dumps can render


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
    ) -> None:
        """``debug``: path (``/debug/...``) -> document served as JSON; none by default."""
        self._address = parse_endpoint(endpoint)
        self._debug = dict(debug or {})
        bad = [p for p in self._debug if not p.startswith("/debug/")]
        if bad:
            raise ValueError(f"debug paths must start with /debug/: {bad}")
        self._registry = registry
        self._metrics_path = metrics_path
        self._liveness = liveness
        self._readiness = readiness
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("server not started")
        return int(self._server.server_address[1])

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
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
        server = ThreadingHTTPServer(self._address, self._handler())
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="http-server", daemon=True
        )
        self._thread.start()
        log.info("http server listening address=%s:%d", self._address[0], self.port)

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
