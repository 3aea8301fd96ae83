"""What a node's GPUs tell the plugin, and the upstream rules that turn fabric info into a clique.

Owns the `DeviceDiscovery` protocol (one `discover()` call at start-up), its value types and
`clique_id_from_fabric`, the single implementation of upstream's clique rules, shared by the
NVML and fake backends so both refuse and accept exactly the same fabric states:

* fabric not supported (error or state NOT_SUPPORTED) on a GPU -> that GPU has no clique;
* any state other than COMPLETED, or a status other than success -> `DiscoveryError`
  (upstream "refusing to start": the fabric manager is still training or broken) -- unless the
  gate ``CrashOnNVLinkFabricErrors`` is off (``strict=False``, upstream's legacy go-nvlib
  ``IsFabricAttached`` rule): then that GPU is simply not fabric-attached and has no clique;
* on a single-node NVLink system (``single_node_nvlink``, detected by `fabric` only with the
  gate ``FabricManagerPartitioning`` on) a state other than COMPLETED is skipped with a log line
  even in strict mode: its fabric manager may still be registering GPUs after a reboot;
* all-zero cluster UUID -> no clique;
* no GPU with a clique -> ``""`` (non-NVLink node); more than one distinct cluster UUID or
  clique id -> `DiscoveryError` (in both modes); else ``"<clusterUUID>.<cliqueId>"``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol

FABRIC_STATE_NOT_SUPPORTED: Final = 0
FABRIC_STATE_NOT_STARTED: Final = 1
FABRIC_STATE_IN_PROGRESS: Final = 2
FABRIC_STATE_COMPLETED: Final = 3
_STATE_NAMES: Final = {0: "NOT_SUPPORTED", 1: "NOT_STARTED", 2: "IN_PROGRESS", 3: "COMPLETED"}
ZERO_UUID: Final = str(uuid.UUID(int=0))

log = logging.getLogger(__name__)


class DiscoveryError(Exception):
    """The node's GPUs are in a state the plugin must not start with; the message says why."""


@dataclass(frozen=True)
class FabricInfo:
    """One GPU's fabric registration; ``supported=False`` means NVML said NOT_SUPPORTED."""

    supported: bool
    state: int = FABRIC_STATE_NOT_SUPPORTED
    status: int = 0
    cluster_uuid: str = ZERO_UUID
    clique_id: int = 0


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    minor: int | None
    fabric: FabricInfo


@dataclass(frozen=True)
class NodeDevices:
    """Result of discovery: driver version, GPUs, and the node's clique ID (may be empty)."""

    driver_version: str
    gpus: tuple[GpuInfo, ...]
    clique_id: str


class DeviceDiscovery(Protocol):
    def discover(self) -> NodeDevices:
        """Inspect the node's GPUs now; raise `DiscoveryError` if the plugin must not start.

        Called once at start-up and again by the periodic clique refresh, so every call
        re-reads the devices (nothing is cached) and logs the clique detection again.
        """
        ...


def clique_id_from_fabric(
    gpus: Sequence[GpuInfo], *, strict: bool = True, single_node_nvlink: bool = False
) -> str:
    """The node's clique ID (module docstring); ``strict`` is gate CrashOnNVLinkFabricErrors,
    ``single_node_nvlink`` tolerates incomplete registrations (module docstring)."""
    cluster_uuids: set[str] = set()
    clique_ids: set[int] = set()
    for gpu in gpus:
        fabric = gpu.fabric
        if not fabric.supported or fabric.state == FABRIC_STATE_NOT_SUPPORTED:
            continue
        healthy = fabric.state == FABRIC_STATE_COMPLETED and fabric.status == 0
        if not strict and not healthy:
            log.info(
                "no-clique fallback: NVLink fabric not attached (GPU %d/%s, state %s, status %d)",
                gpu.index,
                gpu.uuid,
                _STATE_NAMES.get(fabric.state, fabric.state),
                fabric.status,
            )
            continue
        if fabric.state != FABRIC_STATE_COMPLETED and single_node_nvlink:
            log.info(
                "no-clique fallback: ignoring incomplete NVLink registration (device=%d/%s, "
                "state=%d) on single-node NVLink system",
                gpu.index,
                gpu.uuid,
                fabric.state,
            )
            continue
        if fabric.state != FABRIC_STATE_COMPLETED:
            state = _STATE_NAMES.get(fabric.state, str(fabric.state))
            raise DiscoveryError(
                f"GPU {gpu.index} ({gpu.uuid}): NVLink fabric registration is {state}, not "
                "COMPLETED; refusing to start (check nvidia-fabricmanager / IMEX setup)"
            )
        if fabric.status != 0:
            raise DiscoveryError(
                f"GPU {gpu.index} ({gpu.uuid}): NVLink fabric registration failed with NVML "
                f"status {fabric.status}; refusing to start"
            )
        if fabric.cluster_uuid == ZERO_UUID:
            continue
        log.info(
            "identified fabric clique UUID/ID (device %d/%s): %s/%d",
            gpu.index,
            gpu.uuid,
            fabric.cluster_uuid,
            fabric.clique_id,
        )
        cluster_uuids.add(fabric.cluster_uuid)
        clique_ids.add(fabric.clique_id)
    if not cluster_uuids:
        return ""
    if len(cluster_uuids) > 1:
        raise DiscoveryError(
            f"GPUs report more than one NVLink cluster UUID: {sorted(cluster_uuids)}"
        )
    if len(clique_ids) > 1:
        raise DiscoveryError(f"GPUs report more than one NVLink clique id: {sorted(clique_ids)}")
    return f"{cluster_uuids.pop()}.{clique_ids.pop()}"


def parse_driver_version(version: str) -> tuple[int, ...]:
    """``"570.158.01"`` -> ``(570, 158, 1)``; non-numeric parts compare as 0."""
    parts: list[int] = []
    for part in version.strip().split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


# Upstream refuses DNS-name mode (gate IMEXDaemonsWithDNSNames) on older drivers.
MIN_DNS_NAMES_DRIVER_VERSION: Final = "570.158.01"


def check_driver_version(devices: NodeDevices, *, dns_names: bool) -> None:
    """Raise `DiscoveryError` if DNS-name mode is on and the driver is too old for it."""
    if not dns_names or not devices.gpus:
        return
    if parse_driver_version(devices.driver_version) < parse_driver_version(
        MIN_DNS_NAMES_DRIVER_VERSION
    ):
        raise DiscoveryError(
            f"NVIDIA driver {devices.driver_version} is older than "
            f"{MIN_DNS_NAMES_DRIVER_VERSION}, required for IMEX daemons with DNS names; "
            "upgrade the driver or set featureGates.IMEXDaemonsWithDNSNames=false"
        )
