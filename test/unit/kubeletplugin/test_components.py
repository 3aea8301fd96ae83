"""Unit tests of the plugin's pure parts: discovery (NVML mock, fake), /proc/devices, CDI and
opaque-config resolution (the checkpoint has its own file, test_checkpoint.py)."""

from __future__ import annotations

import ctypes
import json
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pkg.api import constants as c
from pkg.draplugin.errors import PermanentError
from pkg.kubeletplugin.cdi import CdiWriter, ContainerEdits, minimum_version
from pkg.kubeletplugin.claims import config_groups
from pkg.kubeletplugin.discovery import DiscoveryError
from pkg.kubeletplugin.discovery.base import NodeDevices, check_driver_version
from pkg.kubeletplugin.discovery.fake import FakeDiscovery, load_fake_config
from pkg.kubeletplugin.discovery.nvml import FabricInfoV1, FabricInfoV2, NvmlDiscovery
from pkg.kubeletplugin.procdevices import ProcDevicesError, char_device_major
from pkg.kubeletplugin.state import domain_dir

CLUSTER = uuid.UUID("2c9f7d4e-3b1a-4e5f-9a8b-7c6d5e4f3a2b")


# -- NVML (mocked library) ----------------------------------------------------------------------


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class FabricInfo:
    def __init__(self) -> None:
        self.clusterUuid = bytes(16)
        self.status = 0
        self.cliqueId = 0
        self.state = 0


def uid_for(name: str) -> str:
    """A readable name turned into the UID form opaque configs require."""
    return str(uuid.uuid5(uuid.NAMESPACE_OID, name))


def fake_nvml(fabrics: list[Any], *, version: str = "580.65.06") -> Any:
    """A stand-in for pynvml: each fabric item is a dict of fields or an NVML error code."""
    calls: list[str] = []

    def get_fabric(handle: int, ref: Any) -> None:
        item = fabrics[handle]
        if isinstance(item, int):
            raise NVMLError(item)
        info = ref._obj  # ctypes.byref() wraps the python object
        for key, value in item.items():
            field = (ctypes.c_ubyte * 16).from_buffer_copy(value) if key == "clusterUuid" else value
            setattr(info, key, field)

    return SimpleNamespace(
        NVMLError=NVMLError,
        calls=calls,
        nvmlInitWithFlags=lambda flags: calls.append(f"init:{flags}"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlSystemGetDriverVersion=version.encode,
        nvmlDeviceGetCount=lambda: len(fabrics),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
        nvmlDeviceGetMinorNumber=lambda h: h,
        c_nvmlGpuFabricInfo_t=FabricInfo,
        c_nvmlGpuFabricInfo_v2_t=FabricInfo,
        nvmlDeviceGetGpuFabricInfo=get_fabric,
        nvmlDeviceGetGpuFabricInfoV=get_fabric,
    )


def done(clique: int = 7) -> dict[str, Any]:
    return {"clusterUuid": CLUSTER.bytes, "state": 3, "status": 0, "cliqueId": clique}


def test_nvml_clique_from_completed_fabric(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ctypes.byref", lambda obj: SimpleNamespace(_obj=obj))
    nvml = fake_nvml([done(), done()])
    devices = NvmlDiscovery(nvml=nvml).discover()
    assert devices.clique_id == f"{CLUSTER}.7"
    assert devices.driver_version == "580.65.06"
    assert nvml.calls == ["init:1", "shutdown"]


@pytest.mark.parametrize(
    "fabrics",
    [[3, 3], [{"state": 0}], [{**done(), "clusterUuid": bytes(16)}]],
    ids=["not-supported", "state-not-supported", "zero-uuid"],
)
def test_nvml_no_clique(monkeypatch: pytest.MonkeyPatch, fabrics: list[Any]) -> None:
    monkeypatch.setattr("ctypes.byref", lambda obj: SimpleNamespace(_obj=obj))
    assert NvmlDiscovery(nvml=fake_nvml(fabrics)).discover().clique_id == ""


@pytest.mark.parametrize(
    ("fabrics", "expected"),
    [
        ([{**done(), "state": 2}], "IN_PROGRESS"),
        ([{**done(), "status": 5}], "status 5"),
        ([done(1), done(2)], "more than one NVLink clique id"),
        ([999], "NVML query failed"),
    ],
    ids=["in-progress", "failed", "two-cliques", "nvml-error"],
)
def test_nvml_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch, fabrics: list[Any], expected: str
) -> None:
    monkeypatch.setattr("ctypes.byref", lambda obj: SimpleNamespace(_obj=obj))
    nvml = fake_nvml(fabrics)
    with pytest.raises(DiscoveryError, match=expected):
        NvmlDiscovery(nvml=nvml).discover()
    assert nvml.calls[-1] == "shutdown"


def test_nvml_falls_back_to_versioned_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ctypes.byref", lambda obj: SimpleNamespace(_obj=obj))
    nvml = fake_nvml([done()])
    nvml.nvmlDeviceGetGpuFabricInfo = lambda h, ref: (_ for _ in ()).throw(NVMLError(13))
    assert NvmlDiscovery(nvml=nvml).discover().clique_id == f"{CLUSTER}.7"


def test_driver_version_gate() -> None:
    old = NodeDevices(
        driver_version="570.86.10",
        gpus=FakeDiscovery(config={"gpuCount": 1}, node_name="n").discover().gpus,
        clique_id="",
    )
    with pytest.raises(DiscoveryError, match=r"570\.158\.01"):
        check_driver_version(old, dns_names=True)
    check_driver_version(old, dns_names=False)


# -- fake GPUs ------------------------------------------------------------------------------------


def test_fake_config_inline_and_file(tmp_path: Path) -> None:
    inline = {"gpuCount": 2, "clusterUUID": str(CLUSTER), "cliqueId": 3}
    devices = FakeDiscovery(config=load_fake_config(json.dumps(inline)), node_name="n").discover()
    assert devices.clique_id == f"{CLUSTER}.3" and len(devices.gpus) == 2
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps({"gpuCount": 1}))
    assert (
        FakeDiscovery(config=load_fake_config(str(path)), node_name="n").discover().clique_id == ""
    )
    with pytest.raises(DiscoveryError, match='unknown key "gpucount"'):
        load_fake_config('{"gpucount": 1}')
    bad = {"clusterUUID": str(CLUSTER), "fabric": {"state": "NOT_STARTED"}}
    with pytest.raises(DiscoveryError, match="NOT_STARTED"):
        FakeDiscovery(config=bad, node_name="n").discover()


