"""Reading a file a less trusted process controls (`pkg.base.files.read_untrusted_file`).

The kubelet plugin (root, privileged) reads what an IMEX daemon leaves in its
``domains/<uid>`` directory. Whatever the daemon puts there - a symlink to a host file, a FIFO,
a directory, a device node, a huge file - is refused promptly with `UnsafeFileError`, never
followed, blocked on or read past the cap. Each case runs on both ways of opening: ``O_PATH``
plus a reopen through ``/proc/self/fd`` (Linux), and the portable ``lstat`` + ``O_NOFOLLOW``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pkg.base import files
from pkg.base.files import (
    UnsafeFileError,
    open_untrusted_dir,
    open_untrusted_file,
    read_untrusted_file,
)

CAP = 64


@pytest.fixture(params=["o_path", "portable"], autouse=True)
def opening(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "portable":
        monkeypatch.setattr(files, "_O_PATH", 0)
    else:
        assert files._O_PATH, "Linux has O_PATH"
    yield request.param


def promptly(fn: Callable[[], object], *, unblock: Path | None = None) -> object:
    """``fn()``'s result or raised exception, failing the test if it blocks. The thread and
    timeout are only a safety net: a call that blocks fails here (and ``unblock``, a FIFO, is
    opened for writing so the stuck reader is released before the next test)."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(fn())
        except BaseException as err:  # handed to the test
            outcome.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(5)
    if thread.is_alive():
        if unblock is not None:
            os.close(os.open(unblock, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(5)
        pytest.fail("the read blocked")
    [result] = outcome
    return result


def refused(fn: Callable[[], object], kind: str, *, unblock: Path | None = None) -> str:
    result = promptly(fn, unblock=unblock)
    assert isinstance(result, UnsafeFileError), result
    assert result.kind == kind
    return str(result)


def test_a_regular_file_is_read(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * CAP)
    assert read_untrusted_file(tmp_path / "f", max_bytes=CAP) == b"x" * CAP
    (tmp_path / "e").write_bytes(b"")
    assert read_untrusted_file(tmp_path / "e", max_bytes=CAP) == b""


def test_an_absent_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_untrusted_file(tmp_path / "nope", max_bytes=CAP)


def test_a_symlink_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "host-secret"
    secret.write_bytes(b"root:x:0:0")
    (tmp_path / "f").symlink_to(secret)
    msg = refused(lambda: read_untrusted_file(tmp_path / "f", max_bytes=CAP), "a symlink")
    assert str(tmp_path / "f") in msg and "root:x" not in msg
    # A dangling one, or one to a FIFO, is refused the same way (nothing is opened).
    (tmp_path / "d").symlink_to(tmp_path / "missing")
    refused(lambda: read_untrusted_file(tmp_path / "d", max_bytes=CAP), "a symlink")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "lf").symlink_to(tmp_path / "fifo")
    refused(
        lambda: read_untrusted_file(tmp_path / "lf", max_bytes=CAP),
        "a symlink",
        unblock=tmp_path / "fifo",
    )


def test_a_fifo_returns_at_once_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "f"
    os.mkfifo(fifo)  # no writer: a plain open() would wait forever
    msg = refused(
        lambda: read_untrusted_file(fifo, max_bytes=CAP), "not a regular file", unblock=fifo
    )
    assert "FIFO" in msg


def test_a_directory_or_a_device_is_refused(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    assert "directory" in refused(
        lambda: read_untrusted_file(tmp_path / "dir", max_bytes=CAP), "not a regular file"
    )
    assert "device" in refused(
        lambda: read_untrusted_file("/dev/zero", max_bytes=CAP), "not a regular file"
    )


def test_a_file_over_the_cap_is_refused_by_its_size(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * (CAP + 1))
    msg = refused(lambda: read_untrusted_file(tmp_path / "f", max_bytes=CAP), "too large")
    assert f"{CAP + 1} bytes" in msg


def test_no_more_than_the_cap_is_read_whatever_the_size_says() -> None:
    """procfs files say size 0 and hold more: the read itself stops past the cap."""
    assert os.stat("/proc/self/status").st_size == 0
    refused(lambda: read_untrusted_file("/proc/self/status", max_bytes=8), "too large")


def test_relative_to_a_directory_opened_without_following(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"ok")
    dir_fd = open_untrusted_dir(tmp_path / "d")
    try:
        assert read_untrusted_file("f", max_bytes=CAP, dir_fd=dir_fd) == b"ok"
        fd = open_untrusted_file("f", dir_fd=dir_fd)
        os.close(fd)
    finally:
        os.close(dir_fd)
    (tmp_path / "link").symlink_to(tmp_path / "d")
    refused(lambda: open_untrusted_dir(tmp_path / "link"), "a symlink")
    refused(lambda: open_untrusted_dir(tmp_path / "d" / "f"), "not a directory")
    with pytest.raises(FileNotFoundError):
        open_untrusted_dir(tmp_path / "missing")


def test_a_refusal_is_an_oserror() -> None:
    """Callers that treat "cannot read" as "not there" need no second except clause."""
    assert issubclass(UnsafeFileError, OSError)
