"""The wired controller in upstream's other modes, against the fake API server.

* gate ``ComputeDomainCliques`` off: no clique informer, no clique reconcilers; a daemon's own
  ``status.nodes`` write makes the domain Ready, and the entry of a daemon whose pod is gone
  is pruned from ``status.nodes``;
* ``ADDITIONAL_NAMESPACES``: a domain's DaemonSet and daemon pods in an additional namespace
  are adopted (nothing is created in the driver namespace), aggregated, and torn down.
"""

from __future__ import annotations

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
)
from opentelemetry import trace
from prometheus_client import CollectorRegistry

from pkg.api import constants as c
from pkg.base.clock import RealClock
from pkg.base.types import JSON
from pkg.kube import resources as res
from pkg.kube.client import RestClient
from pkg.kube.errors import ConflictError
from pkg.reconcilers.config import ControllerConfig
from pkg.reconcilers.manager import ControllerManager
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer

OLD_NS = "old-driver-ns"


def start_manager(
    client: RestClient,
    config: ControllerConfig,
    registry: CollectorRegistry,
    events: RecordedEvents,
) -> ControllerManager:
    mgr = ControllerManager(
        client=client,
        config=replace(config, cleanup_interval=3600),
        registry=registry,
        tracer=trace.NoOpTracer(),
        clock=RealClock(),
        informer_clock=RealClock(),
        events=events,
    )
    assert mgr.start(sync_timeout=10)
    return mgr


def get_cd(server: FakeApiServer) -> JSON | None:
    objs = server.objects(res.COMPUTE_DOMAINS)
    return objs[0] if objs else None


def status_of(server: FakeApiServer) -> JSON:
    return dict((get_cd(server) or {}).get("status") or {})


@pytest.fixture
def cliques_off(
    client: RestClient,
    config: ControllerConfig,
    registry: CollectorRegistry,
    events: RecordedEvents,
) -> Iterator[ControllerManager]:
    gates = "ComputeDomainCliques=false,IMEXDaemonsWithDNSNames=false"
    off = replace(config, compute_domain_cliques=False, feature_gates=gates)
    mgr = start_manager(client, off, registry, events)
    yield mgr
    mgr.stop()


def test_cliques_off_domain_forms_from_status_nodes_and_prunes_a_departed_daemon(
    server: FakeApiServer,
    client: RestClient,
    cliques_off: ControllerManager,
) -> None:
    assert [ctl.name for ctl in cliques_off.controllers] == [
        "computedomain",
        "resourceclaim",
        "cliquelabel",
    ]
    uid = str(server.seed(res.COMPUTE_DOMAINS, compute_domain(numNodes=2))["metadata"]["uid"])
    for n in ("a", "b"):
        server.seed(res.NODES, node(n))
    server.seed(res.RESOURCE_CLAIMS, channel_claim("w0", ns="team", uid=uid, node_name="a"))
    eventually(lambda: len(server.objects(res.DAEMONSETS)) == 1)
    # A clique object (left by another mode) is not membership here.
    server.seed(res.COMPUTE_DOMAIN_CLIQUES, clique(uid, "cl.1", [daemon_entry("z", index=0)]))
    for n in ("a", "b"):
        server.seed(res.PODS, daemon_pod(uid, n, clique="cl.1"))

    def daemon_writes(entries: list[JSON]) -> None:
        while True:
            obj = client.get(res.COMPUTE_DOMAINS, "cd1", namespace="team")
            obj.setdefault("status", {})["nodes"] = entries
            try:
                client.update(res.COMPUTE_DOMAINS, obj, subresource="status")
                return
            except ConflictError:
                continue

    a = {"name": "a", "ipAddress": "10.1.0.1", "cliqueID": "cl.1", "index": 0, "status": "Ready"}
    b = {**a, "name": "b", "ipAddress": "10.1.0.2", "index": 1}
    daemon_writes([a, b])
    eventually(lambda: status_of(server).get("status") == "Ready")
    assert status_of(server)["nodeCount"] == 2
    # b's daemon pod goes for good (no clean leave): its entry is pruned, and with
    # numNodes 2 the domain is NotReady again.
    client.delete(res.PODS, "daemon-b", namespace=DRIVER_NS)
    eventually(lambda: [n["name"] for n in status_of(server).get("nodes") or []] == ["a"])
    assert status_of(server)["status"] == "NotReady"
    assert not [p for _m, p in server.request_log if "computedomaincliques" in p]
    # Teardown without cliques.
    client.delete(res.COMPUTE_DOMAINS, "cd1", namespace="team")
    eventually(lambda: server.objects(res.DAEMONSETS) == [])
    client.delete(res.PODS, "daemon-a", namespace=DRIVER_NS)
    eventually(lambda: get_cd(server) is None)
    assert server.objects(res.RESOURCE_CLAIM_TEMPLATES) == []


