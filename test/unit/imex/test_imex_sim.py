"""The simulated IMEX as real processes: bind failures, handshake, domains, reload, readiness."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pkg.imex import nodesconfig as nc
from pkg.imex.config import ImexConfig
from pkg.imex.ctl import peer_connections
from pkg.imex.hosts import HostsFile
from pkg.imex.sim import imexd
from pkg.testing.eventually import eventually
from pkg.testing.fakedriverroot import FakeDriverRoot

REPO = Path(__file__).resolve().parents[3]


def free_port(ips: list[str]) -> int:
    """A port free on every address in ``ips`` (same port for all, like a real IMEX domain)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        ok = True
        for ip in ips:
            for p in (port, port + 1):
                with socket.socket() as t:
                    try:
                        t.bind((ip, p))
                    except OSError:
                        ok = False
        if ok and port < 65000:
            return port
    raise RuntimeError("no free port")


class SimNode:
    def __init__(self, tmp: Path, *, ip: str, port: int, domain: str, entries: list[str]) -> None:
        self.dir = tmp / ip
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cfg = self.dir / "imexd.cfg"
        self.nodes = self.dir / "nodes.cfg"
        self.hosts = HostsFile(self.dir / "hosts", name_prefix=nc.NAME_PREFIX)
        self.cfg.write_text(
            ImexConfig(
                bind_ip=ip, node_config_path=str(self.nodes), server_port=port, cmd_port=port + 1
            ).render()
        )
        self.nodes.write_text("".join(f"{e}\n" for e in entries))
        self.env = {
            **os.environ,
            "IMEX_HOSTS_FILE": str(self.hosts.path),
            "IMEX_DOMAIN_ID": domain,
            "IMEX_SIM_PROBE_INTERVAL": "0.05",
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> subprocess.Popen[bytes]:
        # nvidia-imex as a test driver root installs it (a zipapp run by this interpreter).
        root = FakeDriverRoot.create(self.dir / "driver-root", python=sys.executable)
        self.proc = subprocess.Popen(
            [str(root.binary("nvidia-imex")), "-c", str(self.cfg)],
            env=self.env,
            stderr=subprocess.PIPE,
        )
        return self.proc

    def ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pkg.imex.sim.ctl", "-c", str(self.cfg), *args],
            capture_output=True,
            text=True,
            cwd=REPO,
            check=False,
        )

    def status(self) -> dict[str, Any]:
        done = self.ctl("-N", "-j")
        if done.returncode != 0:
            return {}
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(10)
        if self.proc and self.proc.stderr:
            self.proc.stderr.close()


@pytest.fixture
def nodes() -> Iterator[list[SimNode]]:
    created: list[SimNode] = []
    yield created
    for n in created:
        n.stop()


def test_bad_bind_address_fails(tmp_path: Path, nodes: list[SimNode]) -> None:
    node = SimNode(tmp_path, ip="192.0.2.77", port=free_port(["127.0.0.1"]), domain="d", entries=[])
    nodes.append(node)
    proc = node.start()
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 1
    assert b"cannot bind IMEX server to 192.0.2.77" in err
    assert b"Cannot assign requested address" in err


def test_port_clash_fails(tmp_path: Path, nodes: list[SimNode]) -> None:
    port = free_port(["127.0.0.1"])
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen(1)
        node = SimNode(tmp_path, ip="127.0.0.1", port=port, domain="d", entries=[])
        nodes.append(node)
        proc = node.start()
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 1
    assert b"Address already in use" in err


def test_missing_nodes_config_fails(tmp_path: Path, nodes: list[SimNode]) -> None:
    node = SimNode(tmp_path, ip="127.0.0.1", port=free_port(["127.0.0.1"]), domain="d", entries=[])
    nodes.append(node)
    node.nodes.unlink()
    proc = node.start()
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 1
    assert b"cannot read nodes config" in err


def _upstream_shape(node: SimNode, cmd_ip: str) -> None:
    """Rewrite ``node``'s config as upstream's daemon writes it: ``BIND_INTERFACE_IP`` empty,
    the pod IP in ``IMEX_CMD_BIND_INTERFACE_IP``."""
    lines = [
        "BIND_INTERFACE_IP="
        if line.startswith("BIND_INTERFACE_IP=")
        else f"IMEX_CMD_BIND_INTERFACE_IP={cmd_ip}"
        if line.startswith("IMEX_CMD_BIND_INTERFACE_IP=")
        else line
        for line in node.cfg.read_text().splitlines()
    ]
    node.cfg.write_text("\n".join(lines) + "\n")


