"""Prometheus metrics of one IMEX daemon, served on ``/metrics``.

Owns the daemon's metric names (prefix ``compute_domain_daemon_``) in a private registry, so
tests can build many daemons in one process, among them `BUILD_INFO_METRIC`, the build this
process runs (`pkg.runtime.buildinfometric`). Also implements
:class:`pkg.imex.supervisor.SupervisorObserver`, which is how process events become counters.

Invariant: every series exists from start (zero-valued), so dashboards never see gaps.
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from pkg.imex.supervisor import describe_exit
from pkg.runtime.buildinfo import BuildInfo, load_build_info
from pkg.runtime.buildinfometric import register_build_info

BUILD_INFO_METRIC = "compute_domain_daemon_build_info"


class DaemonMetrics:
    def __init__(
        self, registry: CollectorRegistry | None = None, *, build_info: BuildInfo | None = None
    ) -> None:
        """Registers every series in ``registry`` (default: a new one); ``build_info`` (default:
        this installation's) labels `BUILD_INFO_METRIC`."""
        self.registry = registry or CollectorRegistry()
        register_build_info(
            self.registry, name=BUILD_INFO_METRIC, info=build_info or load_build_info()
        )
        p = "compute_domain_daemon_"
        self.restarts = Counter(
            f"{p}imex_restarts",
            "IMEX process restarts (after a crash or a config change).",
            registry=self.registry,
        )
        self.exits = Counter(
            f"{p}imex_exits",
            "IMEX process exits by cause.",
            ["expected", "cause"],
            registry=self.registry,
        )
        self.reloads = Counter(
            f"{p}imex_reloads", "SIGUSR1 reloads sent to IMEX.", registry=self.registry
        )
        self.peers = Gauge(
            f"{p}imex_peers_configured",
            "Peers (other daemons of this domain and clique) currently in the IMEX config.",
            registry=self.registry,
        )
        self.ready = Gauge(
            f"{p}imex_ready", "1 when the local IMEX answers READY.", registry=self.registry
        )
        self.conflicts = Counter(
            f"{p}membership_conflicts",
            "409 conflicts retried while writing the membership list.",
            registry=self.registry,
        )
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    # SupervisorObserver
    def started(self, *, pid: int, restarts: int) -> None:
        del pid
        if restarts:
            self.restarts.inc()

    def exited(self, *, code: int, expected: bool) -> None:
        cause = describe_exit(code).split(" ")[-1] if code < 0 else f"exit{code}"
        self.exits.labels(expected=str(expected).lower(), cause=cause).inc()

    def reloaded(self) -> None:
        self.reloads.inc()

    def conflict(self) -> None:
        self.conflicts.inc()

    def serve(self, address: str) -> tuple[str, int]:
        """Serve ``/metrics`` on ``host:port`` (no host: all interfaces); returns the bound pair."""
        host, _, port = address.rpartition(":")
        server, thread = start_http_server(
            int(port), addr=host or "0.0.0.0", registry=self.registry
        )
        self._server, self._thread = server, thread
        bound = server.server_address
        return str(bound[0]), int(bound[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
