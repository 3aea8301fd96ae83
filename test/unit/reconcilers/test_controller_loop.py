"""Generic Controller: result/requeue/terminal semantics, metrics, spans, handler mapping, and
each reconcile's deadline and stop signal with a draining `stop`, all on a fake clock."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from pkg.informers import RateLimitingQueue
from pkg.reconcilers.controller import (
    BACKGROUND,
    CancelledError,
    Controller,
    ReconcileContext,
    ReconcileMetrics,
    Result,
    TerminalError,
)
from pkg.testing.clock import FakeClock
from pkg.testing.eventually import eventually


class Scripted:
    """A reconciler whose outcome per call is scripted."""

    def __init__(self, *outcomes: Callable[[], Result]) -> None:
        self.outcomes = list(outcomes)
        self.keys: list[str] = []

    def reconcile(self, key: str, ctx: ReconcileContext = BACKGROUND) -> Result:
        self.keys.append(key)
        return self.outcomes.pop(0)()


def raise_(exc: Exception) -> Callable[[], Result]:
    def f() -> Result:
        raise exc

    return f


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def build(
    reconciler: Scripted, exporter: InMemorySpanExporter, *, batch_period: float = 0.0
) -> tuple[Controller, RateLimitingQueue[str], FakeClock, CollectorRegistry]:
    clock, registry = FakeClock(), CollectorRegistry()
    queue: RateLimitingQueue[str] = RateLimitingQueue(name="demo", clock=clock, registry=registry)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    ctl = Controller(
        name="demo",
        reconciler=reconciler,
        queue=queue,
        metrics=ReconcileMetrics(registry),
        tracer=provider.get_tracer("t"),
        clock=clock,
        batch_period=batch_period,
    )
    return ctl, queue, clock, registry


def total(registry: CollectorRegistry, result: str) -> float:
    value = registry.get_sample_value(
        "nvidia_dra_reconcile_total", {"controller": "demo", "result": result}
    )
    return value or 0.0


def test_success_error_terminal_and_requeue_after(exporter: InMemorySpanExporter) -> None:
    rec = Scripted(
        Result,
        raise_(RuntimeError("boom")),
        raise_(TerminalError("bad spec")),
        lambda: Result(requeue_after=30.0),
    )
    ctl, queue, clock, registry = build(rec, exporter)
    ctl.enqueue("ns/a")
    assert ctl.process_next()
    assert total(registry, "success") == 1 and queue.num_requeues("ns/a") == 0
    ctl.enqueue("ns/a")
    assert ctl.process_next()
    assert total(registry, "error") == 1
    assert queue.num_requeues("ns/a") == 1 and queue.waiting() == 1  # rate-limited retry
    clock.step(1.0)
    assert ctl.process_next()  # the retry: terminal → forgotten, not requeued
    assert total(registry, "terminal") == 1
    assert queue.num_requeues("ns/a") == 0 and queue.waiting() == 0 and queue.len() == 0
    ctl.enqueue("ns/a")
    assert ctl.process_next()
    assert total(registry, "requeue") == 1 and queue.waiting() == 1
    assert (
        registry.get_sample_value("nvidia_dra_reconcile_errors_total", {"controller": "demo"}) == 2
    )
    assert (
        registry.get_sample_value(
            "nvidia_dra_reconcile_duration_seconds_count", {"controller": "demo"}
        )
        == 4
    )
    assert registry.get_sample_value("workqueue_adds_total", {"name": "demo"}) is not None
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["reconcile demo"] * 4
    assert all(s.attributes and s.attributes["key"] == "ns/a" for s in spans)
    assert rec.keys == ["ns/a"] * 4
    ctl.stop()
    assert not ctl.process_next()


def test_handler_maps_objects_and_survives_a_failing_mapper(
    exporter: InMemorySpanExporter,
) -> None:
    ctl, queue, _clock, _ = build(Scripted(), exporter)
    ctl.handler(lambda o: [o["metadata"]["name"], "x"])({"metadata": {"name": "n1"}})
    ctl.handler(lambda o: [o["missing"]])({"metadata": {}})
    assert queue.len() == 2


def test_workers_run_until_stopped(exporter: InMemorySpanExporter) -> None:
    rec = Scripted(*([Result] * 3))
    ctl, queue, _clock, registry = build(rec, exporter)
    for key in ("a", "b", "c"):
        ctl.enqueue(key)
    ctl.start()
    queue.shutdown_with_drain(timeout=5)
    ctl.stop()
    assert sorted(rec.keys) == ["a", "b", "c"]
    assert total(registry, "success") == 3


def test_batch_period_coalesces_a_burst_of_events_per_key(
    exporter: InMemorySpanExporter,
) -> None:
    """The first event of a key is reconciled at once; events within the batch period after
    that reconcile started wait for its end and cost one reconcile together; another key is
    not held back; once the period is over, an event is reconciled at once again."""
    rec = Scripted(*([Result] * 5))
    ctl, queue, clock, _registry = build(rec, exporter, batch_period=0.2)
    on_event = ctl.handler(lambda o: [o["metadata"]["name"]])
    a, b = {"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}
    on_event(a)
    assert queue.len() == 1 and ctl.process_next() and rec.keys == ["a"]
    clock.step(0.05)
    for _ in range(5):
        on_event(a)  # a burst within the period: held back
    on_event(b)  # another key: at once
    assert queue.len() == 1 and queue.waiting() == 1
    assert ctl.process_next() and rec.keys == ["a", "b"]
    worker = threading.Thread(target=ctl.process_next)
    worker.start()
    assert clock.block_until_waiters(1)
    clock.step(0.1)  # 0.15 s after a's reconcile started: still held back
    worker.join(timeout=0.2)
    assert worker.is_alive() and rec.keys == ["a", "b"] and queue.waiting() == 1
    clock.step(0.06)
    worker.join(timeout=5)
    assert not worker.is_alive() and rec.keys == ["a", "b", "a"]
    clock.step(0.5)
    on_event(a)  # a quiet period: at once
    assert queue.len() == 1 and ctl.process_next() and rec.keys == ["a", "b", "a", "a"]
    ctl.enqueue("a")  # a direct enqueue is never held back
    assert queue.len() == 1


# -- deadline, stop signal and drain ----------------------------------------------------------


class Waiting:
    """Per key: records its context, then runs the scripted behaviour for that key."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.contexts: dict[str, ReconcileContext] = {}
        self.entered = threading.Event()
        self.release = threading.Event()

    def reconcile(self, key: str, ctx: ReconcileContext = BACKGROUND) -> Result:
        self.contexts[key] = ctx
        if key == "slow":  # one long API call (virtual time), then the check between calls
            self.clock.step(6.0)
            ctx.check()
        elif key == "cooperative":  # waits for the stop signal like a call that is retried
            self.entered.set()
            eventually(ctx.stopped)
            ctx.check()
        elif key == "stubborn":  # ignores its context until the test releases it
            self.entered.set()
            self.release.wait(10)
        else:
            ctx.check()
        return Result()


