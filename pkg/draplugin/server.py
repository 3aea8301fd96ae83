"""gRPC servers on the kubelet's Unix sockets: DRA (v1 + v1beta1), device health, registration.

Owns socket lifecycle and the mapping between wire messages and a `ClaimHandler` (normally
`pkg.draplugin.fanout.ClaimFanOut`). Invariants:
* one `ClaimHandler` serves both DRA versions (the messages have the same shape; v1beta1 simply
  has no ``share_id``, which is never set);
* the DRA socket also serves ``DRAResourceHealth`` as ``v1`` and ``v1alpha1`` (one
  `pkg.draplugin.resourcehealth.DeviceHealthFeed` behind both) when a feed is given;
* every requested claim UID gets exactly one response entry (duplicates are answered once), an
  empty request gets an empty map, and bad claims become per-claim errors - the RPC itself only
  fails if the handler crashes;
* the DRA socket is serving before the registration socket exists (the kubelet dials the
  endpoint right after registering); stale socket files are removed first; socket files are
  ``0600`` (never world-writable); on stop the registration socket goes first, then DRA.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Final, Protocol, cast

import grpc

from pkg.draplugin.claims import ClaimRef
from pkg.draplugin.proto.gen import kubelet_dra_health_v1_pb2 as health_v1_pb2
from pkg.draplugin.proto.gen import kubelet_dra_health_v1_pb2_grpc as health_v1_grpc
from pkg.draplugin.proto.gen import kubelet_dra_health_v1alpha1_pb2 as health_v1alpha1_pb2
from pkg.draplugin.proto.gen import (
    kubelet_dra_health_v1alpha1_pb2_grpc as health_v1alpha1_grpc,
)
from pkg.draplugin.proto.gen import kubelet_dra_v1_pb2 as v1_pb2
from pkg.draplugin.proto.gen import kubelet_dra_v1_pb2_grpc as v1_grpc
from pkg.draplugin.proto.gen import kubelet_dra_v1beta1_pb2 as v1beta1_pb2
from pkg.draplugin.proto.gen import kubelet_dra_v1beta1_pb2_grpc as v1beta1_grpc
from pkg.draplugin.proto.gen import kubelet_pluginregistration_v1_pb2_grpc as reg_grpc
from pkg.draplugin.registration import RegistrationServicer
from pkg.draplugin.resourcehealth import DeviceHealthFeed, ResourceHealthServicer

log = logging.getLogger(__name__)

# The kubelet allows 45 s per call; answer with a retryable error before it gives up.
MAX_CALL_BUDGET: Final = 40.0
_DEADLINE_MARGIN: Final = 3.0


class Device(Protocol):
    """One prepared device as reported to the kubelet (any object with these attributes).

    ``request_names`` may hold subrequest names (``req/sub``); the server strips them like the
    Go library does.
    """

    @property
    def request_names(self) -> Sequence[str]:
        """The claim's requests this device satisfies."""
        ...

    @property
    def pool_name(self) -> str:
        """The ResourceSlice pool the device was allocated from."""
        ...

    @property
    def device_name(self) -> str:
        """The device's name in that pool."""
        ...

    @property
    def cdi_device_ids(self) -> Sequence[str]:
        """Fully qualified CDI device IDs the container runtime injects."""
        ...


@dataclass(frozen=True)
class PrepareOutcome:
    """One claim's answer: its devices, or the per-claim error text (non-empty = failed)."""

    devices: tuple[Device, ...] = ()
    error: str = ""


class ClaimHandler(Protocol):
    """What the DRA servicers call; must be thread-safe (gRPC runs requests concurrently)."""

    def prepare_claims(
        self, claims: Sequence[ClaimRef], *, budget: float
    ) -> dict[str, PrepareOutcome]:
        """An outcome per distinct claim UID within ``budget`` seconds; raises only on a crash
        (which fails the whole RPC)."""
        ...

    def unprepare_claims(self, claims: Sequence[ClaimRef], *, budget: float) -> dict[str, str]:
        """An error text per distinct claim UID (``""`` = done) within ``budget`` seconds."""
        ...


def _budget(context: grpc.ServicerContext) -> float:
    # grpc returns None without a client deadline although its stubs say float.
    remaining: float | None = context.time_remaining()
    if remaining is None:
        return MAX_CALL_BUDGET
    return max(min(remaining - _DEADLINE_MARGIN, MAX_CALL_BUDGET), 0.0)


