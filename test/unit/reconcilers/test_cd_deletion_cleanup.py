"""Ordered deletion of a ComputeDomain and the orphan sweep."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace

import pytest
from cdctl_fakes import (  # type: ignore[import-not-found, unused-ignore]
    DRIVER_NS,
    LaggingCache,
    RecordedEvents,
    channel_claim,
    compute_domain,
    daemon_pod,
    node,
)
from prometheus_client import CollectorRegistry

from pkg.api import constants as c
from pkg.kube import resources as res
from pkg.kube.client import RestClient
from pkg.reconcilers.cache import Caches
from pkg.reconcilers.cleanup import OrphanCleaner
from pkg.reconcilers.computedomain import ComputeDomainReconciler
from pkg.reconcilers.config import ControllerConfig
from pkg.testing.clock import FakeClock
from pkg.testing.fakeapiserver import FakeApiServer


def names(server: FakeApiServer, resource: res.Resource) -> list[str]:
    return sorted(o["metadata"]["name"] for o in server.objects(resource))


def setup_domain(
    server: FakeApiServer, reconciler: ComputeDomainReconciler, *, node_ready: str = "True"
) -> str:
    uid = str(server.seed(res.COMPUTE_DOMAINS, compute_domain())["metadata"]["uid"])
    reconciler.reconcile("team/cd1")  # workload template and finalizer
    reconciler.reconcile("team/cd1")
    server.seed(res.NODES, node("a", ready=node_ready, labels={c.COMPUTE_DOMAIN_LABEL: uid}))
    server.seed(res.PODS, daemon_pod(uid, "a", clique=""))
    reconciler.reconcile("team/cd1")
    return uid


def test_finalizer_is_removed_only_after_daemon_pods_are_gone(
    server: FakeApiServer,
    client: RestClient,
    reconciler: ComputeDomainReconciler,
    events: RecordedEvents,
    registry: CollectorRegistry,
) -> None:
    uid = setup_domain(server, reconciler)
    assert registry.get_sample_value("nvidia_dra_compute_domain_info", {"status": "Ready"}) == 1
    client.delete(res.COMPUTE_DOMAINS, "cd1", namespace="team")
    result = reconciler.reconcile("team/cd1")
    assert result.requeue_after > 0
    # Workload RCT, node label and DaemonSet are gone; the CD and the daemon RCT wait.
    assert names(server, res.RESOURCE_CLAIM_TEMPLATES) == [f"computedomain-daemon-{uid}"]
    assert names(server, res.DAEMONSETS) == []
    (a,) = server.objects(res.NODES)
    assert c.COMPUTE_DOMAIN_LABEL not in a["metadata"]["labels"]
    (cd,) = server.objects(res.COMPUTE_DOMAINS)
    assert cd["metadata"]["finalizers"] == [c.FINALIZER]
    assert "daemon pod" in events.items[-1][3]
    reconciler.reconcile("team/cd1")
    assert len(server.objects(res.COMPUTE_DOMAINS)) == 1
    client.delete(res.PODS, "daemon-a", namespace=DRIVER_NS)
    assert reconciler.reconcile("team/cd1").requeue_after == 0
    assert names(server, res.RESOURCE_CLAIM_TEMPLATES) == []
    assert server.objects(res.COMPUTE_DOMAINS) == []
    assert registry.get_sample_value("nvidia_dra_compute_domain_info", {"status": "Ready"}) == 0


def test_pods_on_unreachable_nodes_do_not_block_deletion(
    server: FakeApiServer, client: RestClient, reconciler: ComputeDomainReconciler
) -> None:
    setup_domain(server, reconciler, node_ready="Unknown")
    client.delete(res.COMPUTE_DOMAINS, "cd1", namespace="team")
    reconciler.reconcile("team/cd1")
    assert server.objects(res.COMPUTE_DOMAINS) == []


def test_upstream_finalizers_on_dependents_are_stripped(
    server: FakeApiServer, client: RestClient, reconciler: ComputeDomainReconciler
) -> None:
    uid = str(server.seed(res.COMPUTE_DOMAINS, compute_domain())["metadata"]["uid"])
    reconciler.reconcile("team/cd1")  # workload template and finalizer
    server.seed(res.RESOURCE_CLAIMS, channel_claim("w0", ns="team", uid=uid, node_name="a"))
    reconciler.reconcile("team/cd1")
    assert len(server.objects(res.DAEMONSETS)) == 1
    for resource in (res.DAEMONSETS, res.RESOURCE_CLAIM_TEMPLATES):
        for obj in server.objects(resource):
            obj["metadata"]["finalizers"] = [c.FINALIZER]
            server.seed(resource, obj)
    client.delete(res.COMPUTE_DOMAINS, "cd1", namespace="team")
    reconciler.reconcile("team/cd1")
    reconciler.reconcile("team/cd1")
    assert server.objects(res.DAEMONSETS) == []
    assert server.objects(res.RESOURCE_CLAIM_TEMPLATES) == []
    assert server.objects(res.COMPUTE_DOMAINS) == []
    assert uid


def test_domain_without_daemons_is_finalized_in_one_pass_though_the_cache_lags(
    server: FakeApiServer,
    client: RestClient,
    caches: Caches,
    config: ControllerConfig,
    events: RecordedEvents,
    clock: FakeClock,
    registry: CollectorRegistry,
    make_reconciler: Callable[..., ComputeDomainReconciler],
) -> None:
    rcts = LaggingCache(caches.rcts, "rcts")  # type: ignore[arg-type, unused-ignore]
    daemonsets = LaggingCache(caches.daemonsets, "daemonsets")  # type: ignore[arg-type, unused-ignore]
    reconciler = make_reconciler(caches=replace(caches, rcts=rcts, daemonsets=daemonsets))
    uid = server.seed(res.COMPUTE_DOMAINS, compute_domain())["metadata"]["uid"]
    server.seed(res.RESOURCE_CLAIMS, channel_claim("w0", ns="team", uid=uid, node_name="a"))
    reconciler.reconcile("team/cd1")
    reconciler.reconcile("team/cd1")
    assert len(server.objects(res.DAEMONSETS)) == 1
    rcts.freeze()  # the informers will still show every dependent after its DELETE
    daemonsets.freeze()
    client.delete(res.COMPUTE_DOMAINS, "cd1", namespace="team")
    events.items.clear()
    # Every DELETE answered "gone" (no finalizers left): nothing is pending, so the finalizer
    # goes in the same pass: no WaitingForDependents Event, no recheck.
    assert reconciler.reconcile("team/cd1").requeue_after == 0
    assert server.objects(res.COMPUTE_DOMAINS) == []
    assert server.objects(res.RESOURCE_CLAIM_TEMPLATES) == []
    assert server.objects(res.DAEMONSETS) == []
    assert events.reasons() == []


def test_deleted_domain_without_our_finalizer_is_ignored(
    server: FakeApiServer, reconciler: ComputeDomainReconciler
) -> None:
    obj = compute_domain()
    obj["metadata"]["finalizers"] = ["someone.else/keep"]
    server.seed(res.COMPUTE_DOMAINS, obj)
    server.objects(res.COMPUTE_DOMAINS)
    server.store.delete(res.COMPUTE_DOMAINS, "team", "cd1")
    server.clear_log()
    reconciler.reconcile("team/cd1")
    assert [m for m, _ in server.request_log if m != "GET"] == []


@pytest.fixture
def cleaner(
    client: RestClient,
    caches: Caches,
    config: ControllerConfig,
    events: RecordedEvents,
    clock: FakeClock,
) -> OrphanCleaner:
    return OrphanCleaner(client=client, caches=caches, config=config, events=events, clock=clock)


def orphan_objects(server: FakeApiServer, uid: str) -> None:
    labels = {c.COMPUTE_DOMAIN_LABEL: uid}
    server.seed(
        res.DAEMONSETS,
        {
            "metadata": {
                "name": f"computedomain-daemon-{uid}",
                "namespace": DRIVER_NS,
                "labels": labels,
            },
            "spec": {},
        },
    )
    server.seed(
        res.RESOURCE_CLAIM_TEMPLATES,
        {
            "metadata": {
                "name": "chan",
                "namespace": "team",
                "labels": {**labels, c.TARGET_LABEL: c.TARGET_WORKLOAD},
                "finalizers": [c.FINALIZER],
            },
            "spec": {"spec": {}},
        },
    )
    server.seed(res.NODES, node(f"n-{uid}", labels=labels))


def test_orphan_sweep_removes_what_dead_domains_left(
    server: FakeApiServer, cleaner: OrphanCleaner, reconciler: ComputeDomainReconciler
) -> None:
    live = setup_domain(server, reconciler)
    orphan_objects(server, "dead-uid")
    assert cleaner.sweep() == 3
    assert names(server, res.DAEMONSETS) == [f"computedomain-daemon-{live}"]
    assert sorted(
        o["metadata"]["labels"].get(c.COMPUTE_DOMAIN_LABEL, "") for o in server.objects(res.NODES)
    ) == ["", live]
    assert all(
        o["metadata"]["labels"][c.COMPUTE_DOMAIN_LABEL] == live
        for o in server.objects(res.RESOURCE_CLAIM_TEMPLATES)
    )
    assert cleaner.sweep() == 0


def test_orphan_sweep_confirms_with_the_api_before_deleting(
    server: FakeApiServer, caches: Caches, cleaner: OrphanCleaner
) -> None:
    uid = str(server.seed(res.COMPUTE_DOMAINS, compute_domain())["metadata"]["uid"])
    orphan_objects(server, uid)
    caches.compute_domains.hidden.add("team/cd1")  # type: ignore[attr-defined]
    assert cleaner.sweep() == 0
    assert len(server.objects(res.DAEMONSETS)) == 1


def test_orphan_sweep_runs_periodically_when_a_backstop_interval_is_set(
    server: FakeApiServer,
    caches: Caches,
    config: ControllerConfig,
    events: RecordedEvents,
    clock: FakeClock,
) -> None:
    cleaner = OrphanCleaner(
        client=server.client(),
        caches=caches,
        events=events,
        clock=clock,
        config=replace(config, cleanup_interval=600.0),
    )
    stop = threading.Event()
    calls: list[float] = []
    real = cleaner.sweep

    def sweep() -> int:
        calls.append(clock.monotonic())
        if len(calls) == 3:
            stop.set()
        return real()

    cleaner.sweep = sweep  # type: ignore[method-assign]
    cleaner.run(stop)
    assert calls == [0.0, 600.0, 1200.0]


def test_orphan_sweep_survives_an_api_server_outage(
    server: FakeApiServer, cleaner: OrphanCleaner, clock: FakeClock
) -> None:
    """A sweep that meets a dead API server fails (logged); the loop waits its interval and
    the next sweep does the work."""
    orphan_objects(server, "dead-uid")
    stop = threading.Event()
    real = cleaner.sweep
    done: list[int] = []

    def sweep() -> int:
        server.set_available(bool(done))  # the first sweep finds the server down
        try:
            done.append(real())
        except Exception:
            done.append(-1)
            raise
        if len(done) == 2:
            stop.set()
        return done[-1]

    cleaner.sweep = sweep  # type: ignore[method-assign]
    cleaner.run(stop)
    assert done == [-1, 3]
    assert server.objects(res.DAEMONSETS) == []


def test_idle_cleaner_does_no_periodic_work_and_sweeps_when_poked(
    server: FakeApiServer, cleaner: OrphanCleaner, clock: FakeClock
) -> None:
    """Default (no backstop interval): one sweep at start, then only when poked."""
    stop = threading.Event()
    calls: list[float] = []
    real = cleaner.sweep
    swept = threading.Semaphore(0)

    def sweep() -> int:
        calls.append(clock.monotonic())
        swept.release()
        return real()

    cleaner.sweep = sweep  # type: ignore[method-assign]
    thread = threading.Thread(target=cleaner.run, args=(stop,), daemon=True)
    thread.start()
    assert swept.acquire(timeout=10)
    thread.join(0.3)  # an idle cleaner blocks: no time passes, no further sweep
    assert thread.is_alive() and len(calls) == 1 and clock.monotonic() == 0.0
    orphan_objects(server, "dead-uid")
    cleaner.poke()
    assert swept.acquire(timeout=10)
    stop.set()
    cleaner.poke()
    thread.join(10)
    assert not thread.is_alive() and len(calls) == 2
    assert server.objects(res.DAEMONSETS) == []


def test_maybe_orphan_pokes_only_for_unknown_domains(
    server: FakeApiServer, cleaner: OrphanCleaner, caches: Caches
) -> None:
    assert not cleaner.maybe_orphan({"metadata": {"name": "x"}})
    assert cleaner.maybe_orphan(
        {"metadata": {"name": "x", "labels": {c.COMPUTE_DOMAIN_LABEL: "nope"}}}
    )


def test_a_labelled_template_in_another_namespace_neither_blocks_nor_is_touched(
    server: FakeApiServer, client: RestClient, reconciler: ComputeDomainReconciler
) -> None:
    """A tenant labels a template of her own namespace with another tenant's domain UID and
    gives it a finalizer nobody removes: the victim's domain still finishes deleting, and the
    controller leaves her object alone (the label proves nothing)."""
    uid = setup_domain(server, reconciler)
    forged = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": "forged",
            "namespace": "rival",
            "labels": {c.COMPUTE_DOMAIN_LABEL: uid},
            "finalizers": ["example.com/hold"],
        },
        "spec": {"spec": {"devices": {"requests": []}}},
    }
    server.seed(res.RESOURCE_CLAIM_TEMPLATES, forged)
    client.delete(res.COMPUTE_DOMAINS, "cd1", namespace="team")
    client.delete(res.PODS, "daemon-a", namespace=DRIVER_NS)
    for _ in range(3):
        reconciler.reconcile("team/cd1")
    assert server.objects(res.COMPUTE_DOMAINS) == []
    [left] = server.objects(res.RESOURCE_CLAIM_TEMPLATES)
    assert left["metadata"]["name"] == "forged"
    assert "deletionTimestamp" not in left["metadata"]
