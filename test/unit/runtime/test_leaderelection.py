"""Leader election: acquire, renew, handover between two electors, loss, release, MicroTime."""

from __future__ import annotations

import re
import threading

import pytest
from testsupport.runtime_fakes import LeaseStore  # type: ignore[import-not-found, unused-ignore]

from pkg.runtime.leaderelection import LeaderElectionConfig, LeaderElector, format_micro_time
from pkg.testing.clock import FakeClock

MICRO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def elector(store: LeaseStore, clock: FakeClock, identity: str) -> LeaderElector:
    cfg = LeaderElectionConfig(namespace="drv", name="cd-controller", identity=identity)
    return LeaderElector(store, cfg, clock=clock)


@pytest.mark.parametrize(
    ("epoch", "expected"),
    [
        (1_700_000_000.0, "2023-11-14T22:13:20.000000Z"),
        (1_700_000_000.5, "2023-11-14T22:13:20.500000Z"),
        (0.000001, "1970-01-01T00:00:00.000001Z"),
    ],
    ids=["zero-micros", "half", "one-micro"],
)
def test_micro_time_always_has_six_digits(epoch: float, expected: str) -> None:
    assert format_micro_time(epoch) == expected


def test_config_validation_mirrors_client_go() -> None:
    with pytest.raises(ValueError, match="exceed renew deadline"):
        LeaderElectionConfig("ns", "n", "me", lease_duration=10, renew_deadline=10).validate()
    with pytest.raises(ValueError, match="retry period"):
        LeaderElectionConfig("ns", "n", "me", renew_deadline=2, retry_period=2).validate()
    with pytest.raises(ValueError, match="identity"):
        LeaderElectionConfig("ns", "n", "").validate()


def test_first_candidate_creates_lease_with_micro_times() -> None:
    store, clock = LeaseStore(), FakeClock(advance_on_wait=True)
    a = elector(store, clock, "a")
    assert a.try_acquire_or_renew()
    spec = store.objects[("drv", "cd-controller")]["spec"]
    assert spec["holderIdentity"] == "a"
    assert spec["leaseDurationSeconds"] == 15
    assert spec["leaseTransitions"] == 0
    assert MICRO.match(spec["renewTime"]) and MICRO.match(spec["acquireTime"])


def test_second_candidate_waits_for_expiry_on_its_own_clock_then_takes_over() -> None:
    store, clock = LeaseStore(), FakeClock(advance_on_wait=True)
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # b first sees the record at t=0
    clock.step(10)
    assert a.try_acquire_or_renew()  # renewal at t=10
    assert not b.try_acquire_or_renew()  # b sees the change at t=10: valid until t=25
    clock.step(14)
    assert not b.try_acquire_or_renew()
    clock.step(2)
    assert b.try_acquire_or_renew()
    spec = store.objects[("drv", "cd-controller")]["spec"]
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("b", 1)
    assert spec["acquireTime"] == spec["renewTime"]
    assert not a.try_acquire_or_renew()  # the old leader cannot renew over the new one


def test_conflicting_takeovers_have_exactly_one_winner() -> None:
    store, clock = LeaseStore(), FakeClock(advance_on_wait=True)
    a, b, c = (elector(store, clock, x) for x in "abc")
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew() and not c.try_acquire_or_renew()
    clock.step(16)
    assert b.try_acquire_or_renew()
    store.stale_get = store.writes[-2]  # what c read before b's write
    assert not c.try_acquire_or_renew()  # c's update carries the old resourceVersion: 409
    store.stale_get = None
    assert store.objects[("drv", "cd-controller")]["spec"]["holderIdentity"] == "b"


