"""Hosts-file rewriting keeps foreign lines; only our marker block changes."""

from __future__ import annotations

import errno
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pkg.imex import hosts
from pkg.imex.hosts import BEGIN_MARKER, END_MARKER, HostsFile

PREFIX = "compute-domain-daemon-"
KUBELET = (
    "# Kubernetes-managed hosts file.\n"
    "127.0.0.1\tlocalhost\n"
    "::1\tlocalhost ip6-localhost ip6-loopback\n"
    "10.244.1.5\tmy-pod\n"
)


def test_block_is_added_replaced_and_removed(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text(KUBELET)
    f = HostsFile(path, name_prefix=PREFIX)
    assert f.update({f"{PREFIX}x-0001": "10.0.0.2", f"{PREFIX}x-0000": "10.0.0.1"})
    text = path.read_text()
    assert text.startswith(KUBELET)
    assert text[len(KUBELET) :] == (
        f"{BEGIN_MARKER}\n10.0.0.1\t{PREFIX}x-0000\n10.0.0.2\t{PREFIX}x-0001\n{END_MARKER}\n"
    )
    assert not f.update({f"{PREFIX}x-0000": "10.0.0.1", f"{PREFIX}x-0001": "10.0.0.2"})
    assert f.update({f"{PREFIX}x-0000": "10.0.0.9"})
    assert hosts.resolve(path.read_text(), f"{PREFIX}x-0000") == "10.0.0.9"
    assert hosts.resolve(path.read_text(), f"{PREFIX}x-0001") is None
    assert f.update({})
    assert path.read_text() == KUBELET


def test_foreign_lines_after_block_survive(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    f = HostsFile(path, name_prefix=PREFIX)
    f.update({f"{PREFIX}a-0000": "10.0.0.1"})
    with path.open("a") as out:
        out.write("192.168.0.1\tadded-by-someone-else\n")
    f.update({f"{PREFIX}a-0000": "10.0.0.2"})
    text = path.read_text()
    assert "192.168.0.1\tadded-by-someone-else" in text
    assert text.count(BEGIN_MARKER) == 1


def test_legacy_unmarked_lines_are_dropped() -> None:
    legacy = KUBELET + "# Compute Domain Daemon mappings\n10.0.0.1\tcompute-domain-daemon-0000\n"
    out = hosts.render_hosts(legacy, {f"{PREFIX}h-0000": "10.0.0.5"}, name_prefix=PREFIX)
    assert "compute-domain-daemon-0000" not in out
    assert out.startswith(KUBELET)


def test_missing_file_is_created(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    assert HostsFile(path, name_prefix=PREFIX).update({f"{PREFIX}a-0000": "10.0.0.1"})
    assert hosts.resolve(path.read_text(), f"{PREFIX}a-0000") == "10.0.0.1"


def test_bind_mounted_file_is_rewritten_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "hosts"
    path.write_text(KUBELET)
    inode = path.stat().st_ino

    def busy(*_args: object, **_kw: object) -> bool:
        raise OSError(errno.EBUSY, "Device or resource busy")

    monkeypatch.setattr(hosts, "write_file_atomically", busy)
    assert HostsFile(path, name_prefix=PREFIX).update({f"{PREFIX}a-0000": "10.0.0.1"})
    assert path.stat().st_ino == inode
    assert path.read_text().startswith(KUBELET)


def test_read_only_root_filesystem_rewrites_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon pod's ``readOnlyRootFilesystem``: no temp file can be created next to the
    kubelet's ``/etc/hosts`` (EROFS from the real atomic write's ``mkstemp``), yet the bind-mounted
    file itself is writable, so the block is written in place."""
    path = tmp_path / "hosts"
    path.write_text(KUBELET)
    inode = path.stat().st_ino

    def read_only(*_args: object, **_kw: object) -> tuple[int, str]:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)  # what pkg.base.files uses
    assert HostsFile(path, name_prefix=PREFIX).update({f"{PREFIX}a-0000": "10.0.0.1"})
    assert path.stat().st_ino == inode
    assert hosts.resolve(path.read_text(), f"{PREFIX}a-0000") == "10.0.0.1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hosts"]


def test_resolve_first_match_and_comments() -> None:
    text = "# 1.1.1.1 a\n10.0.0.1 a b # c\n10.0.0.2 a\n"
    assert hosts.resolve(text, "a") == "10.0.0.1"
    assert hosts.resolve(text, "b") == "10.0.0.1"
    assert hosts.resolve(text, "c") is None


_line = st.from_regex(r"[0-9a-z.:# \t-]{0,30}", fullmatch=True).filter(lambda s: PREFIX not in s)


@given(st.lists(_line, max_size=8), st.dictionaries(st.integers(0, 17), st.ip_addresses(v=4)))
def test_foreign_lines_always_preserved(lines: list[str], members: dict[int, object]) -> None:
    foreign = [ln for ln in lines if ln.strip() not in (BEGIN_MARKER, END_MARKER)]
    existing = "".join(f"{ln}\n" for ln in foreign)
    mapping = {f"{PREFIX}h-{i:04d}": str(ip) for i, ip in members.items()}
    once = hosts.render_hosts(existing, mapping, name_prefix=PREFIX)
    twice = hosts.render_hosts(once, mapping, name_prefix=PREFIX)
    assert once == twice
    kept = hosts.render_hosts(once, {}, name_prefix=PREFIX)
    assert kept.splitlines() == foreign
