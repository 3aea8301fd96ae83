"""Simulated ``nvidia-imex``: ``python -m pkg.imex.sim.imexd -c <imexd.cfg>``.

What it really does, so a bad configuration fails tests the way it would fail real IMEX:

- reads ``imexd.cfg`` (:func:`pkg.imex.config.parse_config`) and the nodes config it names;
  a missing file or a bad port exits 1;
- binds ``BIND_INTERFACE_IP:SERVER_PORT`` and ``IMEX_CMD_BIND_INTERFACE_IP:IMEX_CMD_PORT``
  (an empty command address: the server's); an address not on this host or a port in use
  exits 1 with the OS error. An empty ``BIND_INTERFACE_IP`` is taken, as IMEX documents, from
  the nodes config: the first entry (an IP, or a name through the hosts file) that is an
  address of this host; none exits 1;
- resolves nodes-config names through a hosts file (env ``IMEX_HOSTS_FILE``, default
  ``/etc/hosts``) at start and on SIGUSR1 only -- like IMEX, a changed mapping is not seen
  without a reload. An unresolvable name is retried every round and shown as ``unresolvable``;
  a name resolving to :data:`pkg.imex.nodesconfig.SENTINEL_ADDRESS` is an ``empty`` slot;
- every ``IMEX_SIM_PROBE_INTERVAL`` seconds (default 0.5) says hello to every resolved peer with
  its domain identity (env ``IMEX_DOMAIN_ID``); a peer of another domain, or one that does not
  list us, refuses. The command port reports readiness (``READY`` once both ports listen and
  ``IMEX_SIM_READY_DELAY`` seconds passed; quorum is never awaited) and the status table;
- a *dropped* peer simulates a failed link: every address or nodes-config name listed (one per
  line, ``#`` comments) in the drop file -- env ``IMEX_SIM_DROP_FILE``, default ``drop-peers``
  next to the config file -- is neither probed nor accepted (re-read every round), so both ends
  see the connection ``DISCONNECTED`` in ``nvidia-imex-ctl -N -j``;
- a *held* IMEX is not ready: while the hold file exists -- env ``IMEX_SIM_HOLD_FILE``, default
  ``hold-not-ready`` next to the config file -- the command port answers ``NOT_READY`` (checked
  on every query), as a real IMEX does while it is still starting; tests keep a restarted
  daemon not Ready for as long as they need to observe that state;
- the command port's status is the node table in real ``nvidia-imex-ctl -N -j`` shape
  (:mod:`pkg.imex.ctl`): our own row has one connection per configured peer; the rows of peers
  carry only what we can see (``READY`` when connected). Simulator-only keys (``probes``,
  ``connected``, ``reloads``, ``probeRounds``, ...) are added at the top level;
- SIGTERM/SIGINT exit 0; it also exits when its parent dies, so a killed daemon never leaves an
  orphan holding the ports.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from pkg.imex import hosts, nodesconfig
from pkg.imex.config import (
    DEFAULT_CMD_PORT,
    DEFAULT_HOSTS_FILE,
    DEFAULT_SERVER_PORT,
    DOMAIN_ID_ENV,
    HOSTS_FILE_ENV,
    ImexConfigError,
    read_config,
)
from pkg.imex.sim import wire

_wake = threading.Event()
_flags = {"reload": False, "stop": False}


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    _flags["reload" if signum == signal.SIGUSR1 else "stop"] = True
    _wake.set()


def _install_signal_handlers() -> None:
    for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _on_signal)


# While this file exists next to the config file, the command port answers NOT_READY.
HOLD_FILE = "hold-not-ready"


class SimError(Exception):
    """A configuration problem that makes the simulated IMEX exit 1."""


def _log(prefix: str, msg: str) -> None:
    sys.stderr.write(f"imex-sim[{prefix}] {msg}\n")
    sys.stderr.flush()


@dataclass(frozen=True)
class Settings:
    bind_ip: str
    server_port: int
    cmd_ip: str
    cmd_port: int
    cmd_enabled: bool
    nodes_path: Path
    hosts_path: Path
    domain: str
    probe_interval: float
    ready_delay: float
    drop_file: Path
    hold_file: Path


def _port(cfg: dict[str, str], key: str, default: int) -> int:
    raw = cfg.get(key) or str(default)
    try:
        port = int(raw)
    except ValueError as err:
        raise SimError(f"{key}={raw!r} is not a number") from err
    if not 0 < port < 65536:
        raise SimError(f"{key}={port} is not a TCP port")
    return port


def load_settings(config_path: str, env: dict[str, str]) -> Settings:
    try:
        cfg = read_config(config_path)
    except (OSError, ImexConfigError) as err:
        raise SimError(f"cannot read config {config_path}: {err}") from err
    nodes = cfg.get("IMEX_NODE_CONFIG_FILE", "")
    if not nodes:
        raise SimError("IMEX_NODE_CONFIG_FILE is not set")
    hosts_path = Path(env.get(HOSTS_FILE_ENV) or DEFAULT_HOSTS_FILE)
    bind_ip = cfg.get("BIND_INTERFACE_IP", "") or local_node_address(Path(nodes), hosts_path)
    return Settings(
        bind_ip=bind_ip,
        server_port=_port(cfg, "SERVER_PORT", DEFAULT_SERVER_PORT),
        cmd_ip=cfg.get("IMEX_CMD_BIND_INTERFACE_IP") or bind_ip,
        cmd_port=_port(cfg, "IMEX_CMD_PORT", DEFAULT_CMD_PORT),
        cmd_enabled=cfg.get("IMEX_CMD_ENABLED", "1") == "1",
        nodes_path=Path(nodes),
        hosts_path=hosts_path,
        domain=env.get(DOMAIN_ID_ENV, ""),
        probe_interval=float(env.get("IMEX_SIM_PROBE_INTERVAL") or 0.5),
        ready_delay=float(env.get("IMEX_SIM_READY_DELAY") or 0),
        drop_file=Path(
            env.get("IMEX_SIM_DROP_FILE")
            or os.path.join(os.path.dirname(config_path), "drop-peers")
        ),
        hold_file=Path(
            env.get("IMEX_SIM_HOLD_FILE") or os.path.join(os.path.dirname(config_path), HOLD_FILE)
        ),
    )


def _family(ip: str) -> socket.AddressFamily:
    """The socket family of IP literal ``ip``; ValueError if it is not one."""
    return socket.AF_INET6 if ipaddress.ip_address(ip).version == 6 else socket.AF_INET


def _is_local(address: str) -> bool:
    """Whether ``address`` is one of this host's (network namespace's): it can be bound."""
    try:
        family = _family(address)
    except ValueError:
        return False
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((address, 0))
        except OSError:
            return False
    return True


def _read_hosts(path: Path) -> str:
    """The hosts file's text; empty when it cannot be read (every name is then unresolved)."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""