def test_run_releases_the_lease_on_stop_so_the_successor_takes_over_at_once() -> None:
    store, clock = LeaseStore(), FakeClock(advance_on_wait=True)
    a, b = elector(store, clock, "a"), elector(store, clock, "b")
    stop = threading.Event()
    calls: list[str] = []

    def started() -> None:
        calls.append("started")
        assert a.is_leader()

    def on_wait(_event: threading.Event) -> None:
        if len(clock.waits) >= 5:
            stop.set()

    clock.on_wait = on_wait
    kept = a.run(stop, on_started_leading=started, on_stopped_leading=lambda: calls.append("x"))
    assert kept is True
    assert calls == ["started", "x"]
    spec = store.objects[("drv", "cd-controller")]["spec"]
    assert spec["holderIdentity"] == ""
    assert MICRO.match(spec["renewTime"])
    assert not a.is_leader()
    assert b.try_acquire_or_renew()  # no need to wait out the 15 s lease


def test_leader_that_cannot_renew_within_deadline_steps_down() -> None:
    store, clock = LeaseStore(), FakeClock(advance_on_wait=True)
    a = elector(store, clock, "a")
    stop = threading.Event()
    events: list[str] = []

    def started() -> None:
        events.append("started")
        store.fail_next = 100  # API server unreachable from now on

    kept = a.run(stop, on_started_leading=started, on_stopped_leading=lambda: events.append("x"))
    assert kept is False
    assert events == ["started", "x"]
    assert not a.is_leader()
    # Lost after the renew deadline (10 s) at the 2 s retry period, not earlier.
    assert 10 <= sum(clock.waits) <= 12


def test_leader_steps_down_immediately_when_someone_else_holds_the_lease() -> None:
    store, clock = LeaseStore(), FakeClock(advance_on_wait=True)
    a = elector(store, clock, "a")
    stop = threading.Event()

    def started() -> None:
        store.write_spec("drv", "cd-controller", holderIdentity="intruder")

    assert a.run(stop, on_started_leading=started, on_stopped_leading=lambda: None) is False
    assert sum(clock.waits) == 2.0


def test_leader_renews_with_one_put_and_no_get() -> None:
    store, clock = LeaseStore(), FakeClock(advance_on_wait=True)
    a = elector(store, clock, "a")
    stop = threading.Event()

    def on_wait(_event: threading.Event) -> None:
        if len(clock.waits) >= 4:
            stop.set()

    clock.on_wait = on_wait
    a.run(stop, on_started_leading=lambda: None, on_stopped_leading=lambda: None)
    # Acquire: GET (404) + create; 4 renewals: one PUT each; release: GET + PUT.
    assert store.calls == ["get", "create"] + ["update"] * 4 + ["get", "update"]
    renewals = [w["spec"]["renewTime"] for w in store.writes[1:5]]
    assert renewals == sorted(set(renewals))


def test_renewal_that_races_another_writer_reads_the_lease_and_respects_it() -> None:
    store, clock = LeaseStore(), FakeClock(advance_on_wait=True)
    a = elector(store, clock, "a")
    stop = threading.Event()
    clock.on_wait = lambda _event: None
    assert a.acquire(stop)
    store.write_spec("drv", "cd-controller", holderIdentity="b", renewTime="x")
    store.calls.clear()
    assert not a.try_acquire_or_renew()  # the PUT of our old copy is a 409; the GET shows b
    assert store.calls == ["update", "get"]
    assert a.observed_holder() == "b"
    assert store.objects[("drv", "cd-controller")]["spec"]["holderIdentity"] == "b"


def test_renewal_after_an_api_error_falls_back_to_get_then_update() -> None:
    store, clock = LeaseStore(), FakeClock(advance_on_wait=True)
    a = elector(store, clock, "a")
    assert a.acquire(threading.Event())
    store.fail_next = 1
    store.calls.clear()
    assert a.try_acquire_or_renew()
    assert store.calls == ["update", "get", "update"]


def test_acquire_returns_false_when_stopped_while_waiting() -> None:
    store, clock = LeaseStore(), FakeClock(advance_on_wait=True)
    assert elector(store, clock, "a").try_acquire_or_renew()
    b = elector(store, clock, "b")
    stop = threading.Event()
    clock.on_wait = lambda _event: stop.set()
    assert b.run(stop, on_started_leading=pytest.fail, on_stopped_leading=pytest.fail) is True
