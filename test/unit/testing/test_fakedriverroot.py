"""The fake driver root: a real driver installation's layout, with the simulator as IMEX."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pkg.testing.fakedriverroot import (
    ARCHES,
    DEFAULT_LIB_DIR,
    LIBRARIES,
    PROGRAMS,
    Arch,
    FakeDriverRoot,
    host_arch,
    lib_dir_for,
    main,
)


@pytest.mark.parametrize("arch", ARCHES)
def test_layout_is_a_driver_installation(tmp_path: Path, arch: Arch) -> None:
    made = FakeDriverRoot.create(tmp_path, driver_version="580.1.2", imex_mgmt_minor=77, arch=arch)
    for name in ("nvidia-imex", "nvidia-imex-ctl", "nvidia-smi"):
        mode = made.binary(name).stat().st_mode
        assert stat.S_ISREG(mode) and mode & 0o111, name
    libdir = tmp_path / f"usr/lib/{arch}-linux-gnu"
    assert made.lib_dir == f"usr/lib/{arch}-linux-gnu" and made.arch == arch
    for lib in LIBRARIES:
        assert (libdir / f"{lib}.so.580.1.2").is_file()
        assert os.readlink(libdir / f"{lib}.so.1") == f"{lib}.so.580.1.2"  # relative SONAME link
    assert sorted(p.name for p in (tmp_path / "usr/lib").iterdir()) == [libdir.name]
    proc = tmp_path / "proc/driver/nvidia"
    # The open kernel modules' banner (open-gpu-kernel-modules utils.mk, GENERATE_NVIDSTRING).
    [nvrm, gcc] = (proc / "version").read_text().splitlines()
    assert nvrm.startswith(
        f"NVRM version: NVIDIA UNIX Open Kernel Module for {arch}  580.1.2  Release Build  ("
    )
    assert gcc.startswith("GCC version:  gcc version ")
    assert "DeviceFileMinor: 77\n" in (proc / "capabilities/fabric-imex-mgmt").read_text()


@pytest.mark.parametrize(
    ("machine", "arch"),
    [("x86_64", "x86_64"), ("AMD64", "x86_64"), ("aarch64", "aarch64"), ("arm64", "aarch64")],
)
def test_host_arch_maps_the_machine_names(machine: str, arch: Arch) -> None:
    assert host_arch(machine) == arch
    assert lib_dir_for(arch) == f"usr/lib/{arch}-linux-gnu"


def test_defaults_follow_the_host_and_an_explicit_lib_dir_still_wins(tmp_path: Path) -> None:
    made = FakeDriverRoot.create(tmp_path / "host")
    assert made.arch == host_arch() and made.lib_dir == lib_dir_for(host_arch())
    made = FakeDriverRoot.create(tmp_path / "rhel", arch="aarch64", lib_dir="/usr/lib64/")
    assert made.lib_dir == "usr/lib64" and (tmp_path / "rhel/usr/lib64/libcuda.so.1").is_file()
    assert lib_dir_for("x86_64") == DEFAULT_LIB_DIR  # the old default, still exported
    with pytest.raises(ValueError, match="unknown architecture 'ppc64le'"):
        lib_dir_for("ppc64le")  # type: ignore[arg-type]


def test_program_creates_an_aarch64_root(tmp_path: Path) -> None:
    assert main([str(tmp_path), "--arch", "aarch64"]) == 0
    assert (tmp_path / "usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1").is_file()
    assert "for aarch64  " in (tmp_path / "proc/driver/nvidia/version").read_text()


def test_omit_leaves_files_out_and_removes_earlier_ones(tmp_path: Path) -> None:
    FakeDriverRoot.create(tmp_path)
    made = FakeDriverRoot.create(tmp_path, omit=["nvidia-imex", "usr/bin/nvidia-smi"])
    assert not made.binary("nvidia-imex").exists() and not made.binary("nvidia-smi").exists()
    assert made.binary("nvidia-imex-ctl").is_file()
    FakeDriverRoot.create(tmp_path)  # a complete root again
    assert made.binary("nvidia-imex").is_file()


def test_imex_programs_are_self_contained(tmp_path: Path) -> None:
    """The zipapps carry the simulator: no repository, PYTHONPATH or site-packages needed
    (a CDI mount brings one file into a container whose image has no simulator)."""
    made = FakeDriverRoot.create(tmp_path, python=sys.executable)
    imex = subprocess.run(
        [str(made.binary("nvidia-imex")), "--help"],
        env={},
        cwd="/",
        capture_output=True,
        text=True,
        check=False,
    )
    assert imex.returncode == 0 and "nvidia-imex (simulated)" in imex.stdout
    ctl = subprocess.run(
        [sys.executable, "-I", "-S", str(made.binary("nvidia-imex-ctl")), "-c", "/nope", "-q"],
        env={},
        cwd="/",
        capture_output=True,
        text=True,
        check=False,
    )
    assert ctl.returncode == 1 and "IMEX daemon not reachable" in ctl.stderr
    assert made.binary("nvidia-imex").read_bytes().startswith(f"#!{sys.executable}\n".encode())
    # Every module either program imports is inside (--help above exits before most imports).
    for program, module in PROGRAMS.items():
        # The program alone on the import path: no site-packages (-S), no working directory (-P).
        done = subprocess.run(
            [sys.executable, "-P", "-S", "-s", "-c", f"import {module}"],
            env={"PYTHONPATH": str(made.binary(program))},
            cwd="/",
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr


def test_default_interpreter_is_the_containers_python3(tmp_path: Path) -> None:
    assert main([str(tmp_path)]) == 0
    assert (tmp_path / "usr/bin/nvidia-imex").read_bytes().startswith(b"#!/usr/bin/env python3\n")
