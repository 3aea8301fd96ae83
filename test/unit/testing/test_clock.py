"""FakeClock: stepped waits wake at their virtual deadline, events end waits at once, and the
advance-on-wait mode records and skips every wait; RealClock honours the same contract."""

from __future__ import annotations

import threading

from pkg.base.clock import Clock, RealClock
from pkg.testing.clock import FakeClock
from pkg.testing.eventually import eventually


def test_real_clock_waits_end_early_when_the_event_is_set() -> None:
    clock: Clock = RealClock()
    ev = threading.Event()
    ev.set()
    assert clock.wait(ev, 60.0)
    assert not clock.wait(threading.Event(), 0.0)
    cond = threading.Condition()
    with cond:
        clock.wait_condition(cond, 0.0)
    assert clock.now() > 1.6e9 and clock.monotonic() >= 0


def test_stepped_wait_returns_only_once_time_is_stepped_past_its_deadline() -> None:
    clock = FakeClock()
    ev = threading.Event()
    out: list[bool] = []
    waiter = threading.Thread(target=lambda: out.append(clock.wait(ev, 5.0)))
    waiter.start()
    assert clock.block_until_waiters(1)
    clock.step(4.0)
    assert waiter.is_alive() and clock.waiters() == 1
    clock.step(1.0)
    waiter.join(5)
    assert out == [False] and clock.waiters() == 0 and clock.waits == [5.0]


def test_stepped_wait_ends_as_soon_as_the_event_is_set() -> None:
    clock = FakeClock()
    ev = threading.Event()
    out: list[bool] = []
    waiter = threading.Thread(target=lambda: out.append(clock.wait(ev, None)))
    waiter.start()
    assert clock.block_until_waiters(0)
    eventually(lambda: clock.waits == [] and waiter.is_alive())
    assert clock.block_until_untimed_waiters(1) and clock.waiters() == 0
    ev.set()
    waiter.join(5)
    assert out == [True] and clock.monotonic() == 0.0
    eventually(lambda: clock.untimed_waiters() == 0)


def test_stepped_condition_wait_and_sleep_wake_at_their_deadline() -> None:
    clock = FakeClock(monotonic_start=10.0)
    cond = threading.Condition()
    woke: list[float] = []

    def wait_cond() -> None:
        with cond:
            while clock.monotonic() < 13.0:
                clock.wait_condition(cond, 13.0 - clock.monotonic())
        woke.append(clock.monotonic())

    threads = [threading.Thread(target=wait_cond), threading.Thread(target=lambda: clock.sleep(3))]
    for t in threads:
        t.start()
    assert clock.block_until_waiters(2)
    clock.step(3.0)
    for t in threads:
        t.join(5)
    assert woke == [13.0] and not any(t.is_alive() for t in threads)


def test_advance_on_wait_skips_every_wait_and_records_it() -> None:
    clock = FakeClock(start=100.0, advance_on_wait=True)
    stop = threading.Event()
    seen: list[object] = []
    clock.on_wait = seen.append
    assert not clock.wait(stop, 2.5)
    clock.sleep(1.5)
    cond = threading.Condition()
    with cond:
        clock.wait_condition(cond, 1.0)
    assert clock.waits == [2.5, 1.5, 1.0] and clock.monotonic() == 5.0 and clock.now() == 105.0
    assert seen[0] is stop and seen[2] is cond
    stop.set()
    assert clock.wait(stop, 9.0) and clock.monotonic() == 5.0  # a set event: no time passes
