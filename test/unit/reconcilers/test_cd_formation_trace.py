"""The controller's part of a ComputeDomain's formation trace, and time-to-ready by namespace.

Against the fake API server with an in-memory span exporter: the ``traceparent`` annotation
rides on the finalizer write (no write of its own), the controller's child spans hang under the
announced root, the root is emitted with exactly the announced ids at the first Ready write
(creation → Ready), and nothing is traced when tracing is off or the domain predates it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cdctl_fakes import (  # type: ignore[import-not-found, unused-ignore]
    RecordedEvents,
    clique,
    compute_domain,
    daemon_entry,
    daemon_pod,
    node,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from pkg.api import constants as c
from pkg.base.types import JSON
from pkg.kube import resources as res
from pkg.kube.client import RestClient
from pkg.reconcilers.cache import Caches
from pkg.reconcilers.computedomain import ComputeDomainReconciler
from pkg.reconcilers.config import ControllerConfig
from pkg.reconcilers.formation import ROOT_SPAN_NAME, FormationTracer
from pkg.reconcilers.metrics import DomainMetrics, parse_timestamp
from pkg.runtime.tracing import Tracing, epoch_ns, parse_traceparent
from pkg.testing.clock import FakeClock
from pkg.testing.fakeapiserver import FakeApiServer


@pytest.fixture
def server(clock: FakeClock) -> Iterator[FakeApiServer]:
    # Creation timestamps on the same (virtual) clock as the reconciler's.
    with FakeApiServer(now=clock.now) as srv:
        yield srv


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def make_reconciler(
    client: RestClient,
    caches: Caches,
    config: ControllerConfig,
    events: RecordedEvents,
    clock: FakeClock,
    registry: CollectorRegistry,
    tracing: Tracing | None,
) -> ComputeDomainReconciler:
    return ComputeDomainReconciler(
        client=client,
        caches=caches,
        config=config,
        events=events,
        metrics=DomainMetrics(registry),
        clock=clock,
        formation=FormationTracer(tracing, clock=clock),
    )


def get_cd(server: FakeApiServer) -> JSON:
    (cd,) = server.objects(res.COMPUTE_DOMAINS)
    return cd


def cd_updates(server: FakeApiServer) -> list[str]:
    """Paths of the PUTs to ComputeDomains (metadata and status writes)."""
    return [p for m, p in server.request_log if m == "PUT" and "/computedomains/" in p]


def seed_ready_members(server: FakeApiServer, uid: str) -> None:
    for name in ("a", "b"):
        server.seed(res.NODES, node(name, labels={c.COMPUTE_DOMAIN_LABEL: uid}))
        server.seed(res.PODS, daemon_pod(uid, name, clique="cl.1"))
    server.seed(
        res.COMPUTE_DOMAIN_CLIQUES,
        clique(
            uid,
            "cl.1",
            [
                daemon_entry("a", index=0),
                daemon_entry("b", index=1),
            ],
        ),
    )


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        found.setdefault(span.name, []).append(span)
    return found


def test_formation_trace_from_creation_to_ready(
    server: FakeApiServer,
    client: RestClient,
    caches: Caches,
    config: ControllerConfig,
    events: RecordedEvents,
    clock: FakeClock,
    registry: CollectorRegistry,
    exporter: InMemorySpanExporter,
) -> None:
    tracing = Tracing.with_exporters("compute-domain-controller", [exporter])
    reconciler = make_reconciler(client, caches, config, events, clock, registry, tracing)
    uid = str(server.seed(res.COMPUTE_DOMAINS, compute_domain(numNodes=2))["metadata"]["uid"])
    created = parse_timestamp(get_cd(server)["metadata"]["creationTimestamp"])
    assert created is not None
    for _ in range(2):  # new domains may take two passes (critical path first)
        clock.step(1)
        reconciler.reconcile("team/cd1")
    cd = get_cd(server)
    ids = parse_traceparent(cd["metadata"]["annotations"][c.TRACEPARENT_ANNOTATION])
    assert ids is not None
    # The annotation came with the finalizer: one metadata write, the rest are status writes.
    metadata_writes = [p for p in cd_updates(server) if not p.endswith("/status")]
    assert len(metadata_writes) == 1
    assert cd["metadata"]["finalizers"] == [c.FINALIZER]
    assert cd["status"]["status"] == c.STATUS_NOT_READY
    assert ROOT_SPAN_NAME not in by_name(exporter.get_finished_spans())

    seed_ready_members(server, uid)
    clock.step(40)
    reconciler.reconcile("team/cd1")
    assert get_cd(server)["status"]["status"] == c.STATUS_READY

    spans = by_name(exporter.get_finished_spans())
    (root,) = spans[ROOT_SPAN_NAME]
    assert root.context is not None and root.parent is None
    assert (root.context.trace_id, root.context.span_id) == (ids.trace_id, ids.span_id)
    assert root.start_time == epoch_ns(created)
    assert root.end_time == epoch_ns(clock.now())
    assert root.attributes is not None
    assert root.attributes["computedomain.uid"] == uid
    assert root.attributes["k8s.namespace.name"] == "team"
    # One per pass that found a dependent missing from its cache (a lagging cache adds one):
    # the workload RCT's in the first pass, the daemon objects' once members appeared.
    missing = [str((s.attributes or {})["dependents.missing"]) for s in spans["ensure dependents"]]
    assert missing[0] == "ResourceClaimTemplate/cd1-channel"
    assert any(f"DaemonSet/{c.daemon_object_name(uid)}" in m for m in missing[1:])
    statuses = spans["write status"]
    assert [s.attributes["computedomain.status"] for s in statuses if s.attributes] == [
        c.STATUS_NOT_READY,
        c.STATUS_READY,
    ]
    for child in (*spans["ensure dependents"], *statuses):
        assert child.parent is not None and child.context is not None
        assert (child.context.trace_id, child.parent.span_id) == (ids.trace_id, ids.span_id)
        assert root.start_time is not None and child.start_time is not None
        assert root.end_time is not None and child.end_time is not None
        assert root.start_time <= child.start_time <= child.end_time <= root.end_time
    ttr = "nvidia_dra_compute_domain_time_to_ready_seconds"
    assert registry.get_sample_value(f"{ttr}_count", {"namespace": "team"}) == 1
    assert registry.get_sample_value(f"{ttr}_sum", {"namespace": "team"}) == clock.now() - created

    # Formed: later passes and writes add nothing to the trace, and the root is never re-sent.
    exporter.clear()
    server.seed(res.NODES, node("c", labels={c.COMPUTE_DOMAIN_LABEL: uid}))
    clock.step(5)
    reconciler.reconcile("team/cd1")
    assert exporter.get_finished_spans() == ()


def test_tracing_off_writes_no_annotation_and_no_spans(
    server: FakeApiServer,
    client: RestClient,
    caches: Caches,
    config: ControllerConfig,
    events: RecordedEvents,
    clock: FakeClock,
    registry: CollectorRegistry,
) -> None:
    reconciler = make_reconciler(client, caches, config, events, clock, registry, None)
    server.seed(res.COMPUTE_DOMAINS, compute_domain(numNodes=2))
    for _ in range(2):
        reconciler.reconcile("team/cd1")
    assert c.TRACEPARENT_ANNOTATION not in (get_cd(server)["metadata"].get("annotations") or {})


def test_domain_that_predates_tracing_is_left_alone(
    server: FakeApiServer,
    client: RestClient,
    caches: Caches,
    config: ControllerConfig,
    events: RecordedEvents,
    clock: FakeClock,
    registry: CollectorRegistry,
    exporter: InMemorySpanExporter,
) -> None:
    tracing = Tracing.with_exporters("compute-domain-controller", [exporter])
    reconciler = make_reconciler(client, caches, config, events, clock, registry, tracing)
    body = compute_domain(numNodes=2)
    body["metadata"]["finalizers"] = [c.FINALIZER]
    uid = str(server.seed(res.COMPUTE_DOMAINS, body)["metadata"]["uid"])
    reconciler.reconcile("team/cd1")
    seed_ready_members(server, uid)
    clock.step(3)
    reconciler.reconcile("team/cd1")
    cd = get_cd(server)
    assert cd["status"]["status"] == c.STATUS_READY
    assert c.TRACEPARENT_ANNOTATION not in (cd["metadata"].get("annotations") or {})
    assert [p for p in cd_updates(server) if not p.endswith("/status")] == []
    assert exporter.get_finished_spans() == ()
    # The histogram does not depend on tracing.
    ttr = "nvidia_dra_compute_domain_time_to_ready_seconds_count"
    assert registry.get_sample_value(ttr, {"namespace": "team"}) == 1
