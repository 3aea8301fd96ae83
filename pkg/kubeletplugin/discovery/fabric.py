"""Is this node a single-node NVLink system? (gate ``FabricManagerPartitioning``)

Owns the one filesystem probe the plugin makes to tell an NVSwitch system whose fabric spans
only this node (HGX boards, DGX with NVLink switches but no multi-node fabric) from the rest.
On such a node a GPU whose fabric registration is not yet COMPLETED is a fabric manager still
coming up after a reboot, not a broken multi-node fabric, so `clique_id_from_fabric` skips it
instead of refusing to start (see ``single_node_nvlink`` there).

The probe looks under the plugin's *dev root*: the mounted driver root when it carries its own
``dev/`` (a containerized driver), else ``/``. The node is a single-node NVLink system when

* ``<devRoot>/proc/driver/nvidia-nvswitch/devices`` has at least one entry (an NVSwitch the
  driver manages), or
* some ``<devRoot>/sys/class/infiniband/*/device/vpd`` contains ``SW_MNG`` (a switch
  management port, the NVLink-over-InfiniBand switch trays).

Invariants: absent paths mean "no"; any other I/O error is a `DiscoveryError` whose message
starts with ``error checking if node is single-node NVLink system:`` (upstream's), since
guessing either way could crash-loop the plugin or hide a real fabric fault.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from pkg.kubeletplugin.discovery.base import DiscoveryError

__all__ = ["SWITCH_MANAGEMENT_MARKER", "is_single_node_nvlink", "select_dev_root"]

SWITCH_MANAGEMENT_MARKER: Final = b"SW_MNG"
_NVSWITCH_DEVICES: Final = Path("proc/driver/nvidia-nvswitch/devices")
_INFINIBAND_CLASS: Final = Path("sys/class/infiniband")


def select_dev_root(container_driver_root: Path, *, host_root: Path = Path("/")) -> Path:
    """The driver root as mounted in the plugin if it has a ``dev/`` directory, else
    ``host_root`` (the plugin's own ``/``)."""
    if (container_driver_root / "dev").is_dir():
        return container_driver_root
    return host_root


def is_single_node_nvlink(dev_root: Path) -> bool:
    """Whether ``dev_root`` shows an NVSwitch or a switch-management port (module docstring).

    Raises `DiscoveryError` on an I/O error other than a missing path.
    """
    try:
        return _has_nvswitch(dev_root) or _has_switch_management_port(dev_root)
    except OSError as err:
        raise DiscoveryError(f"error checking if node is single-node NVLink system: {err}") from err


def _has_nvswitch(dev_root: Path) -> bool:
    devices = dev_root / _NVSWITCH_DEVICES
    try:
        return any(True for _ in devices.iterdir())
    except FileNotFoundError:
        return False


def _has_switch_management_port(dev_root: Path) -> bool:
    ports = dev_root / _INFINIBAND_CLASS
    try:
        names = sorted(ports.iterdir())
    except FileNotFoundError:
        return False
    for port in names:
        try:
            vpd = (port / "device" / "vpd").read_bytes()
        except FileNotFoundError:
            continue
        if SWITCH_MANAGEMENT_MARKER in vpd:
            return True
    return False
