"""Streaming watch-list, metadata-only informers and the fake API server's honesty about them.

The same requests are sent to a real kube-apiserver in ``test/e2e/test_watch_list.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import urllib3

from pkg.base.types import JSON
from pkg.informers.factory import SharedInformerFactory
from pkg.informers.informer import SharedInformer
from pkg.informers.listwatch import RestListerWatcher
from pkg.informers.reflector import BackoffPolicy
from pkg.kube import resources as r
from pkg.kube.client import INITIAL_EVENTS_END
from pkg.reconcilers.slim import slim_node
from pkg.testing.clock import FakeClock
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer


def node(name: str, **labels: str) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
        },
        "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "lastHeartbeatTime": "2026-11-27T10:00:00Z",
                    "lastTransitionTime": "2026-11-27T09:00:00Z",
                }
            ],
            "images": [{"names": ["x" * 200], "sizeBytes": 1}] * 20,
            "nodeInfo": {"kubeletVersion": "v1.37.1"},
        },
    }


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer(bookmark_interval=0.05) as server:
        yield server


def start(inf: SharedInformer) -> SharedInformer:
    inf.start()
    assert inf.wait_for_sync(5.0)
    return inf


def test_watch_list_syncs_with_one_request_then_streams(api: FakeApiServer) -> None:
    for i in range(3):
        api.seed(r.NODES, node(f"n{i}"))
    factory = SharedInformerFactory(api.client(), clock=FakeClock(), watch_list=True)
    inf = start(factory.informer_for(r.NODES))
    try:
        assert sorted(o["metadata"]["name"] for o in inf.indexer.list()) == ["n0", "n1", "n2"]
        gets = [
            q
            for m, p, q in ((x.method, x.path, x.query) for x in api.requests)
            if m == "GET" and p == "/api/v1/nodes"
        ]
        assert len(gets) == 1  # no LIST: one WATCH carried the initial state
        assert gets[0]["sendInitialEvents"] == "true"
        assert gets[0]["resourceVersionMatch"] == "NotOlderThan"
        assert gets[0]["allowWatchBookmarks"] == "true"
        api.seed(r.NODES, node("n3"))
        eventually(lambda: inf.indexer.get_by_key("n3") is not None)
        assert (inf.reflector.watch_lists, inf.reflector.lists) == (1, 1)
    finally:
        factory.shutdown()


def test_watch_list_refused_falls_back_to_list_and_watch(api: FakeApiServer) -> None:
    api.watch_list = False
    api.seed(r.NODES, node("n0"))
    factory = SharedInformerFactory(api.client(), clock=FakeClock(), watch_list=True)
    inf = start(factory.informer_for(r.NODES))
    try:
        assert inf.indexer.get_by_key("n0") is not None
        api.seed(r.NODES, node("n1"))
        eventually(lambda: inf.indexer.get_by_key("n1") is not None)
        queries = [x.query for x in api.requests if x.path == "/api/v1/nodes"]
        assert queries[0].get("sendInitialEvents") == "true"  # tried once
        assert "watch" not in queries[1]  # then a LIST
        assert all("sendInitialEvents" not in q for q in queries[1:])  # never again
    finally:
        factory.shutdown()


def test_metadata_only_informer_caches_partial_object_metadata(api: FakeApiServer) -> None:
    api.seed(r.NODES, node("n0", zone="a"))
    factory = SharedInformerFactory(api.client(), clock=FakeClock(), watch_list=True)
    inf = start(factory.informer_for(r.NODES, metadata_only=True))
    try:
        cached = inf.indexer.get_by_key("n0")
        assert cached is not None
        assert cached["kind"] == "PartialObjectMetadata"
        assert set(cached) == {"apiVersion", "kind", "metadata"}
        assert cached["metadata"]["labels"] == {"zone": "a"}
    finally:
        factory.shutdown()


def test_metadata_only_list_and_get_shapes(api: FakeApiServer) -> None:
    api.seed(r.NODES, node("n0"))
    client = api.client()
    lw = RestListerWatcher(client, r.NODES, metadata_only=True)
    page = lw.list(limit=10, continue_token=None, resource_version="0")
    assert page["kind"] == "PartialObjectMetadataList"
    assert page["items"][0]["kind"] == "PartialObjectMetadata"
    streaming = RestListerWatcher(client, r.NODES, metadata_only=True, watch_list_enabled=True)
    stream = streaming._watch_list(timeout_seconds=5)
    try:
        first = next(iter(stream))
        assert first.type == "ADDED" and "spec" not in first.object
        end = next(iter(stream))
        assert end.type == "BOOKMARK"
        assert end.object["metadata"]["annotations"] == {INITIAL_EVENTS_END: "true"}
    finally:
        stream.stop()


def test_watch_list_validation_matches_the_api_server(api: FakeApiServer) -> None:
    """sendInitialEvents without resourceVersionMatch=NotOlderThan is a 400 there too."""
    url = f"{api.url}/api/v1/nodes?watch=true&sendInitialEvents=true&allowWatchBookmarks=true"
    resp = urllib3.PoolManager().request("GET", url, timeout=5)
    assert resp.status == 400


def test_slim_node_keeps_what_the_controller_reads() -> None:
    full = node("n0", zone="a")
    slim = slim_node(full)
    assert "managedFields" not in slim["metadata"]
    assert slim["metadata"]["labels"] == {"zone": "a"}
    assert slim["spec"] == full["spec"]
    assert slim["status"] == {
        "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-27T09:00:00Z"}
        ]
    }
    assert "managedFields" in full["metadata"] and "images" in full["status"]  # not mutated


def test_watch_list_broken_before_its_end_bookmark_starts_over(api: FakeApiServer) -> None:
    """A stream that dies before the initial-events-end bookmark has not synced anything:
    the reflector must ask for the initial state again, not resume a plain watch."""
    api.seed(r.NODES, node("n0"))
    api.inject_error("WATCH", r.NODES, 0, count=2)  # drop the first two watch-lists
    factory = SharedInformerFactory(
        api.client(),
        clock=FakeClock(),
        watch_list=True,
        backoff=BackoffPolicy(initial=0.01, cap=0.02),
    )
    inf = factory.informer_for(r.NODES)
    inf.start()
    try:
        assert inf.wait_for_sync(10.0)
        assert inf.indexer.get_by_key("n0") is not None
        streams = [x.query for x in api.requests if x.path == "/api/v1/nodes"]
        assert len(streams) >= 3 and all(q.get("sendInitialEvents") == "true" for q in streams)
    finally:
        factory.shutdown()


def test_metadata_list_with_the_object_media_type_is_406_as_on_the_api_server(
    api: FakeApiServer,
) -> None:
    """kube-apiserver: "you requested PartialObjectMetadata, but the requested object is a
    list" (found by test/e2e/test_watch_list.py); the fake must refuse it too."""
    api.seed(r.NODES, node("n0"))
    accept = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
    resp = urllib3.PoolManager().request(
        "GET", f"{api.url}/api/v1/nodes", headers={"Accept": accept}, timeout=5
    )
    assert resp.status == 406
