"""The fake driver root: a real driver installation's layout, with the simulator as IMEX."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from pkg.testing.fakedriverroot import LIBRARIES, PROGRAMS, FakeDriverRoot, main


def test_layout_is_a_driver_installation(tmp_path: Path) -> None:
    made = FakeDriverRoot.create(tmp_path, driver_version="580.1.2", imex_mgmt_minor=77)
    for name in ("nvidia-imex", "nvidia-imex-ctl", "nvidia-smi"):
        mode = made.binary(name).stat().st_mode
        assert stat.S_ISREG(mode) and mode & 0o111, name
    libdir = tmp_path / "usr/lib/x86_64-linux-gnu"
    for lib in LIBRARIES:
        assert (libdir / f"{lib}.so.580.1.2").is_file()
        assert os.readlink(libdir / f"{lib}.so.1") == f"{lib}.so.580.1.2"  # relative SONAME link
    proc = tmp_path / "proc/driver/nvidia"
    assert "580.1.2" in (proc / "version").read_text()
    assert "DeviceFileMinor: 77\n" in (proc / "capabilities/fabric-imex-mgmt").read_text()


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
    imex = subprocess.run([str(made.binary("nvidia-imex")), "--help"], env={}, cwd="/",
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert imex.returncode == 0 and "nvidia-imex (simulated)" in imex.stdout
    ctl = subprocess.run(
        [sys.executable, "-I", "-S", str(made.binary("nvidia-imex-ctl")), "-c", "/nope", "-q"],
        env={}, cwd="/", capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert ctl.returncode == 1 and "IMEX daemon not reachable" in ctl.stderr
    assert made.binary("nvidia-imex").read_bytes().startswith(f"#!{sys.executable}\n".encode())
    # Every module either program imports is inside (--help above exits before most imports).
    for program, module in PROGRAMS.items():
        code = f"import sys; sys.path.insert(0, {str(made.binary(program))!r}); import {module}"
        done = subprocess.run([sys.executable, "-I", "-S", "-c", code], env={}, cwd="/",
                              capture_output=True, text=True, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr


def test_default_interpreter_is_the_containers_python3(tmp_path: Path) -> None:
    assert main([str(tmp_path)]) == 0
    assert (tmp_path / "usr/bin/nvidia-imex").read_bytes().startswith(b"#!/usr/bin/env python3\n")