def _daemonset(uid: str, ns: str) -> JSON:
    name = c.daemon_object_name(uid)
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": ns, "labels": {c.COMPUTE_DOMAIN_LABEL: uid}},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "d", "image": "old"}]},
            },
        },
    }


def test_a_domains_daemons_in_an_additional_namespace_are_adopted_and_torn_down(
    server: FakeApiServer,
    client: RestClient,
    config: ControllerConfig,
    registry: CollectorRegistry,
    events: RecordedEvents,
) -> None:
    mgr = start_manager(client, replace(config, additional_namespaces=(OLD_NS,)), registry, events)
    try:
        uid = str(server.seed(res.COMPUTE_DOMAINS, compute_domain())["metadata"]["uid"])
        server.seed(res.NODES, node("a"))
        # An older installation's daemon objects live in OLD_NS (a migration).
        server.seed(res.DAEMONSETS, _daemonset(uid, OLD_NS))
        server.seed(res.PODS, daemon_pod(uid, "a", clique="cl.1", ns=OLD_NS))
        server.seed(
            res.COMPUTE_DOMAIN_CLIQUES, clique(uid, "cl.1", [daemon_entry("a", index=0)], ns=OLD_NS)
        )
        server.seed(res.RESOURCE_CLAIMS, channel_claim("w0", ns="team", uid=uid, node_name="a"))
        eventually(lambda: status_of(server).get("status") == "Ready")
        assert [n["name"] for n in status_of(server)["nodes"]] == ["a"]
        ds: list[Any] = server.objects(res.DAEMONSETS)
        assert [d["metadata"]["namespace"] for d in ds] == [OLD_NS]  # adopted, none created
        client.delete(res.COMPUTE_DOMAINS, "cd1", namespace="team")
        eventually(lambda: server.objects(res.DAEMONSETS) == [])
        client.delete(res.PODS, "daemon-a", namespace=OLD_NS)
        eventually(lambda: get_cd(server) is None)
    finally:
        mgr.stop()


def test_kinds_cached_in_full_are_held_serialized(
    server: FakeApiServer,
    client: RestClient,
    config: ControllerConfig,
    registry: CollectorRegistry,
    events: RecordedEvents,
) -> None:
    """Every kind the controller caches in full keeps JSON bytes (about 1x their
    JSON size, `pkg.informers.serialized`); the metadata-only and slimmed Node caches keep
    dicts. Reads still give the objects."""
    server.seed(res.COMPUTE_DOMAINS, compute_domain())
    server.seed(res.RESOURCE_CLAIMS, channel_claim("w-0", ns="team", uid="u", node_name="n1"))
    mgr = start_manager(client, config, registry, events)
    try:
        held = {
            name: {type(v) for v in inf.indexer._items.values()}
            for name, inf in mgr._informers.items()
        }
        full = {n for n in held if n not in ("nodes", "node_health")}
        assert full >= {
            "compute_domains",
            "rcts",
            "claims",
            "slices",
            "daemonsets[0]",
            "pods[0]",
            "cliques[0]",
        }, sorted(held)
        assert held["compute_domains"] == {bytes} and held["claims"] == {bytes}, held
        assert all(held[n] <= {bytes} for n in full), held
        assert [o["metadata"]["name"] for o in mgr.caches.compute_domains.list()] == ["cd1"]
        assert mgr.caches.claims.get_by_key("team/w-0") is not None
    finally:
        mgr.stop()
