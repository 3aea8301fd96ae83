"""The client-side limit is client-go's: one token bucket per client (a clientset), whatever API
group a request goes to; a group named in ``separate_groups`` spends a bucket of its own, as a
second clientset would. Real requests to the fake API server, a fake clock for the bucket."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pkg.kube import resources as res
from pkg.kube.client import RestClient
from pkg.testing.fakeapiserver import FakeApiServer


class Clock:
    """The limiter's clock: time moves only when a test (or a sleep) moves it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def limited(api: FakeApiServer, clock: Clock, **kwargs: object) -> RestClient:
    return api.client(qps=5.0, burst=4, monotonic=clock.monotonic, sleep=clock.sleep, **kwargs)


def test_two_api_groups_share_one_budget(api: FakeApiServer) -> None:
    """Nodes (core) and DaemonSets (apps) draw on one bucket of 4: the fifth request waits
    1/qps, whichever group it goes to; the bucket refills at qps as time passes."""
    clock = Clock()
    client = limited(api, clock)
    for _ in range(2):
        client.list(res.NODES)
        client.list(res.DAEMONSETS, namespace="d")
    assert clock.slept == []
    client.list(res.DAEMONSETS, namespace="d")
    assert clock.slept == [pytest.approx(0.2)]
    clock.now += 0.4  # two tokens back
    client.list(res.NODES)
    client.list(res.NODES)
    assert clock.slept == [pytest.approx(0.2)]
    client.list(res.NODES)
    assert clock.slept == [pytest.approx(0.2), pytest.approx(0.2)]


def test_a_separate_group_spends_its_own_budget(api: FakeApiServer) -> None:
    """resource.nvidia.com as the Go driver's second clientset: its requests neither wait for
    the Kubernetes groups' bucket nor empty it."""
    clock = Clock()
    client = limited(api, clock, separate_groups=(res.COMPUTE_DOMAINS.group,))
    for _ in range(4):
        client.list(res.NODES)
        client.list(res.COMPUTE_DOMAINS, namespace="t")
    assert clock.slept == []  # 8 requests on two buckets of 4
    client.list(res.COMPUTE_DOMAINS, namespace="t")
    assert clock.slept == [pytest.approx(0.2)]  # its own bucket is empty
    client.list(res.NODES)  # the 0.2 s just slept gave the Kubernetes bucket a token back
    assert len(clock.slept) == 1
    client.list(res.NODES)
    assert clock.slept == [pytest.approx(0.2), pytest.approx(0.2)]


def test_without_qps_nothing_waits(api: FakeApiServer) -> None:
    clock = Clock()
    client = api.client(qps=None, monotonic=clock.monotonic, sleep=clock.sleep)
    for _ in range(20):
        client.list(res.NODES)
    assert clock.slept == []