def _refs(claims: Any) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]


class _DraServicer:
    """Serves one DRA API version; ``pb2`` is that version's generated message module."""

    def __init__(self, *, handler: ClaimHandler, pb2: ModuleType) -> None:
        self._handler = handler
        self._pb2 = pb2

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        pb2 = self._pb2
        outcomes = self._handler.prepare_claims(_refs(request.claims), budget=_budget(context))
        response = pb2.NodePrepareResourcesResponse()
        for uid, outcome in outcomes.items():
            entry = response.claims[uid]
            if outcome.error:
                entry.error = outcome.error
                continue
            for d in outcome.devices:
                entry.devices.append(
                    pb2.Device(
                        # Like the Go kubeletplugin library: subrequest names are stripped.
                        request_names=[n.split("/", 1)[0] for n in d.request_names],
                        pool_name=d.pool_name,
                        device_name=d.device_name,
                        cdi_device_ids=list(d.cdi_device_ids),
                    )
                )
        return response

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        pb2 = self._pb2
        errors = self._handler.unprepare_claims(_refs(request.claims), budget=_budget(context))
        response = pb2.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            response.claims[uid].error = error
        return response


def _bind_unix(server: grpc.Server, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()  # stale socket of a previous run
    if server.add_insecure_port(f"unix:{path}") == 0:
        raise OSError(f"cannot listen on {path}")


class PluginServers:
    """The DRA server and the registration server, started and stopped in the safe order.

    Not thread-safe itself: call `start` once, then `stop` once, from one thread (the RPCs it
    serves run on its own worker threads).
    """

    def __init__(
        self,
        *,
        handler: ClaimHandler,
        registration: RegistrationServicer,
        dra_socket: Path,
        registration_socket: Path,
        device_health: DeviceHealthFeed | None = None,
        max_workers: int = 16,
    ) -> None:
        """Builds both servers without touching the file system; ``device_health`` adds the
        ``DRAResourceHealth`` services; ``max_workers`` bounds concurrent DRA RPCs."""
        self.dra_socket = dra_socket
        self.registration_socket = registration_socket
        self._dra = grpc.server(futures.ThreadPoolExecutor(max_workers, "dra"))
        v1 = cast(v1_grpc.DRAPluginServicer, _DraServicer(handler=handler, pb2=v1_pb2))
        v1_grpc.add_DRAPluginServicer_to_server(v1, self._dra)
        v1beta1 = cast(
            v1beta1_grpc.DRAPluginServicer, _DraServicer(handler=handler, pb2=v1beta1_pb2)
        )
        v1beta1_grpc.add_DRAPluginServicer_to_server(v1beta1, self._dra)
        if device_health is not None:
            h1 = ResourceHealthServicer(feed=device_health, pb2=health_v1_pb2)
            health_v1_grpc.add_DRAResourceHealthServicer_to_server(
                cast(health_v1_grpc.DRAResourceHealthServicer, h1), self._dra
            )
            h1a1 = ResourceHealthServicer(feed=device_health, pb2=health_v1alpha1_pb2)
            health_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(
                cast(health_v1alpha1_grpc.DRAResourceHealthServicer, h1a1), self._dra
            )
        self._reg = grpc.server(futures.ThreadPoolExecutor(2, "registration"))
        reg_grpc.add_RegistrationServicer_to_server(registration, self._reg)

    def start(self) -> None:
        """Serve DRA, then registration (stale socket files replaced, both ``0600``).

        Raises `OSError` if a socket cannot be bound; the kubelet may call in as soon as this
        returns.
        """
        _bind_unix(self._dra, self.dra_socket)
        self._dra.start()
        os.chmod(self.dra_socket, 0o600)
        _bind_unix(self._reg, self.registration_socket)
        self._reg.start()
        os.chmod(self.registration_socket, 0o600)
        log.info("serving DRA on %s, registration on %s", self.dra_socket, self.registration_socket)

    def stop(self, grace: float = 1.0) -> None:
        """Stop registration first (the kubelet de-registers), then DRA after ``grace`` seconds
        for in-flight calls; both socket files are removed. Idempotent."""
        self._reg.stop(grace).wait(grace + 1)
        self.registration_socket.unlink(missing_ok=True)
        self._dra.stop(grace).wait(grace + 1)
        self.dra_socket.unlink(missing_ok=True)
