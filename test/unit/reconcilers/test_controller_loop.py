"""Generic Controller: result/requeue/terminal semantics, metrics, spans and handler mapping."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from pkg.informers import RateLimitingQueue
from pkg.reconcilers.controller import Controller, ReconcileMetrics, Result, TerminalError
from pkg.testing.clock import FakeClock


class Scripted:
    """A reconciler whose outcome per call is scripted."""

    def __init__(self, *outcomes: Callable[[], Result]) -> None:
        self.outcomes = list(outcomes)
        self.keys: list[str] = []

    def reconcile(self, key: str) -> Result:
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
    reconciler: Scripted, exporter: InMemorySpanExporter
) -> tuple[Controller, RateLimitingQueue[str], FakeClock, CollectorRegistry]:
    clock, registry = FakeClock(), CollectorRegistry()
    queue: RateLimitingQueue[str] = RateLimitingQueue(name="demo", clock=clock, registry=registry)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    ctl = Controller(
        name="demo", reconciler=reconciler, queue=queue, metrics=ReconcileMetrics(registry),
        tracer=provider.get_tracer("t"),
    )  # fmt: skip
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
