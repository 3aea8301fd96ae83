"""Update loop policy: DNS mode (hosts + SIGUSR1 only on change) and IP mode (barrier, restart)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from pkg.api.daemonentry import DaemonEntry
from pkg.daemon.imexsync import ImexSync
from pkg.daemon.membership import Identity
from pkg.imex import hosts, nodesconfig
from pkg.imex.hosts import HostsFile

UID = "cd-uid-1"
CLIQUE = "c.1"


class FakeProcess:
    def __init__(self) -> None:
        self.is_running = False
        self.calls: list[str] = []

    def ensure_started(self) -> bool:
        if self.is_running:
            return False
        self.is_running = True
        self.calls.append("start")
        return True

    def reload(self) -> bool:
        self.calls.append("reload")
        return self.is_running

    def restart(self) -> None:
        self.is_running = True
        self.calls.append("restart")

    def running(self) -> bool:
        return self.is_running


class Gauge:
    value = -1.0

    def set(self, value: float) -> None:
        self.value = value


ME = Identity(
    domain_uid=UID,
    domain_name="cd",
    domain_namespace="ns",
    clique_id=CLIQUE,
    node_name="n0",
    pod_ip="10.0.0.1",
    pod_name="p",
    pod_uid="u",
    pod_namespace="drv",
)


def e(node: str, ip: str, index: int, clique: str = CLIQUE) -> DaemonEntry:
    return DaemonEntry(node, ip, clique, index)


def make(tmp_path: Path, *, dns: bool) -> tuple[ImexSync, FakeProcess, Gauge, Path]:
    proc, gauge = FakeProcess(), Gauge()
    hosts_path = tmp_path / "hosts"
    hosts_path.write_text("127.0.0.1\tlocalhost\n")
    sync = ImexSync(
        ME,
        dns_names=dns,
        max_nodes=4,
        hosts=HostsFile(hosts_path, name_prefix=nodesconfig.NAME_PREFIX),
        nodes_config_path=str(tmp_path / "nodes.cfg"),
        process=proc,
        peers=gauge,
    )
    sync.prepare()
    return sync, proc, gauge, hosts_path


def resolve(hosts_path: Path, index: int) -> str | None:
    return hosts.resolve(hosts_path.read_text(), nodesconfig.node_name(UID, index, max_nodes=4))


def test_dns_mode_starts_immediately_and_reloads_only_on_change(tmp_path: Path) -> None:
    sync, proc, gauge, hosts_path = make(tmp_path, dns=True)
    assert (tmp_path / "nodes.cfg").read_text() == nodesconfig.render_dns_nodes_config(
        UID, max_nodes=4
    )
    sync.apply([])  # not a member yet: nothing starts
    assert proc.calls == []
    sync.apply([e("n0", "10.0.0.1", 0)])
    assert proc.calls == ["start"] and gauge.value == 0
    assert resolve(hosts_path, 0) == "10.0.0.1"
    assert resolve(hosts_path, 1) == nodesconfig.SENTINEL_ADDRESS
    sync.apply([e("n0", "10.0.0.1", 0), e("n1", "10.0.0.2", 1), e("x", "10.9.0.1", 2, "other")])
    assert proc.calls == ["start", "reload"] and gauge.value == 1
    assert resolve(hosts_path, 2) == nodesconfig.SENTINEL_ADDRESS  # other clique ignored
    sync.apply([e("n0", "10.0.0.1", 0), e("n1", "10.0.0.2", 1)])
    assert proc.calls == ["start", "reload"]  # unchanged mapping: no signal
    sync.apply([e("n0", "10.0.0.1", 0), e("n1", "10.0.0.7", 1)])  # peer restarted, new IP
    assert proc.calls == ["start", "reload", "reload"]
    assert resolve(hosts_path, 1) == "10.0.0.7"
    assert (tmp_path / "hosts").read_text().startswith("127.0.0.1\tlocalhost\n")


def test_dns_mode_first_start_sends_no_reload(tmp_path: Path) -> None:
    sync, proc, _, _ = make(tmp_path, dns=True)
    sync.apply([e("n0", "10.0.0.1", 0), e("n1", "10.0.0.2", 1)])
    assert proc.calls == ["start"]


def test_dns_mode_own_index_change_restarts(tmp_path: Path) -> None:
    sync, proc, _, hosts_path = make(tmp_path, dns=True)
    sync.apply([e("n0", "10.0.0.1", 0)])
    sync.apply([e("n1", "10.0.0.2", 0), e("n0", "10.0.0.1", 3)])
    assert proc.calls == ["start", "restart"]
    assert resolve(hosts_path, 3) == "10.0.0.1"
    sync.apply([e("n1", "10.0.0.2", 0), e("n0", "10.0.0.1", 3)])
    assert proc.calls == ["start", "restart"]


def test_ip_mode_barrier_then_restart_on_change(tmp_path: Path) -> None:
    sync, proc, _, _ = make(tmp_path, dns=False)
    nodes = tmp_path / "nodes.cfg"
    sync.apply([e("n0", "10.0.0.1", 0)], num_nodes=2)
    assert proc.calls == [] and not nodes.exists()
    both = [e("n1", "10.0.0.2", 1), e("n0", "10.0.0.1", 0)]
    sync.apply(both, num_nodes=2)
    assert proc.calls == ["start"] and nodes.read_text() == "10.0.0.1\n10.0.0.2\n"
    sync.apply(both, num_nodes=2)
    assert proc.calls == ["start"]
    sync.apply([e("n0", "10.0.0.1", 0), e("n1", "10.0.0.3", 1)], num_nodes=2)
    assert proc.calls == ["start", "restart"] and nodes.read_text() == "10.0.0.1\n10.0.0.3\n"


# ``ipaddress`` alone accepts a scope ID with any text, which would add a hosts line.
INJECTED = "fe80::1%a\n10.0.0.9\tcompute-domain-daemon-x-0000"
BAD_IPS = [
    INJECTED,
    "fe80::1%eth0",
    "010.0.0.1",
    "FD00::1",
    "fd00:0:0:0:0:0:0:1",
    " 10.0.0.2",
    "10.0.0.2\n",
    "compute-domain-daemon-0000",
    "",
    nodesconfig.SENTINEL_ADDRESS,
]


@pytest.mark.parametrize("bad", BAD_IPS)
def test_dns_mode_skips_a_bad_entry_and_writes_the_good_ones(
    tmp_path: Path, bad: str, caplog: pytest.LogCaptureFixture
) -> None:
    sync, proc, _, hosts_path = make(tmp_path, dns=True)
    members = [e("n0", "10.0.0.1", 0), e("evil", bad, 1), e("n2", "fd00::3", 2)]
    with caplog.at_level(logging.WARNING, logger="pkg.daemon.imexsync"):
        sync.apply(members)
        sync.apply(members)  # the loop goes on; warned about once
    assert proc.calls == ["start"]
    assert resolve(hosts_path, 0) == "10.0.0.1" and resolve(hosts_path, 2) == "fd00::3"
    assert resolve(hosts_path, 1) == nodesconfig.SENTINEL_ADDRESS
    text = hosts_path.read_text()
    assert "10.0.0.9" not in text and "%" not in text
    assert [r.message.count("skipping clique entry of node 'evil'") for r in caplog.records] == [1]


@pytest.mark.parametrize("bad", BAD_IPS)
def test_ip_mode_skips_a_bad_entry_and_writes_the_good_ones(tmp_path: Path, bad: str) -> None:
    sync, proc, _, _ = make(tmp_path, dns=False)
    members = [e("n0", "10.0.0.1", 0), e("evil", bad, 1), e("n2", "10.0.0.3", 2)]
    sync.apply(members, num_nodes=3)
    assert proc.calls == ["start"]
    assert (tmp_path / "nodes.cfg").read_text() == "10.0.0.1\n10.0.0.3\n"


def test_an_index_held_twice_still_starts_our_imex_with_our_address(tmp_path: Path) -> None:
    """A stale or racing entry with our index (listed first) neither hides our own entry nor
    keeps IMEX from starting: our entry wins the tie in our hosts mapping. Ruled out as the
    cause of an IMEX that never starts."""
    sync, proc, gauge, hosts_path = make(tmp_path, dns=True)
    sync.apply([e("n1", "10.0.0.2", 0), e("n0", "10.0.0.1", 0)])
    assert proc.calls == ["start"] and gauge.value == 1
    assert resolve(hosts_path, 0) == "10.0.0.1"
