"""Reflector + SharedInformer against the fake API server: every scenario ends with
cache == server state. Backoff runs on a FakeClock, so no test really waits for it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from pkg.base.types import JSON
from pkg.informers.informer import SharedInformer
from pkg.informers.listwatch import ResourceListerWatcher
from pkg.informers.reflector import BackoffPolicy
from pkg.informers.store import DeletedFinalStateUnknown
from pkg.kube import resources as r
from pkg.testing.clock import FakeClock
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer

NO_JITTER = BackoffPolicy(initial=1.0, cap=8.0, jitter=0.0)


def pod(name: str, **labels: str) -> JSON:
    return {"metadata": {"name": name, "namespace": "ns", "labels": labels}, "spec": {}}


class Rig:
    def __init__(self, api: FakeApiServer, *, page_size: int = 500, **lw: Any) -> None:
        self.api = api
        self.clock = FakeClock()
        self.client = api.client()
        self.inf = SharedInformer(
            ResourceListerWatcher(self.client, r.PODS, **lw),
            clock=self.clock,
            page_size=page_size,
            backoff=NO_JITTER,
            min_watch_timeout=60,
        )
        self.events: list[tuple[str, Any]] = []
        self.reg = self.inf.add_event_handler(
            lambda o: self.events.append(("add", o["metadata"]["name"])),
            lambda _o, n: self.events.append(("update", n["metadata"]["name"])),
            lambda o: self.events.append(("delete", o)),
        )

    def start(self) -> None:
        self.inf.start()
        assert self.inf.wait_for_sync(5)
        eventually(self.reg.has_synced)

    def watching(self) -> None:
        eventually(lambda: any(q.query.get("watch") for q in self.api.requests[-1:]))

    def converged(self, **selector: str) -> None:
        """The cache holds exactly the server's objects (same keys, same RVs)."""

        def same() -> bool:
            want = {
                f"{o['metadata']['namespace']}/{o['metadata']['name']}": o["metadata"][
                    "resourceVersion"
                ]
                for o in self.api.objects(r.PODS)
                if all(o["metadata"].get("labels", {}).get(k) == v for k, v in selector.items())
            }
            have = {k: o["metadata"]["resourceVersion"] for k, o in self.inf.indexer.items()}
            return want == have

        eventually(same)
        assert self.reg.wait_idle(5)

    def deleted_names(self) -> list[str]:
        out = []
        for kind, obj in self.events:
            if kind == "delete":
                o = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
                out.append(o["metadata"]["name"])
        return out


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer(bookmark_interval=0.05) as server:
        yield server


@pytest.fixture
def rigs() -> Iterator[list[Rig]]:
    made: list[Rig] = []
    yield made
    for rig in made:
        rig.inf.stop()


def test_paginated_initial_list_then_watch(api: FakeApiServer, rigs: list[Rig]) -> None:
    for i in range(7):
        api.seed(r.PODS, pod(f"p{i}"))
    rig = Rig(api, page_size=3)
    rigs.append(rig)
    rig.start()
    lists = [q for q in api.requests if not q.query.get("watch")]
    assert len(lists) == 3 and lists[0].query["resourceVersion"] == "0"
    assert "continue" in lists[1].query and lists[2].query["limit"] == "3"
    rig.watching()
    rig.client.create(r.PODS, pod("late"))
    rig.client.patch(r.PODS, "p1", {"metadata": {"labels": {"x": "y"}}}, namespace="ns")
    rig.client.delete(r.PODS, "p2", namespace="ns")
    rig.converged()
    assert rig.events[-3:][0] == ("add", "late") and rig.events[-2] == ("update", "p1")
    assert rig.deleted_names() == ["p2"]


def test_bookmarks_advance_rv_without_events(api: FakeApiServer, rigs: list[Rig]) -> None:
    rig = Rig(api, label_selector="app=mine")
    rigs.append(rig)
    rig.start()
    rig.watching()
    before = rig.inf.last_sync_resource_version
    api.seed(r.PODS, pod("other", app="theirs"))  # filtered out, but moves the global RV
    eventually(lambda: rig.inf.last_sync_resource_version != before)
    assert rig.events == [] and rig.inf.reflector.lists == 1
    rig.converged(app="mine")


def test_dropped_connection_resumes_from_last_rv(api: FakeApiServer, rigs: list[Rig]) -> None:
    api.seed(r.PODS, pod("a"))
    rig = Rig(api)
    rigs.append(rig)
    rig.start()
    rig.watching()
    api.close_watches()
    assert rig.clock.block_until_waiters(1)  # reflector is backing off
    last_rv = rig.inf.last_sync_resource_version
    api.seed(r.PODS, pod("b"))
    rig.client.delete(r.PODS, "a", namespace="ns")
    api.clear_log()
    rig.clock.step(NO_JITTER.initial)
    rig.converged()
    assert rig.inf.reflector.lists == 1
    assert api.requests[0].query["watch"] == "true"
    assert api.requests[0].query["resourceVersion"] == last_rv
    assert rig.deleted_names() == ["a"]
    assert not isinstance(rig.events[-1][1], DeletedFinalStateUnknown)


