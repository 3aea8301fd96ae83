"""AsyncEventRecorder / EventCorrelator: never blocks the caller, aggregation, dedup, spam filter.

All time is a fake clock; the sender is driven with ``process_pending`` except where the test is
about the background thread, and nothing sleeps for real.
"""

from __future__ import annotations

import threading
from typing import Any

from pkg.base.types import JSON
from pkg.kube.errors import ConnectionFailedError, NotFoundError
from pkg.kube.eventbroadcaster import AGGREGATED_PREFIX, AsyncEventRecorder, EventCorrelator
from pkg.kube.resources import EVENTS, Resource
from pkg.testing.clock import FakeClock


def obj(name: str = "cd1", uid: str = "u1") -> JSON:
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": name, "namespace": "team", "uid": uid},
    }


class SinkClient:
    """Records Event creates/patches; can block or fail on demand."""

    def __init__(self) -> None:
        self.created: list[JSON] = []
        self.patches: list[tuple[str, JSON]] = []
        self.block = threading.Event()
        self.block.set()
        self.fail_with: list[Exception] = []
        self.calls = 0

    def _enter(self) -> None:
        self.calls += 1
        self.block.wait()
        if self.fail_with:
            raise self.fail_with.pop(0)

    def create(self, resource: Resource, body: JSON, *, namespace: str | None = None) -> JSON:
        assert resource is EVENTS
        self._enter()
        self.created.append(body)
        return body

    def patch(self, resource: Resource, name: str, body: JSON, **kw: Any) -> JSON:
        assert resource is EVENTS
        self._enter()
        if not any(e["metadata"]["name"] == name for e in self.created):
            raise NotFoundError(404, "NotFound", name)
        self.patches.append((name, body))
        return body


def recorder(client: SinkClient, clock: FakeClock, **kw: Any) -> AsyncEventRecorder:
    kw.setdefault("sleep", clock.step)
    return AsyncEventRecorder(client, "compute-domain-controller", clock, **kw)  # type: ignore[arg-type]


def test_event_returns_at_once_while_the_sink_hangs_and_drops_when_full() -> None:
    clock, client = FakeClock(), SinkClient()
    client.block.clear()  # every API call hangs until released
    rec = recorder(client, clock, queue_size=50)
    rec.start()
    try:
        done = threading.Event()

        def producer() -> None:
            for i in range(500):
                rec.event(obj(uid=f"u{i}"), "Normal", "Created", f"m{i}")
            done.set()

        threading.Thread(target=producer, daemon=True).start()
        assert done.wait(5.0), "event() blocked on a hanging API server"
        # the sender holds one event in the hanging call; the rest is queued or dropped
        assert rec.pending() + rec.dropped + 1 >= 500
        assert rec.dropped >= 500 - 50 - 1
    finally:
        client.block.set()
        rec.stop()


def test_transient_failures_retry_on_the_sender_only_then_give_up() -> None:
    clock, client = FakeClock(), SinkClient()
    client.fail_with = [ConnectionFailedError("down")] * 10
    slept: list[float] = []
    rec = recorder(client, clock, retry_delays=(1.0, 2.0), sleep=slept.append)
    rec.event(obj(), "Warning", "Broken", "x")  # returns without any API call
    assert client.calls == 0
    rec.process_pending()
    assert slept == [1.0, 2.0] and client.calls == 3
    assert rec.failed == 1 and not client.created


def test_identical_events_patch_count_instead_of_creating() -> None:
    clock, client = FakeClock(), SinkClient()
    rec = recorder(client, clock)
    for _ in range(3):
        rec.event(obj(), "Normal", "WaitingForDependents", "waiting")
        clock.step(1)
    rec.process_pending()
    assert len(client.created) == 1
    assert [p["count"] for _, p in client.patches] == [2, 3]


def test_expired_event_is_created_again() -> None:
    clock, client = FakeClock(), SinkClient()
    rec = recorder(client, clock)
    rec.event(obj(), "Normal", "R", "m")
    rec.process_pending()
    client.created.clear()  # the Event expired server-side
    rec.event(obj(), "Normal", "R", "m")
    rec.process_pending()
    assert len(client.created) == 1 and client.created[0]["count"] == 1


def test_similar_events_are_aggregated_after_ten_within_ten_minutes() -> None:
    clock = FakeClock()
    corr = EventCorrelator(clock)
    out = []
    for i in range(12):
        ev = {
            "involvedObject": {"uid": "u1"},
            "source": {"component": "c"},
            "type": "Warning",
            "reason": "NodeNotReady",
            "message": f"node-{i}",
            "count": 1,
        }
        result = corr.correlate(ev)
        assert result is not None
        out.append(result)
        if result.existing is None:
            corr.written(result, "team", f"e{i}")
    assert all(not r.body["message"].startswith(AGGREGATED_PREFIX) for r in out[:9])
    assert out[9].body["message"] == AGGREGATED_PREFIX + "node-9"
    assert out[9].existing is None  # first aggregate: created
    assert out[10].existing == ("team", "e9") and out[10].body["count"] == 2
    # after the interval the aggregation window starts afresh
    clock.step(601)
    ev = dict(out[0].body, message="node-x")
    fresh = corr.correlate(ev)
    assert fresh is not None and not fresh.body["message"].startswith(AGGREGATED_PREFIX)


def test_spam_filter_allows_a_burst_of_25_per_object_then_one_per_five_minutes() -> None:
    clock, client = FakeClock(), SinkClient()
    rec = recorder(client, clock)
    for i in range(40):
        rec.event(obj(), "Normal", f"R{i}", "m")
    rec.event(obj(name="other", uid="u2"), "Normal", "R", "m")  # another object: own bucket
    rec.process_pending()
    assert rec.written == 26 and rec.filtered == 15
    clock.step(299)
    rec.event(obj(), "Normal", "late", "m")
    rec.process_pending()
    assert rec.filtered == 16
    clock.step(1)
    rec.event(obj(), "Normal", "later", "m")
    rec.process_pending()
    assert rec.written == 27


def test_background_sender_delivers() -> None:
    clock, client = FakeClock(), SinkClient()
    rec = recorder(client, clock)
    rec.start()
    try:
        rec.event(obj(), "Normal", "R", "m")
        for _ in range(500):
            if client.created:
                break
            threading.Event().wait(0.01)
        assert client.created and client.created[0]["reason"] == "R"
        assert client.created[0]["source"] == {"component": "compute-domain-controller"}
    finally:
        rec.stop()
