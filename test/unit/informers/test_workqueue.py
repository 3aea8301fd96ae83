"""Work queue invariants (hypothesis state machine with real worker threads), delays, limiters."""

from __future__ import annotations

import random
import threading
from collections import Counter

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from prometheus_client import CollectorRegistry

from pkg.informers.workqueue import (
    BucketRateLimiter,
    ItemExponentialFailureRateLimiter,
    MaxOfRateLimiter,
    RateLimitingQueue,
    WorkQueue,
    default_controller_rate_limiter,
)
from pkg.testing.clock import FakeClock

KEYS = st.sampled_from([f"k{i}" for i in range(6)])


class QueueMachine(RuleBasedStateMachine):
    """Workers are real threads that block in get(); the test decides when each finishes."""

    WORKERS = 6

    def __init__(self) -> None:
        super().__init__()
        self.q: WorkQueue[str] = WorkQueue()
        self.lock = threading.Lock()
        self.in_hand: dict[int, str] = {}  # worker -> item it holds
        self.release: dict[int, threading.Event] = {}
        self.violations: list[str] = []
        self.pending: set[str] = set()  # model: added and not yet picked up (dirty)
        self.picked = threading.Condition(self.lock)
        self.completed: Counter[int] = Counter()
        self.expected_runs: Counter[str] = Counter()  # one per clean -> dirty transition
        self.runs: Counter[str] = Counter()
        self.threads = [
            threading.Thread(target=self.worker, args=(i,)) for i in range(self.WORKERS)
        ]
        for t in self.threads:
            t.start()

    def worker(self, wid: int) -> None:
        while True:
            item, shutdown = self.q.get()
            if shutdown:
                return
            assert item is not None
            ev = threading.Event()
            with self.lock:
                if item in self.in_hand.values():
                    self.violations.append(f"{item} held twice")
                self.in_hand[wid] = item
                self.release[wid] = ev
                self.pending.discard(item)
                self.runs[item] += 1
                self.picked.notify_all()
            ev.wait()
            with self.lock:
                del self.in_hand[wid]
                del self.release[wid]
            self.q.done(item)
            with self.lock:
                self.completed[wid] += 1
                self.picked.notify_all()

    def settle(self) -> None:
        """Wait (real time, bounded) until every deliverable item is in a worker's hand."""
        with self.lock:
            self.picked.wait_for(
                lambda: (
                    not (self.pending - set(self.in_hand.values()))
                    or len(self.in_hand) == self.WORKERS
                ),
                timeout=2,
            )

    @rule(key=KEYS, times=st.integers(1, 3))
    def add(self, key: str, times: int) -> None:
        with self.lock:
            if key not in self.pending:
                self.expected_runs[key] += 1
            self.pending.add(key)
        for _ in range(times):
            self.q.add(key)
        self.settle()

    @precondition(lambda self: bool(self.in_hand))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        with self.lock:
            by_item = {item: wid for wid, item in self.in_hand.items()}
        item = data.draw(st.sampled_from(sorted(by_item)))
        wid = by_item[item]
        with self.lock:
            before = self.completed[wid]
            ev = self.release[wid]
        ev.set()
        with self.lock:
            assert self.picked.wait_for(lambda: self.completed[wid] > before, timeout=5)
        self.settle()

    @invariant()
    def exclusive_and_nothing_lost(self) -> None:
        with self.lock:
            assert not self.violations
            held = list(self.in_hand.values())
            assert len(held) == len(set(held))
            # Dirty items are either queued or deferred behind their own processing.
            queued = len(self.q)
            waiting = self.pending - set(held)
            deferred = self.pending & set(held)
            assert queued == len(waiting) or len(held) == self.WORKERS
            del deferred
            # Nothing lost, nothing duplicated: each dirty period yields exactly one run.
            for key, want in self.expected_runs.items():
                assert self.runs[key] + (key in self.pending) == want

    def teardown(self) -> None:
        drained = threading.Thread(target=self.q.shutdown_with_drain)
        drained.start()
        with self.lock:
            events = list(self.release.values())
        drained.join(0.05)
        assert drained.is_alive() == bool(events) or not events  # drain waits for in-flight
        for ev in events:
            ev.set()
        # Keep releasing any re-runs handed out while draining.
        while drained.is_alive() or any(t.is_alive() for t in self.threads):
            with self.lock:
                for ev in self.release.values():
                    ev.set()
            drained.join(0.01)
            for t in self.threads:
                t.join(0.01)


