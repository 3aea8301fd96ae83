"""Queries against a local IMEX through ``nvidia-imex-ctl``.

Owns the readiness contract used by the daemon's ``check`` probe and its own readiness poller:
``nvidia-imex-ctl -c <imexd.cfg> -q`` must exit 0 **and** print exactly ``READY`` followed by one
newline. Anything else (other text, a non-zero exit, a timeout, a missing binary) is "not ready".
Readiness is local: it says this node's IMEX serves, not that the whole domain is connected
(``IMEX_WAIT_FOR_QUORUM=RECOVERY``).

Peer connectivity: ``nvidia-imex-ctl -c <imexd.cfg> -N -j`` prints the domain's node table as
JSON, in the shape real IMEX prints it::

    {"status": "UP", "timestamp": "...",
     "nodes": {"0": {"host": "10.0.0.1", "hostName": "...", "status": "READY",
                     "connections": {"0": {"host": "10.0.0.1", "status": "CONNECTED", ...},
                                     "1": {"host": "10.0.0.2", "status": "CONNECTED", ...}}},
               "1": {...}}}

:func:`peer_connections` takes this node's row (its ``host`` is our bind address) and returns
the connection state to each peer address; only ``CONNECTED`` means the peer is reachable
(other states: ``NEVER_CONNECTED``, ``RECOVERING``, ``DISCONNECTED``, ``AUTHENTICATING``,
``INVALID``, version or node-map mismatch). The simulator (:mod:`pkg.imex.sim.ctl`) prints the
same shape.

The command is run through an injected :class:`CommandRunner` so tests need no binary.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

READY_OUTPUT: Final = "READY\n"
CONNECTED: Final = "CONNECTED"


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    output: str  # stdout and stderr combined, as upstream compares them


class CommandRunner(Protocol):
    def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        """Run to completion; raises OSError or :class:`subprocess.TimeoutExpired`."""


class SubprocessCommandRunner:
    def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        done = subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
        return CommandResult(done.returncode, done.stdout.decode(errors="replace"))


@dataclass(frozen=True)
class ReadinessResult:
    ready: bool
    detail: str  # what the ctl said, for logs and the `check` failure message


class ImexCtl:
    """``nvidia-imex-ctl`` bound to one config file."""

    def __init__(
        self,
        ctl_argv: Sequence[str],
        *,
        config_path: str,
        runner: CommandRunner,
        timeout: float = 10.0,
    ) -> None:
        self._argv = list(ctl_argv)
        self._config_path = config_path
        self._runner = runner
        self._timeout = timeout

    def query_ready(self) -> ReadinessResult:
        """``-q``: ready only for exit 0 with output exactly ``READY\\n``."""
        try:
            result = self._runner.run(
                [*self._argv, "-c", self._config_path, "-q"], timeout=self._timeout
            )
        except subprocess.TimeoutExpired:
            return ReadinessResult(False, f"no answer within {self._timeout:.0f}s")
        except OSError as err:
            return ReadinessResult(False, f"cannot run {self._argv[0]}: {err}")
        if result.returncode == 0 and result.output == READY_OUTPUT:
            return ReadinessResult(True, "READY")
        return ReadinessResult(
            False, f"exit code {result.returncode}, output {result.output.strip()!r}"
        )

    def node_status(self) -> dict[str, Any]:
        """``-N -j``: the per-node connection table as JSON (raises on any failure)."""
        result = self._runner.run(
            [*self._argv, "-c", self._config_path, "-N", "-j"], timeout=self._timeout
        )
        if result.returncode != 0:
            raise RuntimeError(f"nvidia-imex-ctl -N failed ({result.returncode}): {result.output}")
        status: dict[str, Any] = json.loads(result.output)
        return status


def peer_connections(status: object, *, own_address: str) -> dict[str, str]:
    """Connection state (``CONNECTED``, ``DISCONNECTED``, ...) from this node to each peer
    address, read from ``-N -j`` output ``status``; our own address is left out.

    Raises ``ValueError`` when the output is not the documented shape or has no row whose
    ``host`` is ``own_address`` (then nothing can be said about our connections).
    """
    if not isinstance(status, dict) or not isinstance(status.get("nodes"), dict):
        raise ValueError("nvidia-imex-ctl -N -j: no 'nodes' object")
    rows = [r for r in status["nodes"].values() if isinstance(r, dict)]
    own = next((r for r in rows if r.get("host") == own_address), None)
    if own is None:
        raise ValueError(f"nvidia-imex-ctl -N -j: no node with host {own_address}")
    connections = own.get("connections")
    if not isinstance(connections, dict):
        raise ValueError(f"nvidia-imex-ctl -N -j: node {own_address} has no 'connections'")
    out: dict[str, str] = {}
    for conn in connections.values():
        if not isinstance(conn, dict):
            continue
        host = conn.get("host")
        if isinstance(host, str) and host and host != own_address:
            out[host] = str(conn.get("status") or "INVALID")
    return out
