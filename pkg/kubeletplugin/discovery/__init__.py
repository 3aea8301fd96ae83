"""Device discovery backends (NVML and fake GPUs) behind the `DeviceDiscovery` protocol."""

from pkg.kubeletplugin.discovery.base import (
    DeviceDiscovery,
    DiscoveryError,
    FabricInfo,
    GpuInfo,
    NodeDevices,
    clique_id_from_fabric,
)

__all__ = [
    "DeviceDiscovery",
    "DiscoveryError",
    "FabricInfo",
    "GpuInfo",
    "NodeDevices",
    "clique_id_from_fabric",
]
