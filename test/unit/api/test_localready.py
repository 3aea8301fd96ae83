"""The node-local readiness record: its format, and that only a live writer's record counts."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from pkg.api import localready
from pkg.api.localready import FILE_NAME, LOCK_NAME, MAX_RECORD_BYTES, LocalReady, Publisher
from pkg.base.files import UnsafeFileError

REC = LocalReady("uid-1", "node-a", "10.0.0.1")


def test_a_published_record_reads_back_while_its_writer_holds_the_lock(tmp_path: Path) -> None:
    pub = Publisher(tmp_path / "d")
    assert localready.read(tmp_path / "d") is None  # no directory yet
    assert pub.acquire()
    assert pub.publish(REC)
    assert json.loads((tmp_path / "d" / FILE_NAME).read_text()) == {
        "domainUID": "uid-1",
        "nodeName": "node-a",
        "ipAddress": "10.0.0.1",
        "status": "Ready",
    }
    assert localready.read(tmp_path / "d") == REC
    assert pub.withdraw() and localready.read(tmp_path / "d") is None
    assert not pub.withdraw()  # idempotent
    pub.publish(REC)
    pub.release()
    assert not (tmp_path / "d" / FILE_NAME).exists() and not pub.holding
    assert not pub.publish(REC)  # no lock, nothing written
    assert not (tmp_path / "d" / FILE_NAME).exists()


def test_the_record_of_a_killed_writer_does_not_count(tmp_path: Path) -> None:
    """SIGKILL leaves the file; the kernel drops the lock with the process."""
    script = (
        "import sys, os, signal\n"
        "from pkg.api.localready import LocalReady, Publisher\n"
        "p = Publisher(sys.argv[1]); assert p.acquire()\n"
        "p.publish(LocalReady('uid-1', 'node-a', '10.0.0.1'))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=root, check=False)
    assert done.returncode == -9
    assert (tmp_path / FILE_NAME).exists()
    assert localready.read(tmp_path) is None


def test_a_second_writer_cannot_take_the_lock_and_a_new_one_withdraws_the_old_record(
    tmp_path: Path,
) -> None:
    first = Publisher(tmp_path)
    assert first.acquire()
    first.publish(REC)
    second = Publisher(tmp_path)
    assert not second.acquire(attempts=2, pause=0.0)
    assert not second.publish(REC)
    assert localready.read(tmp_path) == REC  # the first one still stands behind it
    first.abandon()  # gone without withdrawing
    assert localready.read(tmp_path) is None
    assert second.acquire(attempts=1)
    assert not (tmp_path / FILE_NAME).exists()  # withdrawn before anything else


def test_malformed_or_not_ready_records_are_ignored(tmp_path: Path) -> None:
    pub = Publisher(tmp_path)
    assert pub.acquire()
    for raw in (
        "",
        "{",
        "[]",
        '{"status": "NotReady", "domainUID": "u", "nodeName": "n", "ipAddress": "i"}',
        '{"status": "Ready", "domainUID": 1, "nodeName": "n", "ipAddress": "i"}',
    ):
        (tmp_path / FILE_NAME).write_text(raw)
        assert localready.read(tmp_path) is None, raw
    assert (tmp_path / LOCK_NAME).exists()


def test_a_record_speaks_only_for_its_own_domain_node_and_ip() -> None:
    assert REC.speaks_for("uid-1", "node-a", "10.0.0.1")
    assert not REC.speaks_for("uid-2", "node-a", "10.0.0.1")
    assert not REC.speaks_for("uid-1", "node-b", "10.0.0.1")
    assert not REC.speaks_for("uid-1", "node-a", "10.0.0.2")
    assert not REC.speaks_for("uid-1", "node-a", None)
    assert not LocalReady("uid-1", "node-a", "").speaks_for("uid-1", "node-a", "")


# -- a hostile daemon's files ---------------------------------------------------------


def _reader(directory: Path) -> tuple[list[tuple[Path, OSError]], Callable[[], object]]:
    """``read`` with an ``on_unsafe`` that records; the read runs in a thread only as a safety
    net: if it blocks (a FIFO opened for reading), the test fails instead of hanging."""
    seen: list[tuple[Path, OSError]] = []

    def call() -> object:
        out: list[object] = []
        t = threading.Thread(
            target=lambda: out.append(
                localready.read(directory, on_unsafe=lambda p, e: seen.append((p, e)))
            ),
            daemon=True,
        )
        t.start()
        t.join(5)
        if t.is_alive():
            for fifo in directory.glob("*"):
                if stat.S_ISFIFO(fifo.lstat().st_mode):
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            pytest.fail("reading the record blocked")
        return out[0]

    return seen, call


def _live_daemon(directory: Path) -> Publisher:
    pub = Publisher(directory)
    assert pub.acquire()
    return pub


def test_a_symlinked_record_is_not_followed(tmp_path: Path) -> None:
    """A record elsewhere (another domain's, or any host file) never counts through a link."""
    other = _live_daemon(tmp_path / "other")
    other.publish(REC)
    mine = _live_daemon(tmp_path / "d")
    (tmp_path / "d" / FILE_NAME).symlink_to(tmp_path / "other" / FILE_NAME)
    seen, call = _reader(tmp_path / "d")
    assert call() is None
    [(path, err)] = seen
    assert path == tmp_path / "d" / FILE_NAME and isinstance(err, UnsafeFileError)
    assert err.kind == "a symlink"
    mine.release()
    other.release()


def test_a_fifo_record_returns_at_once(tmp_path: Path) -> None:
    pub = _live_daemon(tmp_path)
    os.mkfifo(tmp_path / FILE_NAME)  # no writer: a plain read would hang the plugin
    seen, call = _reader(tmp_path)
    assert call() is None
    assert [e.kind for _, e in seen if isinstance(e, UnsafeFileError)] == ["not a regular file"]
    pub.abandon()


def test_a_directory_or_oversized_record_does_not_count(tmp_path: Path) -> None:
    pub = _live_daemon(tmp_path)
    (tmp_path / FILE_NAME).mkdir()
    seen, call = _reader(tmp_path)
    assert call() is None
    assert isinstance(seen[-1][1], UnsafeFileError) and seen[-1][1].kind == "not a regular file"
    (tmp_path / FILE_NAME).rmdir()
    body = json.dumps(
        {"domainUID": "uid-1", "nodeName": "node-a", "ipAddress": "10.0.0.1", "status": "Ready"}
    )
    (tmp_path / FILE_NAME).write_text(body + " " * (MAX_RECORD_BYTES - len(body) + 1))
    assert call() is None
    assert isinstance(seen[-1][1], UnsafeFileError) and seen[-1][1].kind == "too large"
    (tmp_path / FILE_NAME).write_text(body + " " * (MAX_RECORD_BYTES - len(body)))
    assert call() == REC  # exactly the cap is still a record
    # Nested too deep for the JSON parser: malformed, not a crash of the plugin's Prepare.
    (tmp_path / FILE_NAME).write_text("[" * (MAX_RECORD_BYTES - 1))
    assert call() is None
    pub.release()


def test_a_symlinked_lock_or_directory_does_not_count(tmp_path: Path) -> None:
    """The record's writer must hold *this* directory's lock: a link to a live daemon's lock
    elsewhere proves nothing; a linked domain directory is not read at all."""
    other = _live_daemon(tmp_path / "other")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / LOCK_NAME).symlink_to(tmp_path / "other" / LOCK_NAME)
    (tmp_path / "d" / FILE_NAME).write_text(
        json.dumps(
            {"domainUID": "uid-1", "nodeName": "node-a", "ipAddress": "10.0.0.1", "status": "Ready"}
        )
    )
    seen, call = _reader(tmp_path / "d")
    assert call() is None
    assert [(p.name, e.kind) for p, e in seen if isinstance(e, UnsafeFileError)] == [
        (LOCK_NAME, "a symlink")
    ]
    other.publish(REC)
    (tmp_path / "link").symlink_to(tmp_path / "other")
    seen, call = _reader(tmp_path / "link")
    assert call() is None
    assert [(p.name, e.kind) for p, e in seen if isinstance(e, UnsafeFileError)] == [
        ("link", "a symlink")
    ]
    assert localready.read(tmp_path / "other") == REC  # the real one, read directly, counts
    other.release()
