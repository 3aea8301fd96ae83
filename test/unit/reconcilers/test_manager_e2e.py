"""The wired controller (real informers, queues and workers) against the fake API server."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

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
    resource_slice,
)
from opentelemetry import trace
from prometheus_client import CollectorRegistry

from pkg.api import constants as c
from pkg.base.clock import RealClock
from pkg.kube import resources as res
from pkg.kube.client import RestClient
from pkg.reconcilers.config import ControllerConfig
from pkg.reconcilers.manager import ControllerManager
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer


@pytest.fixture
def manager(
    client: RestClient,
    config: ControllerConfig,
    registry: CollectorRegistry,
    events: RecordedEvents,
) -> Iterator[ControllerManager]:
    mgr = ControllerManager(
        client=client,
        config=replace(config, cleanup_interval=3600),
        registry=registry,
        tracer=trace.NoOpTracer(),
        clock=RealClock(),
        informer_clock=RealClock(),
        events=events,
    )
    yield mgr
    mgr.stop()


def test_domain_lifecycle_is_event_driven_end_to_end(
    server: FakeApiServer,
    client: RestClient,
    manager: ControllerManager,
    registry: CollectorRegistry,
) -> None:
    uid = str(server.seed(res.COMPUTE_DOMAINS, compute_domain())["metadata"]["uid"])
    server.seed(res.NODES, node("a"))
    server.seed(res.RESOURCE_SLICES, resource_slice("a", clique_id="uuid.3"))
    assert manager.start(sync_timeout=10)
    assert manager.synced()

    def cd() -> dict[str, Any] | None:
        objs = server.objects(res.COMPUTE_DOMAINS)
        return objs[0] if objs else None

    def node_labels() -> dict[str, str]:
        return dict(server.objects(res.NODES)[0]["metadata"].get("labels") or {})

    # Both passes done (status written): the workload template exists, but no daemon objects
    # while no workload uses the domain.
    eventually(lambda: bool((cd() or {}).get("status")))
    assert len(server.objects(res.RESOURCE_CLAIM_TEMPLATES)) == 1
    assert server.objects(res.DAEMONSETS) == []
    eventually(lambda: node_labels().get(c.GPU_CLIQUE_NODE_LABEL) == "uuid.3")
    # The scheduler allocates a workload claim on node a: the node is labelled at once, and
    # the domain creates its daemon RCT and DaemonSet.
    server.seed(res.RESOURCE_CLAIMS, channel_claim("w0", ns="team", uid=uid, node_name="a"))
    eventually(lambda: node_labels().get(c.COMPUTE_DOMAIN_LABEL) == uid)
    eventually(lambda: len(server.objects(res.DAEMONSETS)) == 1)
    assert len(server.objects(res.RESOURCE_CLAIM_TEMPLATES)) == 2
    # The DaemonSet's pod starts there and its daemon registers Ready in its clique.
    server.seed(res.PODS, daemon_pod(uid, "a", clique="uuid.3"))
    server.seed(
        res.COMPUTE_DOMAIN_CLIQUES,
        clique(uid, "uuid.3", [daemon_entry("a", index=0, clique_id="uuid.3")]),
    )
    eventually(lambda: (cd() or {}).get("status", {}).get("status") == "Ready")
    eventually(
        lambda: registry.get_sample_value("nvidia_dra_compute_domain_info", {"status": "Ready"})
    )
    assert registry.get_sample_value(
        "workqueue_adds_total", {"name": "computedomain"}
    )  # named queues export metrics
    # Delete: the finalizer stays until the daemon pod is gone.
    client.delete(res.COMPUTE_DOMAINS, "cd1", namespace="team")
    eventually(lambda: server.objects(res.DAEMONSETS) == [])
    eventually(lambda: c.COMPUTE_DOMAIN_LABEL not in node_labels())
    assert cd() is not None
    client.delete(res.PODS, "daemon-a", namespace=DRIVER_NS)
    eventually(lambda: cd() is None)
    assert server.objects(res.RESOURCE_CLAIM_TEMPLATES) == []


def test_stale_clique_entry_is_pruned_on_pod_delete_after_the_grace_period(
    server: FakeApiServer,
    client: RestClient,
    config: ControllerConfig,
    registry: CollectorRegistry,
    events: RecordedEvents,
) -> None:
    mgr = ControllerManager(
        client=client,
        config=replace(config, cleanup_interval=3600, clique_entry_grace_period=0.5),
        registry=registry,
        tracer=trace.NoOpTracer(),
        clock=RealClock(),
        informer_clock=RealClock(),
        events=events,
    )
    uid = "u-prune"
    server.seed(res.PODS, daemon_pod(uid, "a"))
    server.seed(res.PODS, daemon_pod(uid, "b"))
    entries = [daemon_entry("a", index=0), daemon_entry("b", index=1)]
    server.seed(res.COMPUTE_DOMAIN_CLIQUES, clique(uid, "cl.1", entries))

    def nodes() -> list[str]:
        return [d["nodeName"] for d in server.objects(res.COMPUTE_DOMAIN_CLIQUES)[0]["daemons"]]

    try:
        assert mgr.start(sync_timeout=10)
        client.delete(res.PODS, "daemon-b", namespace=DRIVER_NS)
        deleted = time.monotonic()
        eventually(lambda: nodes() == ["a"])
        assert time.monotonic() - deleted >= 0.5  # not before the grace period
        # Past the grace, another pass over the clique keeps the entry whose pod lives.
        prune = next(ctl for ctl in mgr.controllers if ctl.name == "cliqueprune")
        work = {"name": "cliqueprune"}

        def passes() -> float:
            count = "workqueue_work_duration_seconds_count"
            return registry.get_sample_value(count, work) or 0.0

        before = passes()
        prune.enqueue(
            f"{DRIVER_NS}/{server.objects(res.COMPUTE_DOMAIN_CLIQUES)[0]['metadata']['name']}"
        )
        eventually(lambda: passes() > before)
        assert nodes() == ["a"]
        assert registry.get_sample_value("workqueue_adds_total", {"name": "cliqueprune"})
    finally:
        mgr.stop()


def test_status_writer_and_informers_ride_out_dropped_writes_and_an_outage(
    server: FakeApiServer, client: RestClient, manager: ControllerManager
) -> None:
    uid = str(server.seed(res.COMPUTE_DOMAINS, compute_domain())["metadata"]["uid"])
    server.seed(res.PODS, daemon_pod(uid, "a", clique="cl.1"))
    server.seed(
        res.COMPUTE_DOMAIN_CLIQUES,
        clique(uid, "cl.1", [daemon_entry("a", index=0, status="NotReady")]),
    )
    # The first status writes are dropped on the wire: the reconcile fails and is requeued.
    server.inject_error("PUT", res.COMPUTE_DOMAINS, 0, count=8)
    assert manager.start(sync_timeout=10)

    def status() -> str:
        return str(server.objects(res.COMPUTE_DOMAINS)[0].get("status", {}).get("status"))

    eventually(lambda: status() == "NotReady")
    # The API server restarts; meanwhile the daemon turns Ready (written before the outage
    # ends, seen by nobody): once it is back, watches resume and the status catches up.
    tried = len(server.request_log)
    server.set_available(False)
    eventually(lambda: len(server.request_log) > tried + 5)  # the informers retry in vain
    server.seed(res.COMPUTE_DOMAIN_CLIQUES, clique(uid, "cl.1", [daemon_entry("a", index=0)]))
    server.set_available(True)
    eventually(lambda: status() == "Ready", timeout=20)
    assert all(
        ctl._threads and all(t.is_alive() for t in ctl._threads) for ctl in manager.controllers
    )


def test_num_nodes_unreachable_clears_when_a_node_publishes_its_slices(
    server: FakeApiServer, manager: ControllerManager
) -> None:
    server.seed(res.NODES, node("a"))
    server.seed(res.RESOURCE_SLICES, resource_slice("a", clique_id="uuid.3"))
    server.seed(res.COMPUTE_DOMAINS, compute_domain(numNodes=2))
    assert manager.start(sync_timeout=10)

    def reason() -> str:
        st = server.objects(res.COMPUTE_DOMAINS)[0].get("status") or {}
        cond: dict[str, Any] = next(
            (x for x in st.get("conditions") or [] if x["type"] == "Ready"), {}
        )
        return str(cond.get("reason", ""))

    eventually(lambda: reason() == "NumNodesUnreachable")
    server.seed(res.NODES, node("b"))  # no slice yet: still unreachable
    server.seed(res.RESOURCE_SLICES, resource_slice("b", clique_id="uuid.3"))  # the event
    eventually(lambda: reason() == "WaitingForNodes")


def _queue_adds(registry: CollectorRegistry) -> float:
    total = 0.0
    for metric in registry.collect():
        if metric.name == "workqueue_adds":
            total += sum(s.value for s in metric.samples if s.name == "workqueue_adds_total")
    return total


def _queues_idle(registry: CollectorRegistry) -> bool:
    """No queue holds an item or has one in processing (delayed requeues do not count)."""
    busy = 0.0
    for metric in registry.collect():
        if metric.name in ("workqueue_depth", "workqueue_unfinished_work_seconds"):
            busy += sum(s.value for s in metric.samples)
    return busy == 0


def _quiet_manager(
    client: RestClient,
    config: ControllerConfig,
    registry: CollectorRegistry,
    events: RecordedEvents,
) -> ControllerManager:
    """A manager on real clocks with no periodic sweep and status coalescing off (its timed
    requeue would be a queue add of its own): every add it makes answers an event."""
    return ControllerManager(
        client=client,
        registry=registry,
        tracer=trace.NoOpTracer(),
        clock=RealClock(),
        config=replace(config, cleanup_interval=3600, status_update_interval=0.0),
        informer_clock=RealClock(),
        events=events,
    )


def test_foreign_node_annotation_sweeps_wake_no_reconciler(
    server: FakeApiServer,
    client: RestClient,
    config: ControllerConfig,
    registry: CollectorRegistry,
    events: RecordedEvents,
) -> None:
    """kube-controller-manager's TTL controller annotates every Node when a cluster grows; at
    5,000 Nodes that sweep (~20 updates/s for minutes) kept the idle controller at 4-5 % CPU,
    each update re-queueing every domain still waiting for nodes. Foreign annotations are not
    cached, and an update that changes nothing cached queues nothing. (Status coalescing off:
    its timed requeue would be an add of its own.)"""
    manager = _quiet_manager(client, config, registry, events)
    try:
        _no_queue_adds_for_foreign_annotations(server, manager, registry)
    finally:
        manager.stop()


def test_kubelet_status_reports_wake_no_reconciler(
    server: FakeApiServer,
    client: RestClient,
    config: ControllerConfig,
    registry: CollectorRegistry,
    events: RecordedEvents,
) -> None:
    """Every kubelet rewrites its Node's condition heartbeats every 5 minutes; on the Nodes
    hosting daemons (watched in full for their health) each report used to queue that node's
    domains, clique entries and joins. The heartbeat is not cached, so a report that changed
    nothing else queues nothing; a Ready change still does."""
    manager = _quiet_manager(client, config, registry, events)
    try:
        names = [f"n{i}" for i in range(10)]
        for i, name in enumerate(names):  # one domain per node: each report, its own key
            cd = server.seed(res.COMPUTE_DOMAINS, compute_domain(f"cd{i}"))
            uid = str(cd["metadata"]["uid"])
            server.seed(res.NODES, node(name, labels={c.COMPUTE_DOMAIN_LABEL: uid}))
        assert manager.start(sync_timeout=10)
        eventually(
            lambda: all(
                (cd.get("status") or {}).get("status") for cd in server.objects(res.COMPUTE_DOMAINS)
            )
        )
        before = _settled_adds(registry)

        def report(name: str, beat: str, ready: str = "True") -> None:
            client.patch(
                res.NODES,
                name,
                {
                    "status": {
                        "conditions": [
                            {"type": "Ready", "status": ready, "lastHeartbeatTime": beat}
                        ]
                    }
                },
                subresource="status",
            )

        for name in names:
            report(name, "2026-11-27T10:05:00Z")

        want = {n: str(client.get(res.NODES, n)["metadata"]["resourceVersion"]) for n in names}

        def every_cache_has_them() -> bool:  # the node-health informer among them
            for inf in manager.informer_snapshot():
                objects = inf.get("objects") or {}
                if any(n in objects and objects[n] != want[n] for n in names):
                    return False
            return True

        eventually(every_cache_has_them)
        after = _settled_adds(registry)
        assert after - before <= 2, "heartbeats queued reconciles"
        report("n0", "2026-11-27T10:10:00Z", ready="False")
        eventually(lambda: _queue_adds(registry) > after)  # a Ready change still counts
    finally:
        manager.stop()


def _settled_adds(registry: CollectorRegistry) -> float:
    """The queue adds once the queues are idle and the count held still for three reads
    0.1 s apart (handlers run after the cache; a slow machine can only hide adds from this,
    never invent them)."""
    eventually(lambda: _queues_idle(registry))
    counts = [_queue_adds(registry)]
    while len(counts) < 3 or len(set(counts[-3:])) > 1:
        time.sleep(0.1)
        counts.append(_queue_adds(registry))
    return counts[-1]


def _no_queue_adds_for_foreign_annotations(
    server: FakeApiServer, manager: ControllerManager, registry: CollectorRegistry
) -> None:
    names = [f"n{i}" for i in range(20)]
    for name in names:
        server.seed(res.NODES, node(name))
    server.seed(res.COMPUTE_DOMAINS, compute_domain(numNodes=3))  # waits for nodes
    assert manager.start(sync_timeout=10)
    eventually(lambda: (server.objects(res.COMPUTE_DOMAINS)[0].get("status") or {}).get("status"))
    eventually(lambda: _queues_idle(registry))  # the first passes are done
    before = _queue_adds(registry)
    client = server.client()
    for name in names:
        client.patch(
            res.NODES, name, {"metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": "30"}}}
        )

    def cached_rv(name: str) -> str:
        obj = manager.caches.nodes.get_by_key(name) or {}
        return str(obj.get("metadata", {}).get("resourceVersion"))

    def server_rv(name: str) -> str:
        return str(client.get(res.NODES, name)["metadata"]["resourceVersion"])

    eventually(lambda: all(cached_rv(n) == server_rv(n) for n in names))
    cached = manager.caches.nodes.get_by_key("n0") or {}
    assert "node.alpha.kubernetes.io/ttl" not in (cached["metadata"].get("annotations") or {})
    # Before the filter the 20 updates queued >= 60 keys (each Node: its domains, its claim
    # and clique-label keys, every waiting domain); a stray event of the domain's own first
    # writes may still land after the idle check above, nothing per Node may.
    assert _queue_adds(registry) - before <= 2, "foreign annotations queued reconciles"
    client.patch(res.NODES, "n0", {"metadata": {"labels": {"team": "a"}}})
    eventually(lambda: _queue_adds(registry) > before)  # a label change still counts


def _adds_of(registry: CollectorRegistry, queue: str) -> float:
    return sum(
        s.value
        for metric in registry.collect()
        if metric.name == "workqueue_adds"
        for s in metric.samples
        if s.name == "workqueue_adds_total" and s.labels.get("name") == queue
    )


def test_status_writes_of_a_domain_do_not_requeue_its_nodes_claims(
    server: FakeApiServer,
    client: RestClient,
    manager: ControllerManager,
    registry: CollectorRegistry,
) -> None:
    """Every status write of a forming domain queued a resourceclaim pass for each of its
    nodes (18 nodes: ~300 passes per formation); only the domain's appearance and deletion
    matter to that reconciler."""
    cd = client.create(res.COMPUTE_DOMAINS, compute_domain(), namespace="team")
    uid = cd["metadata"]["uid"]
    for name in ("a", "b", "c"):
        server.seed(res.NODES, node(name))
    assert manager.start(sync_timeout=10)
    for name in ("a", "b", "c"):  # allocated after the start: this term labels their nodes
        server.seed(
            res.RESOURCE_CLAIMS, channel_claim(f"w-{name}", ns="team", uid=uid, node_name=name)
        )
    # The labels as the controller's own Node cache shows them: their watch events (each a
    # resourceclaim add) have arrived before the count is taken.
    eventually(
        lambda: (
            all(
                (n["metadata"].get("labels") or {}).get(c.COMPUTE_DOMAIN_LABEL) == uid
                for n in manager.caches.nodes.list()
            )
            and len(manager.caches.nodes.list()) == 3
        )
    )
    seen: list[float] = []

    def settled() -> bool:  # idle, and no resourceclaim add since the previous poll
        seen.append(_adds_of(registry, "resourceclaim"))
        return _queues_idle(registry) and len(seen) > 1 and seen[-1] == seen[-2]

    eventually(settled)
    before = _adds_of(registry, "resourceclaim")
    for i in range(5):
        obj = client.get(res.COMPUTE_DOMAINS, "cd1", namespace="team")
        obj.setdefault("metadata", {}).setdefault("annotations", {})["test/touch"] = str(i)
        client.update(res.COMPUTE_DOMAINS, obj)
    eventually(
        lambda: (
            (manager.caches.compute_domains.get_by_key("team/cd1") or {})
            .get("metadata", {})
            .get("annotations", {})
            .get("test/touch")
            == "4"
        )
    )
    eventually(lambda: _queues_idle(registry))
    assert _adds_of(registry, "resourceclaim") == before
    client.delete(res.COMPUTE_DOMAINS, "cd1", namespace="team")
    eventually(lambda: _adds_of(registry, "resourceclaim") >= before + 3)


def test_a_new_term_leaves_claims_allocated_before_it_to_the_plugin(
    server: FakeApiServer, manager: ControllerManager
) -> None:
    """A claim allocated before the manager started may be one whose pod the plugin already
    unprepared (label removed while the pod terminates): the new term must not label its node
    again. A claim allocated after the start labels its node."""
    uid = str(server.seed(res.COMPUTE_DOMAINS, compute_domain())["metadata"]["uid"])
    server.seed(res.NODES, node("a"))
    server.seed(res.NODES, node("b"))
    server.seed(res.RESOURCE_CLAIMS, channel_claim("w0", ns="team", uid=uid, node_name="a"))
    assert manager.start(sync_timeout=10)

    def label(name: str) -> str | None:
        obj = next(o for o in server.objects(res.NODES) if o["metadata"]["name"] == name)
        return (obj["metadata"].get("labels") or {}).get(c.COMPUTE_DOMAIN_LABEL)

    server.seed(res.RESOURCE_CLAIMS, channel_claim("w1", ns="team", uid=uid, node_name="b"))
    eventually(lambda: label("b") == uid)
    eventually(lambda: len(server.objects(res.DAEMONSETS)) == 1)
    assert label("a") is None
