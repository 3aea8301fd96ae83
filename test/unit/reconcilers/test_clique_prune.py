"""CliquePruneReconciler: stale daemons[] entries are removed, live or restarting ones never."""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

import pytest
from cdctl_fakes import (  # type: ignore[import-not-found, unused-ignore]
    DRIVER_NS,
    RecordedEvents,
    clique,
    daemon_entry,
    daemon_pod,
    node,
)

from pkg.base.clock import RealClock
from pkg.base.types import JSON
from pkg.informers import SharedInformerFactory
from pkg.kube import resources as res
from pkg.kube.client import RestClient
from pkg.kube.errors import ConflictError
from pkg.kubeletplugin.computedomains import DomainTracker
from pkg.reconcilers.cache import Caches
from pkg.reconcilers.cliqueprune import CliquePruneReconciler
from pkg.reconcilers.config import ControllerConfig
from pkg.testing.clock import FakeClock
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer

UID = "cd-uid-1"
OTHER_UID = "cd-uid-2"
KEY = f"{DRIVER_NS}/{UID}.cl.1"


def make(
    client: Any, caches: Caches, config: ControllerConfig, events: RecordedEvents, clock: FakeClock
) -> CliquePruneReconciler:
    return CliquePruneReconciler(
        client=client, caches=caches, config=config, events=events, clock=clock
    )


@pytest.fixture
def prune(
    client: RestClient,
    caches: Caches,
    config: ControllerConfig,
    events: RecordedEvents,
    clock: FakeClock,
) -> CliquePruneReconciler:
    return make(client, caches, config, events, clock)


def nodes_in_clique(server: FakeApiServer) -> list[str]:
    [obj] = server.objects(res.COMPUTE_DOMAIN_CLIQUES)
    return [d["nodeName"] for d in obj.get("daemons") or []]


def seed_clique(server: FakeApiServer, *nodes: str) -> None:
    entries = [daemon_entry(n, index=i) for i, n in enumerate(nodes)]
    server.seed(res.COMPUTE_DOMAIN_CLIQUES, clique(UID, "cl.1", entries))


def puts(server: FakeApiServer) -> list[str]:
    return [p for m, p in server.request_log if m == "PUT"]


def test_entry_of_a_vanished_daemon_is_pruned_after_the_grace_period(
    server: FakeApiServer, prune: CliquePruneReconciler, clock: FakeClock, events: RecordedEvents
) -> None:
    seed_clique(server, "a", "b")
    server.seed(res.PODS, daemon_pod(UID, "a"))
    # Daemon b was SIGKILLed and its pod deleted: nothing replaces it.
    result = prune.reconcile(KEY)
    assert result.requeue_after == pytest.approx(30.0)  # re-check when the grace ends
    assert nodes_in_clique(server) == ["a", "b"]
    clock.step(29.0)
    assert prune.reconcile(KEY).requeue_after == pytest.approx(1.0)
    assert nodes_in_clique(server) == ["a", "b"]
    clock.step(1.0)
    assert prune.reconcile(KEY).requeue_after == 0
    assert nodes_in_clique(server) == ["a"]
    [obj] = server.objects(res.COMPUTE_DOMAIN_CLIQUES)
    assert obj["daemons"] == [daemon_entry("a", index=0)]  # the survivor is untouched
    assert puts(server) == [
        f"/apis/resource.nvidia.com/v1beta1/namespaces/{DRIVER_NS}/computedomaincliques/{UID}.cl.1"
    ]
    assert "StaleDaemonRemoved" in events.reasons()
    # Nothing left to do: no write, no re-check.
    assert prune.reconcile(KEY).requeue_after == 0
    assert len(puts(server)) == 1


def test_entry_with_a_daemon_pod_is_never_removed_even_if_not_ready(
    server: FakeApiServer, prune: CliquePruneReconciler, clock: FakeClock
) -> None:
    seed_clique(server, "a")
    server.seed(res.PODS, daemon_pod(UID, "a", ready=False))
    for _ in range(5):
        assert prune.reconcile(KEY).requeue_after == 0
        clock.step(3600.0)
    failed = daemon_pod(UID, "a")
    failed["status"]["phase"] = "Failed"
    server.seed(res.PODS, failed)
    clock.step(3600.0)
    assert prune.reconcile(KEY).requeue_after == 0
    assert nodes_in_clique(server) == ["a"]
    assert puts(server) == []


