"""The driver root: what the IMEX daemon receives through CDI, NVML by absolute path, and the
hand-kept file lists checked against NVIDIA's own CDI generator (nvidia-container-toolkit)."""

from __future__ import annotations

import fnmatch
import importlib
import json
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from testsupport.kp_harness import make_config

from pkg.kubeletplugin import driverroot as dr
from pkg.kubeletplugin import procdevices
from pkg.kubeletplugin.discovery import DiscoveryError, NodeDevices
from pkg.kubeletplugin.discovery.nvml import load_pynvml
from pkg.kubeletplugin.driver import KubeletPlugin
from pkg.kubeletplugin.driverroot import DriverRoot, DriverRootError, management_edits
from pkg.kubeletplugin.options import build_discovery, parse_args
from pkg.testing.fakeapiserver import FakeApiServer
from pkg.testing.fakedriverroot import ARCHES, LIBRARIES, Arch, FakeDriverRoot

VERSION = "570.170.01"
HOST = Path("/run/nvidia/driver")  # a GPU-operator host path; the files live in tmp_path

# -- facts read from github.com/NVIDIA/nvidia-container-toolkit v1.20.1 -------------------------
# `nvidia-ctk cdi generate --mode=management` cannot run here (see docs/operators.md, "Driver
# root"), so the plugin keeps its own lists; these constants are the toolkit's, copied from its
# source, and the tests below fail when the plugin's lists drift from them.

# pkg/nvcdi/driver-nvml.go newDriverBinariesDiscoverer
TOOLKIT_DRIVER_BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-imex",
    "nvidia-imex-ctl",
)
# pkg/lookup/path.go defaultPATH (searched under the driver root)
TOOLKIT_EXECUTABLE_PATH = (
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
)
# pkg/lookup/library.go NewLibraryLocator search paths (besides the root itself)
TOOLKIT_LIBRARY_PATHS = (
    "/usr/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib/aarch64-linux-gnu/nvidia/current",
    "/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu/nvidia/current",
    "/lib/aarch64-linux-gnu/nvidia/current",
)
# internal/discover/mounts.go: options of every located driver file
TOOLKIT_MOUNT_OPTIONS = ["ro", "nosuid", "nodev", "rbind", "rprivate"]
# pkg/nvcdi/management.go newManagementDeviceDiscoverer and nodeIsBlocked
TOOLKIT_MANAGEMENT_DEVICE_GLOBS = (
    "/dev/nvidia*",
    "/dev/nvidia-caps/nvidia-cap*",
    "/dev/nvidia-modeset",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-uvm",
    "/dev/nvidiactl",
)
TOOLKIT_BLOCKED_DEVICE_PREFIXES = ("nvidia-fs", "nvidia-nvswitch", "nvidia-nvlink")
# pkg/nvcdi/driver-nvml.go getVersionLibs: libraries located as "*.so.<driver version>"
TOOLKIT_VERSIONED_LIBRARY_GLOB = "*.so.{version}"


def test_binary_list_is_the_toolkits() -> None:
    assert dr.DRIVER_BINARIES == TOOLKIT_DRIVER_BINARIES
    assert set(dr.IMEX_BINARIES) <= set(TOOLKIT_DRIVER_BINARIES)


def test_search_paths_are_the_toolkits() -> None:
    assert tuple(f"/{d}" for d in dr.BINARY_DIRS) == TOOLKIT_EXECUTABLE_PATH
    assert tuple(f"/{d}" for d in dr.LIBRARY_DIRS) == TOOLKIT_LIBRARY_PATHS


def test_mounts_use_the_toolkits_options_and_root_relative_container_paths(
    tmp_path: Path,
) -> None:
    FakeDriverRoot.create(tmp_path, driver_version=VERSION)
    files = DriverRoot(host=HOST, container=tmp_path).scan()
    edits = management_edits(files, uvm_major=None)
    assert edits.mounts
    for mount in edits.mounts:
        assert mount["options"] == TOOLKIT_MOUNT_OPTIONS
        if mount["containerPath"].endswith(".so.1"):
            continue  # a SONAME link: mounted as its target (next test)
        # The toolkit's driver-root transform: hostPath = host root + containerPath.
        assert mount["hostPath"] == f"{HOST}{mount['containerPath']}"


