"""Simulated ``nvidia-imex-ctl``: ``python -m pkg.imex.sim.ctl (-c <imexd.cfg> | --u=<socket>)
(-q | -N [-j])``.

Talks to the simulated IMEX's command port named in the config
(``IMEX_CMD_BIND_INTERFACE_IP:IMEX_CMD_PORT``):

- ``-q``: prints ``READY`` (exit 0) or ``NOT_READY`` (exit 0, like the real tool, so callers must
  compare the text); an unreachable daemon prints an error and exits 1;
- ``--u=<socket>``: ask over that Unix socket instead (the control socket a host's
  ``nvidia-imex.service`` serves, :mod:`pkg.imex.sim.hostservice`; host-managed mode);
- ``-N``: the per-node connection table; ``-j`` prints it as JSON in real ``nvidia-imex-ctl``
  shape (see :mod:`pkg.imex.ctl`), plus simulator keys (``connected`` lists the peer addresses
  this daemon currently holds a connection to, ``probes`` its per-entry probe results).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys

from pkg.imex.config import DEFAULT_CMD_PORT, ImexConfigError, read_config
from pkg.imex.sim import wire


def _request_unix(path: str, command: str) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5.0)
        sock.connect(path)
        wire.send_line(sock, command)
        return wire.recv_line(sock)


def _request(config_path: str, command: str) -> str:
    cfg = read_config(config_path)
    ip = cfg.get("IMEX_CMD_BIND_INTERFACE_IP") or cfg.get("BIND_INTERFACE_IP") or "127.0.0.1"
    port = int(cfg.get("IMEX_CMD_PORT") or DEFAULT_CMD_PORT)
    with socket.create_connection((ip, port), timeout=3.0) as sock:
        sock.settimeout(5.0)
        wire.send_line(sock, command)
        return wire.recv_line(sock)


def _table(status: dict[str, object]) -> str:
    rows = [f"IMEX domain {status.get('domain')!r} on {status.get('address')}"]
    nodes = status.get("probes")
    for node in nodes if isinstance(nodes, list) else []:
        rows.append(
            f"{node.get('index'):>4}  {node.get('entry', ''):<45} "
            f"{node.get('address') or '-':<16} {node.get('state')}"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nvidia-imex-ctl (simulated)")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("-c", "--config")
    target.add_argument("--u", dest="unix_socket", help="control Unix socket (host IMEX)")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("-q", action="store_true", help="query local readiness")
    mode.add_argument("-N", action="store_true", help="show node connection status")
    parser.add_argument("-j", action="store_true", help="JSON output (with -N)")
    args = parser.parse_args(argv)
    try:
        if args.q:
            ask = (
                _request_unix(args.unix_socket, wire.CMD_READY)
                if args.unix_socket
                else (_request(args.config, wire.CMD_READY))
            )
            sys.stdout.write(ask + "\n")
            return 0
        if args.unix_socket:
            parser.error("--u supports -q only")
        status = json.loads(_request(args.config, wire.CMD_STATUS))
    except (OSError, ImexConfigError, ValueError) as err:
        sys.stderr.write(f"IMEX daemon not reachable: {err}\n")
        return 1
    sys.stdout.write((json.dumps(status, sort_keys=True) if args.j else _table(status)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
