"""ComputeDomainReconciler against the fake API server: create, adopt, status, delete, errors."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from cdctl_fakes import (  # type: ignore[import-not-found, unused-ignore]
    DRIVER_NS,
    LaggingCache,
    RecordedEvents,
    channel_claim,
    clique,
    compute_domain,
    daemon_entry,
    daemon_pod,
    node,
    resource_slice,
)
from prometheus_client import CollectorRegistry

from pkg.api import constants as c
from pkg.base.types import JSON
from pkg.kube import resources as res
from pkg.kube.client import RestClient
from pkg.kube.errors import ConflictError
from pkg.reconcilers.cache import Caches
from pkg.reconcilers.computedomain import ComputeDomainReconciler
from pkg.reconcilers.config import ControllerConfig
from pkg.reconcilers.controller import TerminalError
from pkg.reconcilers.metrics import DomainMetrics
from pkg.testing.clock import FakeClock
from pkg.testing.fakeapiserver import FakeApiServer


def get_cd(server: FakeApiServer, name: str = "cd1") -> JSON:
    return next(o for o in server.objects(res.COMPUTE_DOMAINS) if o["metadata"]["name"] == name)


def ready_condition(cd: JSON) -> JSON:
    return next(x for x in cd["status"]["conditions"] if x["type"] == "Ready")


def writes(server: FakeApiServer) -> list[tuple[str, str]]:
    return [(m, p) for m, p in server.request_log if m in ("POST", "PUT", "PATCH", "DELETE")]


def allocate_a_claim(server: FakeApiServer, uid: str) -> None:
    """The scheduler allocated a channel claim of domain ``uid``: the domain is in use."""
    server.seed(res.RESOURCE_CLAIMS, channel_claim("w0", ns="team", uid=uid, node_name="a"))


def created_domain(
    server: FakeApiServer,
    reconciler: ComputeDomainReconciler,
    *,
    in_use: bool = True,
    **spec: Any,
) -> str:
    """A new domain through both passes: the critical one (requeued) and the full one, with
    (``in_use``) a channel claim allocated in between."""
    uid = str(server.seed(res.COMPUTE_DOMAINS, compute_domain(**spec))["metadata"]["uid"])
    reconciler.reconcile("team/cd1")
    if in_use:
        allocate_a_claim(server, uid)
    reconciler.reconcile("team/cd1")
    return uid


def test_new_domain_gets_its_workload_template_first_then_the_rest(
    server: FakeApiServer, reconciler: ComputeDomainReconciler
) -> None:
    uid = server.seed(res.COMPUTE_DOMAINS, compute_domain())["metadata"]["uid"]
    allocate_a_claim(server, uid)
    server.clear_log()
    result = reconciler.reconcile("team/cd1")
    # Critical path first: the template that unblocks the user's pods, then the finalizer;
    # the daemon objects and the status wait for the requeued second pass.
    assert writes(server) == [
        ("POST", "/apis/resource.k8s.io/v1/namespaces/team/resourceclaimtemplates"),
        ("PUT", "/apis/resource.nvidia.com/v1beta1/namespaces/team/computedomains/cd1"),
    ]
    assert result.requeue_after == 0  # the finalizer's watch event brings the second pass
    assert server.objects(res.DAEMONSETS) == []
    assert "status" not in get_cd(server) or not get_cd(server)["status"]
    server.clear_log()
    assert reconciler.reconcile("team/cd1").requeue_after == 0
    assert [p.rsplit("/", 1)[-1] for _, p in writes(server)] == [
        "resourceclaimtemplates",
        "daemonsets",
        "status",
    ]


def test_creation_renders_every_dependent_and_reports_waiting(
    server: FakeApiServer, reconciler: ComputeDomainReconciler, events: RecordedEvents
) -> None:
    for name in ("a", "b"):  # two nodes could join: numNodes 2 is reachable
        server.seed(res.NODES, node(name))
        server.seed(res.RESOURCE_SLICES, resource_slice(name, clique_id="cl.1"))
    uid = created_domain(server, reconciler, numNodes=2)
    cd = get_cd(server)
    assert cd["metadata"]["finalizers"] == [c.FINALIZER]
    rcts = {
        (o["metadata"]["namespace"], o["metadata"]["name"]): o
        for o in server.objects(res.RESOURCE_CLAIM_TEMPLATES)
    }
    workload = rcts[("team", "cd1-channel")]
    assert workload["metadata"]["labels"] == {
        c.COMPUTE_DOMAIN_LABEL: uid,
        c.TARGET_LABEL: c.TARGET_WORKLOAD,
    }
    params = workload["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert params == {
        "apiVersion": c.API_VERSION,
        "kind": c.CHANNEL_CONFIG_KIND,
        "domainID": uid,
        "allocationMode": "Single",
    }
    assert (DRIVER_NS, f"computedomain-daemon-{uid}") in rcts
    (ds,) = server.objects(res.DAEMONSETS)
    assert ds["metadata"]["name"] == f"computedomain-daemon-{uid}"
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {c.COMPUTE_DOMAIN_LABEL: uid}
    assert cd["status"]["status"] == "NotReady"
    cond = ready_condition(cd)
    assert (cond["status"], cond["reason"], cond["observedGeneration"]) == (
        "False",
        "WaitingForNodes",
        cd["metadata"]["generation"],
    )
    assert cd["status"]["nodeCount"] == 0
    # no Normal Event at creation (as upstream): dependents are logged, status shows progress
    assert [i[2] for i in events.items if i[1] == "Normal"] == []


@pytest.mark.parametrize("use", ["claim", "node label"])
def test_daemon_objects_wait_until_the_domain_is_in_use(
    server: FakeApiServer, reconciler: ComputeDomainReconciler, use: str
) -> None:
    uid = created_domain(server, reconciler, in_use=False)
    assert get_cd(server)["status"]["status"] == "NotReady"
    assert [o["metadata"]["name"] for o in server.objects(res.RESOURCE_CLAIM_TEMPLATES)] == [
        "cd1-channel"
    ]
    assert server.objects(res.DAEMONSETS) == []
    server.clear_log()
    reconciler.reconcile("team/cd1")
    assert writes(server) == []  # not in use: nothing to do
    if use == "claim":  # the scheduler allocated a channel claim of the domain
        allocate_a_claim(server, uid)
    else:  # the kubelet plugin labelled a node at Prepare (claim not seen by this process)
        server.seed(res.NODES, node("a", labels={c.COMPUTE_DOMAIN_LABEL: uid}))
    reconciler.reconcile("team/cd1")
    (ds,) = server.objects(res.DAEMONSETS)
    assert ds["metadata"]["name"] == f"computedomain-daemon-{uid}"
    assert len(server.objects(res.RESOURCE_CLAIM_TEMPLATES)) == 2


def test_a_cache_behind_our_own_creates_costs_no_second_create(
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
    rcts.freeze()
    daemonsets.freeze()
    reconciler = make_reconciler(caches=replace(caches, rcts=rcts, daemonsets=daemonsets))
    uid = server.seed(res.COMPUTE_DOMAINS, compute_domain())["metadata"]["uid"]
    allocate_a_claim(server, uid)
    server.clear_log()
    for _ in range(3):
        reconciler.reconcile("team/cd1")
    creates = [p.rsplit("/", 1)[-1] for m, p in server.request_log if m == "POST"]
    assert creates == ["resourceclaimtemplates", "resourceclaimtemplates", "daemonsets"]
    assert [p for m, p in server.request_log if m == "GET"] == []  # no AlreadyExists GETs


def test_a_pass_before_the_cache_has_our_finalizer_write_waits_for_its_event(
    server: FakeApiServer,
    client: RestClient,
    caches: Caches,
    config: ControllerConfig,
    events: RecordedEvents,
    clock: FakeClock,
    registry: CollectorRegistry,
    make_reconciler: Callable[..., ComputeDomainReconciler],
) -> None:
    domains = LaggingCache(caches.compute_domains, "compute_domains")  # type: ignore[arg-type, unused-ignore]
    reconciler = make_reconciler(caches=replace(caches, compute_domains=domains))
    server.seed(res.COMPUTE_DOMAINS, compute_domain())
    domains.freeze()  # the informer will not deliver the finalizer write for a while
    reconciler.reconcile("team/cd1")
    server.clear_log()
    # e.g. the workload template's ADDED event came first: no stale PUT (a 409), no writes
    assert reconciler.reconcile("team/cd1").requeue_after == 0
    assert server.request_log == []
    domains.thaw()
    reconciler.reconcile("team/cd1")  # the finalizer's event: the second pass
    assert get_cd(server)["status"]["status"] == "NotReady"


def test_rereconcile_is_idempotent_and_writes_nothing(
    server: FakeApiServer, reconciler: ComputeDomainReconciler, events: RecordedEvents
) -> None:
    created_domain(server, reconciler)
    n_events = len(events.items)
    server.clear_log()
    for _ in range(3):
        reconciler.reconcile("team/cd1")
    assert writes(server) == []
    assert len(events.items) == n_events


def test_numnodes_zero_without_nodes_is_not_ready(
    server: FakeApiServer, reconciler: ComputeDomainReconciler
) -> None:
    created_domain(server, reconciler, numNodes=0)
    assert get_cd(server)["status"]["status"] == "NotReady"


def test_adopts_existing_dependents_of_the_same_domain(
    server: FakeApiServer, reconciler: ComputeDomainReconciler, events: RecordedEvents
) -> None:
    uid = created_domain(server, reconciler)
    server.seed(res.COMPUTE_DOMAINS, {**get_cd(server), "status": None})
    events.items.clear()
    server.clear_log()
    reconciler.reconcile("team/cd1")
    assert not any(m == "POST" and "resourceclaimtemplates" in p for m, p in writes(server))
    assert len(server.objects(res.DAEMONSETS)) == 1
    assert server.objects(res.DAEMONSETS)[0]["metadata"]["labels"][c.COMPUTE_DOMAIN_LABEL] == uid


def test_changed_config_updates_the_daemonset(
    server: FakeApiServer,
    client: RestClient,
    caches: Caches,
    config: ControllerConfig,
    events: RecordedEvents,
    clock: FakeClock,
    reconciler: ComputeDomainReconciler,
    make_reconciler: Callable[..., ComputeDomainReconciler],
) -> None:
    created_domain(server, reconciler)
    newer = make_reconciler(
        config=replace(config, image_name="registry.local/cd:2"),
        metrics=DomainMetrics(CollectorRegistry()),
    )
    newer.reconcile("team/cd1")
    (ds,) = server.objects(res.DAEMONSETS)
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.local/cd:2"
    assert "DaemonSetUpdated" in events.reasons()


def test_status_aggregates_cliques_and_non_fabric_pods(
    server: FakeApiServer,
    reconciler: ComputeDomainReconciler,
    events: RecordedEvents,
    registry: CollectorRegistry,
    clock: FakeClock,
) -> None:
    uid = created_domain(server, reconciler, numNodes=3)
    for n in ("a", "b", "c"):
        server.seed(res.NODES, node(n, labels={c.COMPUTE_DOMAIN_LABEL: uid}))
    server.seed(res.PODS, daemon_pod(uid, "a", clique="cl.1"))
    server.seed(res.PODS, daemon_pod(uid, "b", clique="cl.1"))
    server.seed(res.PODS, daemon_pod(uid, "c", clique="", ip="10.9.9.9"))
    server.seed(res.PODS, daemon_pod("other-uid", "z", clique="cl.1"))
    server.seed(
        res.COMPUTE_DOMAIN_CLIQUES,
        clique(
            uid,
            "cl.1",
            [
                daemon_entry("a", index=0),
                daemon_entry("b", index=1, status="NotReady"),
                daemon_entry("gone", index=2),  # stale: no daemon pod of this domain there
            ],
        ),
    )
    clock.step(42)
    reconciler.reconcile("team/cd1")
    status = get_cd(server)["status"]
    assert [(n["name"], n["status"], n["index"]) for n in status["nodes"]] == [
        ("a", "Ready", 0),
        ("b", "NotReady", 1),
        ("c", "Ready", -1),
    ]
    assert status["nodes"][2]["ipAddress"] == "10.9.9.9"
    assert (status["readyNodes"], status["nodeCount"], status["status"]) == (2, 3, "NotReady")
    assert ready_condition(get_cd(server))["reason"] == "DaemonsNotReady"
    assert events.reasons().count("NodeJoined") == 3
    # b's daemon turns Ready: the domain turns Ready with one event and one sample.
    server.seed(
        res.COMPUTE_DOMAIN_CLIQUES,
        clique(
            uid,
            "cl.1",
            [
                daemon_entry("a", index=0),
                daemon_entry("b", index=1),
            ],
        ),
    )
    reconciler.reconcile("team/cd1")
    cd = get_cd(server)
    assert cd["status"]["status"] == "Ready"
    assert ready_condition(cd)["reason"] == "AllNodesReady"
    assert events.reasons()[-2:] == ["NodeReady", "Ready"]
    assert registry.get_sample_value("nvidia_dra_compute_domain_info", {"status": "Ready"}) == 1
    ttr = "nvidia_dra_compute_domain_time_to_ready_seconds_count"
    assert registry.get_sample_value(ttr, {"namespace": "team"}) == 1


def test_node_loss_turns_entry_not_ready_with_reason(
    server: FakeApiServer, reconciler: ComputeDomainReconciler, events: RecordedEvents
) -> None:
    uid = created_domain(server, reconciler)
    for n in ("a", "b"):
        server.seed(res.NODES, node(n, labels={c.COMPUTE_DOMAIN_LABEL: uid}))
        server.seed(res.PODS, daemon_pod(uid, n, clique="cl.1"))
    server.seed(
        res.COMPUTE_DOMAIN_CLIQUES,
        clique(
            uid,
            "cl.1",
            [
                daemon_entry("a", index=0),
                daemon_entry("b", index=1),
            ],
        ),
    )
    reconciler.reconcile("team/cd1")
    assert get_cd(server)["status"]["status"] == "Ready"
    server.seed(
        res.NODES,
        node(
            "b",
            ready="Unknown",
            labels={c.COMPUTE_DOMAIN_LABEL: uid},
            taints=[{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}],
        ),
    )
    reconciler.reconcile("team/cd1")
    cd = get_cd(server)
    assert [n["status"] for n in cd["status"]["nodes"]] == ["Ready", "NotReady"]
    cond = ready_condition(cd)
    assert (cond["status"], cond["reason"]) == ("False", "NodeUnreachable")
    assert "b (NodeUnreachable)" in cond["message"]
    assert "NodeUnreachable" in events.reasons() and "NotReady" in events.reasons()


def test_invalid_spec_is_terminal_with_condition_and_event(
    server: FakeApiServer, reconciler: ComputeDomainReconciler, events: RecordedEvents
) -> None:
    server.seed(
        res.COMPUTE_DOMAINS,
        compute_domain(channel={"resourceClaimTemplate": {"name": "x"}, "allocationMode": "Bogus"}),
    )
    with pytest.raises(TerminalError):
        reconciler.reconcile("team/cd1")
    cd = get_cd(server)
    cond = ready_condition(cd)
    assert cond["reason"] == "InvalidSpec" and "spec.channel.allocationMode" in cond["message"]
    assert events.reasons() == ["InvalidSpec"]
    assert server.objects(res.DAEMONSETS) == []


def test_rct_name_clash_with_foreign_object_is_reported_not_touched(
    server: FakeApiServer, reconciler: ComputeDomainReconciler, events: RecordedEvents
) -> None:
    foreign = server.seed(
        res.RESOURCE_CLAIM_TEMPLATES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "cd1-channel", "namespace": "team"},
            "spec": {"spec": {}},
        },
    )
    created_domain(server, reconciler)
    assert reconciler.reconcile("team/cd1").requeue_after == 300.0  # slow recheck, no storm
    cond = ready_condition(get_cd(server))
    assert cond["reason"] == "ResourceClaimTemplateConflict"
    assert "spec.channel.resourceClaimTemplate.name" in cond["message"]
    assert "ResourceClaimTemplateConflict" in events.reasons()
    (rct,) = [
        o
        for o in server.objects(res.RESOURCE_CLAIM_TEMPLATES)
        if o["metadata"]["namespace"] == "team"
    ]
    assert rct["metadata"]["resourceVersion"] == foreign["metadata"]["resourceVersion"]


def test_missing_driver_namespace_is_reported_and_retried_slowly(
    server: FakeApiServer, reconciler: ComputeDomainReconciler, events: RecordedEvents
) -> None:
    uid = server.seed(res.COMPUTE_DOMAINS, compute_domain())["metadata"]["uid"]
    allocate_a_claim(server, uid)
    server.seed(
        res.RESOURCE_CLAIM_TEMPLATES,
        {
            "metadata": {
                "name": "cd1-channel",
                "namespace": "team",
                "labels": {c.COMPUTE_DOMAIN_LABEL: uid, c.TARGET_LABEL: c.TARGET_WORKLOAD},
            },
            "spec": {"spec": {}},
        },
    )
    reconciler.reconcile("team/cd1")  # adopts it, adds the finalizer
    server.inject_error("POST", res.RESOURCE_CLAIM_TEMPLATES, 404, count=1)
    result = reconciler.reconcile("team/cd1")
    assert result.requeue_after == 60.0
    assert ready_condition(get_cd(server))["reason"] == "DriverNamespaceUnavailable"
    assert "DriverNamespaceUnavailable" in events.reasons()
    assert reconciler.reconcile("team/cd1").requeue_after == 0  # namespace is back
    assert len(server.objects(res.DAEMONSETS)) == 1


def test_status_conflict_is_retried_on_a_fresh_read(
    server: FakeApiServer, reconciler: ComputeDomainReconciler
) -> None:
    server.seed(res.COMPUTE_DOMAINS, compute_domain())
    server.inject_error("PUT", res.COMPUTE_DOMAINS, 409, count=1, name="cd1")
    with pytest.raises(ConflictError):
        reconciler.reconcile("team/cd1")  # the finalizer PUT hits the 409: retried by the queue
    uid = get_cd(server)["metadata"]["uid"]
    reconciler.reconcile("team/cd1")
    reconciler.reconcile("team/cd1")
    server.seed(res.NODES, node("a", labels={c.COMPUTE_DOMAIN_LABEL: uid}))
    server.seed(res.PODS, daemon_pod(uid, "a", clique=""))
    server.inject_error("PUT", res.COMPUTE_DOMAINS, 409, count=1, name="cd1")
    reconciler.reconcile("team/cd1")  # status PUT: a 409, then a re-read and success
    assert get_cd(server)["status"]["status"] == "Ready"
    puts = [p for m, p in server.request_log if m == "PUT" and p.endswith("/status")]
    assert len(puts) == 3  # first status, the conflicting write, its retry


def test_many_concurrent_daemon_writers_never_lose_an_entry(
    server: FakeApiServer,
    client: RestClient,
    reconciler: ComputeDomainReconciler,
    clock: FakeClock,
) -> None:
    uid = created_domain(server, reconciler)
    n_nodes = c.DEFAULT_MAX_NODES_PER_IMEX_DOMAIN  # a full clique; a higher index is skipped
    name = c.clique_object_name(uid, "cl.1")
    server.seed(res.COMPUTE_DOMAIN_CLIQUES, clique(uid, "cl.1", []))
    for i in range(n_nodes):
        server.seed(res.NODES, node(f"n{i:02d}", labels={c.COMPUTE_DOMAIN_LABEL: uid}))
        server.seed(res.PODS, daemon_pod(uid, f"n{i:02d}", clique="cl.1"))

    def daemon(i: int) -> None:
        # What each daemon does: read-modify-write of its own entry with an RV precondition.
        while True:
            obj = client.get(res.COMPUTE_DOMAIN_CLIQUES, name, namespace=DRIVER_NS)
            obj["daemons"] = [*(obj.get("daemons") or []), daemon_entry(f"n{i:02d}", index=i)]
            try:
                client.update(res.COMPUTE_DOMAIN_CLIQUES, obj)
                return
            except ConflictError:
                continue

    stop = threading.Event()

    def aggregate() -> None:
        while not stop.is_set():
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
    clock.step(60)  # past the status coalescing interval: the last counts are written now
    reconciler.reconcile("team/cd1")
    status = get_cd(server)["status"]
    assert status["nodeCount"] == n_nodes and status["status"] == "Ready"


def test_upstream_daemonset_is_adopted_without_restarting_daemons(
    server: FakeApiServer, reconciler: ComputeDomainReconciler
) -> None:
    uid = str(server.seed(res.COMPUTE_DOMAINS, compute_domain())["metadata"]["uid"])
    upstream = server.seed(
        res.DAEMONSETS,
        {
            "metadata": {
                "name": f"computedomain-daemon-{uid}",
                "namespace": DRIVER_NS,
                "labels": {c.COMPUTE_DOMAIN_LABEL: uid},
            },
            "spec": {"template": {"spec": {"containers": [{"name": "old", "image": "upstream"}]}}},
        },
    )
    reconciler.reconcile("team/cd1")
    (ds,) = server.objects(res.DAEMONSETS)
    assert ds["metadata"]["resourceVersion"] == upstream["metadata"]["resourceVersion"]


def test_gauge_counts_domains_already_ready_at_startup(
    server: FakeApiServer,
    reconciler: ComputeDomainReconciler,
    registry: CollectorRegistry,
    client: RestClient,
    caches: Caches,
    config: ControllerConfig,
    events: RecordedEvents,
    clock: FakeClock,
    make_reconciler: Callable[..., ComputeDomainReconciler],
) -> None:
    uid = created_domain(server, reconciler)
    server.seed(res.NODES, node("a", labels={c.COMPUTE_DOMAIN_LABEL: uid}))
    server.seed(res.PODS, daemon_pod(uid, "a", clique=""))
    reconciler.reconcile("team/cd1")
    fresh_registry = CollectorRegistry()
    restarted = make_reconciler(metrics=DomainMetrics(fresh_registry))
    server.clear_log()
    restarted.reconcile("team/cd1")
    assert writes(server) == []
    labels = {"status": "Ready"}
    assert fresh_registry.get_sample_value("nvidia_dra_compute_domain_info", labels) == 1
    ttr = "nvidia_dra_compute_domain_time_to_ready_seconds_count"
    assert fresh_registry.get_sample_value(ttr, {"namespace": "team"}) is None


def test_lost_node_leaves_the_status_after_the_grace_and_the_reconcile_waits_for_it(
    server: FakeApiServer,
    reconciler: ComputeDomainReconciler,
    events: RecordedEvents,
    clock: FakeClock,
) -> None:
    uid = created_domain(server, reconciler)
    for n in ("a", "b"):
        server.seed(res.PODS, daemon_pod(uid, n, clique="cl.1"))
    server.seed(res.NODES, node("a"))
    # b stopped posting status 20 s ago; no computeDomain label needed to be judged.
    server.seed(res.NODES, node("b", ready="Unknown", since=clock.now() - 20))
    server.seed(
        res.COMPUTE_DOMAIN_CLIQUES,
        clique(
            uid,
            "cl.1",
            [
                daemon_entry("a", index=0),
                daemon_entry("b", index=1),
            ],
        ),
    )
    result = reconciler.reconcile("team/cd1")
    assert result.requeue_after == pytest.approx(40.0)  # config: node_loss_grace_period 60 s
    assert [(n["name"], n["status"]) for n in get_cd(server)["status"]["nodes"]] == [
        ("a", "Ready"),
        ("b", "NotReady"),
    ]
    clock.step(40.0)
    assert reconciler.reconcile("team/cd1").requeue_after == 0
    cd = get_cd(server)
    assert [n["name"] for n in cd["status"]["nodes"]] == ["a"]
    assert (cd["status"]["status"], ready_condition(cd)["reason"]) == ("Ready", "AllNodesReady")
    lost = [i for i in events.items if i[2] == "NodeLost"]
    assert lost == [
        (
            "cd1",
            "Warning",
            "NodeLost",
            "node b left the domain: NodeUnreachable "
            "for more than 60s (its daemon pod stays bound to the node)",
        )
    ]


def test_crashed_daemon_makes_its_node_not_ready_in_the_status(
    server: FakeApiServer,
    client: RestClient,
    reconciler: ComputeDomainReconciler,
) -> None:
    uid = created_domain(server, reconciler)
    server.seed(res.PODS, daemon_pod(uid, "a", clique="cl.1", container="running"))
    server.seed(res.COMPUTE_DOMAIN_CLIQUES, clique(uid, "cl.1", [daemon_entry("a", index=0)]))
    reconciler.reconcile("team/cd1")
    assert get_cd(server)["status"]["status"] == "Ready"
    crashed = daemon_pod(uid, "a", clique="cl.1", container="terminated", ready=False)
    client.update(res.PODS, crashed, subresource="status")
    reconciler.reconcile("team/cd1")
    cd = get_cd(server)
    assert [n["status"] for n in cd["status"]["nodes"]] == ["NotReady"]
    assert (cd["status"]["status"], ready_condition(cd)["reason"]) == (
        "NotReady",
        "DaemonNotRunning",
    )


def test_full_clique_gives_capacity_exceeded_with_events_on_domain_and_pods(
    server: FakeApiServer,
    client: RestClient,
    caches: Caches,
    config: ControllerConfig,
    events: RecordedEvents,
    clock: FakeClock,
    registry: CollectorRegistry,
    make_reconciler: Callable[..., ComputeDomainReconciler],
) -> None:
    reconciler = make_reconciler(config=replace(config, max_nodes_per_imex_domain=2))
    uid = created_domain(server, reconciler)
    for n in ("a", "b", "c"):
        server.seed(res.PODS, daemon_pod(uid, n, clique="cl.1"))
    server.seed(
        res.COMPUTE_DOMAIN_CLIQUES,
        clique(
            uid,
            "cl.1",
            [
                daemon_entry("a", index=0),
                daemon_entry("b", index=1),
            ],
        ),
    )
    for _ in range(3):  # level-triggered: the same cause is reported once
        assert reconciler.reconcile("team/cd1").requeue_after == 0
    cd = get_cd(server)
    cond = ready_condition(cd)
    expected = (
        "clique cl.1 is full: it already holds 2 IMEX daemons "
        "(MAX_NODES_PER_IMEX_DOMAIN=2); nodes left out: c"
    )
    assert (cond["status"], cond["reason"], cond["message"]) == (
        "False",
        "CapacityExceeded",
        expected,
    )
    assert cd["status"]["status"] == "NotReady"
    assert [n["name"] for n in cd["status"]["nodes"]] == ["a", "b"]  # c is in no entry
    capacity = [i for i in events.items if i[2] == "CapacityExceeded"]
    assert capacity == [
        ("cd1", "Warning", "CapacityExceeded", expected),
        ("daemon-c", "Warning", "CapacityExceeded", f"IMEX daemon on c cannot join: {expected}"),
    ]
    # b's workload leaves and its daemon with it: c can join, the condition clears.
    client.delete(res.PODS, "daemon-b", namespace=DRIVER_NS)
    server.seed(
        res.COMPUTE_DOMAIN_CLIQUES,
        clique(
            uid,
            "cl.1",
            [
                daemon_entry("a", index=0),
                daemon_entry("c", index=1),
            ],
        ),
    )
    reconciler.reconcile("team/cd1")
    assert ready_condition(get_cd(server))["reason"] == "AllNodesReady"


def _three_node_domain(server: FakeApiServer, reconciler: ComputeDomainReconciler) -> str:
    uid = created_domain(server, reconciler, numNodes=3)
    for n in ("a", "b", "c"):
        server.seed(res.NODES, node(n, labels={c.COMPUTE_DOMAIN_LABEL: uid}))
        server.seed(res.PODS, daemon_pod(uid, n, clique="cl.1"))
    return uid


def _entries(server: FakeApiServer, uid: str, ready: set[str]) -> None:
    server.seed(
        res.COMPUTE_DOMAIN_CLIQUES,
        clique(
            uid,
            "cl.1",
            [
                daemon_entry(n, index=i, status="Ready" if n in ready else "NotReady")
                for i, n in enumerate(("a", "b", "c"))
            ],
        ),
    )


def _status_writes(server: FakeApiServer) -> int:
    return sum(1 for m, p in writes(server) if m == "PUT" and p.endswith("/status"))


def test_status_writes_that_only_move_counts_are_coalesced_not_lost(
    server: FakeApiServer, reconciler: ComputeDomainReconciler, clock: FakeClock
) -> None:
    """Daemons turning Ready one by one: a count-only change within ``status_update_interval``
    (1 s) of our last write waits (the pass asks to be requeued when it is due) and is then
    written; the domain turning Ready is written at once."""
    uid = _three_node_domain(server, reconciler)
    _entries(server, uid, ready=set())
    clock.step(42)
    reconciler.reconcile("team/cd1")
    assert get_cd(server)["status"]["readyNodes"] == 0
    before = _status_writes(server)
    _entries(server, uid, ready={"a"})
    clock.step(0.25)
    result = reconciler.reconcile("team/cd1")
    assert _status_writes(server) == before, "a count-only change waits for the interval"
    assert 0 < result.requeue_after <= 0.75 + 1e-9
    clock.step(result.requeue_after)
    reconciler.reconcile("team/cd1")  # the requeue
    assert _status_writes(server) == before + 1
    assert get_cd(server)["status"]["readyNodes"] == 1
    _entries(server, uid, ready={"a", "b", "c"})  # right after a write: Ready is not held back
    assert reconciler.reconcile("team/cd1").requeue_after == 0
    assert _status_writes(server) == before + 2
    assert get_cd(server)["status"]["status"] == "Ready"


def test_status_update_interval_zero_writes_every_change(
    server: FakeApiServer,
    config: ControllerConfig,
    make_reconciler: Callable[..., ComputeDomainReconciler],
) -> None:
    reconciler = make_reconciler(config=replace(config, status_update_interval=0.0))
    uid = _three_node_domain(server, reconciler)
    _entries(server, uid, ready=set())
    reconciler.reconcile("team/cd1")
    before = _status_writes(server)
    for ready in ({"a"}, {"a", "b"}):
        _entries(server, uid, ready=ready)
        reconciler.reconcile("team/cd1")
    assert _status_writes(server) == before + 2
    assert get_cd(server)["status"]["readyNodes"] == 2
