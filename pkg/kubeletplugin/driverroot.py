"""The host's NVIDIA driver installation, and what the IMEX daemon container receives from it.

Owns the driver-root contract shared with upstream: the host path of the installation
(``NVIDIA_DRIVER_ROOT``: ``/`` for a host install, ``/run/nvidia/driver`` for the GPU operator)
is mounted into the plugin container at ``DRIVER_ROOT_CTR_PATH`` (``/driver-root``). The plugin
reads files through the container path and writes CDI specs with host paths, because the
container runtime applies them on the host.

What the daemon container gets (the base CDI spec, device ``all``), modelled on NVIDIA's
``nvidia-ctk cdi generate --mode=management`` (``pkg/nvcdi`` in nvidia-container-toolkit; the
facts are pinned by ``test/unit/kubeletplugin/test_driverroot.py``):

* the driver binaries found in the root's ``PATH`` directories -- ``nvidia-imex`` and
  ``nvidia-imex-ctl`` among them -- each bind-mounted read-only at its root-relative path (so
  ``/usr/bin/nvidia-imex`` in the container, found by the daemon through ``PATH``);
* every library carrying the driver version suffix (``lib*.so.<version>``) in the directory of
  ``libnvidia-ml.so.1``, plus the ``.so.N`` links to them, mounted the same way;
* ``/dev/nvidiactl`` and, when the kernel module is loaded, ``/dev/nvidia-uvm{,-tools}``, with
  explicit type/major/minor so nothing needs to stat host nodes.

Invariants: symlinks are resolved *inside* the root (an absolute link in
``/run/nvidia/driver`` points into that root, not into the plugin's filesystem), so every
``hostPath`` is a regular file on the host; a root without the IMEX binaries still yields a
spec (workloads on nodes without NVLink need no IMEX) and :attr:`DriverFiles.missing_imex`
names what is missing, for the start-up warning.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Final

from pkg.kubeletplugin.cdi import ContainerEdits

log = logging.getLogger(__name__)

# nvidia-ctk's executable search path (pkg/lookup/path.go defaultPATH), relative to the root.
BINARY_DIRS: Final = ("usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin")
# nvidia-ctk's library search path (pkg/lookup/library.go), relative to the root.
LIBRARY_DIRS: Final = (
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib/x86_64-linux-gnu/nvidia/current",
    "usr/lib/aarch64-linux-gnu/nvidia/current",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "lib/x86_64-linux-gnu/nvidia/current",
    "lib/aarch64-linux-gnu/nvidia/current",
)
# nvidia-ctk's driver binaries (pkg/nvcdi/driver-nvml.go newDriverBinariesDiscoverer).
DRIVER_BINARIES: Final = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-imex",
    "nvidia-imex-ctl",
)
IMEX_BINARIES: Final = ("nvidia-imex", "nvidia-imex-ctl")
NVML_LIBRARY: Final = "libnvidia-ml.so.1"
# nvidia-ctk's mount options for driver files (internal/discover/mounts.go).
MOUNT_OPTIONS: Final = ("ro", "nosuid", "nodev", "rbind", "rprivate")
# Directories the daemon image's dynamic loader searches without help (Debian multiarch);
# libraries mounted elsewhere (e.g. /usr/lib64 of a RHEL host) get LD_LIBRARY_PATH instead of
# nvidia-ctk's ldcache hook. Those directories hold only the mounted NVIDIA libraries.
LOADER_DIRS: Final = frozenset(
    {
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/lib/x86_64-linux-gnu",
        "/lib/aarch64-linux-gnu",
        "/usr/lib",
        "/lib",
    }
)
NVIDIA_MAJOR: Final = 195
NVIDIACTL_MINOR: Final = 255
MAX_SYMLINKS: Final = 40


class DriverRootError(Exception):
    """The driver root lacks something the plugin cannot start without; the message says what."""


@dataclass(frozen=True)
class DriverFile:
    """One file the daemon container receives: where it appears and which host file it is."""

    container_path: str
    host_path: str

    def to_cdi_mount(self) -> dict[str, Any]:
        """The CDI ``mounts`` entry (read-only bind mount, nvidia-ctk's options)."""
        return {
            "hostPath": self.host_path,
            "containerPath": self.container_path,
            "options": list(MOUNT_OPTIONS),
        }


@dataclass(frozen=True)
class DriverFiles:
    """The result of :meth:`DriverRoot.scan`."""

    binaries: tuple[DriverFile, ...]
    libraries: tuple[DriverFile, ...]
    version: str  # "" when no libnvidia-ml.so.1 was found
    missing_imex: tuple[str, ...]

    def library_dirs(self) -> tuple[str, ...]:
        """Container directories of the mounted libraries, in first-seen order."""
        dirs = (str(PurePosixPath(f.container_path).parent) for f in self.libraries)
        return tuple(dict.fromkeys(dirs))


class DriverRoot:
    """A driver installation seen at ``container`` whose host path is ``host``."""

    def __init__(self, *, host: Path, container: Path) -> None:
        self.host = host
        self.container = container

    def host_path(self, relative: str) -> str:
        """Host path of a root-relative path (what a CDI ``hostPath`` must name)."""
        return str(PurePosixPath(self.host) / relative.lstrip("/"))

    def resolve(self, relative: str) -> str | None:
        """Root-relative path of the regular file ``relative`` leads to, following symlinks
        inside the root (absolute targets are re-rooted); None if there is no such file."""
        parts = [p for p in PurePosixPath(relative).parts if p not in ("/", ".")]
        done: list[str] = []
        hops = 0
        while parts:
            part = parts.pop(0)
            if part == "..":
                if done:
                    done.pop()
                continue
            candidate = self.container.joinpath(*done, part)
            try:
                info = os.lstat(candidate)
            except OSError:
                return None
            if stat.S_ISLNK(info.st_mode):
                hops += 1
                if hops > MAX_SYMLINKS:
                    return None
                target = PurePosixPath(os.readlink(candidate))
                if target.is_absolute():
                    done = []
                parts = [p for p in target.parts if p not in ("/", ".")] + parts
                continue
            done.append(part)
        path = self.container.joinpath(*done)
        if not done or not path.is_file():
            return None
        return "/" + "/".join(done)

    def find_binary(self, name: str) -> DriverFile | None:
        """``name`` in the first ``BINARY_DIRS`` entry that has it as an executable file."""
        for directory in BINARY_DIRS:
            relative = f"/{directory}/{name}"
            resolved = self.resolve(relative)
            if resolved and os.access(self.container / resolved.lstrip("/"), os.X_OK):
                return DriverFile(container_path=relative, host_path=self.host_path(resolved))
        return None

    def _find_library(self, name: str) -> tuple[str, str] | None:
        """(link path, resolved path), both root-relative, of ``name`` in ``LIBRARY_DIRS``."""
        for directory in LIBRARY_DIRS:
            relative = f"/{directory}/{name}"
            resolved = self.resolve(relative)
            if resolved:
                return relative, resolved
        return None

    def nvml_library(self) -> Path:
        """Where this process can ``dlopen`` NVML: the resolved ``libnvidia-ml.so.1``.

        Loading by absolute path keeps the plugin's own libraries (libc ...) those of its
        image; raises :class:`DriverRootError` if the root has no NVML.
        """
        found = self._find_library(NVML_LIBRARY)
        if found is None:
            searched = ", ".join(LIBRARY_DIRS)
            raise DriverRootError(
                f"{NVML_LIBRARY} not found in the driver root {self.host} (mounted at "
                f"{self.container}; searched {searched}): check nvidiaDriverRoot"
            )
        return self.container / found[1].lstrip("/")

    def scan(self) -> DriverFiles:
        """Find the binaries and libraries of the module docstring."""
        binaries = []
        for name in DRIVER_BINARIES:
            found = self.find_binary(name)
            if found is not None:
                binaries.append(found)
        present = {PurePosixPath(b.container_path).name for b in binaries}
        missing = tuple(name for name in IMEX_BINARIES if name not in present)
        nvml = self._find_library(NVML_LIBRARY)
        version = ""
        libraries: list[DriverFile] = []
        if nvml is not None:
            match = re.fullmatch(r"libnvidia-ml\.so\.(.+)", PurePosixPath(nvml[1]).name)
            version = match.group(1) if match else ""
        if version and nvml is not None:
            libraries = self._versioned_libraries(PurePosixPath(nvml[0]).parent, version)
        return DriverFiles(tuple(binaries), tuple(libraries), version, missing)

    def _versioned_libraries(self, directory: PurePosixPath, version: str) -> list[DriverFile]:
        suffix = f".so.{version}"
        try:
            names = sorted(os.listdir(self.container / str(directory).lstrip("/")))
        except OSError:
            return []
        files: list[DriverFile] = []
        versioned: set[str] = set()
        links: list[tuple[str, str]] = []
        for name in names:
            relative = str(directory / name)
            resolved = self.resolve(relative)
            if resolved is None or ".so." not in name:
                continue
            if name.endswith(suffix) and resolved == relative:
                versioned.add(resolved)
                files.append(DriverFile(relative, self.host_path(resolved)))
            elif re.search(r"\.so\.\d+$", name):
                links.append((relative, resolved))
        # The SONAME links (libnvidia-ml.so.1 -> libnvidia-ml.so.<version>), which nvidia-ctk
        # recreates with a hook: here each is a bind mount of the file it names.
        files.extend(
            DriverFile(link, self.host_path(target))
            for link, target in links
            if target in versioned
        )
        return files

    def imex_mgmt_caps_file(self, *, proc_root: Path = Path("/proc")) -> Path:
        """The fabric-imex-mgmt capability file: the root's copy if it has one (fake and
        containerized drivers), else the kernel's under ``proc_root``."""
        relative = Path("driver/nvidia/capabilities/fabric-imex-mgmt")
        in_root = self.container / "proc" / relative
        return in_root if in_root.is_file() else proc_root / relative


def management_edits(
    files: DriverFiles, *, uvm_major: int | None, extra_nodes: Iterable[dict[str, Any]] = ()
) -> ContainerEdits:
    """Container edits of the base spec's ``all`` device (see the module docstring).

    ``extra_nodes`` (the GPUs' ``/dev/nvidiaN``) come first; ``uvm_major`` is the
    ``nvidia-uvm`` major from ``/proc/devices`` (None: module not loaded, no UVM nodes).
    """
    nodes = [*extra_nodes, _char_node("/dev/nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR)]
    if uvm_major is not None:
        nodes.append(_char_node("/dev/nvidia-uvm", uvm_major, 0))
        nodes.append(_char_node("/dev/nvidia-uvm-tools", uvm_major, 1))
    mounts = tuple(f.to_cdi_mount() for f in (*files.binaries, *files.libraries))
    extra_dirs = [d for d in files.library_dirs() if d not in LOADER_DIRS]
    env = (f"LD_LIBRARY_PATH={':'.join(extra_dirs)}",) if extra_dirs else ()
    return ContainerEdits(env=env, device_nodes=tuple(nodes), mounts=mounts)


def _char_node(path: str, major: int, minor: int) -> dict[str, Any]:
    return {"path": path, "type": "c", "major": major, "minor": minor}