TestQueueMachine = QueueMachine.TestCase
TestQueueMachine.settings = settings(
    max_examples=40,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_adds_during_processing_collapse_into_one_rerun() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    _item, _ = q.get()
    for _ in range(5):
        q.add("a")
    assert len(q) == 0  # deferred: never handed out while processing
    q.done("a")
    assert len(q) == 1
    assert q.get() == ("a", False)
    q.done("a")
    assert len(q) == 0


def test_shutdown_ignores_adds_and_hands_out_remaining() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.shutdown()
    q.add("b")
    assert q.get() == ("a", False)
    assert q.get() == (None, True)


def test_add_after_earlier_ready_wins_and_clock_drives_delivery() -> None:
    clock = FakeClock()
    q: RateLimitingQueue[str] = RateLimitingQueue(clock=clock)
    q.add_after("a", 10)
    q.add_after("a", 2)
    q.add_after("a", 5)  # later than the pending 2 s: ignored
    got: list[str | None] = []
    t = threading.Thread(target=lambda: got.append(q.get()[0]))
    t.start()
    assert clock.block_until_waiters(1)
    clock.step(1.9)
    t.join(0.05)
    assert not got
    clock.step(0.2)
    t.join(2)
    assert got == ["a"] and q.waiting() == 0
    q.add_after("b", 0)
    assert len(q) == 1


def test_rate_limited_requeue_and_metrics() -> None:
    clock = FakeClock()
    reg = CollectorRegistry()
    q: RateLimitingQueue[str] = RateLimitingQueue(
        ItemExponentialFailureRateLimiter(1.0, 100.0), name="test", clock=clock, registry=reg
    )
    q.add("a")
    _item, _ = q.get()
    clock.step(3)
    q.add_rate_limited("a")
    q.done("a")
    assert q.num_requeues("a") == 1 and len(q) == 0
    clock.step(1.0)
    assert q.get() == ("a", False)
    q.forget("a")
    assert q.num_requeues("a") == 0
    assert (
        reg.get_sample_value("workqueue_longest_running_processor_seconds", {"name": "test"}) == 0
    )
    clock.step(2)
    assert reg.get_sample_value("workqueue_unfinished_work_seconds", {"name": "test"}) == 2
    q.done("a")
    assert reg.get_sample_value("workqueue_adds_total", {"name": "test"}) == 2
    assert reg.get_sample_value("workqueue_retries_total", {"name": "test"}) == 1
    assert reg.get_sample_value("workqueue_depth", {"name": "test"}) == 0
    assert reg.get_sample_value("workqueue_work_duration_seconds_count", {"name": "test"}) == 2
    # Promotion happens inside get(), so the delayed item spent no time in the FIFO itself.
    assert reg.get_sample_value("workqueue_queue_duration_seconds_sum", {"name": "test"}) == 0
    RateLimitingQueue(name="other", clock=clock, registry=reg)  # shares the collectors


@pytest.mark.parametrize(
    ("base", "cap", "failures", "expected"),
    [
        (0.005, 1000, 1, 0.005),
        (0.005, 1000, 2, 0.01),
        (0.005, 1000, 11, 5.12),
        (0.005, 1000, 30, 1000),
        (1, 8, 5, 8),
        (0.005, 1000, 5000, 1000),
    ],
    ids=["first", "second", "eleventh", "capped", "small-cap", "huge-count"],
)
def test_item_exponential(base: float, cap: float, failures: int, expected: float) -> None:
    rl = ItemExponentialFailureRateLimiter(base, cap)
    delays = [rl.when("x") for _ in range(failures)]
    assert delays[-1] == pytest.approx(expected)
    assert rl.num_requeues("x") == failures
    rl.forget("x")
    assert rl.when("x") == pytest.approx(base)


def test_item_exponential_jitter_is_bounded() -> None:
    rl = ItemExponentialFailureRateLimiter(1.0, 1000, jitter=0.5, rng=random.Random(1))
    for n in range(8):
        assert 2**n <= rl.when("x") <= 1.5 * 2**n


def test_bucket_and_max_of() -> None:
    clock = FakeClock()
    bucket = BucketRateLimiter(10, 2, clock=clock)
    assert [bucket.when(i) for i in range(4)] == pytest.approx([0, 0, 0.1, 0.2])
    clock.step(1)
    assert bucket.when("z") == 0
    combo = MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(1, 10), BucketRateLimiter(1, 1, clock=clock)
    )
    assert combo.when("a") == 1 and combo.when("a") == 2 and combo.num_requeues("a") == 2
    combo.forget("a")
    assert combo.num_requeues("a") == 0
    default = default_controller_rate_limiter(clock)
    assert default.when("k") == pytest.approx(0.005)
    with pytest.raises(ValueError, match="at least one"):
        MaxOfRateLimiter()
