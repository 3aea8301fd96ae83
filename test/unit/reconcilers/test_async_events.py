"""No reconcile waits for an Event: the ComputeDomain reconciler with the production recorder
(AsyncEventRecorder) finishes while every Event write hangs; the reconcile client's limiter is
per API group and the Events client is a different one."""

from __future__ import annotations

import threading
from typing import Any

from cdctl_fakes import compute_domain  # type: ignore[import-not-found, unused-ignore]
from prometheus_client import CollectorRegistry

from pkg.base.types import JSON
from pkg.kube import resources as res
from pkg.kube.client import RestClient
from pkg.kube.eventbroadcaster import AsyncEventRecorder
from pkg.kube.resources import Resource
from pkg.reconcilers.cache import Caches
from pkg.reconcilers.computedomain import ComputeDomainReconciler
from pkg.reconcilers.config import ControllerConfig
from pkg.reconcilers.metrics import DomainMetrics
from pkg.testing.clock import FakeClock
from pkg.testing.fakeapiserver import FakeApiServer


class HangingEvents:
    """An Events client whose every call blocks until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def create(self, resource: Resource, body: JSON, **kw: Any) -> JSON:
        self.calls += 1
        self.release.wait()
        return body

    def patch(self, resource: Resource, name: str, body: JSON, **kw: Any) -> JSON:
        return self.create(resource, body)


def test_reconcile_completes_while_event_writes_hang(
    server: FakeApiServer,
    client: RestClient,
    caches: Caches,
    config: ControllerConfig,
    clock: FakeClock,
) -> None:
    sink = HangingEvents()
    recorder = AsyncEventRecorder(sink, "compute-domain-controller", clock)  # type: ignore[arg-type]
    recorder.start()
    reconciler = ComputeDomainReconciler(
        client=client,
        caches=caches,
        config=config,
        events=recorder,
        metrics=DomainMetrics(CollectorRegistry()),
        clock=clock,
    )
    try:
        server.seed(res.COMPUTE_DOMAINS, compute_domain(numNodes=1))
        # a template of someone else under the domain's name: a Warning Event on every pass
        server.seed(
            res.RESOURCE_CLAIM_TEMPLATES,
            {
                "metadata": {"name": "cd1-channel", "namespace": "team"},
                "spec": {"spec": {}},
            },
        )
        done = threading.Event()

        def run() -> None:
            for _ in range(3):
                reconciler.reconcile("team/cd1")
            done.set()

        threading.Thread(target=run, daemon=True).start()
        assert done.wait(30), "reconcile waited for an Event write"
        (cd,) = server.objects(res.COMPUTE_DOMAINS)
        assert "ResourceClaimTemplateConflict" in str(cd.get("status"))  # the work was done
        assert sink.calls <= 1 and recorder.pending() >= 1  # events parked, not lost
    finally:
        sink.release.set()
        recorder.stop()


def test_reconcile_client_limits_each_clientset_not_each_group(server: FakeApiServer) -> None:
    client = server.client(qps=5.0, burst=10, separate_groups=("resource.nvidia.com",))
    core = client._throttle_for("/api/v1/nodes")
    assert core is client._throttle_for("/api/v1/namespaces/x/pods")
    assert core is client._throttle_for("/apis/apps/v1/namespaces/x/daemonsets")
    nvidia = client._throttle_for("/apis/resource.nvidia.com/v1beta1/computedomains")
    assert nvidia is not core
    shared = server.client(qps=5.0, burst=10)
    assert shared._throttle_for("/api/v1/nodes") is shared._throttle_for("/apis/apps/v1/x")
