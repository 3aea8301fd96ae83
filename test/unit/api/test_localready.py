"""The node-local readiness record: its format, and that only a live writer's record counts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pkg.api import localready
from pkg.api.localready import FILE_NAME, LOCK_NAME, LocalReady, Publisher

REC = LocalReady("uid-1", "node-a", "10.0.0.1")


def test_a_published_record_reads_back_while_its_writer_holds_the_lock(tmp_path: Path) -> None:
    pub = Publisher(tmp_path / "d")
    assert localready.read(tmp_path / "d") is None  # no directory yet
    assert pub.acquire()
    assert pub.publish(REC)
    assert json.loads((tmp_path / "d" / FILE_NAME).read_text()) == {
        "domainUID": "uid-1", "nodeName": "node-a", "ipAddress": "10.0.0.1", "status": "Ready",
    }  # fmt: skip
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
    for raw in ("", "{", "[]", '{"status": "NotReady", "domainUID": "u", "nodeName": "n", '
                '"ipAddress": "i"}', '{"status": "Ready", "domainUID": 1, "nodeName": "n", '
                '"ipAddress": "i"}'):  # fmt: skip
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