def test_device_nodes_are_management_nodes_the_toolkit_would_inject() -> None:
    gpus = [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]
    edits = management_edits(dr.DriverFiles((), (), "", ()), uvm_major=511, extra_nodes=gpus)
    paths = [n["path"] for n in edits.device_nodes]
    assert "/dev/nvidiactl" in paths
    for path in paths:
        assert any(fnmatch.fnmatch(path, g) for g in TOOLKIT_MANAGEMENT_DEVICE_GLOBS), path
        assert not os.path.basename(path).startswith(TOOLKIT_BLOCKED_DEVICE_PREFIXES), path
    for node in edits.device_nodes:  # explicit numbers: the CDI library never stats the host
        assert {"type", "major", "minor"} <= node.keys()
    assert {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255} in edits.device_nodes


def test_libraries_are_the_versioned_ones_plus_their_soname_links(tmp_path: Path) -> None:
    made = FakeDriverRoot.create(tmp_path, driver_version=VERSION)
    libdir = tmp_path / made.lib_dir
    (libdir / "libunrelated.so.1").write_text("not the driver's")
    (libdir / "libnvidia-old.so.550.1").write_text("another version")
    files = DriverRoot(host=HOST, container=tmp_path).scan()
    assert files.version == VERSION
    names = {Path(f.container_path).name for f in files.libraries}
    glob = TOOLKIT_VERSIONED_LIBRARY_GLOB.format(version=VERSION)
    versioned = {n for n in os.listdir(libdir) if fnmatch.fnmatch(n, glob)}
    assert versioned and versioned <= names
    assert "libnvidia-ml.so.1" in names and "libcuda.so.1" in names
    assert "libunrelated.so.1" not in names and "libnvidia-old.so.550.1" not in names
    soname = next(f for f in files.libraries if f.container_path.endswith("libnvidia-ml.so.1"))
    # A link is mounted as the file it names (a bind mount of the link would resolve it on the
    # host, where an absolute target points outside a containerized driver's root).
    assert soname.host_path == f"{HOST}/{made.lib_dir}/libnvidia-ml.so.{VERSION}"


def test_imex_binaries_are_mounted_where_the_daemon_finds_them(tmp_path: Path) -> None:
    FakeDriverRoot.create(tmp_path)
    files = DriverRoot(host=HOST, container=tmp_path).scan()
    assert files.missing_imex == ()
    by_path = {b.container_path: b.host_path for b in files.binaries}
    assert by_path["/usr/bin/nvidia-imex"] == f"{HOST}/usr/bin/nvidia-imex"
    assert by_path["/usr/bin/nvidia-imex-ctl"] == f"{HOST}/usr/bin/nvidia-imex-ctl"


def test_absolute_symlinks_resolve_inside_the_root(tmp_path: Path) -> None:
    FakeDriverRoot.create(tmp_path)
    real = tmp_path / "usr" / "sbin" / "nvidia-imex"
    real.parent.mkdir(parents=True)
    os.replace(tmp_path / "usr/bin/nvidia-imex", real)
    (tmp_path / "usr/bin/nvidia-imex").symlink_to("/usr/sbin/nvidia-imex")  # absolute, in-root
    files = DriverRoot(host=HOST, container=tmp_path).scan()
    by_path = {b.container_path: b.host_path for b in files.binaries}
    assert by_path["/usr/sbin/nvidia-imex"] == f"{HOST}/usr/sbin/nvidia-imex"
    assert "/usr/bin/nvidia-imex" not in by_path  # first PATH directory with the name wins
    assert DriverRoot(host=HOST, container=tmp_path).resolve("/usr/bin/nvidia-imex") == (
        "/usr/sbin/nvidia-imex"
    )


def test_missing_imex_binaries_are_reported(tmp_path: Path) -> None:
    FakeDriverRoot.create(tmp_path, omit=["nvidia-imex"])
    files = DriverRoot(host=HOST, container=tmp_path).scan()
    assert files.missing_imex == ("nvidia-imex",)
    assert "/usr/bin/nvidia-imex-ctl" in {b.container_path for b in files.binaries}


