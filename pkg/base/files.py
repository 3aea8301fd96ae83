"""Atomic file replacement, and reading files another, less trusted, process controls.

Owns the one way this repository replaces a file other processes read (CDI specs, the plugin
checkpoint, ``imexd.cfg``, IMEX's nodes config and hosts block, the daemon's node-local readiness
record): write a temp file in the same directory, fsync it, rename it over the target, fsync the
directory. A failure leaves the target untouched and no temp file behind.

And the one way a privileged process reads a file that a less trusted one can replace (the
kubelet plugin reading what an IMEX daemon leaves in its ``domains/<uid>`` directory):
`read_untrusted_file` and `open_untrusted_file`, relative to a directory opened with
`open_untrusted_dir`. They never follow a symlink in the names they are given, never block on a
FIFO or device, never open a device node at all, read regular files only and at most a cap;
whatever they refuse raises `UnsafeFileError` (an ``OSError``), so "cannot read it" and "may
not read it" are one case for callers that treat both as "not there".
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

__all__ = [
    "UnsafeFileError",
    "atomic_write",
    "open_untrusted_dir",
    "open_untrusted_file",
    "read_untrusted_file",
    "write_file_atomically",
]

# open(2) flags for any untrusted open: no symlink in the last component, no blocking (FIFOs,
# devices), no controlling terminal, not inherited by children.
_NOFOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
_O_PATH: int = getattr(os, "O_PATH", 0)


class UnsafeFileError(OSError):
    """A file that exists but is refused: a symlink, not a regular file (or directory), too
    large, or swapped while being opened. ``kind`` is one of those words (stable, for
    de-duplicating reports); ``str()`` names the path and the reason."""

    def __init__(self, path: str | os.PathLike[str], kind: str, detail: str = "") -> None:
        self.path = os.fspath(path)
        self.kind = kind
        super().__init__(f"{self.path}: {detail or kind}")


def _kind_of(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _regular(path: str | os.PathLike[str], st: os.stat_result) -> os.stat_result:
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeFileError(path, "a symlink")
    if not stat.S_ISREG(st.st_mode):
        what = _kind_of(st.st_mode)
        raise UnsafeFileError(path, "not a regular file", f"not a regular file ({what})")
    return st


def open_untrusted_dir(path: str | os.PathLike[str], *, dir_fd: int | None = None) -> int:
    """A read-only descriptor of the directory ``path`` (relative to ``dir_fd`` if given), for
    the ``dir_fd`` of `open_untrusted_file`. The last component must be a directory itself, not a
    symlink to one; earlier components are followed, so they must be the caller's own.
    Raises `UnsafeFileError` (a symlink, not a directory), ``FileNotFoundError`` or another
    ``OSError``; the caller closes the descriptor."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=dir_fd)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            # Linux says ENOTDIR for O_DIRECTORY | O_NOFOLLOW on a symlink: tell them apart.
            try:
                link = stat.S_ISLNK(os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_mode)
            except OSError:
                link = False
            raise UnsafeFileError(path, "a symlink" if link else "not a directory") from err
        raise


def open_untrusted_file(path: str | os.PathLike[str], *, dir_fd: int | None = None) -> int:
    """A read-only, non-blocking descriptor of the regular file ``path`` (relative to
    ``dir_fd`` if given), which the caller closes.

    Contract: a symlink as the last component is refused, not followed; anything but a regular
    file (FIFO, socket, directory, device node) is refused without being opened for reading -
    the name is first opened with ``O_PATH`` (which runs no driver code and cannot block), its
    type checked with ``fstat``, and only that very inode reopened through ``/proc/self/fd``;
    where there is no ``O_PATH`` or no ``/proc``, an ``lstat`` check, then ``O_RDONLY |
    O_NOFOLLOW | O_NONBLOCK`` and an ``fstat`` that must show the same regular file. Earlier
    components of ``path`` are followed: pass a ``dir_fd`` from `open_untrusted_dir` when they
    are not the caller's own. Raises `UnsafeFileError` for a refused file,
    ``FileNotFoundError`` when there is none, another ``OSError`` when it cannot be opened."""
    st: os.stat_result | None = None
    fd = -1
    if _O_PATH:
        pfd = os.open(path, _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            st = _regular(path, os.fstat(pfd))
            with contextlib.suppress(FileNotFoundError):  # no /proc: the portable way below
                fd = os.open(f"/proc/self/fd/{pfd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        finally:
            os.close(pfd)
    if fd < 0:
        st = _regular(path, os.stat(path, dir_fd=dir_fd, follow_symlinks=False))
        try:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW, dir_fd=dir_fd)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise UnsafeFileError(path, "a symlink") from err
            raise
    try:
        now = _regular(path, os.fstat(fd))
        assert st is not None
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise UnsafeFileError(path, "replaced", "replaced while being opened")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_untrusted_file(
    path: str | os.PathLike[str], *, max_bytes: int, dir_fd: int | None = None
) -> bytes:
    """The content of the regular file ``path`` (relative to ``dir_fd`` if given), opened as
    `open_untrusted_file` does, if it holds at most ``max_bytes`` bytes.

    Never follows a symlink in the last component, never blocks (FIFO, device), never reads
    more than ``max_bytes + 1`` bytes. Raises `UnsafeFileError` for a refused file (including
    one larger than ``max_bytes``, by its size or by what could be read), ``FileNotFoundError``
    when there is none, another ``OSError`` when it cannot be read. Takes no lock: callers read
    first and publish what they read under their own lock afterwards."""
    fd = open_untrusted_file(path, dir_fd=dir_fd)
    try:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise UnsafeFileError(path, "too large", f"{size} bytes, more than {max_bytes}")
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, max_bytes + 1 - total)
            if not chunk:
                break
            total += len(chunk)
            if total > max_bytes:
                raise UnsafeFileError(path, "too large", f"more than {max_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


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
