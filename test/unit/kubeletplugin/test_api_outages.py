"""The plugin's API loops while the fake API server drops connections or is down.

The slice publisher must never die or block start-up on an unreachable API server, and the
node-label writer must turn an outage into a retryable error after backing off, never into a
crash or a permanent error.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pkg.api import constants as c
from pkg.base.clock import RealClock
from pkg.base.types import JSON
from pkg.draplugin.errors import RetryableError
from pkg.draplugin.slices import SlicePublisher
from pkg.informers import SharedInformerFactory
from pkg.kube import resources as res
from pkg.kubeletplugin.claims import slice_devices
from pkg.kubeletplugin.computedomains import DomainTracker
from pkg.testing.clock import FakeClock
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer

NODE = "node-a"
DRIVER_NS = "nvidia-dra-driver"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as srv:
        srv.seed(res.NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        yield srv


def publisher(api: FakeApiServer) -> tuple[SlicePublisher, SharedInformerFactory]:
    client = api.client()
    factory = SharedInformerFactory(client, clock=RealClock())
    pub = SlicePublisher(
        client=client,
        informers=factory,
        driver_name=c.DRIVER_NAME,
        node_name=NODE,
        devices=slice_devices("cl.1"),
        retry_delay=0.02,
        max_retry_delay=0.1,
    )
    return pub, factory


def slices(api: FakeApiServer) -> list[JSON]:
    return api.objects(res.RESOURCE_SLICES)


def test_slice_publisher_starts_while_the_api_server_is_down(api: FakeApiServer) -> None:
    pub, factory = publisher(api)
    api.set_available(False)
    api.clear_log()
    try:
        pub.start()  # must neither raise nor block on the Node read
        # It kept trying the dead server (the log records dropped requests too).
        eventually(lambda: len(api.request_log) >= 3)
        assert slices(api) == []
        api.set_available(True)
        [obj] = eventually(lambda: slices(api))
        assert obj["metadata"]["ownerReferences"][0]["name"] == NODE
        eventually(lambda: pub.failures == 0)
    finally:
        pub.stop()
        factory.shutdown()


def test_slice_publisher_survives_a_dropped_write(api: FakeApiServer) -> None:
    pub, factory = publisher(api)
    api.inject_error("POST", res.RESOURCE_SLICES, 0, count=2)  # POSTs are never auto-retried
    try:
        pub.start()
        eventually(lambda: slices(api))
        eventually(lambda: pub.failures == 0)  # reset once the pass that created it returns
        # The publisher thread is still alive: it repairs a deleted slice.
        api.client().delete(res.RESOURCE_SLICES, pub.name)
        eventually(lambda: slices(api))
    finally:
        pub.stop()
        factory.shutdown()


def tracker(api: FakeApiServer, clock: FakeClock) -> DomainTracker:
    client = api.client()
    return DomainTracker(
        client=client,
        informers=SharedInformerFactory(client, clock=clock),
        node_name=NODE,
        driver_namespace=DRIVER_NS,
        clique_id=lambda: "cl.1",
        clock=clock,
    )


def node_label(api: FakeApiServer) -> str | None:
    [node] = api.objects(res.NODES)
    return (node["metadata"].get("labels") or {}).get(c.COMPUTE_DOMAIN_LABEL)


def test_label_writer_retries_a_dropped_patch_with_backoff(api: FakeApiServer) -> None:
    clock = FakeClock(advance_on_wait=True)
    api.inject_error("PATCH", res.NODES, 0, count=2)
    tracker(api, clock).add_node_label("uid-1")
    assert node_label(api) == "uid-1"
    assert [round(w, 3) for w in clock.waits] == [0.1, 0.2]
    api.inject_error("PATCH", res.NODES, 0, count=1)
    tracker(api, clock).remove_node_label("uid-1")
    assert node_label(api) is None


def test_label_writer_turns_a_long_outage_into_a_retryable_error(api: FakeApiServer) -> None:
    clock = FakeClock(advance_on_wait=True)
    api.set_available(False)
    with pytest.raises(RetryableError, match="API server unavailable while labeling"):
        tracker(api, clock).add_node_label("uid-1")
    assert [round(w, 3) for w in clock.waits] == [0.1, 0.2, 0.4, 0.8]
    with pytest.raises(RetryableError, match="API server unavailable"):
        tracker(api, clock).remove_node_label("uid-1")
    api.set_available(True)
    tracker(api, clock).add_node_label("uid-1")
    assert node_label(api) == "uid-1"
