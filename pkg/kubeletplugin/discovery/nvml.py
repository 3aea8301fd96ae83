"""NVML discovery backend (``nvidia-ml-py``, imported as ``pynvml``).

Owns every NVML call the plugin makes: driver version, per-GPU UUID/minor number and fabric info.
The NVML module is injected (``NvmlDiscovery(nvml=pynvml)``) so tests pass a mock with the same
attribute names. Invariants: NVML is initialised with ``NVML_INIT_FLAG_NO_GPUS`` (discovery must
work even if a GPU is in a bad state) and always shut down again; fabric info is read with the
plain call and falls back to the versioned ``...V`` call when the symbol is missing (mirrors
go-nvlib); NOT_SUPPORTED means "no clique", never an error; the clique rules themselves live in
`clique_id_from_fabric`.

The fabric-info structures are declared here from ``nvml.h`` (`FabricInfoV1`, `FabricInfoV2`)
rather than taken from pynvml: releases of nvidia-ml-py have shipped ``nvmlGpuFabricInfo_t``
with ``clusterUuid`` sized ``NVML_DEVICE_UUID_BUFFER_SIZE`` (80 bytes) instead of 16, which
misplaces every later field -- seen on a real H100 (driver 580.159.04), where discovery then
failed with ``bytes is not a 16-char string``. NVML only writes through the pointer it is
given, so the layout must be the C one whatever the Python binding says.
"""

from __future__ import annotations

import contextlib
import ctypes
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pkg.kubeletplugin.discovery.base import (
    DiscoveryError,
    FabricInfo,
    GpuInfo,
    NodeDevices,
    clique_id_from_fabric,
)

_NVML_INIT_FLAG_NO_GPUS = 1
_NVML_ERROR_NOT_SUPPORTED = 3
_NVML_ERROR_FUNCTION_NOT_FOUND = 13
_NVML_GPU_FABRIC_UUID_LEN = 16


class FabricInfoV1(ctypes.Structure):
    """``nvmlGpuFabricInfo_t`` as ``nvml.h`` lays it out (the state is one unsigned char)."""

    _fields_ = [
        ("clusterUuid", ctypes.c_ubyte * _NVML_GPU_FABRIC_UUID_LEN),
        ("status", ctypes.c_int),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_ubyte),
    ]


class FabricInfoV2(ctypes.Structure):
    """``nvmlGpuFabricInfo_v2_t`` (``nvmlGpuFabricInfoV_t``) as ``nvml.h`` lays it out."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_ubyte * _NVML_GPU_FABRIC_UUID_LEN),
        ("status", ctypes.c_int),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_ubyte),
        ("healthMask", ctypes.c_uint32),
    ]

    def __init__(self) -> None:
        # NVML_STRUCT_VERSION(GpuFabricInfo, 2): the size in the low bits, 2 in the top byte.
        super().__init__(version=ctypes.sizeof(FabricInfoV2) | (2 << 24))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _error_code(nvml: Any, err: BaseException) -> int | None:
    if isinstance(err, nvml.NVMLError):
        return int(getattr(err, "value", -1))
    return None


class NvmlDiscovery:
    """`DeviceDiscovery` backed by a real (or mocked) NVML library module."""

    def __init__(
        self, *, nvml: Any, strict_fabric: bool = True, single_node_nvlink: bool = False
    ) -> None:
        """``strict_fabric``: gate CrashOnNVLinkFabricErrors; ``single_node_nvlink``: the
        node is one (`pkg.kubeletplugin.discovery.fabric`); see `clique_id_from_fabric`."""
        self._nvml = nvml
        self._strict = strict_fabric
        self._single_node_nvlink = single_node_nvlink

    def discover(self) -> NodeDevices:
        """Query NVML afresh (init, read, shut down) and derive the clique; `DiscoveryError`
        on an NVML failure or a fabric state the plugin must not run with."""
        nvml = self._nvml
        try:
            nvml.nvmlInitWithFlags(_NVML_INIT_FLAG_NO_GPUS)
        except nvml.NVMLError as err:
            raise DiscoveryError(f"cannot initialise NVML: {err}") from err
        try:
            version = _text(nvml.nvmlSystemGetDriverVersion())
            gpus = tuple(self._gpu(i) for i in range(int(nvml.nvmlDeviceGetCount())))
        except nvml.NVMLError as err:
            raise DiscoveryError(f"NVML query failed: {err}") from err
        finally:
            # A shutdown failure cannot change what was discovered.
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()
        clique_id = clique_id_from_fabric(
            gpus, strict=self._strict, single_node_nvlink=self._single_node_nvlink
        )
        return NodeDevices(driver_version=version, gpus=gpus, clique_id=clique_id)

    def _gpu(self, index: int) -> GpuInfo:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        gpu_uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        try:
            minor: int | None = int(nvml.nvmlDeviceGetMinorNumber(handle))
        except nvml.NVMLError:
            minor = None  # not available on every platform; only used for CDI device paths
        return GpuInfo(index=index, uuid=gpu_uuid, minor=minor, fabric=self._fabric(handle))

    def _fabric(self, handle: Any) -> FabricInfo:
        nvml = self._nvml
        try:
            info: FabricInfoV1 | FabricInfoV2 = FabricInfoV1()
            nvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
        except nvml.NVMLError as err:
            code = _error_code(nvml, err)
            if code == _NVML_ERROR_NOT_SUPPORTED:
                return FabricInfo(supported=False)
            if code != _NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
            info = FabricInfoV2()
            try:
                nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
            except nvml.NVMLError as err2:
                if _error_code(nvml, err2) == _NVML_ERROR_NOT_SUPPORTED:
                    return FabricInfo(supported=False)
                raise
        return FabricInfo(
            supported=True,
            state=int(info.state),
            status=int(info.status),
            cluster_uuid=str(uuid.UUID(bytes=bytes(info.clusterUuid))),
            clique_id=int(info.cliqueId),
        )


def load_pynvml(library: Path | None = None, *, cdll: Callable[[str], Any] = ctypes.CDLL) -> Any:
    """Import pynvml lazily (the fake backend works without it); with ``library``, bind it to
    that ``libnvidia-ml.so`` instead of letting it ``dlopen("libnvidia-ml.so.1")``.

    pynvml loads its library once, into the module global ``nvmlLib``, and only if that is
    still unset; setting it first (under pynvml's own load lock) is how a path is chosen. The
    plugin passes the driver root's file, so NVML never needs ``LD_LIBRARY_PATH`` -- which
    would also hand the host's libc to the plugin's Python. ``cdll`` is injectable for tests.
    """
    try:
        import pynvml  # noqa: PLC0415
    except ImportError as err:
        raise DiscoveryError("nvidia-ml-py (pynvml) is not installed") from err
    if library is not None:
        with pynvml.libLoadLock:
            if pynvml.nvmlLib is None:
                try:
                    pynvml.nvmlLib = cdll(str(library))
                except OSError as err:
                    raise DiscoveryError(f"cannot load NVML from {library}: {err}") from err
    return pynvml
