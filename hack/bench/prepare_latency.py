"""Prepare/Unprepare latency of the kubelet plugin through its real DRA socket.

Starts the in-process fake API server and one plugin (daemon already Ready), then for N claims:
NodePrepareResources (timed) -> NodeUnprepareResources (timed) - one channel claim at a time,
as on a real node (channel 0 is node-exclusive). Prints p50/p90/p99/max in ms.

    .venv/bin/python hack/bench/prepare_latency.py --claims 500
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from testsupport.kp_harness import (
    channel_params,
    running_plugin,
    seed_claim,
    seed_domain,
    seed_world,
    short_tmpdir,
)

from pkg.testing.fakeapi import server as fakeapi_server
from pkg.testing.fakeapiserver import FakeApiServer

# The fake server writes headers and body in separate send()s; with Nagle on, every response
# then waits for the client's delayed ACK (~40 ms), which would measure the fake server, not
# the plugin. Reported to the fake server's owner; remove once it sets TCP_NODELAY itself.
fakeapi_server._Handler.disable_nagle_algorithm = True


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--claims", type=int, default=500)
    args = parser.parse_args()
    with FakeApiServer() as api, short_tmpdir() as root:
        seed_world(api)
        cd = seed_domain(api)
        claims = [seed_claim(api, params=channel_params(cd)) for _ in range(args.claims)]
        with running_plugin(api, root) as (_plugin, kubelet):
            kubelet.prepare()  # warm the channel
            prep: list[float] = []
            unprep: list[float] = []
            for claim in claims:
                t0 = time.perf_counter()
                resp = kubelet.prepare(claim)
                t1 = time.perf_counter()
                kubelet.unprepare(claim)
                t2 = time.perf_counter()
                assert resp.claims[claim["metadata"]["uid"]].error == ""
                prep.append((t1 - t0) * 1000)
                unprep.append((t2 - t1) * 1000)
    for name, values in (("prepare", prep), ("unprepare", unprep)):
        print(
            f"{name:9s} n={len(values)} p50={statistics.median(values):.1f}ms "
            f"p90={pct(values, 0.9):.1f}ms p99={pct(values, 0.99):.1f}ms "
            f"max={max(values):.1f}ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
