"""Node caches of the controller: metadata of all Nodes, health of the domain's Nodes only;
Node writes are metadata merge patches with a resourceVersion precondition."""

from __future__ import annotations

from typing import Any

import pytest
from cdctl_fakes import node  # type: ignore[import-not-found, unused-ignore]
from opentelemetry import trace
from prometheus_client import CollectorRegistry

from pkg.api import constants as c
from pkg.base.clock import RealClock
from pkg.kube import resources as res
from pkg.kube.errors import ConflictError
from pkg.reconcilers.config import ControllerConfig
from pkg.reconcilers.manager import ControllerManager
from pkg.reconcilers.nodecache import as_node_metadata, patch_node_metadata, same_node_metadata
from pkg.reconcilers.status import node_problem
from pkg.testing.fakeapiserver import FakeApiServer


class NoEvents:
    def event(self, obj: Any, type_: str, reason: str, message: str) -> None:
        pass


def test_manager_reads_health_only_of_domain_nodes(
    server: FakeApiServer, config: ControllerConfig
) -> None:
    server.seed(res.NODES, node("plain", ready="False"))
    server.seed(res.NODES, node("member", ready="False", labels={c.COMPUTE_DOMAIN_LABEL: "u"}))
    manager = ControllerManager(
        client=server.client(),
        config=config,
        registry=CollectorRegistry(),
        tracer=trace.get_tracer("t"),
        clock=RealClock(),
        informer_clock=RealClock(),
        events=NoEvents(),
    )
    assert manager.start(sync_timeout=20)
    try:
        member = manager.caches.nodes.get_by_key("member")
        plain = manager.caches.nodes.get_by_key("plain")
        assert member is not None and plain is not None
        assert node_problem(member) == "NodeNotReady"  # full object: health known
        assert set(plain) == {"apiVersion", "kind", "metadata"}  # metadata only
        assert (plain["apiVersion"], plain["kind"]) == ("v1", "Node")
        assert "managedFields" not in plain["metadata"]
        assert sorted(n["metadata"]["name"] for n in manager.caches.nodes.list()) == [
            "member",
            "plain",
        ]
        # idle means idle: no informer replays its cache periodically
        assert all(i._resync_period == 0 for i in manager._informers.values())
        queries = [x for x in server.requests if x.path == "/api/v1/nodes"]
        assert {x.query.get("labelSelector") for x in queries} == {None, c.COMPUTE_DOMAIN_LABEL}
    finally:
        manager.stop()


def test_patch_node_metadata_keeps_spec_and_status_and_checks_rv(server: FakeApiServer) -> None:
    client = server.client()
    seeded = server.seed(res.NODES, node("a", ready="False", labels={"x": "1"}))
    meta_only = {"apiVersion": "v1", "kind": "Node", "metadata": dict(seeded["metadata"])}
    patch_node_metadata(
        client, meta_only, labels={"x": None, c.COMPUTE_DOMAIN_LABEL: "u"}, annotations={"a": "b"}
    )
    (stored,) = server.objects(res.NODES)
    assert stored["metadata"]["labels"] == {c.COMPUTE_DOMAIN_LABEL: "u"}
    assert stored["metadata"]["annotations"] == {"a": "b"}
    assert stored["status"] == seeded["status"] and stored["spec"] == seeded["spec"]
    with pytest.raises(ConflictError):  # the stale cached RV is a precondition
        patch_node_metadata(client, meta_only, labels={"y": "2"})


TTL = "node.alpha.kubernetes.io/ttl"
MANAGED = "resource.nvidia.com/gpu.clique-managed"


def test_node_metadata_cache_keeps_only_our_annotations() -> None:
    meta0: dict[str, Any] = {
        "name": "a",
        "resourceVersion": "1",
        "managedFields": [{}],
        "annotations": {TTL: "0", MANAGED: "true"},
    }
    raw = {"metadata": meta0}
    meta = as_node_metadata(raw)
    assert meta["metadata"]["annotations"] == {MANAGED: "true"}
    assert "managedFields" not in meta["metadata"]
    assert meta0["annotations"][TTL] == "0"  # the input is not mutated
    bare = as_node_metadata({"metadata": {"name": "b", "annotations": {"x/y": "1"}}})
    assert "annotations" not in bare["metadata"]
    swept = {**meta0, "resourceVersion": "2", "annotations": {TTL: "30", MANAGED: "true"}}
    assert same_node_metadata(meta, as_node_metadata({"metadata": swept}))
    relabelled = as_node_metadata({"metadata": {**meta0, "labels": {"k": "v"}}})
    assert not same_node_metadata(meta, relabelled)
