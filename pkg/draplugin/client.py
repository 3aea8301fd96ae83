"""The kubelet's side of a DRA plugin's gRPC protocols: one client for every caller that plays it.

Owns how the kubelet talks to a plugin: ``pluginregistration.Registration`` on the registration
socket (`RegistrationClient`) and ``DRAPlugin`` (``v1``/``v1beta1``) plus ``DRAResourceHealth``
(``v1``/``v1alpha1``) on the DRA endpoint (`DraClient`), with the kubelet's deadlines as
defaults. Used by the plugin's own liveness probe (`pkg.draplugin.health`), the kubelet
stand-in (``hack/kubeletsim``) and the unit tests, so all three speak exactly the same wire.

The DRA messages of the versions are wire-identical; a `DraClient` builds requests from the
chosen version's own message module and calls that version's method path, so the plugin sees
what a kubelet of that version sends. Responses are returned as the generated messages: policy
on them (missing results, per-claim errors) is the caller's - the kubelet stand-in applies the
kubelet's, tests inspect them raw.

Thread-safety: a client owns one gRPC channel; gRPC channels are thread-safe, so one client may
serve concurrent calls. `close` (or leaving the ``with`` block) ends the channel and every call
in flight on it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any, Final, Self

import grpc

from pkg.draplugin.claims import ClaimRef
from pkg.draplugin.proto.gen import kubelet_dra_health_v1_pb2 as health_v1_pb2
from pkg.draplugin.proto.gen import kubelet_dra_health_v1alpha1_pb2 as health_v1alpha1_pb2
from pkg.draplugin.proto.gen import kubelet_dra_v1_pb2 as v1_pb2
from pkg.draplugin.proto.gen import kubelet_dra_v1beta1_pb2 as v1beta1_pb2
from pkg.draplugin.proto.gen import kubelet_pluginregistration_v1_pb2 as reg_pb2
from pkg.draplugin.proto.gen import kubelet_pluginregistration_v1_pb2_grpc as reg_grpc

# The kubelet's deadlines: GetInfo gets about a second, DRA calls 45 s.
GET_INFO_TIMEOUT: Final = 1.0
NOTIFY_TIMEOUT: Final = 5.0
DRA_CALL_TIMEOUT: Final = 45.0

# Service name (as in PluginInfo.supported_versions) -> that version's message module; the
# method paths come from the module's proto package.
DRA_SERVICES: Final[dict[str, ModuleType]] = {
    "v1.DRAPlugin": v1_pb2,
    "v1beta1.DRAPlugin": v1beta1_pb2,
}
HEALTH_SERVICES: Final[dict[str, ModuleType]] = {
    "v1.DRAResourceHealth": health_v1_pb2,
    "v1alpha1.DRAResourceHealth": health_v1alpha1_pb2,
}


def rpc_error_text(err: grpc.RpcError) -> str:
    """The Go client's rendering: ``rpc error: code = <Code> desc = <details>``; never raises."""
    # Errors raised by calls are also grpc.Call objects (code/details), not statically typed so.
    code_fn, details_fn = getattr(err, "code", None), getattr(err, "details", None)
    code = code_fn() if callable(code_fn) else None
    details = details_fn() if callable(details_fn) else str(err)
    return f"rpc error: code = {code.name if code else 'Unknown'} desc = {details}"


def _target(socket: Path | str) -> str:
    return f"unix:{socket}"