def test_a_daemon_pod_of_another_domain_does_not_keep_the_entry(
    server: FakeApiServer, prune: CliquePruneReconciler, clock: FakeClock
) -> None:
    """Unlike upstream, which keeps the entry while any domain's daemon runs on the node."""
    seed_clique(server, "a")
    other = daemon_pod(OTHER_UID, "a")
    other["metadata"]["name"] = "other-daemon-a"
    server.seed(res.PODS, other)
    prune.reconcile(KEY)
    clock.step(30.0)
    prune.reconcile(KEY)
    assert nodes_in_clique(server) == []


def test_daemon_restarted_by_its_daemonset_keeps_its_entry(
    server: FakeApiServer, client: RestClient, prune: CliquePruneReconciler, clock: FakeClock
) -> None:
    seed_clique(server, "a", "b")
    server.seed(res.PODS, daemon_pod(UID, "a"))
    server.seed(res.PODS, daemon_pod(UID, "b"))
    assert prune.reconcile(KEY).requeue_after == 0
    client.delete(res.PODS, "daemon-b", namespace=DRIVER_NS)  # pod deleted ...
    assert prune.reconcile(KEY).requeue_after == pytest.approx(30.0)
    clock.step(20.0)
    server.seed(res.PODS, daemon_pod(UID, "b"))  # ... and recreated by the DaemonSet
    assert prune.reconcile(KEY).requeue_after == 0
    # A second restart later starts a fresh grace period, not the old one.
    clock.step(15.0)
    client.delete(res.PODS, "daemon-b", namespace=DRIVER_NS)
    assert prune.reconcile(KEY).requeue_after == pytest.approx(30.0)
    clock.step(29.0)
    prune.reconcile(KEY)
    assert nodes_in_clique(server) == ["a", "b"]
    assert puts(server) == []


def test_terminating_pod_counts_only_after_its_own_termination_grace(
    server: FakeApiServer, client: RestClient, prune: CliquePruneReconciler, clock: FakeClock
) -> None:
    """A pod stuck terminating (lost node) stops protecting its entry, but only late."""
    seed_clique(server, "a")
    pod = daemon_pod(UID, "a")
    pod["metadata"]["finalizers"] = ["test/hold"]
    server.seed(res.PODS, pod)
    client.delete(res.PODS, "daemon-a", namespace=DRIVER_NS)
    stuck = copy.deepcopy(server.objects(res.PODS)[0])
    stuck["metadata"]["deletionGracePeriodSeconds"] = 30
    server.seed(res.PODS, stuck)
    assert server.objects(res.PODS)[0]["metadata"]["deletionTimestamp"]
    assert prune.reconcile(KEY).requeue_after == pytest.approx(60.0)
    clock.step(59.0)
    prune.reconcile(KEY)
    assert nodes_in_clique(server) == ["a"]
    clock.step(1.0)
    prune.reconcile(KEY)
    assert nodes_in_clique(server) == []


class RacingClient:
    """Delegates to a RestClient; before the first clique PUT, a daemon writes the clique."""

    def __init__(self, inner: RestClient, race: Any) -> None:
        self._inner = inner
        self._race = race
        self.raced = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def update(self, resource: Any, obj: JSON, **kw: Any) -> JSON:
        if resource == res.COMPUTE_DOMAIN_CLIQUES and not self.raced:
            self.raced = True
            self._race()
        return self._inner.update(resource, obj, **kw)