def _resolve(hosts_text: str, entry: str) -> str | None:
    """A nodes-config entry's address: an IP literal as it is, a name through ``hosts_text``."""
    try:
        ipaddress.ip_address(entry)
    except ValueError:
        return hosts.resolve(hosts_text, entry)
    return entry


def local_node_address(
    nodes_path: Path, hosts_path: Path, *, is_local: Callable[[str], bool] = _is_local
) -> str:
    """The bind address of an empty ``BIND_INTERFACE_IP``: the first nodes-config entry (an IP
    literal, or a name resolved through ``hosts_path``) that ``is_local``; `SimError` if the
    nodes config cannot be read or no entry is local (the IMEX guide's rule)."""
    try:
        entries = nodesconfig.parse_nodes_config(nodes_path.read_text(encoding="utf-8"))
    except OSError as err:
        raise SimError(f"cannot read nodes config {nodes_path}: {err}") from err
    text = _read_hosts(hosts_path)
    for entry in entries:
        address = _resolve(text, entry)
        if address and address != nodesconfig.SENTINEL_ADDRESS and is_local(address):
            return address
    raise SimError(
        f"BIND_INTERFACE_IP is empty and no entry of the nodes config {nodes_path} is an "
        "address of this host: nothing to bind"
    )


def _listen(ip: str, port: int, what: str) -> socket.socket:
    try:
        family = _family(ip)
    except ValueError as err:
        raise SimError(f"cannot bind {what}: {ip!r} is not an IP address") from err
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((ip, port))
        sock.listen(64)
    except OSError as err:
        sock.close()
        raise SimError(f"cannot bind {what} to {ip}:{port}: {err.strerror or err}") from err
    return sock


