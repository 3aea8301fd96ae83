"""Gate CrashOnNVLinkFabricErrors: on (default) a GPU with a fabric error stops the plugin;
off, upstream's legacy rule treats that GPU as not fabric-attached. The plugin binary must also
start with the Go driver's other gates in FEATURE_GATES. Gate FabricManagerPartitioning: on a
single-node NVLink system (NVSwitch or switch-management port under the dev root) a pending
registration is skipped even in strict mode."""

from __future__ import annotations

import importlib.util
import json
import logging
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pkg.featuregates import FeatureGates
from pkg.kubeletplugin.discovery import DiscoveryError
from pkg.kubeletplugin.discovery.base import (
    FABRIC_STATE_COMPLETED,
    FABRIC_STATE_IN_PROGRESS,
    FabricInfo,
    GpuInfo,
    clique_id_from_fabric,
)
from pkg.kubeletplugin.discovery.fabric import is_single_node_nvlink, select_dev_root
from pkg.kubeletplugin.discovery.fake import FakeDiscovery

CLUSTER = str(uuid.UUID("2c9f7d4e-3b1a-4e5f-9a8b-7c6d5e4f3a2b"))


def gpu(index: int, *, state: int = FABRIC_STATE_COMPLETED, status: int = 0) -> GpuInfo:
    fabric = FabricInfo(
        supported=True, state=state, status=status, cluster_uuid=CLUSTER, clique_id=4
    )
    return GpuInfo(index=index, uuid=f"GPU-{index}", minor=index, fabric=fabric)


@pytest.mark.parametrize(
    "broken",
    [gpu(1, state=FABRIC_STATE_IN_PROGRESS), gpu(1, status=7)],
    ids=["registration-in-progress", "registration-failed"],
)
def test_fabric_error_is_fatal_only_with_the_gate_on(broken: GpuInfo) -> None:
    with pytest.raises(DiscoveryError, match="refusing to start"):
        clique_id_from_fabric([gpu(0), broken])
    assert clique_id_from_fabric([gpu(0), broken], strict=False) == f"{CLUSTER}.4"
    assert clique_id_from_fabric([broken], strict=False) == ""


def test_fake_discovery_honours_the_gate() -> None:
    config = {"clusterUUID": CLUSTER, "gpuCount": 2, "fabric": {"state": "IN_PROGRESS"}}
    with pytest.raises(DiscoveryError):
        FakeDiscovery(config=config, node_name="n").discover()
    lenient = FakeDiscovery(config=config, node_name="n", strict_fabric=False).discover()
    assert lenient.clique_id == "" and len(lenient.gpus) == 2


@pytest.fixture
def cli() -> ModuleType:
    entry = Path(__file__).resolve().parents[3] / "cmd/compute-domain-kubelet-plugin"
    spec = importlib.util.spec_from_file_location(
        "compute_domain_kubelet_plugin", entry / "compute_domain_kubelet_plugin.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("gates", "outcome"),
    [
        ("", "cannot start: GPU 0"),
        ("CrashOnNVLinkFabricErrors=false", "cannot load kubeconfig"),
        (
            "CrashOnNVLinkFabricErrors=false,MPSSupport=true,AllAlpha=false",
            "cannot load kubeconfig",
        ),
        ("Bogus=true", "cannot start: unrecognized feature gate: Bogus"),
    ],
    ids=["default-crashes", "gate-off-starts", "gpu-gates-accepted", "unknown-gate-refused"],
)
def test_plugin_binary_start_up(
    cli: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    gates: str,
    outcome: str,
) -> None:
    """Discovery passes or fails before the API client is built ("cannot load kubeconfig")."""
    fabric = {"clusterUUID": CLUSTER, "gpuCount": 1, "fabric": {"state": "IN_PROGRESS"}}
    monkeypatch.setenv("FAKE_GPU_CONFIG", json.dumps(fabric))
    argv = [
        "--node-name",
        "n",
        "--device-discovery",
        "fake",
        "--feature-gates",
        gates,
        "--kubeconfig",
        str(tmp_path / "missing"),
    ]
    assert cli.main(argv) == 1
    assert outcome in caplog.text


# -- FabricManagerPartitioning: single-node NVLink systems tolerate pending registration --------


def nvswitch_root(root: Path) -> Path:
    (root / "proc/driver/nvidia-nvswitch/devices/0000:05:00.0").mkdir(parents=True)
    return root


