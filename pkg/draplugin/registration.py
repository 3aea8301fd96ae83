"""The kubelet plugin-watcher registration service (``pluginregistration.Registration``).

Owns what the plugin tells the kubelet about itself and what the kubelet answers. Invariants:
``GetInfo`` never blocks (the kubelet gives it about one second) - it only returns constants;
the versions list puts ``v1.DRAPlugin`` first because kubelets pick the first entry they know,
and advertises the optional ``DRAResourceHealth`` service in both versions (kubelets 1.37+
prefer ``v1``; 1.34-1.36 know only ``v1alpha1``; unknown entries are ignored);
``NotifyRegistrationStatus`` is recorded (thread-safe) for the health service and logged.
Driver-agnostic: the driver only supplies its name and the DRA endpoint.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Final

import grpc

from pkg.draplugin.proto.gen import kubelet_pluginregistration_v1_pb2 as reg_pb2
from pkg.draplugin.proto.gen import kubelet_pluginregistration_v1_pb2_grpc as reg_grpc

log = logging.getLogger(__name__)

PLUGIN_TYPE: Final = "DRAPlugin"
SUPPORTED_SERVICES: Final = (
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1.DRAResourceHealth",
    "v1alpha1.DRAResourceHealth",
)


@dataclass(frozen=True)
class RegistrationStatus:
    """What the kubelet last said about the registration (immutable).

    ``notified`` is False until the first ``NotifyRegistrationStatus``; ``error`` is the
    kubelet's reason when ``registered`` is False.
    """

    notified: bool = False
    registered: bool = False
    error: str = ""


class RegistrationServicer(reg_grpc.RegistrationServicer):
    """The plugin-watcher ``Registration`` service of one plugin instance.

    Thread-safe: gRPC calls it from its worker threads while the health service reads `status`.
    """

    def __init__(self, *, driver_name: str, endpoint: str) -> None:
        """``driver_name`` is the DRA driver name the kubelet matches against the claims'
        results; ``endpoint`` the DRA socket path it dials after registering."""
        self._info = reg_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=driver_name,
            endpoint=endpoint,
            supported_versions=list(SUPPORTED_SERVICES),
        )
        self._lock = threading.Lock()
        self._status = RegistrationStatus()

    def GetInfo(  # noqa: N802
        self, request: reg_pb2.InfoRequest, context: grpc.ServicerContext
    ) -> reg_pb2.PluginInfo:
        """Type, name, endpoint and supported services; constant, never blocks."""
        return self._info

    def NotifyRegistrationStatus(  # noqa: N802
        self, request: reg_pb2.RegistrationStatus, context: grpc.ServicerContext
    ) -> reg_pb2.RegistrationStatusResponse:
        """Record and log the kubelet's verdict (read through :attr:`status`)."""
        with self._lock:
            self._status = RegistrationStatus(
                notified=True, registered=request.plugin_registered, error=request.error
            )
        if request.plugin_registered:
            log.info("kubelet registered plugin %s", self._info.name)
        else:
            log.error("kubelet rejected plugin %s: %s", self._info.name, request.error)
        return reg_pb2.RegistrationStatusResponse()

    @property
    def status(self) -> RegistrationStatus:
        """The kubelet's last verdict (`RegistrationStatus` with ``notified=False`` before any)."""
        with self._lock:
            return self._status