def test_empty_bind_address_comes_from_the_nodes_config(
    tmp_path: Path, nodes: list[SimNode]
) -> None:
    """IMEX's rule for an empty BIND_INTERFACE_IP: the first nodes-config entry (here a name,
    through the hosts file) that is an address of this host; entries before it that are not
    (a foreign IP, the empty-slot sentinel) are passed over."""
    ip, uid = "127.0.0.26", "uid-e"
    names = nc.node_names(uid, max_nodes=3)
    node = SimNode(
        tmp_path, ip=ip, port=free_port([ip]), domain=uid, entries=["192.0.2.77", *names]
    )
    nodes.append(node)
    node.hosts.update(nc.dns_mapping(uid, {2: ip}, max_nodes=3))  # slots 0, 1: the sentinel
    _upstream_shape(node, ip)
    node.start()
    eventually(lambda: node.ctl("-q").stdout == "READY\n")
    assert node.status()["address"] == ip


def test_empty_bind_address_without_a_local_entry_fails(
    tmp_path: Path, nodes: list[SimNode]
) -> None:
    ip = "127.0.0.27"
    node = SimNode(
        tmp_path, ip=ip, port=free_port([ip]), domain="d", entries=["192.0.2.77", "unmapped-name"]
    )
    nodes.append(node)
    _upstream_shape(node, ip)
    proc = node.start()
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 1
    assert b"BIND_INTERFACE_IP is empty and no entry of the nodes config" in err


def test_local_node_address_takes_the_first_local_entry(tmp_path: Path) -> None:
    nodes_cfg, hosts_file = tmp_path / "nodes.cfg", tmp_path / "hosts"
    nodes_cfg.write_text("# comment\n10.0.0.1\nnode-b\nnode-c\n")
    hosts_file.write_text("10.0.0.2 node-b\n10.0.0.3 node-c\n")
    local = {"10.0.0.2", "10.0.0.3"}
    assert imexd.local_node_address(nodes_cfg, hosts_file, is_local=local.__contains__) == (
        "10.0.0.2"
    )
    hosts_file.unlink()  # no hosts file: names resolve to nothing, IPs still count
    with pytest.raises(imexd.SimError, match="no entry of the nodes config"):
        imexd.local_node_address(nodes_cfg, hosts_file, is_local=local.__contains__)
    with pytest.raises(imexd.SimError, match="cannot read nodes config"):
        imexd.local_node_address(tmp_path / "absent", hosts_file, is_local=local.__contains__)


def test_ctl_without_daemon_is_not_ready(tmp_path: Path) -> None:
    node = SimNode(tmp_path, ip="127.0.0.1", port=free_port(["127.0.0.1"]), domain="d", entries=[])
    done = node.ctl("-q")
    assert done.returncode == 1 and done.stdout == ""


def test_domain_forms_refuses_strangers_and_reloads(tmp_path: Path, nodes: list[SimNode]) -> None:
    ips = ["127.0.0.21", "127.0.0.22", "127.0.0.23"]
    port = free_port(ips)
    uid_a, uid_b = "uid-a", "uid-b"
    names_a = nc.node_names(uid_a, max_nodes=4)
    names_b = nc.node_names(uid_b, max_nodes=4)
    a0 = SimNode(tmp_path, ip=ips[0], port=port, domain=uid_a, entries=names_a)
    a1 = SimNode(tmp_path, ip=ips[1], port=port, domain=uid_a, entries=names_a)
    # Domain B wrongly maps one of its names to a member of A: A must refuse it.
    b0 = SimNode(tmp_path, ip=ips[2], port=port, domain=uid_b, entries=names_b)
    nodes += [a0, a1, b0]
    members_a = {0: ips[0], 1: ips[1]}
    for n in (a0, a1):
        n.hosts.update(nc.dns_mapping(uid_a, members_a, max_nodes=4))
    b0.hosts.update(nc.dns_mapping(uid_b, {0: ips[2], 1: ips[0]}, max_nodes=4))
    for n in nodes:
        n.start()
    eventually(lambda: a0.ctl("-q").stdout == "READY\n")
    eventually(lambda: a0.status().get("connected") == [ips[1]])
    eventually(lambda: a1.status().get("connected") == [ips[0]])
    states = [n["state"] for n in a0.status()["probes"]]
    assert states == ["self", "connected", "empty", "empty"]
    eventually(lambda: b0.status()["probes"][1]["state"] == "refused")
    assert "domain mismatch" in b0.status()["probes"][1]["error"]
    assert b0.status()["connected"] == []

    # A new IP for slot 1 is only seen after SIGUSR1, like real IMEX.
    a0.hosts.update(nc.dns_mapping(uid_a, {0: ips[0], 1: "127.0.0.29"}, max_nodes=4))
    rounds = a0.status()["probeRounds"]
    eventually(lambda: a0.status()["probeRounds"] >= rounds + 2)  # probed twice since
    assert a0.status()["probes"][1]["address"] == ips[1]
    assert a0.proc is not None
    a0.proc.send_signal(signal.SIGUSR1)
    eventually(lambda: a0.status()["probes"][1]["address"] == "127.0.0.29")
    assert a0.status()["reloads"] == 1
    eventually(lambda: a0.status()["probes"][1]["state"] == "unreachable")


