"""pkg.runtime.tracing: exporters chosen by OTEL_* env, traceparents, pre-announced spans."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pkg.api import constants as c
from pkg.runtime.tracing import (
    FILE_PATH_VAR,
    FormationIds,
    Tracing,
    child_span,
    epoch_ns,
    new_traceparent,
    parent_context,
    parse_traceparent,
    setup_tracing,
    traceparent_of,
)


def test_traceparent_round_trip_and_rejects() -> None:
    value = new_traceparent()
    ids = parse_traceparent(value)
    assert ids is not None and ids.trace_id and ids.span_id
    assert ids.traceparent() == value and value.endswith("-01")
    assert new_traceparent() != value
    for bad in (None, "", "garbage", "00-" + "0" * 32 + "-" + "1" * 16 + "-01", "00-xyz-abc-01"):
        assert parse_traceparent(bad) is None
        assert parent_context(bad) is None
    obj = {"metadata": {"annotations": {c.TRACEPARENT_ANNOTATION: value}}}
    assert traceparent_of(obj) == value
    assert traceparent_of({"metadata": {}}) is None


def test_preannounced_root_is_the_parent_of_children_made_before_it() -> None:
    exporter = InMemorySpanExporter()
    tracing = Tracing.with_exporters("svc", [exporter])
    value = new_traceparent()
    ids = parse_traceparent(value)
    assert ids is not None
    clock = iter([105.0, 106.0])
    with child_span(
        tracing.tracer,
        parent_context(value),
        "child",
        now=lambda: next(clock),
        attributes={"k": "v"},
    ) as span:
        assert span.is_recording()
    tracing.emit_preannounced("root", ids, start=100.0, end=110.5, attributes={"a": 1})
    child, root = exporter.get_finished_spans()
    assert root.context is not None and child.context is not None and child.parent is not None
    assert (root.context.trace_id, root.context.span_id) == (ids.trace_id, ids.span_id)
    assert root.parent is None
    assert (root.start_time, root.end_time) == (epoch_ns(100.0), epoch_ns(110.5))
    assert child.parent.span_id == ids.span_id and child.context.trace_id == ids.trace_id
    assert (child.start_time, child.end_time) == (epoch_ns(105.0), epoch_ns(106.0))
    assert child.attributes == {"k": "v"} and root.attributes == {"a": 1}
    # Ordinary spans still get random ids.
    with tracing.tracer.start_as_current_span("other") as other:
        assert other.get_span_context().span_id != ids.span_id
    tracing.shutdown()


def test_child_span_records_errors_and_is_inert_without_parent() -> None:
    exporter = InMemorySpanExporter()
    tracing = Tracing.with_exporters("svc", [exporter])
    with child_span(tracing.tracer, None, "x", now=lambda: 1.0) as span:
        assert span is trace.INVALID_SPAN
        with child_span(
            tracing.tracer, trace.set_span_in_context(span), "nested", now=lambda: 1.0
        ) as nested:
            assert not nested.is_recording()
    with (
        pytest.raises(RuntimeError),
        child_span(tracing.tracer, parent_context(new_traceparent()), "boom", now=lambda: 1.0),
    ):
        raise RuntimeError("bad")
    (failed,) = exporter.get_finished_spans()
    assert failed.name == "boom" and not failed.status.is_ok
    assert failed.events[0].name == "exception"


def test_file_exporter_writes_one_json_line_per_span_from_many_threads(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    env = {"OTEL_TRACES_EXPORTER": "file", FILE_PATH_VAR: str(path), "OTEL_SERVICE_NAME": "me"}
    tracing = setup_tracing("svc", env=env)
    assert tracing.enabled

    def work(i: int) -> None:
        for j in range(20):
            with tracing.tracer.start_as_current_span(f"s{i}-{j}"):
                pass

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tracing.shutdown()
    lines = path.read_text().splitlines()
    spans = [json.loads(line) for line in lines]
    assert sorted(s["name"] for s in spans) == sorted(
        f"s{i}-{j}" for i in range(4) for j in range(20)
    )
    assert {s["resource"]["attributes"]["service.name"] for s in spans} == {"me"}


@pytest.mark.parametrize(
    "env",
    [
        {"OTEL_TRACES_EXPORTER": "file"},  # no path
        {"OTEL_TRACES_EXPORTER": "zipkin"},  # not supported here
        {"OTEL_TRACES_EXPORTER": "otlp"},  # no endpoint
        {"OTEL_TRACES_EXPORTER": "console,none"},
        {"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"},
    ],
    ids=["file-without-path", "unsupported", "otlp-without-endpoint", "none-wins", "disabled"],
)
def test_unusable_exporter_settings_mean_no_tracing(env: dict[str, str]) -> None:
    tracing = setup_tracing("svc", env=env)
    assert not tracing.enabled
    tracing.emit_preannounced("root", FormationIds(1, 2), start=0.0, end=1.0)  # no-op
    tracing.shutdown()


def test_console_exporter_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    tracing = setup_tracing("svc", env={"OTEL_TRACES_EXPORTER": "console"})
    assert tracing.enabled
    tracing.emit_preannounced("root", FormationIds(7, 9), start=1.0, end=2.0)
    tracing.shutdown()
    printed = json.loads(capsys.readouterr().out)
    assert printed["name"] == "root"
    assert printed["context"]["span_id"] == f"0x{9:016x}"
