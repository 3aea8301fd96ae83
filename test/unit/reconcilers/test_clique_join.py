"""CliqueJoinReconciler: the controller writes joining daemons' clique entries in batches."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from cdctl_fakes import (  # type: ignore[import-not-found, unused-ignore]
    DRIVER_NS,
    LaggingCache,
    clique,
    daemon_entry,
    daemon_pod,
    node,
    resource_slice,
)

from pkg.api import constants as c
from pkg.base.types import JSON
from pkg.kube import resources as res
from pkg.kube.client import RestClient
from pkg.reconcilers.cache import Caches
from pkg.reconcilers.cliquejoin import CliqueJoinReconciler
from pkg.reconcilers.config import ControllerConfig
from pkg.testing.clock import FakeClock
from pkg.testing.fakeapiserver import FakeApiServer

UID = "cd-uid-1"
KEY = f"{DRIVER_NS}/{UID}.cl.1"


@pytest.fixture
def joins(
    client: RestClient, caches: Caches, config: ControllerConfig, clock: FakeClock
) -> CliqueJoinReconciler:
    return CliqueJoinReconciler(client=client, caches=caches, config=config, clock=clock)


def pod(server: FakeApiServer, node_name: str, ip: str, **kw: Any) -> JSON:
    server.seed(res.NODES, node(node_name))
    seeded: JSON = server.seed(res.PODS, daemon_pod(UID, node_name, ip=ip, **kw))
    return seeded


def the_clique(server: FakeApiServer) -> JSON:
    [obj] = server.objects(res.COMPUTE_DOMAIN_CLIQUES)
    return obj


def entries(server: FakeApiServer) -> list[tuple[str, str, int, str]]:
    return [
        (d["nodeName"], d["ipAddress"], d["index"], d["status"])
        for d in the_clique(server).get("daemons") or []
    ]


def writes(server: FakeApiServer) -> list[tuple[str, str]]:
    return [(m, p) for m, p in server.request_log if m in ("POST", "PUT", "PATCH")]


def test_a_forming_clique_is_created_with_an_entry_for_each_daemon_pod(
    server: FakeApiServer, joins: CliqueJoinReconciler
) -> None:
    pods = [pod(server, n, f"10.2.0.{i}", clique="cl.1") for i, n in enumerate("abc", 1)]
    server.request_log.clear()

    assert joins.reconcile(KEY).requeue_after == 0

    assert len(writes(server)) == 1  # one create for three daemons
    assert entries(server) == [
        ("a", "10.2.0.1", 0, "NotReady"),
        ("b", "10.2.0.2", 1, "NotReady"),
        ("c", "10.2.0.3", 2, "NotReady"),
    ]
    obj = the_clique(server)
    assert obj["metadata"]["labels"] == {c.COMPUTE_DOMAIN_LABEL: UID, c.CLIQUE_ID_LABEL: "cl.1"}
    assert [(r["kind"], r["name"], r["uid"]) for r in obj["metadata"]["ownerReferences"]] == [
        ("Pod", p["metadata"]["name"], p["metadata"]["uid"]) for p in pods
    ]
    for entry in obj["daemons"]:
        assert entry["cliqueID"] == "cl.1"


def test_new_daemons_are_appended_in_one_patch_at_the_free_indices_keeping_the_others(
    server: FakeApiServer, joins: CliqueJoinReconciler
) -> None:
    server.seed(
        res.COMPUTE_DOMAIN_CLIQUES,
        clique(
            UID,
            "cl.1",
            [
                daemon_entry("x", index=0),
                daemon_entry("z", index=2),
            ],
        ),
    )
    pod(server, "x", "10.1.0.1", clique="cl.1")
    pod(server, "z", "10.1.0.3", clique="cl.1")
    pod(server, "b", "10.2.0.2", clique="cl.1")
    pod(server, "a", "10.2.0.1", clique="cl.1")
    server.request_log.clear()

    joins.reconcile(KEY)

    assert [m for m, _ in writes(server)] == ["PATCH"]
    assert entries(server) == [
        ("x", "10.1.0.1", 0, "Ready"),
        ("z", "10.1.0.3", 2, "Ready"),
        ("a", "10.2.0.1", 1, "NotReady"),
        ("b", "10.2.0.2", 3, "NotReady"),
    ]
    owners = {r["name"] for r in the_clique(server)["metadata"]["ownerReferences"]}
    assert owners == {"daemon-a", "daemon-b"}


def test_a_pass_with_nothing_to_add_writes_nothing(
    server: FakeApiServer, joins: CliqueJoinReconciler
) -> None:
    pod(server, "a", "10.2.0.1", clique="cl.1")
    joins.reconcile(KEY)
    server.request_log.clear()

    joins.reconcile(KEY)
    joins.reconcile(KEY)

    assert writes(server) == []
    assert entries(server) == [("a", "10.2.0.1", 0, "NotReady")]


def test_a_node_with_an_entry_is_left_to_its_daemon_even_with_a_new_pod_ip(
    server: FakeApiServer, joins: CliqueJoinReconciler
) -> None:
    server.seed(res.COMPUTE_DOMAIN_CLIQUES, clique(UID, "cl.1", [daemon_entry("a", index=5)]))
    pod(server, "a", "10.9.9.9", clique="cl.1")  # restarted daemon: it moves its entry itself
    server.request_log.clear()

    joins.reconcile(KEY)

    assert writes(server) == []
    assert entries(server) == [("a", "10.1.0.6", 5, "Ready")]


def test_pods_that_cannot_join_yet_or_belong_elsewhere_get_no_entry(
    server: FakeApiServer, client: RestClient, joins: CliqueJoinReconciler, clock: FakeClock
) -> None:
    pod(server, "no-ip", "")  # not started: no podIP
    leaving = daemon_pod(UID, "leaving", ip="10.2.0.2", clique="cl.1")
    leaving["metadata"]["finalizers"] = ["test/hold"]
    server.seed(res.NODES, node("leaving"))
    server.seed(res.PODS, leaving)
    client.delete(res.PODS, "daemon-leaving", namespace=DRIVER_NS)  # terminating
    pod(server, "other-clique", "10.2.0.3", clique="cl.2")
    pod(server, "no-fabric", "10.2.0.4", clique="")
    server.seed(res.NODES, node("lost", ready="Unknown", since=clock.now() - 600))
    server.seed(res.PODS, daemon_pod(UID, "lost", ip="10.2.0.5", clique="cl.1"))
    broken = daemon_pod(UID, "broken", ip="10.2.0.6", clique="cl.1", container="waiting")
    broken["status"]["containerStatuses"][0]["lastState"] = {
        "terminated": {"message": f"{c.REASON_DRIVER_ROOT_INCOMPLETE}: nvidia-imex not found"}
    }
    server.seed(res.NODES, node("broken"))
    server.seed(res.PODS, broken)
    other_domain = daemon_pod("cd-uid-2", "elsewhere", ip="10.2.0.7", clique="cl.1")
    server.seed(res.NODES, node("elsewhere"))
    server.seed(res.PODS, other_domain)
    server.request_log.clear()

    assert joins.reconcile(KEY).requeue_after == 0

    assert writes(server) == []
    assert server.objects(res.COMPUTE_DOMAIN_CLIQUES) == []


def test_until_the_daemon_labels_its_pod_the_clique_comes_from_the_node_slices(
    server: FakeApiServer, joins: CliqueJoinReconciler
) -> None:
    unlabelled = pod(server, "a", "10.2.0.1")
    pod(server, "b", "10.2.0.2")  # its node publishes two cliques: undecided, no entry
    server.seed(res.RESOURCE_SLICES, resource_slice("a", clique_id="cl.1", qualified=True))
    twice = resource_slice("b", clique_id="cl.1")
    twice["spec"]["devices"].append(
        {"name": "channel-1", "attributes": {"cliqueID": {"string": "cl.9"}}}
    )
    server.seed(res.RESOURCE_SLICES, twice)

    assert joins.keys_for_pod(unlabelled) == [KEY]
    assert joins.keys_for_slice(resource_slice("a", clique_id="cl.1")) == [KEY]
    joins.reconcile(KEY)

    assert entries(server) == [("a", "10.2.0.1", 0, "NotReady")]


def test_a_daemon_that_appended_first_refuses_the_write_and_keeps_its_entry(
    server: FakeApiServer,
    client: RestClient,
    caches: Caches,
    config: ControllerConfig,
    clock: FakeClock,
) -> None:
    server.seed(res.COMPUTE_DOMAIN_CLIQUES, clique(UID, "cl.1", [daemon_entry("x", index=0)]))
    pod(server, "a", "10.2.0.1", clique="cl.1")
    lagging = LaggingCache(caches.cliques, "cliques")
    lagging.freeze()
    joins = CliqueJoinReconciler(
        client=client, caches=replace(caches, cliques=lagging), config=config, clock=clock
    )
    # Daemon b appended itself (index 1) after the controller's cache last saw the clique.
    obj = the_clique(server)
    obj["daemons"].append(daemon_entry("b", index=1, status="NotReady"))
    server.seed(res.COMPUTE_DOMAIN_CLIQUES, obj)

    assert joins.reconcile(KEY).requeue_after > 0  # refused (422): look again

    assert [e[0] for e in entries(server)] == ["x", "b"]
    lagging.thaw()
    joins.reconcile(KEY)
    assert entries(server)[-1] == ("a", "10.2.0.1", 2, "NotReady")


def test_a_lost_create_race_retries_without_error(
    server: FakeApiServer,
    client: RestClient,
    caches: Caches,
    config: ControllerConfig,
    clock: FakeClock,
) -> None:
    pod(server, "a", "10.2.0.1", clique="cl.1")
    lagging = LaggingCache(caches.cliques, "cliques")
    lagging.freeze()  # sees no clique
    server.seed(res.COMPUTE_DOMAIN_CLIQUES, clique(UID, "cl.1", [daemon_entry("b", index=0)]))
    joins = CliqueJoinReconciler(
        client=client, caches=replace(caches, cliques=lagging), config=config, clock=clock
    )

    assert joins.reconcile(KEY).requeue_after > 0

    assert [e[0] for e in entries(server)] == ["b"]


def test_an_emptied_clique_is_refilled_with_a_guarded_put(
    server: FakeApiServer, joins: CliqueJoinReconciler
) -> None:
    server.seed(res.COMPUTE_DOMAIN_CLIQUES, clique(UID, "cl.1", []))
    pod(server, "a", "10.2.0.1", clique="cl.1")
    server.request_log.clear()

    joins.reconcile(KEY)

    assert [m for m, _ in writes(server)] == ["PUT"]
    assert entries(server) == [("a", "10.2.0.1", 0, "NotReady")]


def test_a_full_clique_gets_no_entry_and_a_partly_full_one_fills_its_free_slots(
    server: FakeApiServer,
    client: RestClient,
    caches: Caches,
    config: ControllerConfig,
    clock: FakeClock,
) -> None:
    joins = CliqueJoinReconciler(
        client=client,
        caches=caches,
        config=replace(config, max_nodes_per_imex_domain=2),
        clock=clock,
    )
    server.seed(res.COMPUTE_DOMAIN_CLIQUES, clique(UID, "cl.1", [daemon_entry("x", index=1)]))
    for n in ("a", "b", "c"):
        pod(server, n, f"10.2.0.{ord(n)}", clique="cl.1")

    joins.reconcile(KEY)
    assert [(e[0], e[2]) for e in entries(server)] == [("x", 1), ("a", 0)]
    server.request_log.clear()
    joins.reconcile(KEY)
    assert writes(server) == []  # full: b and c join (and report it) by themselves


def test_a_clique_of_another_domain_by_that_name_is_not_written(
    server: FakeApiServer, joins: CliqueJoinReconciler
) -> None:
    foreign = clique(UID, "cl.1", [daemon_entry("x", index=0)])
    foreign["metadata"]["labels"][c.COMPUTE_DOMAIN_LABEL] = "someone-else"
    server.seed(res.COMPUTE_DOMAIN_CLIQUES, foreign)
    pod(server, "a", "10.2.0.1", clique="cl.1")
    server.request_log.clear()

    joins.reconcile(KEY)

    assert writes(server) == []


def test_a_batch_right_after_another_builds_on_our_own_write_not_the_stale_cache(
    server: FakeApiServer,
    client: RestClient,
    caches: Caches,
    config: ControllerConfig,
    clock: FakeClock,
) -> None:
    lagging = LaggingCache(caches.cliques, "cliques")
    lagging.freeze()  # the informer delivers none of our writes during this test
    joins = CliqueJoinReconciler(
        client=client, caches=replace(caches, cliques=lagging), config=config, clock=clock
    )
    pod(server, "a", "10.2.0.1", clique="cl.1")
    joins.reconcile(KEY)
    pod(server, "b", "10.2.0.2", clique="cl.1")
    server.request_log.clear()

    assert joins.reconcile(KEY).requeue_after == 0  # not refused

    assert [m for m, _ in writes(server)] == ["PATCH"]
    assert [(e[0], e[2]) for e in entries(server)] == [("a", 0), ("b", 1)]
    lagging.thaw()  # caught up: the cache is read again
    server.request_log.clear()
    assert joins.reconcile(KEY).requeue_after == 0 and writes(server) == []
