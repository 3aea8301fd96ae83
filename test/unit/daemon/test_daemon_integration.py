"""Real daemon processes (cmd entry point) + simulated IMEX + the fake API server.

Shows: daemons of one CD form one IMEX domain; a daemon killed and restarted on a new IP keeps
its index and the others re-form around the new IP; two CDs on the same clique never list each
other; SIGTERM removes the daemon's entry. Each node has its own hosts file and config dir, and
its own loopback address, like the local e2e.
"""

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

from pkg.api import constants as c
from pkg.imex.sim import wire
from pkg.kube import resources as res
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer
from pkg.testing.fakedriverroot import FakeDriverRoot

REPO = Path(__file__).resolve().parents[3]
ENTRY = REPO / "cmd" / "compute-domain-daemon" / "compute_domain_daemon.py"
NS = "nvidia-dra-driver"
CLIQUE = "c0ffee00-0000-4000-8000-000000000001.7"
UID_A = "aaaaaaaa-0000-4000-8000-000000000001"
UID_B = "bbbbbbbb-0000-4000-8000-000000000002"


def free_port(ips: list[str]) -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port >= 65000:
            continue
        try:
            for ip in ips:
                for p in (port, port + 1):
                    with socket.socket() as t:
                        t.bind((ip, p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port")


PATIENCE = 45.0  # real processes (IMEX simulators) on a loaded machine


class Cluster:
    def __init__(self, tmp: Path, api: FakeApiServer, port: int) -> None:
        self.tmp, self.api, self.port = tmp, api, port
        self.kubeconfig = tmp / "kubeconfig"
        self.kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "c",
                    "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
                    "users": [{"name": "u", "user": {}}],
                    "contexts": [{"name": "c", "context": {"cluster": "fake", "user": "u"}}],
                }
            )
        )
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ips: dict[str, str] = {}
        # What CDI puts into a daemon container: the IMEX binaries at /usr/bin of the root.
        self.driver_root = FakeDriverRoot.create(tmp / "driver-root", python=sys.executable)

    def start(self, node: str, ip: str, *, uid: str) -> None:
        pod = f"daemon-{node}-{ip.rsplit('.', 1)[1]}"
        self.api.seed(
            res.PODS,
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "namespace": NS}},
        )
        home = self.tmp / node
        home.mkdir(exist_ok=True)
        (home / "hosts").write_text(f"127.0.0.1\tlocalhost\n{ip}\t{pod}\n")
        env = {
            "PATH": f"{self.driver_root.root / 'usr' / 'bin'}:{os.environ.get('PATH', '')}",
            "CLIQUE_ID": CLIQUE,
            "COMPUTE_DOMAIN_UUID": uid,
            "COMPUTE_DOMAIN_NAME": f"cd-{uid[0]}",
            "COMPUTE_DOMAIN_NAMESPACE": "team",
            "NODE_NAME": node,
            "POD_IP": ip,
            "POD_UID": f"uid-{pod}",
            "POD_NAME": pod,
            "POD_NAMESPACE": NS,
            "KUBECONFIG": str(self.kubeconfig),
            "IMEX_CONFIG_DIR": str(home / "imexd"),
            "IMEX_HOSTS_FILE": str(home / "hosts"),
            "IMEX_SIM_PROBE_INTERVAL": "0.2",
            "IMEX_SERVER_PORT": str(self.port),
            "IMEX_CMD_PORT": str(self.port + 1),
            "MAX_NODES_PER_IMEX_DOMAIN": "8",
        }
        log = (self.tmp / f"{node}.log").open("ab")
        self.procs[node] = subprocess.Popen(
            [sys.executable, str(ENTRY), "run"], env=env, cwd="/", stdout=log, stderr=log
        )
        self.ips[node] = ip

    def status(self, node: str) -> dict[str, Any]:
        try:
            with socket.create_connection((self.ips[node], self.port + 1), timeout=1) as s:
                s.settimeout(3)
                wire.send_line(s, wire.CMD_STATUS)
                result: dict[str, Any] = json.loads(wire.recv_line(s))
                return result
        except (OSError, ValueError):
            return {}

    def connected(self, node: str) -> list[str]:
        return list(self.status(node).get("connected", []))

    def clique(self, uid: str) -> list[dict[str, Any]]:
        for obj in self.api.objects(res.COMPUTE_DOMAIN_CLIQUES):
            if obj["metadata"]["name"] == f"{uid}.{CLIQUE}":
                return list(obj.get("daemons") or [])
        return []

    def stop(self, node: str, sig: int = signal.SIGTERM) -> int:
        proc = self.procs.pop(node)
        proc.send_signal(sig)
        return proc.wait(30)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in self.tmp.glob("*.log"))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    ips = [f"127.0.0.{i}" for i in range(41, 48)]
    with FakeApiServer() as api:
        cl = Cluster(tmp_path, api, free_port(ips))
        try:
            yield cl
        except BaseException:
            sys.stderr.write(cl.logs())
            raise
        finally:
            for node in list(cl.procs):
                cl.stop(node, signal.SIGKILL)


