"""Gate ``ComputeDomainCliques`` off: the daemons write ``status.nodes``, the controller keeps it.

Against the fake API server with an injected clock: members come from the domain's
``status.nodes`` (clique objects are neither read nor written), entries of departed daemons are
pruned, non-fabric daemons are added from their pods, the readiness, conditions and Events
follow the members, a live daemon's own word is never overwritten (no write war), and a
daemon's concurrent write is never lost to a status write of the controller.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import replace

import pytest
from cdctl_fakes import (  # type: ignore[import-not-found, unused-ignore]
    DRIVER_NS,
    RecordedEvents,
    channel_claim,
    clique,
    compute_domain,
    daemon_entry,
    daemon_pod,
    node,
)

from pkg.api import constants as c
from pkg.base.types import JSON
from pkg.kube import resources as res
from pkg.kube.client import RestClient
from pkg.kube.errors import ConflictError
from pkg.reconcilers.computedomain import ComputeDomainReconciler
from pkg.reconcilers.config import ControllerConfig
from pkg.testing.clock import FakeClock
from pkg.testing.fakeapiserver import FakeApiServer


@pytest.fixture
def reconciler(
    make_reconciler: Callable[..., ComputeDomainReconciler], config: ControllerConfig
) -> ComputeDomainReconciler:
    off = replace(
        config,
        compute_domain_cliques=False,
        feature_gates="ComputeDomainCliques=false,IMEXDaemonsWithDNSNames=true",
    )
    return make_reconciler(config=off)


def get_cd(server: FakeApiServer) -> JSON:
    return next(o for o in server.objects(res.COMPUTE_DOMAINS) if o["metadata"]["name"] == "cd1")


def ready_condition(cd: JSON) -> JSON:
    return next(x for x in cd["status"]["conditions"] if x["type"] == "Ready")


def status_entry(name: str, *, index: int, status: str = "Ready", clique_id: str = "cl.1") -> JSON:
    """A ``status.nodes[]`` item as a daemon writes it."""
    return {
        "name": name,
        "ipAddress": f"10.1.0.{index + 1}",
        "cliqueID": clique_id,
        "index": index,
        "status": status,
    }


def daemon_writes(client: RestClient, entries: list[JSON]) -> None:
    """What a daemon does: read-modify-write of ``status.nodes`` with the read RV."""
    while True:
        obj = client.get(res.COMPUTE_DOMAINS, "cd1", namespace="team")
        obj.setdefault("status", {})["nodes"] = entries
        try:
            client.update(res.COMPUTE_DOMAINS, obj, subresource="status")
            return
        except ConflictError:
            continue


def created_domain(
    server: FakeApiServer, reconciler: ComputeDomainReconciler, **spec: object
) -> str:
    uid = str(server.seed(res.COMPUTE_DOMAINS, compute_domain(**spec))["metadata"]["uid"])
    reconciler.reconcile("team/cd1")
    server.seed(res.RESOURCE_CLAIMS, channel_claim("w0", ns="team", uid=uid, node_name="a"))
    reconciler.reconcile("team/cd1")
    return uid


def test_members_come_from_status_nodes_and_departed_daemons_are_pruned(
    server: FakeApiServer,
    client: RestClient,
    reconciler: ComputeDomainReconciler,
    events: RecordedEvents,
) -> None:
    uid = created_domain(server, reconciler, numNodes=3)
    for n in ("a", "b", "c"):
        server.seed(res.NODES, node(n, labels={c.COMPUTE_DOMAIN_LABEL: uid}))
    server.seed(res.PODS, daemon_pod(uid, "a", clique="cl.1"))
    server.seed(res.PODS, daemon_pod(uid, "b", clique="cl.1"))
    server.seed(res.PODS, daemon_pod(uid, "c", clique="", ip="10.9.9.9"))
    # A clique object of this domain is not the membership in this mode: ignored.
    server.seed(res.COMPUTE_DOMAIN_CLIQUES, clique(uid, "cl.1", [daemon_entry("x", index=5)]))
    daemon_writes(
        client,
        [
            status_entry("b", index=1, status="NotReady"),
            status_entry("a", index=0),
            status_entry("gone", index=2),  # its daemon pod is gone: pruned by the controller
        ],
    )
    reconciler.reconcile("team/cd1")
    status = get_cd(server)["status"]
    # The daemons' entries in the order they wrote them, then the non-fabric member.
    assert [(n["name"], n["status"], n["index"]) for n in status["nodes"]] == [
        ("b", "NotReady", 1),
        ("a", "Ready", 0),
        ("c", "Ready", -1),
    ]
    assert status["nodes"][2]["ipAddress"] == "10.9.9.9"
    assert (status["readyNodes"], status["nodeCount"], status["status"]) == (2, 3, "NotReady")
    assert ready_condition(get_cd(server))["reason"] == "DaemonsNotReady"
    assert events.reasons().count("NodeJoined") == 3
    # b's daemon turns itself Ready: the domain follows, and a pass with nothing new writes
    # nothing (the daemons' entries are the controller's input, not overwritten by it).
    daemon_writes(client, [status_entry("b", index=1), status_entry("a", index=0)])
    reconciler.reconcile("team/cd1")
    cd = get_cd(server)
    assert cd["status"]["status"] == "Ready"
    assert [n["name"] for n in cd["status"]["nodes"]] == ["b", "a", "c"]
    assert events.reasons()[-2:] == ["NodeReady", "Ready"]
    before = len(server.request_log)
    reconciler.reconcile("team/cd1")
    assert not [m for m, _p in server.request_log[before:] if m in ("PUT", "POST", "PATCH")]
    assert not [p for _m, p in server.request_log if "computedomaincliques" in p]


def test_a_live_daemons_word_is_kept_and_a_dead_ones_is_not(
    server: FakeApiServer, client: RestClient, reconciler: ComputeDomainReconciler
) -> None:
    uid = created_domain(server, reconciler)
    for n in ("a", "b"):
        server.seed(res.NODES, node(n, labels={c.COMPUTE_DOMAIN_LABEL: uid}))
        server.seed(res.PODS, daemon_pod(uid, n, clique="cl.1"))
    daemon_writes(client, [status_entry("a", index=0), status_entry("b", index=1)])
    reconciler.reconcile("team/cd1")
    assert get_cd(server)["status"]["status"] == "Ready"
    # Node b stops reporting: its daemon may still run and would write Ready straight back,
    # so its entry stays as written while the domain turns NotReady and says why.
    unreachable = [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]
    server.seed(
        res.NODES,
        node("b", ready="Unknown", labels={c.COMPUTE_DOMAIN_LABEL: uid}, taints=unreachable),
    )
    reconciler.reconcile("team/cd1")
    cd = get_cd(server)
    assert [n["status"] for n in cd["status"]["nodes"]] == ["Ready", "Ready"]
    assert cd["status"]["status"] == "NotReady" and cd["status"]["readyNodes"] == 1
    assert ready_condition(cd)["reason"] == "NodeUnreachable"
    # a's daemon crashed (its container waits to restart): it cannot write, so its entry
    # is published NotReady over its last word.
    server.seed(res.NODES, node("b", labels={c.COMPUTE_DOMAIN_LABEL: uid}))
    client.delete(res.PODS, "daemon-a", namespace=DRIVER_NS)  # seed keeps an old pod's status
    server.seed(res.PODS, daemon_pod(uid, "a", clique="cl.1", container="waiting", ready=False))
    reconciler.reconcile("team/cd1")
    cd = get_cd(server)
    assert [(n["name"], n["status"]) for n in cd["status"]["nodes"]] == [
        ("a", "NotReady"),
        ("b", "Ready"),
    ]
    assert ready_condition(cd)["reason"] == "DaemonNotRunning"


def test_concurrent_daemon_writes_are_never_lost_to_a_status_write(
    server: FakeApiServer,
    client: RestClient,
    reconciler: ComputeDomainReconciler,
    clock: FakeClock,
) -> None:
    uid = created_domain(server, reconciler)
    n_nodes = 16
    for i in range(n_nodes):
        server.seed(res.NODES, node(f"n{i:02d}", labels={c.COMPUTE_DOMAIN_LABEL: uid}))
        server.seed(res.PODS, daemon_pod(uid, f"n{i:02d}", clique="cl.1"))

    def daemon(i: int) -> None:  # appends its own entry, RV-guarded, as our daemons do
        while True:
            obj = client.get(res.COMPUTE_DOMAINS, "cd1", namespace="team")
            status = obj.setdefault("status", {})
            status["nodes"] = [*(status.get("nodes") or []), status_entry(f"n{i:02d}", index=i)]
            try:
                client.update(res.COMPUTE_DOMAINS, obj, subresource="status")
                return
            except ConflictError:
                continue

    stop = threading.Event()

    def aggregate() -> None:
        while not stop.is_set():
            with contextlib.suppress(ConflictError):  # the workqueue retries it
                reconciler.reconcile("team/cd1")

    threads = [threading.Thread(target=daemon, args=(i,)) for i in range(n_nodes)]
    agg = threading.Thread(target=aggregate)
    agg.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    agg.join()
    clock.step(5)  # past the coalescing interval of count-only status writes
    reconciler.reconcile("team/cd1")
    status = get_cd(server)["status"]
    assert sorted(n["name"] for n in status["nodes"]) == [f"n{i:02d}" for i in range(n_nodes)]
    assert status["nodeCount"] == n_nodes and status["status"] == "Ready"


def test_teardown_needs_no_clique_and_leaves_nothing(
    server: FakeApiServer, client: RestClient, reconciler: ComputeDomainReconciler
) -> None:
    created_domain(server, reconciler)
    assert server.objects(res.DAEMONSETS)
    env = {
        e["name"]: e.get("value")
        for e in server.objects(res.DAEMONSETS)[0]["spec"]["template"]["spec"]["containers"][0][
            "env"
        ]
    }
    assert env["FEATURE_GATES"] == "ComputeDomainCliques=false,IMEXDaemonsWithDNSNames=true"
    client.delete(res.COMPUTE_DOMAINS, "cd1", namespace="team")
    for _ in range(3):
        reconciler.reconcile("team/cd1")
    assert not server.objects(res.COMPUTE_DOMAINS)
    assert not server.objects(res.DAEMONSETS)
    assert not [
        o
        for o in server.objects(res.RESOURCE_CLAIM_TEMPLATES)
        if o["metadata"]["namespace"] in ("team", DRIVER_NS)
    ]