def test_unresolvable_name_is_reported_not_fatal(tmp_path: Path, nodes: list[SimNode]) -> None:
    ip = "127.0.0.24"
    node = SimNode(tmp_path, ip=ip, port=free_port([ip]), domain="d", entries=["ghost", ip])
    nodes.append(node)
    node.start()
    eventually(lambda: node.status().get("probes", [{}])[0].get("state") == "unresolvable")
    assert node.ctl("-q").stdout == "READY\n"
    assert node.proc is not None and node.proc.poll() is None


def test_hold_file_keeps_imex_not_ready_while_it_exists(
    tmp_path: Path, nodes: list[SimNode]
) -> None:
    ip = "127.0.0.25"
    node = SimNode(tmp_path, ip=ip, port=free_port([ip]), domain="d", entries=[ip])
    nodes.append(node)
    hold = node.dir / imexd.HOLD_FILE  # next to imexd.cfg, where the daemon's config dir is
    hold.write_text("")
    node.start()
    eventually(lambda: node.status().get("ready") is False)
    assert node.ctl("-q").stdout == "NOT_READY\n"
    assert node.status()["status"] == "DOWN"
    hold.unlink()
    eventually(lambda: node.ctl("-q").stdout == "READY\n")
    hold.write_text("")  # checked on every query, not only at start
    eventually(lambda: node.ctl("-q").stdout == "NOT_READY\n")


def test_node_status_has_real_shape_and_a_dropped_peer_disconnects_both_ends(
    tmp_path: Path, nodes: list[SimNode]
) -> None:
    ips = ["127.0.0.31", "127.0.0.32"]
    port = free_port(ips)
    a, b = (SimNode(tmp_path, ip=ip, port=port, domain="d", entries=ips) for ip in ips)
    nodes += [a, b]
    for n in nodes:
        n.start()

    def view(node: SimNode, me: str) -> dict[str, str]:
        try:  # before the first probe round the own row has no address yet
            return peer_connections(node.status(), own_address=me)
        except ValueError:
            return {}

    eventually(lambda: view(a, ips[0]) == {ips[1]: "CONNECTED"})
    eventually(lambda: view(b, ips[1]) == {ips[0]: "CONNECTED"})
    status = a.status()
    assert status["status"] == "UP"
    assert status["nodes"]["0"]["host"] == ips[0] and status["nodes"]["0"]["status"] == "READY"
    assert status["nodes"]["0"]["connections"]["1"]["host"] == ips[1]

    (a.dir / "drop-peers").write_text(f"# link to b is down\n{ips[1]}\n")
    eventually(lambda: view(a, ips[0]) == {ips[1]: "DISCONNECTED"})
    eventually(lambda: view(b, ips[1]) == {ips[0]: "DISCONNECTED"})  # b is refused by a
    assert a.status()["status"] == "DOWN" or a.status()["status"] == "DEGRADED"

    (a.dir / "drop-peers").unlink()
    eventually(lambda: view(a, ips[0]) == {ips[1]: "CONNECTED"})
    eventually(lambda: view(b, ips[1]) == {ips[0]: "CONNECTED"})
