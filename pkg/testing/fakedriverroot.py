"""A fake NVIDIA driver root: a host directory laid out like a real driver installation.

Every test tier (unit tests, the simulated nodes of the e2e suite, kind) points the kubelet
plugin's driver root (``NVIDIA_DRIVER_ROOT``) at one of these, so the IMEX daemons find
``nvidia-imex`` only through what the plugin injects with CDI -- exactly as on a GPU node.
Layout (``lib_dir`` defaults to the Debian/Ubuntu multiarch directory of ``arch``:
``usr/lib/x86_64-linux-gnu`` or, for Grace/GB200 nodes, ``usr/lib/aarch64-linux-gnu``)::

    <root>/usr/bin/nvidia-imex              simulated IMEX (pkg.imex.sim.imexd), self-contained
    <root>/usr/bin/nvidia-imex-ctl          simulated IMEX control (pkg.imex.sim.ctl)
    <root>/usr/bin/nvidia-smi               placeholder (exits 1: not simulated)
    <root>/<lib_dir>/lib<name>.so.<version> placeholder driver libraries (not ELF files)
    <root>/<lib_dir>/lib<name>.so.1         -> lib<name>.so.<version> (the SONAME links)
    <root>/proc/driver/nvidia/version       the kernel module's version banner (of ``arch``)
    <root>/proc/driver/nvidia/params        module parameters (ModifyDeviceFiles ...)
    <root>/proc/driver/nvidia/capabilities/fabric-imex-mgmt   DeviceFileMinor/Mode/Modify

**Host-managed IMEX** (``host_imex_ctl=<static binary>``): the root also looks like a host
install whose own ``nvidia-imex.service`` runs -- ``dev/`` (so the plugin's dev root is this
root, as on a host install, and it runs ``chroot <root> nvidia-imex-ctl``),
``etc/nvidia-imex/config.cfg`` with ``IMEX_CMD_ENABLED=1`` and
``IMEX_CMD_UNIX_DOMAIN_PATH=/etc/nvidia-imex/imex_ctrl.sock`` (:data:`HOST_IMEX_CONFIG`), and the
given statically linked ``nvidia-imex-ctl`` (``hack/hostimex``) in place of the zipapp, because
nothing inside a chroot into this root can run an interpreter. The service itself is
:mod:`pkg.imex.sim.hostservice`, started by the test on the host with ``--root <root>``.
Without ``host_imex_ctl`` those files are removed again (a refresh back to driver-managed).

The two IMEX programs are Python zip applications: one file each, a ``#!<python>`` line followed
by a zip of ``pkg.imex.sim`` and the few ``pkg.imex`` modules it uses (standard library only).
A single file is what a CDI bind mount carries into a container, so the simulator needs nothing
from the daemon image except an interpreter: ``python`` names it (``/usr/bin/env python3``
inside the daemon image; ``sys.executable`` when the "container" is a local process). The
production daemon image does not contain the simulator at all.

``arch`` (``"x86_64"`` or ``"aarch64"``; default: this host's, see `host_arch`) picks the
library directory and the version banner; the rest of the layout, and the zipapps, are the same
on both (the libraries are placeholders, never loaded). ``omit`` leaves files out (binary names
such as ``"nvidia-imex"`` or paths relative to the root) to build an incomplete root for the
``DriverRootIncomplete`` tests. Run as a program (``python -m pkg.testing.fakedriverroot <dir>
[--arch aarch64]``) it creates a root for ``hack/kind``.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import sys
import zipfile
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, get_args

Arch = Literal["x86_64", "aarch64"]  # the kernel's names (``uname -m``) of the two GPU platforms
ARCHES: Final[tuple[Arch, ...]] = get_args(Arch)
PKG_ROOT: Final = Path(__file__).resolve().parents[1]  # the ``pkg`` package directory
DEFAULT_DRIVER_VERSION: Final = "570.170.01"
DEFAULT_LIB_DIR: Final = "usr/lib/x86_64-linux-gnu"  # x86_64's; see `lib_dir_for`
# ``uname -m`` spellings (and Go/Debian's names, as some tools report them) of each arch.
_MACHINES: Final[dict[str, Arch]] = {
    "x86_64": "x86_64",
    "amd64": "x86_64",
    "aarch64": "aarch64",
    "arm64": "aarch64",
}
DEFAULT_PYTHON: Final = "/usr/bin/env python3"
FABRIC_IMEX_MGMT_MINOR: Final = 512
HOST_IMEX_CONFIG: Final = "etc/nvidia-imex/config.cfg"
HOST_IMEX_SOCKET: Final = "/etc/nvidia-imex/imex_ctrl.sock"
LIBRARIES: Final = ("libnvidia-ml", "libcuda", "libnvidia-cfg", "libnvidia-ptxjitcompiler")
# Modules of ``pkg`` the simulator imports (checked by the unit test that runs the zipapps).
SIM_MODULES: Final = (
    "__init__.py",
    "base/__init__.py",
    "base/clock.py",
    "base/files.py",
    "base/types.py",
    "imex/__init__.py",
    "imex/config.py",
    "imex/hosts.py",
    "imex/nodesconfig.py",
    "imex/sim/__init__.py",
    "imex/sim/imexd.py",
    "imex/sim/ctl.py",
    "imex/sim/wire.py",
)
PROGRAMS: Final = {"nvidia-imex": "pkg.imex.sim.imexd", "nvidia-imex-ctl": "pkg.imex.sim.ctl"}
_SMI_PLACEHOLDER: Final = (
    "#!/bin/sh\necho 'nvidia-smi: not simulated in a fake driver root' >&2\nexit 1\n"
)


def host_arch(machine: str | None = None) -> Arch:
    """The fake root architecture of ``machine`` (default: this host's ``platform.machine()``):
    ``aarch64``/``arm64`` -> ``"aarch64"``, ``x86_64``/``amd64`` -> ``"x86_64"``. Any other
    machine (no GPU platform this driver supports) gets ``"x86_64"``: the fake root's files are
    placeholders and zipapps, usable on any host."""
    return _MACHINES.get((platform.machine() if machine is None else machine).lower(), "x86_64")


def lib_dir_for(arch: Arch) -> str:
    """The Debian/Ubuntu multiarch library directory of ``arch``, relative to the root
    (``usr/lib/aarch64-linux-gnu``); ValueError for an unknown arch."""
    if arch not in ARCHES:
        raise ValueError(f"unknown architecture {arch!r}: one of {', '.join(ARCHES)}")
    return f"usr/lib/{arch}-linux-gnu"


def version_banner(arch: Arch, driver_version: str) -> str:
    """``/proc/driver/nvidia/version`` of the open kernel modules (the ones Hopper/Blackwell
    and Grace nodes run) built for ``arch``: ``NVRM version: NVIDIA UNIX Open Kernel Module for
    <arch>  <version>  Release Build  (<builder>)  <date>``, then the compiler line."""
    if arch not in ARCHES:
        raise ValueError(f"unknown architecture {arch!r}: one of {', '.join(ARCHES)}")
    return (
        f"NVRM version: NVIDIA UNIX Open Kernel Module for {arch}  {driver_version}  "
        "Release Build  (fake-driver-root@localhost)  Thu Jan  1 00:00:00 UTC 2026\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )


@dataclass(frozen=True)
class FakeDriverRoot:
    """A created fake driver root; paths are absolute on the machine that created it."""

    root: Path
    driver_version: str
    lib_dir: str
    arch: Arch = "x86_64"

    @classmethod
    def create(
        cls,
        root: Path,
        *,
        driver_version: str = DEFAULT_DRIVER_VERSION,
        python: str = DEFAULT_PYTHON,
        lib_dir: str | None = None,
        imex_mgmt_minor: int = FABRIC_IMEX_MGMT_MINOR,
        omit: Collection[str] = (),
        arch: Arch | None = None,
        host_imex_ctl: Path | None = None,
    ) -> FakeDriverRoot:
        """Create (or refresh) the layout of the module docstring under ``root``.

        ``arch`` (``"x86_64"`` or ``"aarch64"``; None: `host_arch`) picks the version banner
        and the default ``lib_dir`` (`lib_dir_for`; ValueError for another arch). ``python`` is
        the interpreter command of the zipapps' ``#!`` line. ``omit`` names files to leave out
        (and removes them if an earlier call created them). ``host_imex_ctl``: the host-managed
        IMEX layout of the module docstring with that static ``nvidia-imex-ctl``. Returns the
        root.
        """
        arch = host_arch() if arch is None else arch
        lib_dir = lib_dir_for(arch) if lib_dir is None else lib_dir
        made = cls(root=root, driver_version=driver_version, lib_dir=lib_dir.strip("/"), arch=arch)
        files: dict[str, tuple[bytes, int]] = {
            f"usr/bin/{name}": (zipapp_bytes(module, python=python), 0o755)
            for name, module in PROGRAMS.items()
        }
        files["usr/bin/nvidia-smi"] = (_SMI_PLACEHOLDER.encode(), 0o755)
        if host_imex_ctl is not None:
            files["usr/bin/nvidia-imex-ctl"] = (host_imex_ctl.read_bytes(), 0o755)
            host_cfg = f"IMEX_CMD_ENABLED=1\nIMEX_CMD_UNIX_DOMAIN_PATH={HOST_IMEX_SOCKET}\n"
            files[HOST_IMEX_CONFIG] = (host_cfg.encode(), 0o644)
            (root / "dev").mkdir(parents=True, exist_ok=True)
        else:
            (root / HOST_IMEX_CONFIG).unlink(missing_ok=True)
            if (root / "dev").is_dir() and not any((root / "dev").iterdir()):
                (root / "dev").rmdir()
        for lib in LIBRARIES:
            placeholder = f"placeholder for {lib}.so.{driver_version} (fake driver root)\n"
            files[f"{made.lib_dir}/{lib}.so.{driver_version}"] = (placeholder.encode(), 0o644)
        proc = "proc/driver/nvidia"
        files[f"{proc}/version"] = (version_banner(arch, driver_version).encode(), 0o444)
        files[f"{proc}/params"] = (b"ModifyDeviceFiles: 1\nDeviceFileMode: 438\n", 0o444)
        caps = f"DeviceFileMinor: {imex_mgmt_minor}\nDeviceFileMode: 256\nDeviceFileModify: 1\n"
        files[f"{proc}/capabilities/fabric-imex-mgmt"] = (caps.encode(), 0o444)
        skip = {made._relative(o) for o in omit}
        for rel, (data, mode) in files.items():
            path = root / rel
            if rel in skip:
                path.unlink(missing_ok=True)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            _write(path, data, mode)
        for lib in LIBRARIES:
            rel = f"{made.lib_dir}/{lib}.so.1"
            link = root / rel
            link.unlink(missing_ok=True)
            if rel not in skip and f"{made.lib_dir}/{lib}.so.{driver_version}" not in skip:
                link.symlink_to(f"{lib}.so.{driver_version}")
        return made

    def _relative(self, name: str) -> str:
        """``"nvidia-imex"`` -> ``"usr/bin/nvidia-imex"``; paths stay as they are."""
        return name.strip("/") if "/" in name else f"usr/bin/{name}"

    def path(self, relative: str) -> Path:
        """Absolute path of ``relative`` (a root-relative path or a binary name)."""
        return self.root / self._relative(relative)

    def binary(self, name: str) -> Path:
        """Absolute path of a binary in ``usr/bin``."""
        return self.root / "usr" / "bin" / name


def zipapp_bytes(module: str, *, python: str) -> bytes:
    """A runnable zip application executing ``module``'s ``main()`` under ``python``."""
    buffer = io.BytesIO()
    buffer.write(f"#!{python}\n".encode())
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for rel in SIM_MODULES:
            archive.write(PKG_ROOT / rel, f"pkg/{rel}")
        archive.writestr(
            "__main__.py",
            f"import sys\nfrom {module} import main\nsys.exit(main())\n",
        )
    return buffer.getvalue()


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    tmp.write_bytes(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)  # atomic: a running daemon never execs half a file


def main(argv: list[str] | None = None) -> int:
    """``python -m pkg.testing.fakedriverroot DIR [--arch ARCH] [--python CMD] [--omit NAME
    ...]``."""
    p = argparse.ArgumentParser(prog="fakedriverroot", description=__doc__.splitlines()[0])
    p.add_argument("root", type=Path)
    p.add_argument("--python", default=DEFAULT_PYTHON, help="interpreter of the IMEX zipapps")
    p.add_argument("--driver-version", default=DEFAULT_DRIVER_VERSION)
    p.add_argument(
        "--arch",
        choices=ARCHES,
        default=None,
        help=f"the node's architecture (default: this host's, {host_arch()})",
    )
    p.add_argument("--lib-dir", default=None, help="default: usr/lib/<arch>-linux-gnu")
    p.add_argument("--omit", action="append", default=[], help="file to leave out (repeatable)")
    args = p.parse_args(argv)
    made = FakeDriverRoot.create(
        args.root,
        driver_version=args.driver_version,
        python=args.python,
        lib_dir=args.lib_dir,
        omit=args.omit,
        arch=args.arch,
    )
    sys.stdout.write(f"{made.root}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
