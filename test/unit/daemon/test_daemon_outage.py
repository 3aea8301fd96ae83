"""The daemon's clique writer while the fake API server drops connections, stalls or is down.

Every membership write is a bounded read-modify-write loop: an outage must be one more reason
to back off and try again (like a 409), never an error that ends the join, status flip or leave.
A full clique is the one failure that is not retried blindly: it has its own error type.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_daemon_daemon import (  # type: ignore[import-not-found, unused-ignore]
    CLIQUE as DD_CLIQUE,
)
from test_daemon_daemon import make, options  # type: ignore[import-not-found, unused-ignore]

from pkg.api import constants as c
from pkg.api.daemonentry import DaemonEntry
from pkg.daemon.membership import (
    CliqueFullError,
    CliqueStore,
    Identity,
    Membership,
    upsert,
)
from pkg.kube import resources as res
from pkg.kube.client import RestClient
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer

UID = "uid-outage"
CLIQUE = "cl.1"
NS = "nvidia-dra-driver"


def ident(node: str, ip: str) -> Identity:
    return Identity(
        domain_uid=UID,
        domain_name="cd",
        domain_namespace="team",
        clique_id=CLIQUE,
        node_name=node,
        pod_ip=ip,
        pod_name=f"daemon-{node}",
        pod_uid=f"pod-uid-{node}",
        pod_namespace=NS,
    )


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as srv:
        yield srv


def back_after(server: FakeApiServer, pauses: int) -> tuple[Callable[[float], None], list[float]]:
    """A ``sleep`` that brings the API server back after ``pauses`` backoff pauses."""
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == pauses:
            server.set_available(True)

    return sleep, slept


def membership(
    client: RestClient, node: str, ip: str, sleep: Callable[[float], None]
) -> Membership:
    me = ident(node, ip)
    return Membership(CliqueStore(client, me), me, max_nodes=18, sleep=sleep)


def entries(server: FakeApiServer) -> dict[str, tuple[int, str]]:
    [clique] = server.objects(res.COMPUTE_DOMAIN_CLIQUES)
    return {d["nodeName"]: (d["index"], d["status"]) for d in clique["daemons"]}


def test_join_rides_out_an_api_server_restart(server: FakeApiServer) -> None:
    sleep, slept = back_after(server, 3)
    m = membership(server.client(), "n1", "10.0.0.1", sleep)
    server.set_available(False)
    m.join()
    assert len(slept) == 3  # backed off while the server was down, then wrote
    assert entries(server) == {"n1": (0, c.STATUS_NOT_READY)}


def test_status_flip_and_leave_retry_dropped_and_timed_out_writes(server: FakeApiServer) -> None:
    sleep, slept = back_after(server, 0)
    client = server.client(request_timeout=(1.0, 0.2))
    m = membership(client, "n1", "10.0.0.1", sleep)
    m.join()
    # The status flip is a JSON patch of our own entry (membership.CliqueStore.patch_entry).
    server.inject_error("PATCH", res.COMPUTE_DOMAIN_CLIQUES, 0, count=4)  # urllib3 retries 3x
    m.set_status(c.STATUS_READY)
    assert entries(server) == {"n1": (0, c.STATUS_READY)}
    server.inject_stall("PUT", res.COMPUTE_DOMAIN_CLIQUES, 0.5, count=4)  # client times out
    other = membership(client, "n2", "10.0.0.2", sleep)
    other.join()
    m.leave()
    assert entries(server) == {"n2": (1, c.STATUS_NOT_READY)}
    assert len(slept) >= 2


def test_a_full_clique_is_its_own_error_and_writes_nothing(server: FakeApiServer) -> None:
    full = [DaemonEntry(f"n{i}", f"10.0.1.{i}", CLIQUE, i) for i in range(2)]
    with pytest.raises(CliqueFullError) as exc:
        upsert(full, ident("late", "10.0.0.9"), max_nodes=2)
    assert (exc.value.clique_id, exc.value.max_nodes) == (CLIQUE, 2)
    assert "MAX_NODES_PER_IMEX_DOMAIN=2" in str(exc.value)


def test_daemon_run_loop_waits_out_an_outage_and_then_joins(
    server: FakeApiServer, tmp_path: Path
) -> None:
    """The whole ``run``: labelling its pod, the membership informer and the clique writes all
    meet a dead API server at start, retry, and the daemon joins once it is back."""
    api = server
    api.seed(
        res.PODS,
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "daemon-n0", "namespace": NS}},
    )
    daemon, runner, _, _ = make(api, options(tmp_path))
    api.set_available(False)
    stop = threading.Event()
    ran = threading.Thread(target=daemon.run, args=(stop,))
    ran.start()
    try:
        tried = len(api.request_log)
        eventually(lambda: len(api.request_log) > tried + 3)  # retrying, not exiting
        assert ran.is_alive() and api.objects(res.COMPUTE_DOMAIN_CLIQUES) == []
        api.set_available(True)

        def joined() -> bool:
            cliques = api.objects(res.COMPUTE_DOMAIN_CLIQUES)
            return bool(cliques) and [d["status"] for d in cliques[0].get("daemons") or []] == [
                "Ready"
            ]

        eventually(joined, 20, what="daemon joined after the outage")
        assert api.objects(res.PODS)[0]["metadata"]["labels"] == {c.CLIQUE_ID_LABEL: DD_CLIQUE}
        assert len(runner.procs) == 1
    finally:
        stop.set()
        daemon.wake()
        ran.join(20)
    assert not ran.is_alive()