# -- /proc/devices and CDI ------------------------------------------------------------------------


def test_proc_devices_major(tmp_path: Path) -> None:
    path = tmp_path / "devices"
    path.write_text(
        "Character devices:\n235 nvidia-caps-imex-channels\n\nBlock devices:\n"
        "236 nvidia-caps-imex-channels\n"
    )
    assert char_device_major("nvidia-caps-imex-channels", path=path) == 235
    with pytest.raises(ProcDevicesError, match="not found"):
        char_device_major("nvidia-caps", path=path)


def test_cdi_minimum_version_and_atomic_files(tmp_path: Path) -> None:
    assert minimum_version({"kind": "a/b", "devices": [{"name": "x"}]}) == "0.3.0"
    assert minimum_version({"kind": "a/b", "devices": [{"name": "1x"}]}) == "0.5.0"
    mounts = {"containerEdits": {"mounts": [{"type": "bind"}]}}
    assert minimum_version({"kind": "a/b", "devices": [{"name": "x", **mounts}]}) == "0.4.0"
    writer = CdiWriter(root=tmp_path / "cdi")
    assert writer.write_base_spec(ContainerEdits()) == f"{c.CDI_VENDOR}/device=all"
    ids = writer.write_claim_spec("u1", [])
    assert ids == {} and not writer.claim_spec_path("u1").exists()
    assert [p.name for p in (tmp_path / "cdi").iterdir()] == [f"{c.CDI_VENDOR}-device_base.yaml"]


# -- opaque config resolution -------------------------------------------------------------------


def claim_with(configs: list[dict[str, Any]], device: str = "channel-0") -> dict[str, Any]:
    result = {"request": "req/sub", "driver": c.DRIVER_NAME, "pool": "n", "device": device}
    return {"status": {"allocation": {"devices": {"results": [result], "config": configs}}}}


def opaque(source: str, requests: list[str], **params: Any) -> dict[str, Any]:
    body = {"apiVersion": c.API_VERSION, "kind": c.CHANNEL_CONFIG_KIND, **params}
    return {
        "source": source,
        "requests": requests,
        "opaque": {"driver": c.DRIVER_NAME, "parameters": body},
    }


