"""The kubelet plugin's part of a ComputeDomain's formation trace.

A real plugin on the fake API server with an in-memory span exporter: a channel Prepare of a
domain carrying a ``traceparent`` annotation records ``prepare channel claim`` under the
domain's root with ``label node`` and ``wait for IMEX daemon`` inside it; a daemon Prepare
records ``prepare daemon claim`` and hands the ``traceparent`` to the daemon in its CDI env;
a domain without the annotation gets no spans and no ``TRACEPARENT``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from testsupport.kp_harness import CLIQUE, DRIVER_NS, Kubelet, make_config, seed_claim, seed_domain

from pkg.api import constants as c
from pkg.base.types import JSON
from pkg.kube import resources as res
from pkg.kubeletplugin.discovery import NodeDevices
from pkg.kubeletplugin.driver import KubeletPlugin
from pkg.runtime.tracing import Tracing, new_traceparent, parse_traceparent
from pkg.testing.fakeapiserver import FakeApiServer


@contextmanager
def traced_plugin(
    api: FakeApiServer, root: Path, exporter: InMemorySpanExporter
) -> Iterator[Kubelet]:
    config = make_config(root)
    devices = NodeDevices(driver_version="580.65.06", gpus=(), clique_id=CLIQUE)
    tracing = Tracing.with_exporters("compute-domain-kubelet-plugin", [exporter])
    plugin = KubeletPlugin(
        config=config, client=api.client(), devices=devices, tracer=tracing.tracer
    )
    plugin.start()
    try:
        yield Kubelet(config)
    finally:
        plugin.stop()
        tracing.shutdown()


def annotate(api: FakeApiServer, cd_uid: str) -> str:
    (cd,) = [o for o in api.objects(res.COMPUTE_DOMAINS) if o["metadata"]["uid"] == cd_uid]
    value = new_traceparent()
    meta = cd["metadata"]
    api.client().patch(
        res.COMPUTE_DOMAINS,
        meta["name"],
        {"metadata": {"annotations": {c.TRACEPARENT_ANNOTATION: value}}},
        namespace=meta["namespace"],
    )
    return value


def cdi_env(root: Path, claim_uid: str) -> list[str]:
    path = root / "cdi" / f"{c.CDI_VENDOR}-claim_{claim_uid}.yaml"
    spec: JSON = json.loads(path.read_text())
    return list(spec["devices"][0]["containerEdits"].get("env") or [])


def daemon_claim(api: FakeApiServer, cd_uid: str) -> JSON:
    params = {"apiVersion": c.API_VERSION, "kind": c.DAEMON_CONFIG_KIND, "domainID": cd_uid}
    return seed_claim(
        api, namespace=DRIVER_NS, device=c.DAEMON_DEVICE_NAME, request="daemon", params=params
    )


def channel_claim(api: FakeApiServer, cd_uid: str) -> JSON:
    params = {"apiVersion": c.API_VERSION, "kind": c.CHANNEL_CONFIG_KIND, "domainID": cd_uid}
    return seed_claim(api, params=params)


def spans_named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def test_prepare_spans_join_the_domain_trace(api: FakeApiServer, root: Path) -> None:
    exporter = InMemorySpanExporter()
    cd = seed_domain(api, ready=True)
    value = annotate(api, cd)
    ids = parse_traceparent(value)
    assert ids is not None
    daemon, channel = daemon_claim(api, cd), channel_claim(api, cd)
    with traced_plugin(api, root, exporter) as kubelet:
        for claim in (daemon, channel):
            uid = claim["metadata"]["uid"]
            assert kubelet.prepare(claim).claims[uid].error == ""
        assert f"TRACEPARENT={value}" in cdi_env(root, daemon["metadata"]["uid"])

    (prep_daemon,) = spans_named(exporter, "prepare daemon claim")
    (prep_channel,) = spans_named(exporter, "prepare channel claim")
    for span in (prep_daemon, prep_channel):
        assert span.context is not None and span.parent is not None
        assert (span.context.trace_id, span.parent.span_id) == (ids.trace_id, ids.span_id)
        assert span.attributes is not None and span.attributes["k8s.node.name"] == "node-a"
    assert prep_channel.attributes is not None
    assert prep_channel.attributes["claim.uid"] == channel["metadata"]["uid"]
    (label,) = spans_named(exporter, "label node")
    (wait,) = spans_named(exporter, "wait for IMEX daemon")
    for child in (label, wait):
        assert child.parent is not None and prep_channel.context is not None
        assert child.parent.span_id == prep_channel.context.span_id
    assert wait.attributes is not None and wait.attributes["imex.daemon.ready"] is True
    # The kubelet-facing request span stays a trace of its own.
    requests = spans_named(exporter, "NodePrepareResource")
    assert len(requests) == 2
    assert all(r.context is not None and r.context.trace_id != ids.trace_id for r in requests)
    # Inside each request: the claim's GET and the two checkpointed steps around the domain's
    # part (so a slow Prepare shows where its time went).
    request_ids = {r.context.span_id for r in requests if r.context is not None}
    for name in (
        "get ResourceClaim",
        "record PrepareStarted",
        "write CDI spec, record PrepareCompleted",
    ):
        steps = spans_named(exporter, name)
        assert len(steps) == 2, name
        assert {s.parent.span_id for s in steps if s.parent is not None} == request_ids, name


def test_domain_without_annotation_is_not_traced(api: FakeApiServer, root: Path) -> None:
    exporter = InMemorySpanExporter()
    cd = seed_domain(api, ready=True)
    daemon = daemon_claim(api, cd)
    with traced_plugin(api, root, exporter) as kubelet:
        uid = daemon["metadata"]["uid"]
        assert kubelet.prepare(daemon).claims[uid].error == ""
        assert not any(e.startswith("TRACEPARENT=") for e in cdi_env(root, uid))
    assert [s.name for s in exporter.get_finished_spans()] == [
        "get ResourceClaim",
        "record PrepareStarted",
        "write CDI spec, record PrepareCompleted",
        "NodePrepareResource",
    ]
