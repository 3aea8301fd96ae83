"""Readiness query: exit 0 and output exactly READY\\n, nothing else."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

import pytest

from pkg.imex.ctl import CommandResult, ImexCtl, peer_connections


class FakeCommands:
    def __init__(self, result: CommandResult | Exception) -> None:
        self.result = result
        self.argv: list[str] = []

    def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        self.argv = list(argv)
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


@pytest.mark.parametrize(
    ("result", "ready"),
    [
        (CommandResult(0, "READY\n"), True),
        (CommandResult(0, "READY"), False),
        (CommandResult(0, "NOT_READY\n"), False),
        (CommandResult(1, "READY\n"), False),
        (CommandResult(0, "READY\nwarning\n"), False),
        (FileNotFoundError(2, "nope"), False),
        (subprocess.TimeoutExpired("ctl", 10), False),
    ],
    ids=["ready", "no-newline", "not-ready", "bad-exit", "extra-output", "no-binary", "timeout"],
)
def test_query_ready(result: CommandResult | Exception, ready: bool) -> None:
    cmds = FakeCommands(result)
    ctl = ImexCtl(["nvidia-imex-ctl"], config_path="/imexd/imexd.cfg", runner=cmds)
    assert ctl.query_ready().ready is ready
    assert cmds.argv == ["nvidia-imex-ctl", "-c", "/imexd/imexd.cfg", "-q"]


def test_node_status_parses_json() -> None:
    cmds = FakeCommands(CommandResult(0, '{"connected": ["127.0.0.12"]}\n'))
    ctl = ImexCtl(["python", "-m", "x"], config_path="/c", runner=cmds)
    assert ctl.node_status() == {"connected": ["127.0.0.12"]}
    assert cmds.argv[-2:] == ["-N", "-j"]


REAL_SHAPE = {
    "status": "DEGRADED",
    "timestamp": "9/4/2026 00:00:00.000",
    "nodes": {
        "0": {
            "host": "10.0.0.1",
            "hostName": "a",
            "status": "READY",
            "connections": {
                "0": {"host": "10.0.0.1", "status": "CONNECTED", "changed": False},
                "1": {"host": "10.0.0.2", "status": "CONNECTED", "changed": False},
                "2": {"host": "10.0.0.3", "status": "DISCONNECTED", "changed": True},
            },
        },
        "1": {"host": "10.0.0.2", "status": "READY", "connections": {}},
    },
}


def test_peer_connections_reads_own_row() -> None:
    assert peer_connections(REAL_SHAPE, own_address="10.0.0.1") == {
        "10.0.0.2": "CONNECTED",
        "10.0.0.3": "DISCONNECTED",
    }
    assert peer_connections(REAL_SHAPE, own_address="10.0.0.2") == {}


@pytest.mark.parametrize(
    "bad", [[], None, {"nodes": []}, {"nodes": {"0": {"host": "10.0.0.9"}}}, {"nodes": {}}]
)
def test_peer_connections_rejects_other_shapes(bad: object) -> None:
    with pytest.raises(ValueError):
        peer_connections(bad, own_address="10.0.0.1")
