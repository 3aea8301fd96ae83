"""gRPC health service (``grpc.health.v1.Health``) on a TCP port, upstream's liveness model.

Owns what "healthy" means. Service names:

* ``""`` and ``liveness``: SERVING only if ``GetInfo`` on the registration socket and an empty
  ``NodePrepareResources`` on the DRA socket both answer - i.e. the sockets the kubelet uses
  really work (a probe of the process alone would not notice a deleted socket file);
* ``registration``: SERVING once the kubelet reported a successful registration, NOT_SERVING
  if it reported a failure (the error is logged), UNKNOWN before it said anything;
* ``checkpoint``: NOT_SERVING while a corrupt checkpoint was found at start (see
  `checkpoint`'s policy), so operators can alert on it without the kubelet restarting us.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Final

import grpc

from pkg.kubeletplugin.proto.gen import grpc_health_v1_pb2 as health_pb2
from pkg.kubeletplugin.proto.gen import grpc_health_v1_pb2_grpc as health_grpc
from pkg.kubeletplugin.proto.gen import kubelet_dra_v1_pb2 as dra_pb2
from pkg.kubeletplugin.proto.gen import kubelet_dra_v1_pb2_grpc as dra_grpc
from pkg.kubeletplugin.proto.gen import kubelet_pluginregistration_v1_pb2 as reg_pb2
from pkg.kubeletplugin.proto.gen import kubelet_pluginregistration_v1_pb2_grpc as reg_grpc
from pkg.kubeletplugin.registration import RegistrationServicer

SERVING: Final = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING: Final = health_pb2.HealthCheckResponse.NOT_SERVING
UNKNOWN: Final = health_pb2.HealthCheckResponse.UNKNOWN
_PROBE_TIMEOUT: Final = 5.0


class HealthServicer(health_grpc.HealthServicer):
    def __init__(
        self,
        *,
        registration_socket: Path,
        dra_socket: Path,
        registration: RegistrationServicer,
        checkpoint_problem: Callable[[], str],
    ) -> None:
        self._reg_socket = registration_socket
        self._dra_socket = dra_socket
        self._registration = registration
        self._checkpoint_problem = checkpoint_problem
        self._lock = threading.Lock()

    def sockets_ok(self) -> bool:
        with self._lock:  # one probe at a time: the kubelet may probe faster than we answer
            try:
                with grpc.insecure_channel(f"unix:{self._reg_socket}") as channel:
                    reg_grpc.RegistrationStub(channel).GetInfo(
                        reg_pb2.InfoRequest(), timeout=_PROBE_TIMEOUT
                    )
                with grpc.insecure_channel(f"unix:{self._dra_socket}") as channel:
                    dra_grpc.DRAPluginStub(channel).NodePrepareResources(
                        dra_pb2.NodePrepareResourcesRequest(), timeout=_PROBE_TIMEOUT
                    )
            except grpc.RpcError:
                return False
            return True

    def status_of(self, service: str) -> int | None:
        if service in ("", "liveness"):
            return SERVING if self.sockets_ok() else NOT_SERVING
        if service == "registration":
            status = self._registration.status
            if not status.notified:
                return UNKNOWN
            return SERVING if status.registered else NOT_SERVING
        if service == "checkpoint":
            return NOT_SERVING if self._checkpoint_problem() else SERVING
        return None

    def Check(  # noqa: N802
        self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        status = self.status_of(request.service)
        if status is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)  # type: ignore[arg-type]

    def Watch(  # noqa: N802
        self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext
    ) -> Iterator[health_pb2.HealthCheckResponse]:
        # Probes use Check; Watch reports the current status once instead of streaming.
        status = self.status_of(request.service)
        yield health_pb2.HealthCheckResponse(
            status=health_pb2.HealthCheckResponse.SERVICE_UNKNOWN if status is None else status  # type: ignore[arg-type]
        )


class HealthServer:
    def __init__(self, *, servicer: HealthServicer, port: int, host: str = "0.0.0.0") -> None:
        self._server = grpc.server(futures.ThreadPoolExecutor(2, "health"))
        health_grpc.add_HealthServicer_to_server(servicer, self._server)
        self.port = self._server.add_insecure_port(f"{host}:{port}")
        if self.port == 0:
            raise OSError(f"cannot listen on {host}:{port} for the health service")

    def start(self) -> None:
        self._server.start()

    def stop(self, grace: float = 0.5) -> None:
        self._server.stop(grace).wait(grace + 1)
