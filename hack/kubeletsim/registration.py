"""The kubelet's side of DRA plugin discovery and the DRA node service (gRPC over Unix sockets).

Owns, for one node: watching ``plugins_registry`` for registration sockets, the handshake
(``GetInfo`` with a 1 s deadline, validation of type/name/supported versions, then
``NotifyRegistrationStatus``), de-registration when the socket disappears, and the client calls
``NodePrepareResources`` / ``NodeUnprepareResources`` (v1, 45 s deadline) on the endpoint the
plugin announced. Mirrors kubelet's plugin manager (``pkg/kubelet/pluginmanager``) and DRA plugin
client (``pkg/kubelet/cm/dra/plugin``) closely enough that the real plugin cannot tell. The
wire is `pkg.draplugin.client` (shared with the unit tests and the plugin's liveness probe);
this module adds the kubelet's policy: handshake validation and response checks.
"""

from __future__ import annotations

import logging
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc

from pkg.draplugin.claims import ClaimRef
from pkg.draplugin.client import (
    DRA_SERVICES,
    GET_INFO_TIMEOUT,
    NOTIFY_TIMEOUT,
    DraClient,
    RegistrationClient,
    rpc_error_text,
)
from pkg.draplugin.proto.gen import kubelet_pluginregistration_v1_pb2 as reg

log = logging.getLogger(__name__)

DRA_PLUGIN_TYPE = "DRAPlugin"
KUBELET_DRA_SERVICES = tuple(DRA_SERVICES)
# A kubelet of Kubernetes 1.32 or 1.33 speaks DRA gRPC v1beta1 only (1.32 also v1alpha4, which
# the plugin does not serve); v1.DRAPlugin came with 1.34, as resource.k8s.io/v1 did.
KUBELET_DRA_SERVICES_BEFORE_1_34 = ("v1beta1.DRAPlugin",)


def kubelet_dra_services(resource_api_version: str) -> tuple[str, ...]:
    """The DRA services of a kubelet of the API server's release, told by the resource.k8s.io
    version it serves (`pkg.kube.resourceapi`): v1 means 1.34+."""
    if resource_api_version == "v1":
        return KUBELET_DRA_SERVICES
    return KUBELET_DRA_SERVICES_BEFORE_1_34


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as the kubelet stores it."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]


class DraPluginError(RuntimeError):
    """A NodePrepare/NodeUnprepare call failed (transport, gRPC status or per-claim error)."""


class DraPlugin:
    """A registered DRA plugin instance: its name, endpoint and a gRPC client to it."""

    def __init__(
        self, name: str, endpoint: str, registration_socket: Path, *, service: str = "v1.DRAPlugin"
    ) -> None:
        self.name = name
        self.endpoint = endpoint
        self.registration_socket = registration_socket
        self.service = service
        self._client = DraClient(endpoint, service=service)

    def close(self) -> None:
        self._client.close()

    def prepare(self, claims: Iterable[ClaimRef]) -> dict[str, list[PreparedDevice]]:
        """NodePrepareResources for one pod's claims; returns devices per claim UID.

        Raises DraPluginError on a gRPC error, a per-claim error, a result for an unknown claim
        or a missing result (the kubelet's response validation).
        """
        wanted = list(claims)
        try:
            response = self._client.node_prepare_resources(wanted)
        except grpc.RpcError as e:
            raise DraPluginError(f"NodePrepareResources failed: {rpc_error_text(e)}") from e
        uids = {c.uid for c in wanted}
        out: dict[str, list[PreparedDevice]] = {}
        errors = []
        for uid, result in response.claims.items():
            if uid not in uids:
                raise DraPluginError(
                    f"NodePrepareResources returned result for unknown claim {uid}"
                )
            if result.error:
                errors.append(f"claim {uid}: {result.error}")
                continue
            out[uid] = [
                PreparedDevice(
                    request_names=tuple(d.request_names),
                    pool_name=d.pool_name,
                    device_name=d.device_name,
                    cdi_device_ids=tuple(d.cdi_device_ids),
                )
                for d in result.devices
            ]
        if errors:
            raise DraPluginError("NodePrepareResources failed for " + "; ".join(errors))
        missing = len(uids) - len(out)
        if missing:
            raise DraPluginError(f"NodePrepareResources left out {missing} claims")
        return out

    def unprepare(self, claims: Iterable[ClaimRef]) -> None:
        """NodeUnprepareResources; raises DraPluginError like `prepare`."""
        wanted = list(claims)
        try:
            response = self._client.node_unprepare_resources(wanted)
        except grpc.RpcError as e:
            raise DraPluginError(f"NodeUnprepareResources failed: {rpc_error_text(e)}") from e
        errors = [f"claim {u}: {r.error}" for u, r in response.claims.items() if r.error]
        missing = {c.uid for c in wanted} - set(response.claims)
        if missing:
            errors.append(f"left out {len(missing)} claims")
        if errors:
            raise DraPluginError("NodeUnprepareResources failed for " + "; ".join(errors))


def _is_socket(p: Path) -> bool:
    return _socket_id(p) is not None


def _socket_id(p: Path) -> tuple[int, int] | None:
    """(inode, mtime) of a Unix socket file: a re-created socket gets a new identity."""
    try:
        st = p.lstat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns) if stat.S_ISSOCK(st.st_mode) else None


