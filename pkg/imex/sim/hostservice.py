"""Simulated host ``nvidia-imex.service``: ``python -m pkg.imex.sim.hostservice -c <config.cfg>
[--root <driver root>]``.

The stand-in for what an administrator runs on every node in host-managed IMEX mode: the
node's own IMEX service, outside Kubernetes, reachable on the control socket its
``/etc/nvidia-imex/config.cfg`` names. What it does, so host-managed tests fail the way a badly
set up host would:

- reads ``config.cfg`` (:func:`pkg.imex.config.read_config`); ``IMEX_CMD_ENABLED`` must be ``1``
  and ``IMEX_CMD_UNIX_DOMAIN_PATH`` set, or it exits 1 (no control socket: nothing could ask);
- the socket path is the one ``nvidia-imex-ctl --u=<path>`` uses inside the driver root, so it
  is bound at ``<root>/<path>`` (``--root``, default ``/``: a host install); a stale socket file
  from an earlier run is replaced, any other file there is an error (exit 1);
- answers the command protocol of :mod:`pkg.imex.sim.wire` on it: ``READY?`` gets ``READY``
  or, while the hold file (``hold-not-ready`` next to ``config.cfg``, checked on each query)
  exists, ``UNAVAILABLE``. The not-ready answer must not contain ``READY``: the plugin's check,
  like upstream's, only looks for that substring in the ctl's output;
- SIGTERM/SIGINT exit 0 and remove the socket. Unlike the per-domain simulator
  (:mod:`pkg.imex.sim.imexd`) it does not follow its parent: a host service outlives whoever
  started it, so the caller stops it.

It keeps no peers: in host-managed mode the administrator owns domain membership and the driver
never asks about it.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import stat
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Final

from pkg.imex.config import ImexConfigError, read_config
from pkg.imex.sim import wire

HOLD_FILE: Final = "hold-not-ready"
NOT_READY_ANSWER: Final = "UNAVAILABLE"


class HostServiceError(Exception):
    """A host configuration the simulated service cannot serve; it exits 1 with this text."""


def socket_path(config_path: Path, *, root: Path) -> Path:
    """Where the control socket of ``config_path`` lives on this machine (under ``root``)."""
    try:
        cfg = read_config(config_path)
    except (OSError, ImexConfigError) as err:
        raise HostServiceError(f"cannot read config {config_path}: {err}") from err
    if cfg.get("IMEX_CMD_ENABLED", "0") != "1":
        raise HostServiceError("IMEX_CMD_ENABLED is not 1: no control socket to serve")
    path = cfg.get("IMEX_CMD_UNIX_DOMAIN_PATH", "")
    if not path.startswith("/"):
        raise HostServiceError(f"IMEX_CMD_UNIX_DOMAIN_PATH={path!r} is not an absolute path")
    return root / path.lstrip("/")


def _bind(path: Path) -> socket.socket:
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            path.unlink()  # a stale socket of an earlier run
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
    except OSError as err:
        sock.close()
        raise HostServiceError(f"cannot bind {path}: {err}") from err
    sock.listen(16)
    return sock


def _answer(conn: socket.socket, hold_file: Path) -> None:
    with conn:
        conn.settimeout(2.0)
        try:
            cmd = wire.recv_line(conn).strip()
            if cmd == wire.CMD_READY:
                wire.send_line(conn, NOT_READY_ANSWER if hold_file.exists() else "READY")
            else:
                wire.send_line(conn, f"ERROR unknown command {cmd!r}")
        except OSError:
            return


def serve(config_path: Path, *, root: Path, stop: threading.Event) -> int:
    """Serve until ``stop`` is set; returns 0 (1 for a :class:`HostServiceError`, logged)."""
    try:
        path = socket_path(config_path, root=root)
        sock = _bind(path)
    except HostServiceError as err:
        sys.stderr.write(f"imex-host-sim: fatal: {err}\n")
        return 1
    hold = config_path.parent / HOLD_FILE
    sys.stderr.write(f"imex-host-sim: serving {path} (hold file {hold})\n")
    sys.stderr.flush()
    sock.settimeout(0.2)
    try:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            threading.Thread(target=_answer, args=(conn, hold), daemon=True).start()
        return 0
    finally:
        sock.close()
        path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nvidia-imex.service (simulated)")
    parser.add_argument("-c", "--config", required=True, type=Path, help="path of config.cfg")
    parser.add_argument("--root", type=Path, default=Path("/"), help="driver root (default /)")
    args = parser.parse_args(argv)
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    return serve(args.config, root=args.root, stop=stop)


if __name__ == "__main__":
    sys.exit(main())
