"""The node-local readiness record an IMEX daemon leaves for the kubelet plugin on its node.

Owns two files in a domain's directory, which the kubelet plugin creates as
``<plugin dir>/domains/<cdUID>`` when it prepares the daemon's claim and bind-mounts into the
daemon container (``/imexd``, where the daemon also writes ``imexd.cfg``):

* ``daemon.lock``: the daemon process holds an exclusive ``flock`` on it from its start to its
  exit. The kernel drops the lock when the process ends in any way (SIGKILL, OOM kill, node
  reboot), so a lock nobody holds proves that no daemon is alive to stand behind a record;
* ``daemon-ready.json``: written the moment the daemon's IMEX answers READY, *before* the daemon
  publishes ``Ready`` in its membership entry through the API server, and withdrawn before it
  publishes anything else. Format (JSON object, written atomically: temp file + rename)::

    {"domainUID": "<cdUID>", "nodeName": "<node>", "ipAddress": "<pod IP>", "status": "Ready"}

The plugin's Prepare of a workload's channel claim, waiting for this node's daemon, accepts a
record as well as a ``Ready`` membership entry, so the workload is released without a round trip
through kube-apiserver (and without queueing behind the other daemons' writes to their shared
ComputeDomainClique).

Invariants:
- a record counts only while its writer holds the lock (:func:`read` checks with a shared,
  non-blocking ``flock``) and only for the membership entry with the same domain, node and IP
  (the caller checks :meth:`LocalReady.speaks_for`): a dead daemon's record, one from before a
  reboot or one of a replaced pod never releases a workload, so a daemon the controller marked
  NotReady (its container died) holds Prepares as before;
- absent, unreadable or unlocked means "not known Ready": a reader falls back to the membership
  entry and never fails because of the record;
- the directory is the daemon's (bind-mounted read-write into its pod), so the reader trusts
  nothing in it: the directory itself and both files are opened without following a
  symlink, without blocking (a FIFO) and without opening a device node; the record must be a
  regular file of at most :data:`MAX_RECORD_BYTES` (`pkg.base.files.read_untrusted_file`). A
  file it refuses is reported to the caller's ``on_unsafe`` and counts as absent;
- a daemon process withdraws any record it finds once it holds the lock, before its IMEX runs;
  a process that cannot take the lock (another daemon process of the domain still runs on the
  node) publishes no record and leaves the decision to its membership entry.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pkg.api.constants import STATUS_READY
from pkg.base.files import (
    open_untrusted_dir,
    open_untrusted_file,
    read_untrusted_file,
    write_file_atomically,
)

__all__ = ["FILE_NAME", "LOCK_NAME", "MAX_RECORD_BYTES", "LocalReady", "Publisher", "read"]

FILE_NAME: Final = "daemon-ready.json"
LOCK_NAME: Final = "daemon.lock"
# The largest record is under 500 bytes (a 36-character UID, a node name of at most 253, an IP
# literal of at most 45, the keys); anything beyond 8x that is not a record.
MAX_RECORD_BYTES: Final = 4096

OnUnsafe = Callable[[Path, OSError], None]
"""Told about a file that is there but was refused or could not be read (not about an absent
one): its path and the error (`pkg.base.files.UnsafeFileError` for a refused one)."""


@dataclass(frozen=True)
class LocalReady:
    """One live daemon's statement that its IMEX is READY, for one domain on one node."""

    domain_uid: str
    node_name: str
    ip_address: str

    def speaks_for(self, domain_uid: str, node_name: str, ip_address: object) -> bool:
        """This record is about ``domain_uid`` on ``node_name`` and the daemon at ``ip_address``
        (the IP of the node's membership entry)."""
        return (
            bool(self.ip_address)
            and self.domain_uid == domain_uid
            and self.node_name == node_name
            and self.ip_address == ip_address
        )


