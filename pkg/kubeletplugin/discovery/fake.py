"""Fake-GPU discovery backend for tests and clusters without GPUs.

Configuration comes from env ``FAKE_GPU_CONFIG``: either inline JSON (starts with ``{``) or the
path of a JSON file. Schema (all keys optional)::

    {
      "driverVersion": "580.65.06",          # reported NVIDIA driver version
      "gpuCount": 4,                          # number of GPUs (default 4; 0 = no GPUs)
      "clusterUUID": "<uuid>",                # NVLink cluster UUID; omit/"" for a non-NVLink node
      "cliqueId": 1,                          # NVLink clique id (uint32)
      "fabric": {"state": "COMPLETED",        # default fabric info for every GPU:
                 "status": 0},                #   NOT_SUPPORTED|NOT_STARTED|IN_PROGRESS|COMPLETED
      "gpus": [ {"fabric": {...}, "clusterUUID": "...", "cliqueId": 2}, ... ]
                                              # optional per-GPU overrides (index = position)
    }

Without ``clusterUUID`` every GPU reports NOT_SUPPORTED (non-NVLink node, empty clique). The
fake infos pass through the same `clique_id_from_fabric` rules as NVML, so fabric errors can be
rehearsed. GPU UUIDs are derived from the node name so they are stable across restarts.
A config given as a file path is re-read on every `FakeDiscovery.discover` (`from_setting`),
so a test changes the node's clique at runtime by rewriting that file, as fabric partitioning
would, and the plugin's periodic clique refresh picks it up.
Invariant: an invalid config raises `DiscoveryError` naming the offending key.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from pkg.kubeletplugin.discovery.base import (
    FABRIC_STATE_NOT_SUPPORTED,
    ZERO_UUID,
    DiscoveryError,
    FabricInfo,
    GpuInfo,
    NodeDevices,
    clique_id_from_fabric,
)

_STATES = {"NOT_SUPPORTED": 0, "NOT_STARTED": 1, "IN_PROGRESS": 2, "COMPLETED": 3}
DEFAULT_DRIVER_VERSION = "580.65.06"
_KNOWN_KEYS = {"driverVersion", "gpuCount", "clusterUUID", "cliqueId", "fabric", "gpus"}


def load_fake_config(value: str) -> dict[str, Any]:
    """Parse ``FAKE_GPU_CONFIG``: inline JSON or a path to a JSON file ("" = defaults)."""
    if not value.strip():
        return {}
    text = value if value.lstrip().startswith("{") else _read(Path(value))
    try:
        config = json.loads(text)
    except ValueError as err:
        raise DiscoveryError(f"FAKE_GPU_CONFIG is not valid JSON: {err}") from err
    if not isinstance(config, dict):
        raise DiscoveryError("FAKE_GPU_CONFIG must be a JSON object")
    unknown = sorted(set(config) - _KNOWN_KEYS)
    if unknown:
        raise DiscoveryError(f'FAKE_GPU_CONFIG: unknown key "{unknown[0]}"')
    return config


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as err:
        raise DiscoveryError(f"cannot read FAKE_GPU_CONFIG file {path}: {err}") from err


def _fabric(spec: Any, *, cluster_uuid: str, clique_id: Any, where: str) -> FabricInfo:
    if not isinstance(spec, dict):
        raise DiscoveryError(f'FAKE_GPU_CONFIG: "{where}.fabric" must be an object')
    state_name = spec.get("state", "COMPLETED" if cluster_uuid else "NOT_SUPPORTED")
    if state_name not in _STATES:
        raise DiscoveryError(
            f'FAKE_GPU_CONFIG: "{where}.fabric.state" must be one of {sorted(_STATES)}'
        )
    status = spec.get("status", 0)
    if not isinstance(status, int) or not isinstance(clique_id, int) or clique_id < 0:
        raise DiscoveryError(
            f'FAKE_GPU_CONFIG: "{where}.fabric.status" and "cliqueId" must be non-negative ints'
        )
    state = _STATES[state_name]
    if state == FABRIC_STATE_NOT_SUPPORTED:
        return FabricInfo(supported=False)
    try:
        normalized = str(uuid.UUID(cluster_uuid)) if cluster_uuid else ZERO_UUID
    except ValueError as err:
        raise DiscoveryError(f'FAKE_GPU_CONFIG: "{where}.clusterUUID" is not a UUID') from err
    return FabricInfo(
        supported=True,
        state=state,
        status=status,
        cluster_uuid=normalized,
        clique_id=clique_id,
    )


class FakeDiscovery:
    """`DeviceDiscovery` that reports GPUs described by a config dict (see module docstring)."""

    def __init__(
        self,
        *,
        config: dict[str, Any],
        node_name: str,
        strict_fabric: bool = True,
        single_node_nvlink: bool = False,
        config_file: Path | None = None,
    ) -> None:
        """``strict_fabric``: gate CrashOnNVLinkFabricErrors; ``single_node_nvlink``: the node
        is one (see `clique_id_from_fabric`); ``config_file``: re-read on every `discover`,
        replacing ``config``."""
        self._config = config
        self._node = node_name
        self._strict = strict_fabric
        self._single_node_nvlink = single_node_nvlink
        self._config_file = config_file

    @classmethod
    def from_setting(
        cls,
        value: str,
        *,
        node_name: str,
        strict_fabric: bool = True,
        single_node_nvlink: bool = False,
    ) -> FakeDiscovery:
        """Discovery for a ``FAKE_GPU_CONFIG`` value: inline JSON is parsed once, a file path
        is read now (an invalid file fails here) and again on every `discover`."""
        config = load_fake_config(value)
        is_file = bool(value.strip()) and not value.lstrip().startswith("{")
        return cls(
            config=config,
            node_name=node_name,
            strict_fabric=strict_fabric,
            single_node_nvlink=single_node_nvlink,
            config_file=Path(value) if is_file else None,
        )

    def discover(self) -> NodeDevices:
        """The configured GPUs (the file's current content, if there is one) and their clique;
        `DiscoveryError` for an invalid config or a fabric state the plugin must not run with."""
        cfg = (
            self._config if self._config_file is None else load_fake_config(str(self._config_file))
        )
        count = cfg.get("gpuCount", 4)
        overrides = cfg.get("gpus", [])
        if not isinstance(count, int) or count < 0:
            raise DiscoveryError('FAKE_GPU_CONFIG: "gpuCount" must be a non-negative int')
        if not isinstance(overrides, list):
            raise DiscoveryError('FAKE_GPU_CONFIG: "gpus" must be a list')
        count = max(count, len(overrides))
        gpus = []
        for i in range(count):
            override = overrides[i] if i < len(overrides) else {}
            if not isinstance(override, dict):
                raise DiscoveryError(f'FAKE_GPU_CONFIG: "gpus[{i}]" must be an object')
            cluster = override.get("clusterUUID", cfg.get("clusterUUID", ""))
            fabric = _fabric(
                override.get("fabric", cfg.get("fabric", {})),
                cluster_uuid=cluster or "",
                clique_id=override.get("cliqueId", cfg.get("cliqueId", 0)),
                where=f"gpus[{i}]" if override else "",
            )
            gpu_uuid = "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{self._node}/gpu-{i}"))
            gpus.append(GpuInfo(index=i, uuid=gpu_uuid, minor=i, fabric=fabric))
        version = str(cfg.get("driverVersion", DEFAULT_DRIVER_VERSION))
        return NodeDevices(
            driver_version=version,
            gpus=tuple(gpus),
            clique_id=clique_id_from_fabric(
                gpus, strict=self._strict, single_node_nvlink=self._single_node_nvlink
            ),
        )