def test_gone_relists_and_emits_tombstones(api: FakeApiServer, rigs: list[Rig]) -> None:
    for name in ("keep", "vanish", "change"):
        api.seed(r.PODS, pod(name))
    rig = Rig(api)
    rigs.append(rig)
    rig.start()
    rig.watching()
    api.close_watches()
    assert rig.clock.block_until_waiters(1)
    rig.client.delete(r.PODS, "vanish", namespace="ns")
    rig.client.patch(r.PODS, "change", {"metadata": {"labels": {"v": "2"}}}, namespace="ns")
    api.seed(r.PODS, pod("new"))
    api.compact()
    rig.clock.step(NO_JITTER.initial)
    rig.converged()
    assert rig.inf.reflector.lists == 2
    relist = [q for q in api.requests if not q.query.get("watch")][-1]
    assert relist.query.get("resourceVersion") == ""  # consistent read after 410
    tomb = rig.events[-1][1]
    assert isinstance(tomb, DeletedFinalStateUnknown) and tomb.key == "ns/vanish"
    assert ("add", "new") in rig.events and rig.events.count(("update", "change")) == 1


def test_list_errors_back_off_and_recover(api: FakeApiServer, rigs: list[Rig]) -> None:
    api.seed(r.PODS, pod("a"))
    api.inject_error("LIST", r.PODS, 500, count=2)
    api.inject_error("WATCH", r.PODS, 429)
    rig = Rig(api)
    rigs.append(rig)
    rig.inf.start()
    for _ in range(3):  # two failed lists, then a throttled watch
        assert rig.clock.block_until_waiters(1)
        rig.clock.step(NO_JITTER.cap)
    rig.converged()
    assert rig.inf.has_synced() and rig.inf.reflector.lists == 1


def test_backoff_is_capped_exponential_and_resets() -> None:
    with FakeApiServer() as api:
        rig = Rig(api)
        refl = rig.inf.reflector
        delays = [refl._next_backoff() for _ in range(6)]
        assert delays == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
        rig.clock.step(NO_JITTER.reset_after + 1)
        assert refl._next_backoff() == 1.0


def test_backoff_while_unreachable_stays_short() -> None:
    """No answer at all (API server down or restarting): waits stop growing at 2 s, so the
    client is back within seconds of the server's return; answered failures still grow, but
    an outage does not count toward them: a restarted server answers 403 until its authorizer
    has synced, and the client must not then wait out an escalated backoff (the chaos suite's
    cache check found controller caches stale for 10+ s after an apiserver restart)."""
    with FakeApiServer() as api:
        refl = Rig(api).inf.reflector
        unreachable = [refl._next_backoff(unreachable=True) for _ in range(6)]
        assert unreachable == [1.0, 2.0, 2.0, 2.0, 2.0, 2.0]
        answered = [refl._next_backoff() for _ in range(5)]
        assert answered == [1.0, 2.0, 4.0, 8.0, 8.0]  # starts over, then grows to the cap
        assert refl._next_backoff(unreachable=True) == 1.0  # a new outage starts over too


def test_stop_is_prompt_during_watch_and_backoff(api: FakeApiServer) -> None:
    rig = Rig(api)
    rig.start()
    rig.watching()
    t0 = time.monotonic()
    rig.inf.stop()
    assert time.monotonic() - t0 < 2
    rig2 = Rig(api)
    api.inject_error("LIST", r.PODS, 500, count=100)
    rig2.inf.start()
    assert rig2.clock.block_until_waiters(1)
    t0 = time.monotonic()
    rig2.inf.stop()
    assert time.monotonic() - t0 < 2


def test_api_server_outage_backs_off_then_resumes(api: FakeApiServer, rigs: list[Rig]) -> None:
    """An API server restart: the watch drops, every reconnect fails, the reflector backs off
    (never exits) and catches up with what changed meanwhile once the server is back."""
    api.seed(r.PODS, pod("a"))
    rig = Rig(api)
    rigs.append(rig)
    rig.start()
    rig.watching()
    api.set_available(False)
    for _ in range(3):  # dropped re-watches: 1 s, 2 s, 4 s backoff, never an exit
        assert rig.clock.block_until_waiters(1)
        rig.clock.step(NO_JITTER.cap)
    api.seed(r.PODS, pod("b"))  # changed while the clients could not see it
    api.set_available(True)
    if rig.clock.block_until_waiters(1, timeout=1.0):  # still in the last backoff
        rig.clock.step(NO_JITTER.cap)
    rig.converged()
    assert ("add", "b") in rig.events