def switch_port_root(root: Path, vpd: bytes) -> Path:
    port = root / "sys/class/infiniband/mlx5_0/device"
    port.mkdir(parents=True)
    (port / "vpd").write_bytes(vpd)
    return root


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        (lambda r: r, False),
        (lambda r: (r / "proc/driver/nvidia-nvswitch/devices").mkdir(parents=True) or r, False),
        (nvswitch_root, True),
        (lambda r: switch_port_root(r, b"\x82\x10PN:MCX;V0:SW_MNG;\x78"), True),
        (lambda r: switch_port_root(r, b"\x82\x10PN:MCX75310AAS;\x78"), False),
        (lambda r: (r / "sys/class/infiniband/mlx5_0").mkdir(parents=True) or r, False),
    ],
    ids=["nothing", "no-nvswitch-entries", "nvswitch", "switch-mgmt-port", "plain-hca", "no-vpd"],
)
def test_single_node_nvlink_detection(tmp_path: Path, layout: Any, expected: bool) -> None:
    assert is_single_node_nvlink(layout(tmp_path)) is expected


@pytest.mark.parametrize(
    "broken",
    [
        lambda r: (
            (r / "proc/driver").mkdir(parents=True)
            or (r / "proc/driver/nvidia-nvswitch").write_text("")
        ),
        lambda r: (r / "sys/class/infiniband/mlx5_0/device/vpd").mkdir(parents=True),
    ],
    ids=["nvswitch-path-not-a-dir", "vpd-unreadable"],
)
def test_single_node_nvlink_io_error_is_fatal(tmp_path: Path, broken: Any) -> None:
    broken(tmp_path)
    with pytest.raises(
        DiscoveryError, match=r"^error checking if node is single-node NVLink system: "
    ):
        is_single_node_nvlink(tmp_path)


def test_dev_root_is_the_driver_root_only_when_it_has_dev(tmp_path: Path) -> None:
    host = tmp_path / "host"
    driver = tmp_path / "driver-root"
    driver.mkdir()
    assert select_dev_root(driver, host_root=host) == host
    (driver / "dev").mkdir()
    assert select_dev_root(driver, host_root=host) == driver


def test_strict_mode_skips_incomplete_registration_only_on_single_node_nvlink(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pending = gpu(1, state=FABRIC_STATE_IN_PROGRESS)
    with pytest.raises(DiscoveryError, match="refusing to start"):
        clique_id_from_fabric([gpu(0), pending])
    with caplog.at_level(logging.INFO):
        assert clique_id_from_fabric([gpu(0), pending], single_node_nvlink=True) == f"{CLUSTER}.4"
    assert (
        "no-clique fallback: ignoring incomplete NVLink registration (device=1/GPU-1, state=2) "
        "on single-node NVLink system"
    ) in caplog.messages
    assert clique_id_from_fabric([pending], single_node_nvlink=True) == ""
    with pytest.raises(DiscoveryError, match="failed with NVML status 7"):
        clique_id_from_fabric([gpu(0, status=7)], single_node_nvlink=True)


def test_fabric_manager_partitioning_is_an_implemented_alpha_gate() -> None:
    gates = FeatureGates.parse("FabricManagerPartitioning=true")
    assert gates.unimplemented() == []
    assert FeatureGates().as_dict()["FabricManagerPartitioning"] is False
    assert FeatureGates.parse("AllAlpha=true").enabled("FabricManagerPartitioning")


@pytest.mark.parametrize(
    ("gates", "make_root", "outcome"),
    [
        ("FabricManagerPartitioning=true", nvswitch_root, "cannot load kubeconfig"),
        ("", nvswitch_root, "refusing to start"),
        ("FabricManagerPartitioning=true", lambda r: r, "refusing to start"),
        (
            "FabricManagerPartitioning=true",
            lambda r: (
                (r / "proc/driver").mkdir(parents=True)
                or (r / "proc/driver/nvidia-nvswitch").write_text("")
                or r
            ),
            "cannot start: error checking if node is single-node NVLink system: ",
        ),
    ],
    ids=["gate-on-nvswitch-starts", "gate-off-crashes", "gate-on-multi-node-crashes", "io-error"],
)
def test_plugin_binary_tolerates_pending_registration_under_the_gate(
    cli: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    gates: str,
    make_root: Any,
    outcome: str,
) -> None:
    """The dev root is the mounted driver root (it has dev/); discovery decides before the API
    client is built ("cannot load kubeconfig")."""
    driver_root = tmp_path / "driver-root"
    (driver_root / "dev").mkdir(parents=True)
    make_root(driver_root)
    fabric = {"clusterUUID": CLUSTER, "gpuCount": 1, "fabric": {"state": "IN_PROGRESS"}}
    monkeypatch.setenv("FAKE_GPU_CONFIG", json.dumps(fabric))
    argv = [
        "--node-name",
        "n",
        "--device-discovery",
        "fake",
        "--feature-gates",
        gates,
        "--container-driver-root",
        str(driver_root),
        "--kubeconfig",
        str(tmp_path / "missing"),
    ]
    assert cli.main(argv) == 1
    assert outcome in caplog.text