def test_libraries_outside_the_loader_path_get_ld_library_path(tmp_path: Path) -> None:
    FakeDriverRoot.create(tmp_path, lib_dir="usr/lib64")
    edits = management_edits(DriverRoot(host=HOST, container=tmp_path).scan(), uvm_major=None)
    assert edits.env == ("LD_LIBRARY_PATH=/usr/lib64",)
    FakeDriverRoot.create(tmp_path / "deb")
    edits = management_edits(DriverRoot(host=HOST, container=tmp_path / "deb").scan(), uvm_major=1)
    assert edits.env == ()


@pytest.mark.parametrize("arch", ARCHES)
def test_discovery_finds_everything_in_either_architectures_layout(
    tmp_path: Path, arch: Arch
) -> None:
    """x86_64 nodes and Grace (GB200, aarch64) nodes: the same search finds the IMEX binaries,
    NVML and the driver version, the versioned libraries with their SONAME links, and the
    fabric-imex-mgmt capability; no loader help is needed in either multiarch directory."""
    made = FakeDriverRoot.create(tmp_path, driver_version=VERSION, arch=arch)
    libdir = f"/usr/lib/{arch}-linux-gnu"
    assert (made.arch, f"/{made.lib_dir}") == (arch, libdir)
    root = DriverRoot(host=HOST, container=tmp_path)
    files = root.scan()
    assert files.version == VERSION and files.missing_imex == ()
    binaries = {b.container_path: b.host_path for b in files.binaries}
    for name in dr.IMEX_BINARIES:
        assert binaries[f"/usr/bin/{name}"] == f"{HOST}/usr/bin/{name}"
    libraries = {f.container_path: f.host_path for f in files.libraries}
    for lib in LIBRARIES:
        versioned = f"{HOST}{libdir}/{lib}.so.{VERSION}"
        assert libraries[f"{libdir}/{lib}.so.{VERSION}"] == versioned
        assert libraries[f"{libdir}/{lib}.so.1"] == versioned  # the link, as its target
    assert files.library_dirs() == (libdir,)
    assert root.nvml_library() == tmp_path / made.lib_dir / f"libnvidia-ml.so.{VERSION}"
    gpus = [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]
    edits = management_edits(files, uvm_major=511, extra_nodes=gpus)
    assert edits.env == ()
    assert [n["path"] for n in edits.device_nodes] == [
        "/dev/nvidia0",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]
    caps = root.imex_mgmt_caps_file(proc_root=tmp_path / "no-proc")
    assert caps == tmp_path / "proc/driver/nvidia/capabilities/fabric-imex-mgmt"
    mgmt = procdevices.imex_mgmt_node(caps_file=caps, caps_major=236)
    assert (mgmt.path, mgmt.major, mgmt.minor) == ("/dev/nvidia-caps/nvidia-cap512", 236, 512)
    banner = (tmp_path / "proc/driver/nvidia/version").read_text()
    assert banner.startswith(
        f"NVRM version: NVIDIA UNIX Open Kernel Module for {arch}  {VERSION}  "
    )


def test_caps_file_comes_from_the_root_when_it_has_one(tmp_path: Path) -> None:
    root = DriverRoot(host=HOST, container=tmp_path)
    assert root.imex_mgmt_caps_file(proc_root=Path("/p")) == Path(
        "/p/driver/nvidia/capabilities/fabric-imex-mgmt"
    )
    FakeDriverRoot.create(tmp_path)
    assert root.imex_mgmt_caps_file() == (
        tmp_path / "proc/driver/nvidia/capabilities/fabric-imex-mgmt"
    )


# -- the plugin writes it into the base spec ---------------------------------------------------


