"""Fixtures: a fake API server per test, its client, live caches and a never-sleeping clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cdctl_fakes import DRIVER_NS, RecordedEvents, live_caches  # type: ignore[import-not-found, unused-ignore]
from prometheus_client import CollectorRegistry

from pkg.kube.client import RestClient
from pkg.reconcilers.cache import Caches
from pkg.reconcilers.config import ControllerConfig
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