def waiting_controller(
    exporter: InMemorySpanExporter, reconcile_timeout: float | None = None
) -> tuple[Controller, Waiting, RateLimitingQueue[str], FakeClock, CollectorRegistry]:
    clock, registry = FakeClock(), CollectorRegistry()
    rec = Waiting(clock)
    queue: RateLimitingQueue[str] = RateLimitingQueue(name="demo", clock=clock, registry=registry)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    ctl = Controller(
        name="demo",
        reconciler=rec,
        queue=queue,
        metrics=ReconcileMetrics(registry),
        tracer=provider.get_tracer("t"),
        clock=clock,
        reconcile_timeout=reconcile_timeout,
    )
    return ctl, rec, queue, clock, registry


def test_context_without_owner_is_never_cancelled_and_a_deadline_needs_a_clock() -> None:
    assert not BACKGROUND.cancelled() and BACKGROUND.remaining() is None
    BACKGROUND.check()
    with pytest.raises(ValueError, match="clock"):
        ReconcileContext(deadline=1.0)
    clock = FakeClock()
    ctx = ReconcileContext(clock=clock, deadline=2.0)
    assert ctx.remaining() == 2.0 and not ctx.cancelled()
    clock.step(2.0)
    assert ctx.expired() and ctx.remaining() == 0.0 and not ctx.stopped()
    with pytest.raises(CancelledError, match="deadline"):
        ctx.check()


def test_a_reconcile_past_its_deadline_stops_at_the_next_check_and_is_retried(
    exporter: InMemorySpanExporter,
) -> None:
    ctl, rec, queue, _clock, registry = waiting_controller(exporter, reconcile_timeout=5.0)
    ctl.enqueue("fast")
    assert ctl.process_next()
    assert rec.contexts["fast"].deadline == 5.0 and total(registry, "success") == 1
    ctl.enqueue("slow")
    assert ctl.process_next()
    assert rec.contexts["slow"].expired() and not rec.contexts["slow"].stopped()
    assert total(registry, "error") == 1 and queue.num_requeues("slow") == 1  # backed off


def test_no_deadline_unless_configured(exporter: InMemorySpanExporter) -> None:
    ctl, rec, _queue, _clock, registry = waiting_controller(exporter)
    ctl.enqueue("slow")
    assert ctl.process_next()
    assert rec.contexts["slow"].deadline is None and total(registry, "success") == 1


def test_stop_cancels_in_flight_and_queued_reconciles_and_drains(
    exporter: InMemorySpanExporter,
) -> None:
    ctl, rec, queue, _clock, registry = waiting_controller(exporter)
    ctl.start()
    ctl.enqueue("cooperative")
    assert rec.entered.wait(10)
    ctl.enqueue("queued")  # taken after the stop signal: cancelled before any API call
    assert ctl.stop(timeout=5.0)
    assert rec.contexts["cooperative"].stopped()
    assert all(total(registry, r) == 0 for r in ("success", "error", "terminal", "requeue"))
    assert queue.shutting_down() and queue.len() == 0 and not ctl._threads
    ctl.enqueue("late")  # dropped
    assert queue.len() == 0


def test_stop_gives_up_after_its_timeout_on_the_clock(exporter: InMemorySpanExporter) -> None:
    ctl, rec, _queue, clock, _registry = waiting_controller(exporter)
    ctl.start()
    ctl.enqueue("stubborn")
    assert rec.entered.wait(10)
    outcome: list[bool] = []
    stopper = threading.Thread(target=lambda: outcome.append(ctl.stop(timeout=5.0)))
    stopper.start()
    assert clock.block_until_waiters(1)  # stop is draining, on the fake clock
    clock.step(4.9)
    assert stopper.is_alive()
    clock.step(0.1)
    stopper.join(10)
    assert outcome == [False] and len(ctl._threads) == 1  # the stubborn worker is left behind
    rec.release.set()
    ctl._threads[0].join(10)
