"""Gate CrashOnNVLinkFabricErrors: on (default) a GPU with a fabric error stops the plugin;
off, upstream's legacy rule treats that GPU as not fabric-attached. The plugin binary must also
start with the Go driver's other gates in FEATURE_GATES."""

from __future__ import annotations

import importlib
import json
import sys
import uuid
from pathlib import Path
from types import ModuleType

import pytest

from pkg.kubeletplugin.discovery import DiscoveryError
from pkg.kubeletplugin.discovery.base import (
    FABRIC_STATE_COMPLETED,
    FABRIC_STATE_IN_PROGRESS,
    FabricInfo,
    GpuInfo,
    clique_id_from_fabric,
)
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
    here = Path(__file__).resolve().parents[3] / "cmd/compute-domain-kubelet-plugin"
    sys.path.insert(0, str(here))
    try:
        return importlib.import_module("compute_domain_kubelet_plugin")
    finally:
        sys.path.pop(0)


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
    argv = ["--node-name", "n", "--device-discovery", "fake", "--feature-gates", gates,
            "--kubeconfig", str(tmp_path / "missing")]  # fmt: skip
    assert cli.main(argv) == 1
    assert outcome in caplog.text
