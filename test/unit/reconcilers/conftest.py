"""Fixtures: a fake API server per test, its client, live caches and a never-sleeping clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cdctl_fakes import DRIVER_NS, RecordedEvents, live_caches  # type: ignore[import-not-found, unused-ignore]
from prometheus_client import CollectorRegistry

from pkg.kube.client import RestClient
from pkg.reconcilers.cache import Caches
from pkg.reconcilers.computedomain import ComputeDomainReconciler
from pkg.reconcilers.config import ControllerConfig
from pkg.reconcilers.metrics import DomainMetrics
from pkg.testing.clock import FakeClock
from pkg.testing.fakeapiserver import FakeApiServer


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as srv:
        yield srv


@pytest.fixture
def client(server: FakeApiServer) -> RestClient:
    return server.client()


@pytest.fixture
def caches(server: FakeApiServer) -> Caches:
    caches: Caches = live_caches(server)
    return caches


@pytest.fixture
def events() -> RecordedEvents:
    return RecordedEvents()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(advance_on_wait=True)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def config() -> ControllerConfig:
    return ControllerConfig(
        namespace=DRIVER_NS,
        image_name="registry.local/cd:1",
        log_verbosity_cd_daemon=2,
        feature_gates="ComputeDomainCliques=true,IMEXDaemonsWithDNSNames=true",
        image_pull_secret_names=("pull",),
    ).validate()


@pytest.fixture
def make_reconciler(
    client: RestClient,
    caches: Caches,
    config: ControllerConfig,
    events: RecordedEvents,
    clock: FakeClock,
    registry: CollectorRegistry,
) -> Callable[..., ComputeDomainReconciler]:
    """A ComputeDomainReconciler on this test's fakes; keyword arguments replace any of its
    dependencies (e.g. ``config=replace(config, ...)`` or lagging ``caches``)."""

    def make(**overrides: Any) -> ComputeDomainReconciler:
        deps: dict[str, Any] = {
            "client": client,
            "caches": caches,
            "config": config,
            "events": events,
            "clock": clock,
        }
        if "metrics" not in overrides:  # one DomainMetrics per registry
            deps["metrics"] = DomainMetrics(registry)
        return ComputeDomainReconciler(**{**deps, **overrides})

    return make


@pytest.fixture
def reconciler(make_reconciler: Callable[..., ComputeDomainReconciler]) -> ComputeDomainReconciler:
    return make_reconciler()