def test_conflict_rereads_and_removes_only_the_entries_judged_stale(
    server: FakeApiServer,
    client: RestClient,
    caches: Caches,
    config: ControllerConfig,
    events: RecordedEvents,
    clock: FakeClock,
) -> None:
    seed_clique(server, "a", "b", "c")
    server.seed(res.PODS, daemon_pod(UID, "a"))

    def daemon_writes() -> None:
        # Meanwhile: a new daemon on b re-registered with a new IP, and d joined.
        [obj] = server.objects(res.COMPUTE_DOMAIN_CLIQUES)
        obj["daemons"][1]["ipAddress"] = "10.9.9.9"
        obj["daemons"].append(daemon_entry("d", index=3))
        client.update(res.COMPUTE_DOMAIN_CLIQUES, obj)

    racing = RacingClient(client, daemon_writes)
    prune = make(racing, caches, config, events, clock)
    prune.reconcile(KEY)
    clock.step(30.0)
    prune.reconcile(KEY)
    assert racing.raced
    # b's new registration and d survive; only c's entry, unchanged since judged, is gone.
    [obj] = server.objects(res.COMPUTE_DOMAIN_CLIQUES)
    assert [(d["nodeName"], d["ipAddress"]) for d in obj["daemons"]] == [
        ("a", "10.1.0.1"),
        ("b", "10.9.9.9"),
        ("d", "10.1.0.4"),
    ]
    assert len(puts(server)) == 3  # the racing write, our 409, our retry
    assert any(  # the fresh read: a LIST by name (the Role grants no "get")
        r.method == "GET" and r.query.get("fieldSelector") == f"metadata.name={UID}.cl.1"
        for r in server.requests
    )
    # The re-registered b entry gets a fresh grace period of its own.
    assert prune.reconcile(KEY).requeue_after == pytest.approx(30.0)


def test_persistent_conflicts_raise_for_a_rate_limited_retry(
    server: FakeApiServer, prune: CliquePruneReconciler, clock: FakeClock
) -> None:
    seed_clique(server, "a")
    prune.reconcile(KEY)
    clock.step(30.0)
    server.inject_error("PUT", res.COMPUTE_DOMAIN_CLIQUES, 409, count=10)
    with pytest.raises(ConflictError):
        prune.reconcile(KEY)
    assert nodes_in_clique(server) == ["a"]


def test_deleted_clique_forgets_its_timers(
    server: FakeApiServer, client: RestClient, prune: CliquePruneReconciler, clock: FakeClock
) -> None:
    seed_clique(server, "a")
    prune.reconcile(KEY)
    client.delete(res.COMPUTE_DOMAIN_CLIQUES, f"{UID}.cl.1", namespace=DRIVER_NS)
    assert prune.reconcile(KEY).requeue_after == 0
    assert prune._absent_since == {}
    # Recreated later: the grace period starts over.
    clock.step(100.0)
    seed_clique(server, "a")
    assert prune.reconcile(KEY).requeue_after == pytest.approx(30.0)


def test_pod_events_map_to_the_cliques_of_its_domain(
    server: FakeApiServer, prune: CliquePruneReconciler
) -> None:
    seed_clique(server, "a")
    server.seed(res.COMPUTE_DOMAIN_CLIQUES, clique(OTHER_UID, "cl.1", []))
    assert prune.keys_for_pod(daemon_pod(UID, "a")) == [KEY]
    assert prune.keys_for_pod({"metadata": {"labels": {}}}) == []


def entries_by_node(server: FakeApiServer) -> dict[str, str]:
    [obj] = server.objects(res.COMPUTE_DOMAIN_CLIQUES)
    return {d["nodeName"]: d["status"] for d in obj.get("daemons") or []}


def test_ready_entry_of_a_dead_daemon_container_turns_not_ready_at_once(
    server: FakeApiServer,
    client: RestClient,
    prune: CliquePruneReconciler,
    events: RecordedEvents,
) -> None:
    """SIGKILL or OOM kill: the container is terminated (or waiting to restart) while the
    pod, and so the entry, stays; nobody else would take the entry's Ready back."""
    seed_clique(server, "a", "b")
    server.seed(res.PODS, daemon_pod(UID, "a", container="running"))
    server.seed(res.PODS, daemon_pod(UID, "b", container="terminated"))
    assert prune.reconcile(KEY).requeue_after == 0
    assert entries_by_node(server) == {"a": "Ready", "b": "NotReady"}
    assert events.items[-1][:3] == ("daemon-b", "Warning", "DaemonNotRunning")
    # Waiting in CrashLoopBackOff: nothing more to write (only the daemon sets Ready again).
    client.update(res.PODS, daemon_pod(UID, "b", container="waiting"), subresource="status")
    server.clear_log()
    prune.reconcile(KEY)
    assert puts(server) == []
    # The restarted daemon is Ready again and says so: the controller leaves that alone.
    client.update(res.PODS, daemon_pod(UID, "b", container="running"), subresource="status")
    [obj] = server.objects(res.COMPUTE_DOMAIN_CLIQUES)
    obj["daemons"][1]["status"] = "Ready"
    client.update(res.COMPUTE_DOMAIN_CLIQUES, obj)
    server.clear_log()
    prune.reconcile(KEY)
    assert puts(server) == [] and entries_by_node(server) == {"a": "Ready", "b": "Ready"}


