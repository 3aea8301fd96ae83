"""SharedInformer delivery semantics, resync on a FakeClock, factory sharing, Indexer/Lister."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import pytest

from pkg.base.types import JSON
from pkg.informers.compact import compact
from pkg.informers.factory import SharedInformerFactory
from pkg.informers.lister import Lister
from pkg.informers.serialized import SerializedCodec
from pkg.informers.store import (
    BY_NODE_NAME,
    BY_OWNER_UID,
    BY_UID,
    DeletedFinalStateUnknown,
    Indexer,
    by_label,
    index_by_node_name,
    index_by_owner_uid,
    index_by_uid,
    meta_namespace_key,
)
from pkg.kube import resources as r
from pkg.testing.clock import FakeClock
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer


def pod(name: str, node: str = "n1", **labels: str) -> JSON:
    return {
        "metadata": {"name": name, "namespace": "ns", "labels": labels},
        "spec": {"nodeName": node},
    }


def test_handlers_ordered_isolated_and_cache_first() -> None:
    with FakeApiServer() as api:
        api.seed(r.PODS, pod("a"))
        c = api.client()
        factory = SharedInformerFactory(c, clock=FakeClock())
        inf = factory.informer_for(r.PODS)
        lister = factory.lister_for(r.PODS)
        gate = threading.Event()
        slow: list[str] = []
        fast: list[tuple[str, str, bool]] = []

        def slow_add(o: JSON) -> None:
            gate.wait(5)
            slow.append(o["metadata"]["name"])

        held = threading.Event()

        def fast_add(o: JSON) -> None:
            name = o["metadata"]["name"]
            if name == "p00":
                held.wait(5)  # until the store has applied p03's delete (below)
            fast.append(("add", name, lister.get(name, "ns") is not None))  # cache first

        inf.add_event_handler(on_add=slow_add)
        fast_reg = inf.add_event_handler(
            on_add=fast_add,
            on_update=lambda _o, n: fast.append(("update", n["metadata"]["name"], True)),
            on_delete=lambda o: fast.append(("delete", meta_namespace_key(o), True)),
        )
        factory.start()
        assert factory.wait_for_cache_sync(5)
        for i in range(20):
            c.create(r.PODS, pod(f"p{i:02d}"))
        c.patch(r.PODS, "p03", {"metadata": {"labels": {"x": "1"}}}, namespace="ns")
        c.delete(r.PODS, "p03", namespace="ns")
        eventually(lambda: lister.get("p03", "ns") is None)
        held.set()
        eventually(lambda: len(fast) == 23)  # the slow handler blocks only itself
        assert slow == []
        assert [f[1] for f in fast[:21]] == ["a"] + [f"p{i:02d}" for i in range(20)]
        assert fast[21:] == [("update", "p03", True), ("delete", "ns/p03", True)]
        # Cache first: an add handler finds its object in the cache -- unless the store has
        # moved on meanwhile: handlers lag the store by design (as client-go's do), and p03's
        # add handler, held behind p00's, runs after its delete, when the cache rightly lacks it.
        seen = {name: found for kind, name, found in fast if kind == "add"}
        assert seen.pop("p03") is False
        assert all(seen.values())
        assert fast_reg.has_synced()
        gate.set()
        eventually(lambda: len(slow) == 21)
        assert slow == ["a"] + [f"p{i:02d}" for i in range(20)]
        factory.shutdown()


def test_late_handler_gets_synthetic_adds_and_resync_replays_cache() -> None:
    clock = FakeClock()
    with FakeApiServer() as api:
        for n in ("a", "b"):
            api.seed(r.PODS, pod(n))
        factory = SharedInformerFactory(api.client(), clock=clock, resync_period=30)
        inf = factory.informer_for(r.PODS)
        assert factory.informer_for(r.PODS) is inf
        assert factory.informer_for(r.PODS, "ns") is not inf
        factory.start()
        assert factory.wait_for_cache_sync(5)
        got: list[tuple[str, str]] = []
        reg = inf.add_event_handler(
            on_add=lambda o: got.append(("add", o["metadata"]["name"])),
            on_update=lambda o, n: got.append(
                ("resync" if o is n else "update", n["metadata"]["name"])
            ),
        )
        eventually(reg.has_synced)
        assert got == [("add", "a"), ("add", "b")]
        api.clear_log()
        clock.step(29)
        assert reg.wait_idle(5) and len(got) == 2
        clock.step(1)
        eventually(lambda: len(got) == 4)
        assert got[2:] == [("resync", "a"), ("resync", "b")]
        assert not [q for q in api.requests if not q.query.get("watch")]  # no API calls
        factory.shutdown()


def test_handler_exception_does_not_stop_delivery() -> None:
    with FakeApiServer() as api:
        factory = SharedInformerFactory(api.client(), clock=FakeClock())
        inf = factory.informer_for(r.NODES)
        seen: list[str] = []

        def flaky(o: JSON) -> None:
            seen.append(o["metadata"]["name"])
            raise RuntimeError("boom")

        inf.add_event_handler(on_add=flaky)
        factory.start()
        assert factory.wait_for_cache_sync(5)
        for n in ("x", "y"):
            api.seed(r.NODES, {"metadata": {"name": n}})
        eventually(lambda: seen == ["x", "y"])
        factory.shutdown()


def test_has_stopped_once_no_thread_can_change_the_cache() -> None:
    with FakeApiServer() as api:
        api.seed(r.NODES, {"metadata": {"name": "x"}})
        factory = SharedInformerFactory(api.client(), clock=FakeClock())
        inf = factory.informer_for(r.NODES)
        assert not inf.has_stopped()
        factory.start()
        assert factory.wait_for_cache_sync(5) and not inf.has_stopped()
        factory.shutdown()
        assert inf.has_stopped()  # joined: the threads exited well within the bound
        assert [k for k, _ in inf.indexer.items()] == ["x"]  # the cache keeps its content


CODECS: dict[str, Callable[[], SerializedCodec | None]] = {
    "dicts": lambda: None,
    "serialized": SerializedCodec,
    "serialized-no-lru": lambda: SerializedCodec(decoded=0),
    "serialized-lru-1": lambda: SerializedCodec(decoded=1),
}


@pytest.mark.parametrize("codec", list(CODECS))
def test_indexer_indexes_and_replace(codec: str) -> None:
    idx = Indexer(
        {BY_NODE_NAME: index_by_node_name, "app": by_label("app"), BY_UID: index_by_uid},
        codec=CODECS[codec](),
    )
    a = pod("a", "n1", app="x") | {}
    a["metadata"] = a["metadata"] | {"uid": "u-a"}
    b = pod("b", "n2", app="x")
    b["metadata"] = b["metadata"] | {"ownerReferences": [{"uid": "u-a"}]}
    idx.add(a)
    idx.add(b)
    idx.add_indexers({BY_OWNER_UID: index_by_owner_uid})
    assert [o["metadata"]["name"] for o in idx.by_index("app", "x")] == ["a", "b"]
    assert idx.index_keys(BY_NODE_NAME, "n2") == ["ns/b"]
    assert idx.index_keys(BY_OWNER_UID, "u-a") == ["ns/b"]
    moved = pod("b", "n3", app="y")
    idx.update(moved)
    assert idx.index_keys(BY_NODE_NAME, "n2") == [] and idx.index_keys("app", "y") == ["ns/b"]
    assert idx.get_by_key("ns/b") == moved and idx.index_values("app") == ["x", "y"]
    gone = idx.replace([pod("c")])
    assert sorted(gone) == ["ns/a", "ns/b"] and idx.list_keys() == ["ns/c"]
    assert gone["ns/b"] == moved and idx.list() == [pod("c")] and idx.index_values("app") == []
    assert idx.by_index(BY_UID, "u-a") == []
    idx.delete(DeletedFinalStateUnknown("ns/c", pod("c")))
    assert len(idx) == 0
    with pytest.raises(KeyError):
        idx.by_index("nope", "x")
    with pytest.raises(ValueError, match="exists"):
        idx.add_indexers({"app": by_label("app")})


def test_lister_lookups() -> None:
    idx = Indexer({"app": by_label("app")})
    for p in (pod("a", app="x"), pod("b", app="y")):
        idx.add(p)
    idx.add({"metadata": {"name": "c", "namespace": "other", "labels": {"app": "x"}}})
    lister = Lister(idx, r.PODS)
    assert lister.get("a", "ns") is not None and lister.get("zz", "ns") is None
    assert [o["metadata"]["name"] for o in lister.list("ns")] == ["a", "b"]
    assert [o["metadata"]["name"] for o in lister.list(labels={"app": "x"})] == ["a", "c"]
    assert [o["metadata"]["name"] for o in lister.by_index("app", "x")] == ["a", "c"]
    assert lister.get_by_key("other/c") is not None
    with pytest.raises(ValueError, match="namespaced"):
        lister.get("a")


def test_compact_transform_preserves_equality_and_shares_strings() -> None:
    raw = json.loads('{"metadata": {"name": "a", "managedFields": [{"m": 1}]}, "s": ["Running"]}')
    other = json.loads('{"s": ["Running"]}')
    out = compact(raw)
    assert out == {"metadata": {"name": "a"}, "s": ["Running"]}
    assert "managedFields" in raw["metadata"]  # input untouched
    assert out["s"][0] is compact(other)["s"][0]


def test_factory_shares_one_informer_per_selector_set_and_lists_through_it() -> None:
    with FakeApiServer() as api:
        api.seed(r.PODS, pod("a", node="n1"))
        api.seed(r.PODS, pod("b", node="n2"))
        factory = SharedInformerFactory(api.client(), clock=FakeClock())
        on_n1 = factory.informer_for(r.PODS, "ns", None, "spec.nodeName=n1")
        assert factory.informer_for(r.PODS, "ns", field_selector="spec.nodeName=n1") is on_n1
        assert factory.informer_for(r.PODS, "ns") is not on_n1
        lister = factory.lister_for(r.PODS, "ns", field_selector="spec.nodeName=n1")
        factory.start()
        try:
            assert factory.wait_for_cache_sync(5)
            assert [o["metadata"]["name"] for o in lister.list("ns")] == ["a"]
        finally:
            factory.shutdown()


def test_wait_for_cache_sync_times_out_on_the_injected_clock() -> None:
    with FakeApiServer() as api:
        api.set_available(False)
        clock = FakeClock()
        factory = SharedInformerFactory(api.client(), clock=clock)
        factory.informer_for(r.PODS)
        factory.start()
        try:
            assert not factory.wait_for_cache_sync(0)  # a check, no wait
            synced: list[bool] = []
            waiter = threading.Thread(target=lambda: synced.append(factory.wait_for_cache_sync(5)))
            waiter.start()
            eventually(lambda: clock.waits.count(5.0) == 1)  # blocked in the sync wait
            clock.step(4.9)
            assert waiter.is_alive()  # virtual time, not real time, bounds the wait
            clock.step(0.1)
            waiter.join(5)
            assert synced == [False]
            api.set_available(True)

            def synced_after_a_step() -> bool:
                # Past any reflector backoff, however late the reflector began to wait for it
                # (a single step could come before the failed list's backoff started: flaky
                # in a full unit run).
                clock.step(60.0)
                return factory.wait_for_cache_sync(0)

            eventually(synced_after_a_step)
        finally:
            factory.shutdown()


def test_an_overdue_resync_waits_for_the_first_sync_instead_of_spinning() -> None:
    """A handler's resync that falls due before the informer ever synced (API server out of
    reach at start) waits for the sync; it used to poll every millisecond until then. Real
    time: the spin shows as waits on the clock while fake time stands still, 1 s of it."""
    clock = FakeClock()
    with FakeApiServer() as api:
        client = api.client()
    factory = SharedInformerFactory(client, clock=clock, resync_period=30)  # server gone
    inf = factory.informer_for(r.PODS)
    inf.add_event_handler(on_add=lambda o: None)
    factory.start()
    clock.step(60)
    time.sleep(1.0)  # with the spin: a wait per FakeClock real poll (0.2 s), ~5
    spins = [w for w in clock.waits if 0 < w <= 0.001]
    assert len(spins) <= 1, f"{len(spins)} millisecond waits before the first sync"
    assert not inf.has_synced()
    factory.shutdown()
