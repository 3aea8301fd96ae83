"""``localcluster.hostnet.foreign_arch`` notes the ``binfmt_misc`` mount it makes, not only the
handler, so the sweep after an interrupted run unmounts it too: once a run was SIGKILLed inside
the block (``test/e2e_nodes/test_host_sweep.py`` does so on purpose), the sweep unregistered
the handler but left ``/proc/sys/fs/binfmt_misc`` mounted on a host that had it unmounted.

``hostsys.binfmt`` is replaced by a fake host here (no root, no mount); the real mount and the
sweep are exercised by ``test_host_sweep``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostsys import binfmt
from localcluster import hostnet

HANDLER = "qemu-aarch64"


class FakeHost:
    """``binfmt_misc`` as ``hostsys.binfmt.foreign_arch`` would leave it."""

    def __init__(self, *, mounted: bool) -> None:
        self.is_mounted = mounted
        self.handlers: list[str] = []

    @contextlib.contextmanager
    def foreign_arch(self, arch: str, log: object = None) -> Iterator[None]:
        mounted_here = not self.is_mounted
        self.is_mounted = True
        self.handlers.append(HANDLER)
        try:
            yield
        finally:
            self.handlers.remove(HANDLER)
            if mounted_here:
                self.is_mounted = False


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeHost]:
    monkeypatch.setenv("CD_E2E_CACHE", str(tmp_path))
    fake = FakeHost(mounted=False)
    monkeypatch.setattr("hostsys.binfmt.foreign_arch", fake.foreign_arch)
    monkeypatch.setattr("hostsys.binfmt.mounted", lambda: fake.is_mounted)
    monkeypatch.setattr("hostsys.binfmt.state", lambda: sorted(fake.handlers))
    yield fake


def _binfmt_leftovers() -> list[str]:
    """What ``hostnet.leftovers`` says of binfmt (the rest is the real host's)."""
    return [x for x in hostnet.leftovers() if "binfmt" in x]


def _state() -> dict[str, object]:
    data: dict[str, object] = json.loads(hostnet.state_file().read_text())
    return data


def test_the_mount_is_noted_while_the_block_runs(host: FakeHost) -> None:
    hostnet.record_host_state()
    assert _state()["binfmt_misc_mounted"] is False
    block = hostnet.foreign_arch("arm64")
    block.__enter__()  # as a run that is killed inside the block: never exited
    assert _state()["binfmt_misc_mounted_here"] is True
    assert _state()["binfmt_registered"] == [HANDLER]
    leftovers = _binfmt_leftovers()
    assert f"binfmt handler {HANDLER}" in leftovers
    assert f"mount {binfmt.BINFMT_MISC}" in leftovers
    block.__exit__(None, None, None)
    assert "binfmt_misc_mounted_here" not in _state()
    assert _state()["binfmt_registered"] == []
    assert _binfmt_leftovers() == []


def test_a_mount_that_was_there_is_not_ours(host: FakeHost) -> None:
    host.is_mounted = True
    hostnet.record_host_state()
    with hostnet.foreign_arch("arm64"):
        assert "binfmt_misc_mounted_here" not in _state()
    assert _binfmt_leftovers() == []
    assert host.is_mounted
