"""qemu-user binfmt handlers: run foreign-architecture binaries (arm64 ``RUN`` steps, an arm64
node's containerd and containers) on this machine, and leave the host as it was found.

Debian's ``qemu-user-static`` ships one ``/usr/lib/binfmt.d/qemu-<arch>.conf`` per architecture
with flags ``OPF``: ``F`` opens the interpreter when the handler is registered, so it also works
inside containers and chroots that do not have it.  :func:`foreign_arch` mounts ``binfmt_misc``
if needed and registers the handler if it is missing, and on exit undoes exactly what it did:
a handler or mount that was there before stays.  :func:`state` and :func:`mounted` are what
the host leftovers check compares before and after.
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

BINFMT_MISC = Path("/proc/sys/fs/binfmt_misc")
BINFMT_D = Path("/usr/lib/binfmt.d")

#: Debian/OCI architecture name -> the kernel's ``uname -m`` / qemu name.
QEMU_ARCH = {"arm64": "aarch64", "amd64": "x86_64"}


class BinfmtError(RuntimeError):
    """A handler could not be registered (says what to install or run)."""


def native_arch() -> str:
    """This machine's architecture as OCI/Debian name it (``amd64``, ``arm64``)."""
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def handler_name(arch: str) -> str:
    """The ``binfmt_misc`` entry of ``arch`` (OCI name): ``qemu-aarch64`` for ``arm64``."""
    return f"qemu-{QEMU_ARCH.get(arch, arch)}"


def state() -> list[str]:
    """The registered qemu handlers (names), or ``[]`` when ``binfmt_misc`` is not mounted."""
    if not (BINFMT_MISC / "register").exists():
        return []
    return sorted(p.name for p in BINFMT_MISC.iterdir() if p.name.startswith("qemu-"))


def mounted() -> bool:
    """Whether ``binfmt_misc`` is mounted at :data:`BINFMT_MISC` (in this mount namespace)."""
    return (BINFMT_MISC / "register").exists()


def unmount(log: Callable[[str], None] = lambda _m: None) -> None:
    """Unmount ``binfmt_misc``; when busy (a foreign binary still exiting), detach it lazily:
    the kernel drops it when the last user goes, so the host is left as it was found."""
    done = subprocess.run(["umount", str(BINFMT_MISC)], check=False, capture_output=True, text=True)
    if done.returncode != 0:
        lazy = subprocess.run(
            ["umount", "-l", str(BINFMT_MISC)], check=False, capture_output=True, text=True
        )
        log(f"umount {BINFMT_MISC}: {done.stderr.strip()}; lazy umount rc={lazy.returncode}")
    log(f"unmounted {BINFMT_MISC}")


@contextlib.contextmanager
def foreign_arch(arch: str, log: Callable[[str], None] = lambda _m: None) -> Iterator[None]:
    """Within the block, binaries of ``arch`` (OCI name) run here: natively, or through the
    qemu-user handler registered for the block.  Raises :class:`BinfmtError` when
    ``qemu-user-static`` is missing or registration is refused (not root)."""
    if arch == native_arch():
        yield
        return
    name = handler_name(arch)
    conf = BINFMT_D / f"{name}.conf"
    if not conf.is_file():
        raise BinfmtError(f"{conf} missing: apt-get install qemu-user-static (to run {arch} code)")
    mounted_here = False
    registered_here = False
    try:
        if not mounted():
            subprocess.run(
                ["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT_MISC)],
                check=True,
                capture_output=True,
                text=True,
            )
            mounted_here = True
            log(f"mounted binfmt_misc at {BINFMT_MISC}")
        if not (BINFMT_MISC / name).exists():
            line = next(ln for ln in conf.read_text().splitlines() if ln and not ln.startswith("#"))
            # The conf holds the register line with \x escapes, as written to the kernel.
            fd = os.open(BINFMT_MISC / "register", os.O_WRONLY)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
            registered_here = True
            log(f"registered binfmt handler {name}")
    except (OSError, subprocess.CalledProcessError, StopIteration) as exc:
        _undo(name, registered_here, mounted_here, log)
        raise BinfmtError(f"cannot register the {name} binfmt handler: {exc}") from exc
    try:
        yield
    finally:
        _undo(name, registered_here, mounted_here, log)


def _undo(name: str, registered: bool, mounted_here: bool, log: Callable[[str], None]) -> None:
    if registered and (BINFMT_MISC / name).exists():
        (BINFMT_MISC / name).write_text("-1")
        log(f"unregistered binfmt handler {name}")
    if mounted_here:
        unmount(log)