def test_claim_config_precedence() -> None:
    configs = [
        opaque("FromClaim", [], domainID=uid_for("claim-default")),
        opaque("FromClass", ["req"], domainID=uid_for("class-specific")),
        opaque("FromClaim", ["req"], domainID=uid_for("claim-specific")),
    ]
    (group,) = config_groups(claim_with(configs))
    assert group.config.domain_id == uid_for("claim-specific")
    assert config_groups({"status": {"allocation": {"devices": {"results": []}}}}) == ()


def test_claim_config_type_mismatch_and_missing() -> None:
    with pytest.raises(PermanentError, match="cannot apply"):
        config_groups(claim_with([opaque("FromClaim", ["req"], domainID=uid_for("x"))], "daemon-0"))
    with pytest.raises(PermanentError, match="ComputeDomainChannelConfig"):
        config_groups(claim_with([]))


@pytest.mark.parametrize(
    "domain_id",
    ["/var/run/cdi", "/", "..", "../..", "../../etc", "a/../../b", ".", "", "a/b", "x\0y"],
)
def test_domain_dir_never_leaves_the_domains_root(tmp_path: Path, domain_id: str) -> None:
    """Defence in depth: ``plugin_dir / "domains" / "/var/run/cdi"`` would be
    ``/var/run/cdi``; the result is mounted read-write and removed with rmtree."""
    with pytest.raises(ValueError, match="would leave"):
        domain_dir(tmp_path, domain_id)


def test_domain_dir_of_a_uid() -> None:
    uid = uid_for("cd")
    assert domain_dir(Path("/plugins/x"), uid) == Path("/plugins/x/domains") / uid


def test_nvml_fabric_structs_have_the_nvml_h_layout() -> None:
    """NVML writes through the pointer: offsets and sizes must be nvml.h's, whatever pynvml
    declares (a pynvml release sized clusterUuid 80 bytes; seen on a real H100)."""
    v1 = [(f[0], getattr(FabricInfoV1, f[0]).offset) for f in FabricInfoV1._fields_]
    assert v1 == [("clusterUuid", 0), ("status", 16), ("cliqueId", 20), ("state", 24)]
    assert ctypes.sizeof(FabricInfoV1) == 28
    v2 = [(f[0], getattr(FabricInfoV2, f[0]).offset) for f in FabricInfoV2._fields_]
    assert v2 == [
        ("version", 0),
        ("clusterUuid", 4),
        ("status", 20),
        ("cliqueId", 24),
        ("state", 28),
        ("healthMask", 32),
    ]
    assert FabricInfoV2().version == 0x02000024  # nvmlGpuFabricInfo_v2 in nvml.h


@pytest.mark.parametrize("cluster", [bytes(16), CLUSTER.bytes, b"\x01" + bytes(15)])
def test_nvml_reads_what_the_library_wrote_into_the_c_struct(cluster: bytes) -> None:
    """The call writes C memory; discovery must read it back with the C layout. Before the
    own structs, a pynvml whose struct had an 80-byte clusterUuid made discovery fail on a
    real H100 outside any NVLink fabric (``bytes is not a 16-char string``)."""

    def get_fabric(handle: int, ref: Any) -> None:
        # What NVML does: fill sizeof(nvmlGpuFabricInfo_t) bytes at the pointer it was given.
        raw = cluster + (0).to_bytes(4, "little") + (5).to_bytes(4, "little") + bytes([3, 0, 0, 0])
        ctypes.memmove(ref, raw, len(raw))

    class MisdeclaredInfo(ctypes.Structure):  # the pynvml release seen on the H100
        _fields_ = [
            ("clusterUuid", ctypes.c_uint8 * 80),
            ("status", ctypes.c_int),
            ("cliqueId", ctypes.c_uint32),
            ("state", ctypes.c_uint),
        ]

    nvml = fake_nvml([0])
    nvml.c_nvmlGpuFabricInfo_t = MisdeclaredInfo
    nvml.nvmlDeviceGetGpuFabricInfo = get_fabric
    (gpu,) = NvmlDiscovery(nvml=nvml, strict_fabric=False).discover().gpus
    assert gpu.fabric.cluster_uuid == str(uuid.UUID(bytes=cluster))
    assert (gpu.fabric.clique_id, gpu.fabric.state, gpu.fabric.status) == (5, 3, 0)