def test_entry_of_a_lost_node_is_removed_after_the_node_loss_grace(
    server: FakeApiServer,
    client: RestClient,
    prune: CliquePruneReconciler,
    clock: FakeClock,
    events: RecordedEvents,
) -> None:
    """The daemon pod stays bound to a dead node (it tolerates every taint); the entry does
    not stay in the clique."""
    seed_clique(server, "a", "b")
    for n in ("a", "b"):
        server.seed(res.PODS, daemon_pod(UID, n))
    server.seed(res.NODES, node("a"))
    server.seed(
        res.NODES,
        node(
            "b",
            ready="Unknown",
            since=clock.now() - 20,
            taints=[{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}],
        ),
    )
    assert prune.keys_for_node(node("b")) == [KEY]
    assert prune.reconcile(KEY).requeue_after == pytest.approx(40.0)
    assert nodes_in_clique(server) == ["a", "b"]
    clock.step(40.0)
    assert prune.reconcile(KEY).requeue_after == 0
    assert nodes_in_clique(server) == ["a"]
    assert events.items[-1][2] == "NodeLost" and "b (10.1.0.2, index 1)" in events.items[-1][3]
    # A daemon still alive on the node (its kubelet died) re-adds itself: removed again, but
    # only a clique-entry grace period later, so the two never race.
    [obj] = server.objects(res.COMPUTE_DOMAIN_CLIQUES)
    obj["daemons"].append(daemon_entry("b", index=1))
    client.update(res.COMPUTE_DOMAIN_CLIQUES, obj)
    assert prune.reconcile(KEY).requeue_after == pytest.approx(30.0)
    assert nodes_in_clique(server) == ["a", "b"]
    clock.step(30.0)
    prune.reconcile(KEY)
    assert nodes_in_clique(server) == ["a"]
    # The node comes back (Ready, untainted): its daemon's entry is left alone again.
    server.seed(res.NODES, node("b"))
    client.update(res.NODES, node("b"), subresource="status")
    [obj] = server.objects(res.COMPUTE_DOMAIN_CLIQUES)
    obj["daemons"].append(daemon_entry("b", index=1))
    client.update(res.COMPUTE_DOMAIN_CLIQUES, obj)
    assert prune.reconcile(KEY).requeue_after == 0
    assert nodes_in_clique(server) == ["a", "b"]


def test_the_plugin_holds_channel_prepares_while_the_entry_is_marked_not_ready(
    server: FakeApiServer, client: RestClient, prune: CliquePruneReconciler
) -> None:
    """The plugin releases a workload only on a Ready entry (DomainTracker.wait_ready, which
    Prepare waits on): once the controller takes Ready back from a dead daemon, a Prepare on
    that node waits until the restarted daemon is Ready again."""
    seed_clique(server, "b")
    server.seed(res.PODS, daemon_pod(UID, "b", container="terminated"))
    informers = SharedInformerFactory(client, clock=RealClock())
    tracker = DomainTracker(
        client=client,
        informers=informers,
        node_name="b",
        driver_namespace=DRIVER_NS,
        clique_id=lambda: "cl.1",
        clock=RealClock(),
    )
    tracker.start()
    try:
        assert tracker.wait_synced(5)
        assert tracker.wait_ready(UID, deadline=time.monotonic() + 5)  # stale Ready
        prune.reconcile(KEY)
        assert entries_by_node(server) == {"b": "NotReady"}
        eventually(lambda: not tracker.is_ready(UID), 5)  # the plugin's watch catches up
        assert not tracker.wait_ready(UID, deadline=time.monotonic() + 0.3)  # held
        released = threading.Event()

        def prepare() -> None:
            if tracker.wait_ready(UID, deadline=time.monotonic() + 10):
                released.set()

        waiter = threading.Thread(target=prepare)
        waiter.start()
        [obj] = server.objects(res.COMPUTE_DOMAIN_CLIQUES)
        obj["daemons"][0]["status"] = "Ready"  # the restarted daemon's IMEX is up
        client.update(res.COMPUTE_DOMAIN_CLIQUES, obj)
        waiter.join(10)
        assert released.is_set()
    finally:
        tracker.stop()
        informers.shutdown()