def test_domains_form_reform_and_stay_apart(cluster: Cluster) -> None:
    a = {"a0": "127.0.0.41", "a1": "127.0.0.42", "a2": "127.0.0.43"}
    b = {"b0": "127.0.0.44", "b1": "127.0.0.45"}
    for node, ip in a.items():
        cluster.start(node, ip, uid=UID_A)
    for node, ip in b.items():
        cluster.start(node, ip, uid=UID_B)

    def formed(group: dict[str, str]) -> bool:
        return all(
            sorted(cluster.connected(n)) == sorted(ip for m, ip in group.items() if m != n)
            for n in group
        )

    eventually(lambda: formed(a) and formed(b), PATIENCE, what="both domains formed")
    entries = cluster.clique(UID_A)
    assert sorted(e["index"] for e in entries) == [0, 1, 2]
    eventually(
        lambda: {e["status"] for e in cluster.clique(UID_A)} == {c.STATUS_READY},
        PATIENCE,
        what="A ready",
    )
    index_a2 = next(e["index"] for e in cluster.clique(UID_A) if e["nodeName"] == "a2")
    pods = {p["metadata"]["name"]: p for p in cluster.api.objects(res.PODS)}

    # Every daemon publishes what its IMEX (nvidia-imex-ctl -N -j) sees of its clique peers.
    def peers(uid: str) -> dict[str, tuple[object, object]]:
        return {
            e["nodeName"]: (e.get("connectedPeers"), tuple(e.get("unreachablePeers", ["-"])))
            for e in cluster.clique(uid)
        }

    eventually(
        lambda: set(peers(UID_A).values()) == {(2, ())},
        PATIENCE,
        what="A reports all peers connected",
    )
    # The link a0 <-> a1 fails (the simulator's drop file): both ends name the other.
    drop = cluster.tmp / "a0" / "imexd" / "drop-peers"
    drop.write_text(a["a1"] + "\n")
    want = {"a0": (1, ("a1",)), "a1": (1, ("a0",)), "a2": (2, ())}
    eventually(
        lambda: peers(UID_A) == want, PATIENCE, what="a0 and a1 report each other unreachable"
    )
    drop.unlink()
    eventually(lambda: set(peers(UID_A).values()) == {(2, ())}, PATIENCE, what="the link is back")
    assert pods["daemon-a0-41"]["metadata"]["labels"][c.CLIQUE_ID_LABEL] == CLIQUE

    # Kill a2's daemon hard (its IMEX follows), bring the node back on a new pod IP.
    cluster.stop("a2", signal.SIGKILL)
    cluster.start("a2", "127.0.0.46", uid=UID_A)
    a["a2"] = "127.0.0.46"
    eventually(lambda: formed(a), PATIENCE, what="domain A re-formed around the new IP")
    entries = cluster.clique(UID_A)
    assert len(entries) == 3
    assert next(e for e in entries if e["nodeName"] == "a2")["index"] == index_a2
    assert "127.0.0.43" not in {e["ipAddress"] for e in entries}
    for node in a:
        for peer in cluster.status(node)["probes"]:
            assert peer.get("address") not in set(b.values())
    for node in b:
        assert sorted(cluster.connected(node)) == sorted(ip for m, ip in b.items() if m != node)

    # Graceful shutdown removes the entry; the others drop the peer.
    assert cluster.stop("a1") == 0
    eventually(
        lambda: "a1" not in {e["nodeName"] for e in cluster.clique(UID_A)}, PATIENCE, what="a1 left"
    )
    eventually(lambda: cluster.connected("a0") == ["127.0.0.46"], PATIENCE, what="a0 dropped a1")
