"""gRPC health service (``grpc.health.v1.Health``) on a TCP port, upstream's liveness model.

Owns what "healthy" means. Service names:

* ``""`` and ``liveness``: SERVING only if ``GetInfo`` on the registration socket and an empty
  ``NodePrepareResources`` on the DRA socket both answer - i.e. the sockets the kubelet uses
  really work (a probe of the process alone would not notice a deleted socket file);
* ``registration``: SERVING once the kubelet reported a successful registration, NOT_SERVING
  if it reported a failure (the error is logged), UNKNOWN before it said anything;
* every name the driver adds (``checks``): SERVING while its check answers True, NOT_SERVING
  otherwise - e.g. the ComputeDomain driver's ``checkpoint`` (a corrupt checkpoint was found
  at start), so operators can alert on it without the kubelet restarting the plugin.

The socket probes are made with `pkg.draplugin.client`, exactly as the kubelet calls.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from pathlib import Path
from typing import Final

import grpc

from pkg.draplugin.client import DraClient, RegistrationClient
from pkg.draplugin.proto.gen import grpc_health_v1_pb2 as health_pb2
from pkg.draplugin.proto.gen import grpc_health_v1_pb2_grpc as health_grpc
from pkg.draplugin.registration import RegistrationServicer

SERVING: Final = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING: Final = health_pb2.HealthCheckResponse.NOT_SERVING
UNKNOWN: Final = health_pb2.HealthCheckResponse.UNKNOWN
_PROBE_TIMEOUT: Final = 5.0


class HealthServicer(health_grpc.HealthServicer):
    """``grpc.health.v1.Health`` over the plugin's sockets, its registration and driver checks.

    Thread-safe: socket probes are serialised; checks are called from gRPC worker threads and
    must be cheap and thread-safe themselves.
    """

    def __init__(
        self,
        *,
        registration_socket: Path,
        dra_socket: Path,
        registration: RegistrationServicer,
        checks: Mapping[str, Callable[[], bool]] | None = None,
    ) -> None:
        """``checks`` maps extra service names to "is it SERVING" callables (the names
        ``""``, ``liveness`` and ``registration`` are the library's and cannot be replaced)."""
        self._reg_socket = registration_socket
        self._dra_socket = dra_socket
        self._registration = registration
        self._checks = dict(checks or {})
        self._lock = threading.Lock()

    def sockets_ok(self) -> bool:
        """Whether ``GetInfo`` and an empty ``NodePrepareResources`` both answer (5 s each)."""
        with self._lock:  # one probe at a time: the kubelet may probe faster than we answer
            try:
                with RegistrationClient(self._reg_socket) as reg:
                    reg.get_info(timeout=_PROBE_TIMEOUT)
                with DraClient(self._dra_socket) as dra:
                    dra.node_prepare_resources((), timeout=_PROBE_TIMEOUT)
            except grpc.RpcError:
                return False
            return True

    def status_of(self, service: str) -> int | None:
        """The status of ``service``, or None if it is unknown (see the module docstring)."""
        if service in ("", "liveness"):
            return SERVING if self.sockets_ok() else NOT_SERVING
        if service == "registration":
            status = self._registration.status
            if not status.notified:
                return UNKNOWN
            return SERVING if status.registered else NOT_SERVING
        check = self._checks.get(service)
        if check is not None:
            return SERVING if check() else NOT_SERVING
        return None

    def Check(  # noqa: N802
        self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        """The status of ``request.service``; aborts with ``NOT_FOUND`` for an unknown name."""
        status = self.status_of(request.service)
        if status is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)  # type: ignore[arg-type]

    def Watch(  # noqa: N802
        self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext
    ) -> Iterator[health_pb2.HealthCheckResponse]:
        """The current status once (``SERVICE_UNKNOWN`` for an unknown name), then the stream
        ends: probes use `Check`, so Watch does not stream changes."""
        status = self.status_of(request.service)
        yield health_pb2.HealthCheckResponse(
            status=health_pb2.HealthCheckResponse.SERVICE_UNKNOWN if status is None else status  # type: ignore[arg-type]
        )


class HealthServer:
    """The health service on a TCP port (the kubelet's gRPC liveness probe dials it).

    Call `start` once and `stop` once, from one thread.
    """

    def __init__(self, *, servicer: HealthServicer, port: int, host: str = "0.0.0.0") -> None:
        """Binds at once (``port`` 0 picks a free one, see ``self.port``); `OSError` if the
        address cannot be bound."""
        self._server = grpc.server(futures.ThreadPoolExecutor(2, "health"))
        health_grpc.add_HealthServicer_to_server(servicer, self._server)
        self.port = self._server.add_insecure_port(f"{host}:{port}")
        if self.port == 0:
            raise OSError(f"cannot listen on {host}:{port} for the health service")

    def start(self) -> None:
        """Start answering probes."""
        self._server.start()

    def stop(self, grace: float = 0.5) -> None:
        """Stop after ``grace`` seconds for calls in flight; idempotent."""
        self._server.stop(grace).wait(grace + 1)
