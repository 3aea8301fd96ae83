"""The node label decided from the plugin's watch of its own node, with a GET where it may lag.

A node the controller labelled at allocation needs no request at Prepare; an unlabelled one
a single patch; the cache never undoes our own write of a moment ago (it must not be older
than the node as we last wrote or read it), and a label the cache shows for another domain,
or none to remove, is settled on a GET. The caches here are frozen (their informers shut
down after the first list, and their threads seen to have exited) to play a watch that lags.
The informers and the tracker share one client, as in the plugin: a watch stopped while it was
being opened must not hand its still-streaming connection to the tracker's next request.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pkg.api import constants as c
from pkg.base.clock import RealClock
from pkg.draplugin.errors import RetryableError
from pkg.informers import SharedInformerFactory
from pkg.kube import resources as res
from pkg.kubeletplugin.computedomains import DomainTracker
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer

NODE = "node-a"
DRIVER_NS = "nvidia-dra-driver"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as srv:
        srv.seed(res.NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        yield srv


def set_label(api: FakeApiServer, value: str | None) -> None:
    api.client().patch(res.NODES, NODE, {"metadata": {"labels": {c.COMPUTE_DOMAIN_LABEL: value}}})


def label(api: FakeApiServer) -> str | None:
    [node] = api.objects(res.NODES)
    return (node["metadata"].get("labels") or {}).get(c.COMPUTE_DOMAIN_LABEL)


def node_requests(api: FakeApiServer) -> list[str]:
    """GETs and PATCHes of the node (not the informer's list and watch of the collection)."""
    return [m for m, path in api.request_log if path.endswith(f"/nodes/{NODE}")]


def synced_tracker(
    api: FakeApiServer, *, freeze: bool
) -> tuple[DomainTracker, SharedInformerFactory]:
    client = api.client()
    factory = SharedInformerFactory(client, clock=RealClock())
    tracker = DomainTracker(
        client=client,
        informers=factory,
        node_name=NODE,
        driver_namespace=DRIVER_NS,
        clique_id=lambda: "cl.1",
        clock=RealClock(),
    )
    tracker.start()
    eventually(tracker._nodes.has_synced)
    if freeze:
        factory.shutdown()  # the cache keeps what it listed: a watch that lags forever
        # shutdown() joins each thread for a bounded time only: the freeze holds once none is
        # left that could still apply an event to the cache.
        eventually(lambda: all(inf.has_stopped() for _, inf in factory.informers()))
    api.clear_log()
    return tracker, factory


def test_a_node_the_controller_labelled_costs_no_request(api: FakeApiServer) -> None:
    set_label(api, "uid-1")
    tracker, factory = synced_tracker(api, freeze=False)
    try:
        tracker.add_node_label("uid-1")
        assert node_requests(api) == []
    finally:
        factory.shutdown()


def test_an_unlabelled_node_costs_one_patch(api: FakeApiServer) -> None:
    tracker, factory = synced_tracker(api, freeze=False)
    try:
        tracker.add_node_label("uid-1")
        assert label(api) == "uid-1" and node_requests(api) == ["PATCH"]
    finally:
        factory.shutdown()


def test_a_lagging_cache_never_undoes_our_own_write(api: FakeApiServer) -> None:
    set_label(api, "uid-1")
    tracker, _ = synced_tracker(api, freeze=True)  # shows uid-1 from now on
    tracker.add_node_label("uid-1")
    assert node_requests(api) == []
    tracker.remove_node_label("uid-1")  # the cache says ours: one guarded patch
    assert label(api) is None and node_requests(api) == ["PATCH"]
    api.clear_log()
    # The cache still shows uid-1, but it is older than our removal: read the node again.
    tracker.add_node_label("uid-1")
    assert label(api) == "uid-1" and node_requests(api) == ["GET", "PATCH"]


def test_a_stale_patch_is_refused_and_decided_on_a_get(api: FakeApiServer) -> None:
    tracker, _ = synced_tracker(api, freeze=True)  # shows the node unlabelled
    set_label(api, "uid-other")  # after the cache's copy: its resourceVersion test fails
    api.clear_log()
    with pytest.raises(RetryableError, match="labeled for another ComputeDomain") as refused:
        tracker.add_node_label("uid-1")
    # The other domain may be another tenant's: the claim's pod Events must not name it.
    assert "uid-other" not in str(refused.value)
    assert node_requests(api) == ["PATCH", "GET"]
    assert label(api) == "uid-other"


def test_another_domains_label_in_the_cache_is_checked_on_a_get(api: FakeApiServer) -> None:
    set_label(api, "uid-other")
    tracker, _ = synced_tracker(api, freeze=True)  # shows uid-other from now on
    set_label(api, None)  # that domain's workload left
    api.clear_log()
    tracker.add_node_label("uid-1")
    assert label(api) == "uid-1" and node_requests(api) == ["GET", "PATCH"]


def test_a_label_the_cache_does_not_show_is_still_removed(api: FakeApiServer) -> None:
    tracker, _ = synced_tracker(api, freeze=True)  # shows the node unlabelled
    set_label(api, "uid-1")  # the controller labelled it after the cache's copy
    api.clear_log()
    tracker.remove_node_label("uid-1")
    assert label(api) is None and node_requests(api) == ["GET", "PATCH"]
