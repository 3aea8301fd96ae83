"""The real kube-apiserver (1.37) accepts the requests our informers send and the fake API
server serves (test/unit/informers/test_watch_list.py): metadata-only lists and watches
(PartialObjectMetadata) and streaming watch-list (sendInitialEvents + the initial-events-end
bookmark), and refuses a watch-list without resourceVersionMatch=NotOlderThan with a 4xx."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from localcluster import Cluster, fake_node

from pkg.base.clock import RealClock
from pkg.informers.factory import SharedInformerFactory
from pkg.informers.listwatch import RestListerWatcher
from pkg.kube import resources as r
from pkg.kube.client import INITIAL_EVENTS_END, KubeClient, RestClient
from pkg.kube.config import load_api_client
from pkg.kube.errors import AlreadyExistsError, ApiError, NotFoundError


@pytest.fixture
def rest(cluster: Cluster) -> RestClient:
    return RestClient(load_api_client(str(cluster.kubeconfig("admin"))), user_agent="e2e")


@pytest.fixture
def a_node(rest: RestClient) -> Iterator[str]:
    name = "watch-list-probe"
    with contextlib.suppress(AlreadyExistsError):
        rest.create(r.NODES, fake_node(name))
    yield name
    with contextlib.suppress(NotFoundError):
        rest.delete(r.NODES, name)


def test_metadata_only_list_and_watch_list_on_the_real_apiserver(
    rest: RestClient, a_node: str
) -> None:
    page = rest.list(r.NODES, limit=5, metadata_only=True)
    assert page["kind"] == "PartialObjectMetadataList"
    items = page["items"]
    assert items and all(set(i) <= {"apiVersion", "kind", "metadata"} for i in items)
    assert all(i["kind"] == "PartialObjectMetadata" for i in items)
    lw = RestListerWatcher(rest, r.NODES, metadata_only=True, watch_list_enabled=True)
    stream = lw._watch_list(timeout_seconds=30)
    names = set()
    try:
        for ev in stream:
            if ev.type == "BOOKMARK":
                annotations = ev.object["metadata"].get("annotations") or {}
                assert annotations.get(INITIAL_EVENTS_END) == "true"
                break
            assert ev.type == "ADDED" and ev.object["kind"] == "PartialObjectMetadata"
            names.add(ev.object["metadata"]["name"])
    finally:
        stream.stop()
    assert names == {i["metadata"]["name"] for i in rest.list(r.NODES)["items"]}


def test_watch_list_without_not_older_than_is_refused(rest: RestClient) -> None:
    stream = rest.watch(r.NODES, resource_version="", timeout_seconds=5)
    stream.stop()
    with pytest.raises(ApiError) as err:
        rest._call(
            "GET",
            r.NODES.path(None),
            query={"watch": "true", "sendInitialEvents": "true", "allowWatchBookmarks": "true"},
        )
    assert 400 <= err.value.status < 500


def test_informer_syncs_by_watch_list_on_the_real_apiserver(
    rest: RestClient, admin: KubeClient, a_node: str
) -> None:
    factory = SharedInformerFactory(rest, clock=RealClock(), watch_list=True)
    inf = factory.informer_for(r.NODES, metadata_only=True)
    inf.start()
    try:
        assert inf.wait_for_sync(30)
        assert inf.reflector.watch_lists == 1 and inf.reflector.lists == 1
        assert len(inf.indexer.list()) == len(admin.list(r.NODES)["items"]) >= 1
        cached = inf.indexer.get_by_key(a_node)
        assert cached is not None and cached["kind"] == "PartialObjectMetadata"
    finally:
        factory.shutdown()