class PluginWatcher:
    """Registers every DRA plugin whose socket appears in ``registry_dir`` (and sub-dirs).

    Polls (the kubelet uses inotify) every ``interval`` s. A socket that fails the handshake is
    retried on the next pass; a removed socket de-registers its plugin. ``on_change`` is called
    after every (de)registration.
    """

    def __init__(
        self,
        registry_dir: Path,
        *,
        interval: float = 0.2,
        on_change: Callable[[], None] | None = None,
        services: tuple[str, ...] = KUBELET_DRA_SERVICES,
    ) -> None:
        self._dir = registry_dir
        self.services = services  # the DRA services this kubelet speaks, preferred first
        self._interval = interval
        self._on_change = on_change
        self._lock = threading.Lock()
        self._by_socket: dict[Path, DraPlugin] = {}
        self._ids: dict[Path, tuple[int, int]] = {}
        self._failed: dict[Path, str] = {}
        self._retry_at: dict[Path, float] = {}
        self._stop = threading.Event()
        self._changed = threading.Condition(self._lock)
        self._thread = threading.Thread(
            target=self._run, name=f"plugins:{registry_dir}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with self._lock:
            for p in self._by_socket.values():
                p.close()
            self._by_socket.clear()

    def plugin(self, driver: str) -> DraPlugin | None:
        """The most recently registered instance of ``driver`` (kubelet's preference)."""
        with self._lock:
            matches = [p for p in self._by_socket.values() if p.name == driver]
        return matches[-1] if matches else None

    def wait_for(self, driver: str, timeout: float) -> DraPlugin | None:
        with self._changed:
            self._changed.wait_for(
                lambda: any(p.name == driver for p in self._by_socket.values()), timeout
            )
        return self.plugin(driver)

    def last_errors(self) -> dict[Path, str]:
        with self._lock:
            return dict(self._failed)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._scan()
            except Exception:
                log.exception("plugin registry scan failed")
            self._stop.wait(self._interval)

    def _scan(self) -> None:
        present: dict[Path, tuple[int, int]] = {}
        for p in self._dir.rglob("*"):
            ident = None if p.name.startswith(".") else _socket_id(p)
            if ident is not None:
                present[p] = ident
        changed = False
        with self._lock:
            # Removed or re-created sockets de-register (the kubelet sees inotify events).
            for sock in [s for s in self._by_socket if present.get(s) != self._ids.get(s)]:
                old = self._by_socket.pop(sock)
                self._ids.pop(sock, None)
                old.close()
                log.info("de-registered plugin %s (socket %s removed)", old.name, sock)
                changed = True
            new = [s for s in present if s not in self._by_socket]
        for sock in sorted(new):
            if time.monotonic() < self._retry_at.get(sock, 0.0):
                continue
            plugin = self._register(sock)
            if plugin is None:
                self._retry_at[sock] = time.monotonic() + 1.0  # the reconciler's period
            else:
                with self._lock:
                    self._by_socket[sock] = plugin
                    self._ids[sock] = present[sock]
                    self._failed.pop(sock, None)
                    self._changed.notify_all()
                changed = True
        if changed and self._on_change:
            self._on_change()

    def _register(self, sock: Path) -> DraPlugin | None:
        with RegistrationClient(sock) as client:
            try:
                info = client.get_info(timeout=GET_INFO_TIMEOUT)
            except grpc.RpcError as e:
                self._note_failure(sock, f"GetInfo: {rpc_error_text(e)}")
                return None
            error = _validate(info, self.services)
            try:
                client.notify_registration_status(
                    registered=not error, error=error, timeout=NOTIFY_TIMEOUT
                )
            except grpc.RpcError as e:
                # The kubelet only logs this; the plugin is registered regardless.
                log.warning("NotifyRegistrationStatus to %s: %s", sock, rpc_error_text(e))
            if error:
                self._note_failure(sock, error)
                return None
        endpoint = info.endpoint or str(sock)
        # Like kubelet 1.34+: the first entry of the plugin's list that the kubelet supports.
        service = next(v for v in info.supported_versions if v in self.services)
        log.info("registered DRA plugin %s endpoint=%s service=%s", info.name, endpoint, service)
        return DraPlugin(info.name, endpoint, sock, service=service)

    def _note_failure(self, sock: Path, error: str) -> None:
        with self._lock:
            if self._failed.get(sock) != error:
                log.warning("plugin registration via %s failed: %s", sock, error)
            self._failed[sock] = error


def _validate(info: reg.PluginInfo, services: tuple[str, ...] = KUBELET_DRA_SERVICES) -> str:
    """The kubelet's checks; returns an error message or ``""``."""
    if info.type != DRA_PLUGIN_TYPE:
        return f"unsupported plugin type {info.type!r}"
    if not info.name:
        return "plugin name is empty"
    if not info.supported_versions:
        return "empty list of supported versions"
    if not any(v in services for v in info.supported_versions):
        return (
            f"none of services supported by the plugin {list(info.supported_versions)} are "
            f"supported by the kubelet {list(services)}"
        )
    if info.endpoint and not _is_socket(Path(info.endpoint)):
        return f"endpoint {info.endpoint} is not a Unix socket"
    return ""
