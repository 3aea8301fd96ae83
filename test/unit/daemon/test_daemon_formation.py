"""An IMEX daemon's part of its ComputeDomain's formation trace (in-memory span exporter).

With the ``TRACEPARENT`` the plugin injects, one pass of the loop records ``join``, ``start
IMEX`` and ``IMEX ready`` under an ``IMEX daemon`` span that ends at the first published
Ready and hangs under the domain's root; later passes (an IMEX restart) add nothing; a daemon
that stops first ends its span with an error; without ``TRACEPARENT`` nothing is recorded.
"""

from __future__ import annotations

from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from test_daemon_daemon import (  # type: ignore[import-not-found, unused-ignore]
    FakeCtl,
    FakeRunner,
    fake_clock,
    following,
    options,
    own_entry,
)

from pkg.api import constants as c
from pkg.daemon.daemon import Daemon, Timing
from pkg.daemon.metrics import DaemonMetrics
from pkg.daemon.options import Options
from pkg.runtime.tracing import Tracing, new_traceparent, parse_traceparent
from pkg.testing.clock import FakeClock
from pkg.testing.fakeapiserver import FakeApiServer


def traced(
    api: FakeApiServer, opts: Options, exporter: InMemorySpanExporter
) -> tuple[Daemon, FakeRunner]:
    runner = FakeRunner()
    tracing = Tracing.with_exporters("compute-domain-daemon", [exporter])
    daemon = Daemon(
        opts,
        client=api.client(),
        clock=fake_clock(),
        runner=runner,
        commands=FakeCtl(runner),
        metrics=DaemonMetrics(),
        child_env={"PATH": "/bin"},
        timing=Timing(),
        informer_clock=FakeClock(),
        locate=lambda program: f"/usr/bin/{program}",
        tracer=tracing.tracer,
    )
    return daemon, runner


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    found = {s.name: s for s in spans}
    assert len(found) == len(spans), [s.name for s in spans]
    return found


def test_first_ready_records_join_imex_start_and_ready(api: FakeApiServer, tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    value = new_traceparent()
    ids = parse_traceparent(value)
    assert ids is not None
    daemon, runner = traced(api, options(tmp_path, TRACEPARENT=value), exporter)
    daemon.formation.begin()  # what run() does once the node has a clique
    daemon._take_local_lock()
    daemon._write_imex_config()
    with following(daemon):
        daemon.step()
        assert own_entry(api)["status"] == c.STATUS_NOT_READY  # the record went out first
        daemon._clock.step(Timing().ready_write_spread)  # type: ignore[attr-defined]
        daemon.step()
        assert own_entry(api)["status"] == c.STATUS_READY and len(runner.procs) == 1
        formation = exporter.get_finished_spans()
        # An IMEX crash and restart later is not part of the formation.
        exporter.clear()
        runner.procs[0].code = 1
        daemon.step()
        daemon.supervisor._clock.step(1.0)  # type: ignore[attr-defined]
        daemon.step()
        daemon.step()
        assert len(runner.procs) == 2
        daemon.formation.end("stopped")
        assert exporter.get_finished_spans() == ()

    spans = by_name(formation)
    assert set(spans) == {
        "IMEX daemon",
        "join",
        "start IMEX",
        "IMEX ready on the node",
        "IMEX ready",
    }
    top = spans["IMEX daemon"]
    assert top.parent is not None and top.context is not None
    assert (top.context.trace_id, top.parent.span_id) == (ids.trace_id, ids.span_id)
    assert top.attributes is not None and top.attributes["k8s.node.name"] == "n0"
    assert top.attributes["imex.clique.id"] == "cl.1"
    for name in ("join", "start IMEX", "IMEX ready on the node", "IMEX ready"):
        child = spans[name]
        assert child.parent is not None and child.parent.span_id == top.context.span_id
        assert top.start_time is not None and top.end_time is not None
        assert child.start_time is not None and child.end_time is not None
        assert top.start_time <= child.start_time <= child.end_time <= top.end_time
    assert spans["join"].end_time <= spans["start IMEX"].start_time  # type: ignore[operator]
    assert spans["start IMEX"].end_time == spans["IMEX ready"].start_time
    # The node-local record goes out before the entry's Ready.
    local = spans["IMEX ready on the node"]
    assert spans["start IMEX"].end_time <= local.start_time  # type: ignore[operator]
    assert local.end_time <= spans["IMEX ready"].end_time  # type: ignore[operator]
    assert top.status.status_code != StatusCode.ERROR


def test_stop_before_ready_ends_the_span_with_an_error(api: FakeApiServer, tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    daemon, _ = traced(api, options(tmp_path, TRACEPARENT=new_traceparent()), exporter)
    daemon.formation.begin()
    daemon.formation.end("stopped before its IMEX daemon was Ready")
    daemon.formation.end("again")
    (span,) = exporter.get_finished_spans()
    assert span.name == "IMEX daemon" and span.status.status_code == StatusCode.ERROR
    assert span.status.description == "stopped before its IMEX daemon was Ready"


def test_without_traceparent_nothing_is_recorded(api: FakeApiServer, tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    daemon, _ = traced(api, options(tmp_path), exporter)
    daemon.formation.begin()
    daemon._write_imex_config()
    with following(daemon):
        daemon.step()
    assert own_entry(api)["status"] == c.STATUS_READY
    assert exporter.get_finished_spans() == ()