class Node:
    """State of one simulated IMEX daemon; all mutable fields guarded by ``_lock``."""

    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self._lock = threading.Lock()
        self._entries: list[str] = []
        self._resolved: dict[str, str | None] = {}
        self._states: dict[int, dict[str, Any]] = {}
        self._inbound: dict[str, float] = {}
        self._ever_connected: set[str] = set()
        self._started = time.monotonic()
        self.reloads = 0
        self.probe_rounds = 0  # completed probe_all passes (tests wait for rounds, not time)
        self.listening = False

    def load_nodes(self) -> None:
        """(Re)read the nodes config and re-resolve every name: start and SIGUSR1."""
        try:
            text = self.s.nodes_path.read_text(encoding="utf-8")
        except OSError as err:
            raise SimError(f"cannot read nodes config {self.s.nodes_path}: {err}") from err
        entries = nodesconfig.parse_nodes_config(text)
        with self._lock:
            self._entries = entries
            self._resolved = {}
            self._states = {}
        self._resolve_missing()

    def _resolve_missing(self) -> None:
        text = _read_hosts(self.s.hosts_path)
        with self._lock:
            for entry in self._entries:
                if self._resolved.get(entry) is None:
                    self._resolved[entry] = _resolve(text, entry)

    def peer_addresses(self) -> set[str]:
        with self._lock:
            return {
                a
                for a in self._resolved.values()
                if a and a not in (nodesconfig.SENTINEL_ADDRESS, self.s.bind_ip)
            }

    def ready(self) -> bool:
        if not self.listening or time.monotonic() - self._started < self.s.ready_delay:
            return False
        return not self.s.hold_file.exists()

    def dropped(self) -> set[str]:
        """Addresses and names listed in the drop file (empty when there is none)."""
        try:
            text = self.s.drop_file.read_text(encoding="utf-8")
        except OSError:
            return set()
        lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
        return {line for line in lines if line}

    def probe_all(self, pool: ThreadPoolExecutor) -> None:
        self._resolve_missing()
        drop = self.dropped()
        with self._lock:
            targets = [(i, e, self._resolved.get(e)) for i, e in enumerate(self._entries)]
        results = pool.map(lambda t: (t[0], self._probe(t[1], t[2], drop)), targets)
        states = dict(results)
        with self._lock:
            self._states = states
            self.probe_rounds += 1
            self._ever_connected |= {
                str(st["address"]) for st in states.values() if st["state"] == "connected"
            }

    def _probe(self, entry: str, address: str | None, drop: set[str]) -> dict[str, Any]:
        state: dict[str, Any] = {"entry": entry, "address": address}
        if address is not None and address != self.s.bind_ip and (drop & {entry, address}):
            return {**state, "state": "dropped", "error": "link dropped (drop file)"}
        if address is None:
            return {**state, "state": "unresolvable"}
        if address == nodesconfig.SENTINEL_ADDRESS:
            return {**state, "state": "empty"}
        if address == self.s.bind_ip:
            return {**state, "state": "self"}
        try:
            with socket.create_connection((address, self.s.server_port), timeout=1.0) as sock:
                sock.settimeout(2.0)
                hello = {"domain": self.s.domain, "address": self.s.bind_ip}
                wire.send_line(sock, wire.encode(wire.HELLO, hello))
                verb, payload = wire.decode(wire.recv_line(sock))
        except (OSError, ValueError) as err:
            return {**state, "state": "unreachable", "error": str(err)}
        if verb == wire.WELCOME:
            return {**state, "state": "connected"}
        return {**state, "state": "refused", "error": payload.get("reason", "")}

    def handle_peer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(2.0)
            try:
                verb, payload = wire.decode(wire.recv_line(conn))
                if verb != wire.HELLO:
                    wire.send_line(conn, f"{wire.REFUSE} protocol: expected HELLO")
                    return
                domain, address = payload.get("domain"), payload.get("address")
                if domain != self.s.domain:
                    wire.send_line(conn, f"{wire.REFUSE} domain mismatch: {domain!r}")
                    return
                if address not in self.peer_addresses():
                    wire.send_line(conn, f"{wire.REFUSE} unknown node {address}")
                    return
                if str(address) in self.dropped() or self._entry_of(str(address)) in self.dropped():
                    wire.send_line(conn, f"{wire.REFUSE} link dropped (drop file)")
                    return
                with self._lock:
                    self._inbound[str(address)] = time.time()
                reply = {"domain": self.s.domain, "address": self.s.bind_ip}
                wire.send_line(conn, wire.encode(wire.WELCOME, reply))
            except (OSError, ValueError):
                return

    def _entry_of(self, address: str) -> str | None:
        with self._lock:
            return next((e for e, a in self._resolved.items() if a == address), None)

    def _connection_state(self, probe: dict[str, Any]) -> str:
        state = probe["state"]
        if state in ("connected", "self"):
            return "CONNECTED"
        if state in ("unreachable", "dropped", "refused"):
            return (
                "DISCONNECTED"
                if probe.get("address") in self._ever_connected
                else ("NEVER_CONNECTED")
            )
        return "INVALID"  # pending, unresolvable

    def status(self) -> dict[str, Any]:
        """``nvidia-imex-ctl -N -j`` output plus the simulator's own keys (module docstring)."""
        with self._lock:
            probes = [
                {"index": i, **self._states.get(i, {"entry": e, "state": "pending"})}
                for i, e in enumerate(self._entries)
            ]
            members = [p for p in probes if p["state"] != "empty"]
            connections = {
                str(p["index"]): {
                    "host": p.get("address") or "N/A",
                    "status": self._connection_state(p),
                    "changed": False,
                }
                for p in members
            }
        rows: dict[str, Any] = {}
        for p in members:
            own = p["state"] == "self"
            up = self.ready() if own else p["state"] == "connected"
            rows[str(p["index"])] = {
                "host": p.get("address") or "N/A",
                "hostName": p["entry"],
                "status": "READY" if up else "UNAVAILABLE",
                "connections": connections if own else {},
            }
        peers = [c for c in connections.values() if c["host"] != self.s.bind_ip]
        good = sum(1 for c in peers if c["status"] == "CONNECTED")
        domain_state = "UP" if good == len(peers) else ("DEGRADED" if good else "DOWN")
        return {
            "status": domain_state if self.ready() else "DOWN",
            "timestamp": time.strftime("%m/%d/%Y %H:%M:%S"),
            "nodes": rows,
            "domain": self.s.domain,
            "address": self.s.bind_ip,
            "port": self.s.server_port,
            "ready": self.ready(),
            "reloads": self.reloads,
            "probeRounds": self.probe_rounds,
            "probes": probes,
            "connected": sorted(p["address"] for p in probes if p["state"] == "connected"),
        }

    def handle_cmd(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(2.0)
            try:
                cmd = wire.recv_line(conn).strip()
                if cmd == wire.CMD_READY:
                    wire.send_line(conn, "READY" if self.ready() else "NOT_READY")
                elif cmd == wire.CMD_STATUS:
                    wire.send_line(conn, json.dumps(self.status(), sort_keys=True))
                else:
                    wire.send_line(conn, f"ERROR unknown command {cmd!r}")
            except OSError:
                return


def _serve(sock: socket.socket, handler: Any) -> None:
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        threading.Thread(target=handler, args=(conn,), daemon=True).start()


def run(config_path: str, env: dict[str, str]) -> int:
    settings = load_settings(config_path, env)
    tag = f"{settings.bind_ip}:{settings.server_port}"
    node = Node(settings)
    node.load_nodes()
    server = _listen(settings.bind_ip, settings.server_port, "IMEX server")
    cmd = None
    try:
        if settings.cmd_enabled:
            cmd = _listen(settings.cmd_ip, settings.cmd_port, "IMEX command service")
            threading.Thread(target=_serve, args=(cmd, node.handle_cmd), daemon=True).start()
        threading.Thread(target=_serve, args=(server, node.handle_peer), daemon=True).start()
        node.listening = True
        _log(
            tag,
            f"listening at {time.time():.3f}; domain={settings.domain!r} "
            f"nodes={settings.nodes_path} "
            f"hosts={settings.hosts_path} cmd={settings.cmd_ip}:{settings.cmd_port}",
        )
        parent = os.getppid()
        with ThreadPoolExecutor(max_workers=8) as pool:
            while not _flags["stop"]:
                if _flags["reload"]:
                    _flags["reload"] = False
                    node.reloads += 1
                    node.load_nodes()
                    _log(tag, f"SIGUSR1: reloaded nodes config (reloads={node.reloads})")
                node.probe_all(pool)
                if os.getppid() != parent:
                    _log(tag, "parent process exited; shutting down")
                    break
                _wake.wait(settings.probe_interval)
                _wake.clear()
        _log(tag, "shutting down")
        return 0
    finally:
        server.close()
        if cmd is not None:
            cmd.close()


def main(argv: list[str] | None = None) -> int:
    _install_signal_handlers()
    parser = argparse.ArgumentParser(prog="nvidia-imex (simulated)")
    parser.add_argument("-c", "--config", required=True, help="path of imexd.cfg")
    args = parser.parse_args(argv)
    try:
        return run(args.config, dict(os.environ))
    except SimError as err:
        _log("config", f"fatal: {err}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
