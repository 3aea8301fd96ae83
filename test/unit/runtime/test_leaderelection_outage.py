"""Leader election against the fake API server while it drops connections or stalls requests.

An API server that restarts (connections refused/reset) or answers too slowly (client-side
timeout) must cost a leader nothing as long as it is back within the renew deadline; a leader
that does lose its lease steps down once and campaigns again in the same process.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from pkg.kube import resources as res
from pkg.kube.client import RestClient
from pkg.runtime.leaderelection import LeaderElectionConfig, LeaderElector
from pkg.testing.clock import FakeClock
from pkg.testing.fakeapiserver import FakeApiServer

NS, NAME = "drv", "cd-controller"


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as srv:
        yield srv


def elector(client: RestClient, clock: FakeClock, identity: str = "a") -> LeaderElector:
    cfg = LeaderElectionConfig(namespace=NS, name=NAME, identity=identity)
    return LeaderElector(client, cfg, clock=clock)


def lease_spec(server: FakeApiServer) -> dict[str, object]:
    [lease] = server.objects(res.LEASES)
    return dict(lease["spec"])


def test_a_dropped_connection_is_a_failed_attempt(server: FakeApiServer) -> None:
    a = elector(server.client(), FakeClock(advance_on_wait=True))
    server.set_available(False)
    assert a.try_acquire_or_renew() is False  # not ConnectionFailedError
    server.set_available(True)
    assert a.try_acquire_or_renew() is True
    assert lease_spec(server)["holderIdentity"] == "a"


def test_a_client_side_timeout_is_a_failed_attempt(server: FakeApiServer) -> None:
    client = server.client(request_timeout=(1.0, 0.2))
    a = elector(client, FakeClock(advance_on_wait=True))
    assert a.try_acquire_or_renew()
    # urllib3 retries a timed-out GET three times: stall all four tries.
    server.inject_stall("GET", res.LEASES, 0.5, count=4)
    assert a.try_acquire_or_renew() is False
    assert a.try_acquire_or_renew() is True


def test_write_failures_during_an_outage_are_failed_attempts(server: FakeApiServer) -> None:
    a = elector(server.client(), FakeClock(advance_on_wait=True))
    assert a.try_acquire_or_renew()
    server.inject_error("PUT", res.LEASES, 0, count=4)  # the renew's PUT is dropped
    assert a.try_acquire_or_renew() is False
    assert a.release() is True


def test_leader_keeps_the_lease_through_an_outage_shorter_than_the_renew_deadline(
    server: FakeApiServer,
) -> None:
    clock = FakeClock(advance_on_wait=True)
    a = elector(server.client(), clock)
    stop = threading.Event()
    calls: list[str] = []

    def on_wait(_event: threading.Event) -> None:
        # Waits are 2 s retry periods: down for 3 of them (6 s < 10 s deadline), then back.
        if len(clock.waits) == 1:
            server.set_available(False)
        elif len(clock.waits) == 4:
            server.set_available(True)
        elif len(clock.waits) == 8:
            stop.set()

    clock.on_wait = on_wait
    kept = a.run(
        stop,
        on_started_leading=lambda: calls.append("started"),
        on_stopped_leading=lambda: calls.append("stopped"),
    )
    assert kept is True
    assert calls == ["started", "stopped"]  # one term, ended by stop only
    spec = lease_spec(server)
    assert spec["holderIdentity"] == ""  # released on stop
    assert spec["leaseTransitions"] == 0


def test_leader_that_loses_the_lease_in_an_outage_steps_down_and_campaigns_again(
    server: FakeApiServer,
) -> None:
    clock = FakeClock(advance_on_wait=True)
    a = elector(server.client(), clock)
    stop = threading.Event()
    calls: list[str] = []

    def started() -> None:
        calls.append("started")
        if calls.count("started") == 1:
            server.set_available(False)  # longer than the renew deadline
        else:
            stop.set()

    def stopped() -> None:
        calls.append("stopped")
        if calls.count("stopped") == 1:
            assert not a.is_leader()  # stepped down before the callback
            server.set_available(True)

    lost = a.run_terms(stop, on_started_leading=started, on_stopped_leading=stopped)
    assert lost == 1
    assert calls == ["started", "stopped", "started", "stopped"]
    assert lease_spec(server)["holderIdentity"] == ""
