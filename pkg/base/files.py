"""Atomic file replacement: readers see the old content or the new, never a mix.

Owns the one way this repository replaces a file other processes read (CDI specs, the plugin
checkpoint, ``imexd.cfg``, IMEX's nodes config and hosts block, the daemon's node-local readiness
record): write a temp file in the same directory, fsync it, rename it over the target, fsync the
directory. A failure leaves the target untouched and no temp file behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write", "write_file_atomically"]


def atomic_write(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` (file mode ``mode``). Raises ``OSError``; the parent
    directory must exist."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def write_file_atomically(path: str | os.PathLike[str], content: str) -> bool:
    """Replace ``path`` with the UTF-8 text ``content`` (creating its directory); False, and
    nothing written, when it already holds exactly that. Raises ``OSError``."""
    target = Path(path)
    with contextlib.suppress(FileNotFoundError):
        if target.read_text(encoding="utf-8") == content:
            return False
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target, content.encode("utf-8"))
    return True
