"""The second pinned Kubernetes release of the simulated e2e lane (docs/operators.md "Kubernetes
versions"): which module hack/build-control-plane.sh builds for ``K8S_VERSION``, what the local
control plane turns on for DRA before 1.34, and which DRA gRPC services the kubelet stand-in
speaks there. Offline: nothing is built."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from kubeletsim.registration import KUBELET_DRA_SERVICES, kubelet_dra_services
from localcluster.cluster import dra_settings

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "build-control-plane.sh"


def _bin_dir(tmp_path: Path, version: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "K8S_VERSION"}
    env["CD_E2E_CACHE"] = str(tmp_path)
    if version is not None:
        env["K8S_VERSION"] = version
    return subprocess.run(
        [str(SCRIPT), "--print-bin-dir"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_default_build_is_hack_kube(tmp_path: Path) -> None:
    pinned = re.search(
        r"^require k8s\.io/kubernetes (v\S+)$", (REPO / "hack/kube/go.mod").read_text(), re.M
    )
    assert pinned is not None
    done = _bin_dir(tmp_path, None)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / f"k8s-{pinned.group(1)}" / "bin")


@pytest.mark.parametrize("version", ["v1.32.9", "1.32.9", "1.32", "v1.32"])
def test_k8s_version_picks_its_own_module_and_bin_dir(tmp_path: Path, version: str) -> None:
    done = _bin_dir(tmp_path, version)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "k8s-v1.32.9" / "bin")


@pytest.mark.parametrize("version", ["1.31", "v1.3", "1.32.8"])
def test_an_unpinned_version_is_refused_naming_the_pinned_ones(
    tmp_path: Path, version: str
) -> None:
    done = _bin_dir(tmp_path, version)
    assert done.returncode != 0 and not done.stdout
    assert f"K8S_VERSION={version}: no hack/kube* module pins it" in done.stderr
    assert "v1.32.9 (hack/kube-1.32)" in done.stderr


def test_the_1_32_module_pins_one_release_throughout() -> None:
    """Every staging module is replaced by the release's own v0.32.9 (update-go-mod.sh)."""
    mod = (REPO / "hack/kube-1.32/go.mod").read_text()
    assert re.search(r"^module github\.com/compute-domain/e2e/hack/kube-1\.32$", mod, re.M)
    assert re.search(r"^require k8s\.io/kubernetes v1\.32\.9$", mod, re.M)
    replaces = re.findall(r"^replace (k8s\.io/\S+) => (k8s\.io/\S+) (v\S+)$", mod, re.M)
    assert len(replaces) > 25
    assert all(old == new and v == "v0.32.9" for old, new, v in replaces), replaces
    assert (REPO / "hack/kube-1.32/tools.go").read_text() == (
        REPO / "hack/kube/tools.go"
    ).read_text()


def test_dra_is_turned_on_before_1_34() -> None:
    gate = {"DynamicResourceAllocation": True}
    assert dra_settings(32) == (gate, "resource.k8s.io/v1beta1=true")
    assert dra_settings(33) == (gate, "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true")
    assert dra_settings(34) == ({}, "") and dra_settings(37) == ({}, "")


def test_kubelet_stand_in_speaks_its_release_dra_services() -> None:
    assert kubelet_dra_services("v1") == KUBELET_DRA_SERVICES
    assert KUBELET_DRA_SERVICES[0] == "v1.DRAPlugin"
    assert kubelet_dra_services("v1beta2") == ("v1beta1.DRAPlugin",)
    assert kubelet_dra_services("v1beta1") == ("v1beta1.DRAPlugin",)
