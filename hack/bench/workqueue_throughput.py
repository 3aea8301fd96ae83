#!/usr/bin/env python3
"""Benchmark: RateLimitingQueue add/get/done throughput with 1 and 8 worker threads.

A producer adds N distinct keys (plus a duplicate add of each, which must dedup) while W
workers loop get -> done. Reports items/s for each W, with and without Prometheus metrics.
Usage: .venv/bin/python hack/bench/workqueue_throughput.py [-n N]
"""

from __future__ import annotations

import argparse
import threading
import time

from prometheus_client import CollectorRegistry

from pkg.informers.workqueue import RateLimitingQueue


def run(n: int, workers: int, *, metrics: bool) -> float:
    q: RateLimitingQueue[int] = RateLimitingQueue(
        name="bench" if metrics else None, registry=CollectorRegistry() if metrics else None
    )
    processed = [0] * workers

    def work(wid: int) -> None:
        while True:
            item, shutdown = q.get()
            if shutdown:
                return
            processed[wid] += 1
            q.done(item)  # type: ignore[arg-type]

    threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for i in range(n):
        q.add(i)
        q.add(i)  # dedup (or deferred re-run if already processing)
    q.shutdown_with_drain()
    while len(q):
        time.sleep(0.001)
    q.shutdown()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    assert sum(processed) >= n
    return sum(processed) / dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=200_000)
    args = ap.parse_args()
    for metrics in (False, True):
        for workers in (1, 8):
            rate = run(args.n, workers, metrics=metrics)
            print(
                f"workers={workers} metrics={'on ' if metrics else 'off'}: "
                f"{rate:9.0f} items/s (add+add+get+done)"
            )


if __name__ == "__main__":
    main()