class Publisher:
    """The daemon's side: holds the lock and writes/withdraws the record in ``directory``."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self._dir = Path(directory)
        self._lock_fd: int | None = None

    @property
    def holding(self) -> bool:
        """The lock is ours (records can be published)."""
        return self._lock_fd is not None

    def acquire(self, *, attempts: int = 20, pause: float = 0.01) -> bool:
        """Take the lock (kept until :meth:`release` or process exit) and withdraw whatever
        record a predecessor left; False when another process holds it after ``attempts``
        tries ``pause`` seconds apart (a plugin's check holds it for microseconds). Raises
        ``OSError`` when the directory cannot be written."""
        if self._lock_fd is not None:
            return True
        self._dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        for attempt in range(attempts):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if attempt + 1 < attempts:
                    time.sleep(pause)
                continue
            self._lock_fd = fd
            self.withdraw()
            return True
        os.close(fd)
        return False

    def release(self) -> None:
        """Withdraw the record and give up the lock (shutdown)."""
        if self._lock_fd is None:
            return
        try:
            self.withdraw()
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Give up the lock without touching the record (it could not be withdrawn): with no
        live holder, no reader believes it. Publishing stops for this process."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def publish(self, record: LocalReady) -> bool:
        """Write ``record`` atomically; False without the lock (nothing written). Raises
        ``OSError`` when it cannot be written."""
        if self._lock_fd is None:
            return False
        body = {
            "domainUID": record.domain_uid,
            "nodeName": record.node_name,
            "ipAddress": record.ip_address,
            "status": STATUS_READY,
        }
        write_file_atomically(self._dir / FILE_NAME, json.dumps(body, sort_keys=True))
        return True

    def withdraw(self) -> bool:
        """Remove the record; True if there was one. A missing file is fine; other
        ``OSError`` s propagate."""
        try:
            os.unlink(self._dir / FILE_NAME)
        except FileNotFoundError:
            return False
        return True


def _writer_alive(dir_fd: int, directory: Path, on_unsafe: OnUnsafe | None) -> bool:
    try:
        fd = open_untrusted_file(LOCK_NAME, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    except OSError as err:
        if on_unsafe is not None:
            on_unsafe(directory / LOCK_NAME, err)
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True  # held exclusively: the daemon process is alive
    except OSError:
        return False
    finally:
        os.close(fd)  # also drops our shared lock, if we got it
    return False


def read(
    directory: str | os.PathLike[str], *, on_unsafe: OnUnsafe | None = None
) -> LocalReady | None:
    """The record in ``directory`` if a live daemon stands behind it; None when absent,
    unreadable, refused (a symlink, FIFO, directory or device, or over
    :data:`MAX_RECORD_BYTES`; ``on_unsafe`` is told), malformed, not ``Ready``, or its writer
    is gone (the lock is free). Never blocks and takes no lock but the record's own ``flock``
    probe: call it outside any lock of the caller."""
    path = Path(directory)
    try:
        dir_fd = open_untrusted_dir(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        if on_unsafe is not None:
            on_unsafe(path, err)
        return None
    try:
        try:
            raw = read_untrusted_file(FILE_NAME, max_bytes=MAX_RECORD_BYTES, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as err:
            if on_unsafe is not None:
                on_unsafe(path / FILE_NAME, err)
            return None
        record: LocalReady | None = None
        # ValueError: also UnicodeDecodeError; RecursionError: "[[[[..." nested too deep.
        with contextlib.suppress(ValueError, RecursionError):
            body = json.loads(raw.decode("utf-8"))
            if isinstance(body, dict) and body.get("status") == STATUS_READY:
                uid, node, ip = body.get("domainUID"), body.get("nodeName"), body.get("ipAddress")
                if isinstance(uid, str) and isinstance(node, str) and isinstance(ip, str):
                    record = LocalReady(uid, node, ip)
        if record is None or not _writer_alive(dir_fd, path, on_unsafe):
            return None
        return record
    finally:
        os.close(dir_fd)