@pytest.mark.parametrize("arch", ARCHES)
def test_base_spec_carries_the_imex_binaries_libraries_and_nvidiactl(
    api: FakeApiServer, root: Path, arch: Arch
) -> None:
    FakeDriverRoot.create(root / "driver", arch=arch)
    config = replace(
        make_config(root), driver_root=Path("/host/driver"), container_driver_root=root / "driver"
    )
    devices = NodeDevices(driver_version=VERSION, gpus=(), clique_id="")
    plugin = KubeletPlugin(config=config, client=api.client(), devices=devices)
    plugin.start()
    try:
        spec = json.loads(plugin.cdi.base_spec_path().read_text())
    finally:
        plugin.stop()
    (device,) = spec["devices"]
    assert device["name"] == "all"
    edits = device["containerEdits"]
    mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
    assert mounts["/usr/bin/nvidia-imex"] == "/host/driver/usr/bin/nvidia-imex"
    assert mounts["/usr/bin/nvidia-imex-ctl"] == "/host/driver/usr/bin/nvidia-imex-ctl"
    libdir = f"/usr/lib/{arch}-linux-gnu"
    assert (
        mounts[f"{libdir}/libnvidia-ml.so.1"] == f"/host/driver{libdir}/libnvidia-ml.so.{VERSION}"
    )
    assert not [p for p in mounts if "linux-gnu" in p and not p.startswith(libdir)]
    assert "/dev/nvidiactl" in [n["path"] for n in edits["deviceNodes"]]
    assert "NVIDIA_VISIBLE_DEVICES=void" in edits["env"]


def test_plugin_starts_with_an_incomplete_root_and_says_what_is_missing(
    api: FakeApiServer, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    FakeDriverRoot.create(root / "driver", omit=["nvidia-imex", "nvidia-imex-ctl"])
    config = replace(make_config(root), container_driver_root=root / "driver")
    devices = NodeDevices(driver_version=VERSION, gpus=(), clique_id="")
    plugin = KubeletPlugin(config=config, client=api.client(), devices=devices)
    plugin.start()
    try:
        spec = json.loads(plugin.cdi.base_spec_path().read_text())
    finally:
        plugin.stop()
    paths = [m["containerPath"] for m in spec["devices"][0]["containerEdits"]["mounts"]]
    assert not [p for p in paths if "imex" in p]
    assert "nvidia-imex or nvidia-imex-ctl" in caplog.text
    assert "DriverRootIncomplete" in caplog.text


# -- NVML by absolute path ----------------------------------------------------------------------


@pytest.fixture
def pynvml_unloaded(monkeypatch: pytest.MonkeyPatch) -> Any:
    pynvml = importlib.import_module("pynvml")
    monkeypatch.setattr(pynvml, "nvmlLib", None)
    return pynvml


@pytest.mark.parametrize("arch", ARCHES)
def test_nvml_is_loaded_from_the_driver_root_by_absolute_path(
    tmp_path: Path, pynvml_unloaded: Any, arch: Arch
) -> None:
    made = FakeDriverRoot.create(tmp_path, arch=arch)
    assert made.lib_dir == f"usr/lib/{arch}-linux-gnu"
    library = DriverRoot(host=Path("/"), container=tmp_path).nvml_library()
    assert library == tmp_path / made.lib_dir / f"libnvidia-ml.so.{made.driver_version}"
    opened: list[str] = []

    def cdll(path: str) -> object:
        opened.append(path)
        return "handle"

    assert load_pynvml(library, cdll=cdll) is pynvml_unloaded
    assert opened == [str(library)]
    assert pynvml_unloaded.nvmlLib == "handle"  # pynvml will not dlopen by soname any more


def test_missing_nvml_names_the_driver_root(tmp_path: Path) -> None:
    with pytest.raises(DriverRootError, match=r"libnvidia-ml\.so\.1 not found.*nvidiaDriverRoot"):
        DriverRoot(host=Path("/run/nvidia/driver"), container=tmp_path).nvml_library()


def test_plugin_nvml_discovery_uses_the_driver_root(tmp_path: Path, pynvml_unloaded: Any) -> None:
    made = FakeDriverRoot.create(tmp_path)
    args = parse_args(
        [
            "--node-name",
            "n",
            "--device-discovery",
            "nvml",
            "--nvidia-driver-root",
            "/run/nvidia/driver",
            "--container-driver-root",
            str(tmp_path),
        ],
        {},
    )
    # The placeholder is no ELF file: the error shows which file the plugin tried to load.
    with pytest.raises(
        DiscoveryError, match=re.escape(f"cannot load NVML from {tmp_path}/{made.lib_dir}/")
    ):
        build_discovery(args)
    assert pynvml_unloaded.nvmlLib is None
    defaults = parse_args(["--node-name", "n"], {})
    assert (defaults.nvidia_driver_root, defaults.container_driver_root) == ("/", "/driver-root")