class _Channel:
    def __init__(self, socket: Path | str) -> None:
        # A connection of its own, as each of the kubelet's gRPC ClientConns has: from gRPC's
        # global subchannel pool a new channel may reuse a connection another channel still
        # holds (closing is asynchronous), and a call then succeeds although the socket file
        # is gone -- a health probe of a deleted socket answered SERVING that way under load.
        self._channel = grpc.insecure_channel(
            _target(socket), options=[("grpc.use_local_subchannel_pool", 1)]
        )

    def close(self) -> None:
        """End the channel and every call in flight on it; idempotent."""
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class RegistrationClient(_Channel):
    """The kubelet plugin watcher's calls on a plugin's registration socket."""

    def __init__(self, socket: Path | str) -> None:
        """Dials lazily: nothing is sent before the first call."""
        super().__init__(socket)
        self._stub = reg_grpc.RegistrationStub(self._channel)

    def get_info(self, *, timeout: float = GET_INFO_TIMEOUT) -> reg_pb2.PluginInfo:
        """``GetInfo``; raises `grpc.RpcError` (e.g. ``DEADLINE_EXCEEDED``, ``UNAVAILABLE``)."""
        return self._stub.GetInfo(reg_pb2.InfoRequest(), timeout=timeout)

    def notify_registration_status(
        self, *, registered: bool, error: str = "", timeout: float = NOTIFY_TIMEOUT
    ) -> None:
        """``NotifyRegistrationStatus`` with the kubelet's verdict; raises `grpc.RpcError`."""
        self._stub.NotifyRegistrationStatus(
            reg_pb2.RegistrationStatus(plugin_registered=registered, error=error),
            timeout=timeout,
        )


class DraClient(_Channel):
    """The kubelet's DRA calls on one plugin endpoint, in one ``DRAPlugin`` version."""

    def __init__(self, endpoint: Path | str, *, service: str = "v1.DRAPlugin") -> None:
        """``service`` is a key of `DRA_SERVICES` (`KeyError` otherwise); dials lazily."""
        super().__init__(endpoint)
        self.service = service
        pb2 = DRA_SERVICES[service]
        package = pb2.DESCRIPTOR.package
        self._pb2 = pb2
        self._prepare = self._channel.unary_unary(
            f"/{package}.DRAPlugin/NodePrepareResources",
            request_serializer=pb2.NodePrepareResourcesRequest.SerializeToString,
            response_deserializer=pb2.NodePrepareResourcesResponse.FromString,
        )
        self._unprepare = self._channel.unary_unary(
            f"/{package}.DRAPlugin/NodeUnprepareResources",
            request_serializer=pb2.NodeUnprepareResourcesRequest.SerializeToString,
            response_deserializer=pb2.NodeUnprepareResourcesResponse.FromString,
        )

    def _claims(self, claims: Iterable[ClaimRef]) -> list[Any]:
        return [self._pb2.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]

    def node_prepare_resources(
        self, claims: Iterable[ClaimRef], *, timeout: float = DRA_CALL_TIMEOUT
    ) -> Any:
        """``NodePrepareResources`` for ``claims`` (in order, duplicates kept); the response
        message of this version. Raises `grpc.RpcError` only if the call itself fails."""
        request = self._pb2.NodePrepareResourcesRequest(claims=self._claims(claims))
        return self._prepare(request, timeout=timeout)

    def node_unprepare_resources(
        self, claims: Iterable[ClaimRef], *, timeout: float = DRA_CALL_TIMEOUT
    ) -> Any:
        """``NodeUnprepareResources``, like `node_prepare_resources`."""
        request = self._pb2.NodeUnprepareResourcesRequest(claims=self._claims(claims))
        return self._unprepare(request, timeout=timeout)

    def node_watch_resources(self, *, service: str = "v1.DRAResourceHealth") -> Any:
        """Open the ``NodeWatchResources`` stream of ``service`` (a key of `HEALTH_SERVICES`).

        Returns gRPC's call iterator: iterate it for the response messages, ``cancel()`` it to
        end the stream; iteration raises `grpc.RpcError` when the stream fails or is cancelled.
        """
        pb2 = HEALTH_SERVICES[service]
        watch = self._channel.unary_stream(
            f"/{pb2.DESCRIPTOR.package}.DRAResourceHealth/NodeWatchResources",
            request_serializer=pb2.NodeWatchResourcesRequest.SerializeToString,
            response_deserializer=pb2.NodeWatchResourcesResponse.FromString,
        )
        return watch(pb2.NodeWatchResourcesRequest())
