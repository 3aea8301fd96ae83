"""Benchmark: what concurrent JSON patches of one ComputeDomainClique cost kube-apiserver.

The daemons of a forming domain all write one object. A patch without a resourceVersion is
never refused for a conflict: kube-apiserver retries it internally until it commits, each
retry decoding, patching, validating and tracking managed fields of the whole object again.
A patch whose ``test`` operation fails is refused (422) at its first attempt. This measures,
on an otherwise idle local 1.37 control plane (``hack/localcluster``, CRDs from ``config/``),
``--writers`` patches of one clique sent at once (one thread each, released by a barrier)
against the same patches one after another (the baseline), for:

* ``append``: ``add /daemons/-`` of a new entry (a join without a guard);
* ``guarded``: the same with a ``test`` that fails (a losing shape-guarded join: 422);
* ``status``: ``add /daemons/<i>/status`` of each writer's own entry (daemons turning Ready).

Printed per case and round: total wall time and p50/max latency per patch, at once and one
after another, and their ratio.

    .venv/bin/python hack/bench/clique_patch_contention.py [--writers 18] [--rounds 2]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for p in (REPO, REPO / "hack", REPO / "test" / "e2e"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from e2e_support import Driver  # noqa: E402
from localcluster import Cluster, bin_dir  # noqa: E402

from pkg.api import constants as c  # noqa: E402
from pkg.api.daemonentry import DaemonEntry  # noqa: E402
from pkg.base.types import JSON  # noqa: E402
from pkg.kube import resources as res  # noqa: E402
from pkg.kube.client import KubeClient, RestClient  # noqa: E402
from pkg.kube.config import load_api_client  # noqa: E402
from pkg.kube.errors import InvalidError  # noqa: E402

NS = "nvidia-dra-driver"
CLIQUE_ID = "u.1"


def entry(i: int) -> JSON:
    return DaemonEntry(f"n{i}", f"10.0.0.{i}", CLIQUE_ID, i, c.STATUS_NOT_READY).encode()


def create_clique(client: KubeClient, name: str, entries: int) -> None:
    client.create(res.COMPUTE_DOMAIN_CLIQUES, {
        "apiVersion": c.API_VERSION, "kind": c.COMPUTE_DOMAIN_CLIQUE_KIND,
        "metadata": {"name": name, "namespace": NS},
        "daemons": [entry(i) for i in range(entries)],
    }, namespace=NS)  # fmt: skip


def send(
    client: KubeClient, name: str, ops_for: Callable[[int], list[JSON]], n: int, *, at_once: bool
) -> tuple[float, list[float], int]:
    """(total seconds, per-patch seconds, 422s) of ``n`` patches, at once or one by one."""
    latencies = [0.0] * n
    refused = [0]
    barrier = threading.Barrier(n) if at_once else None

    def one(i: int) -> None:
        if barrier is not None:
            barrier.wait()
        started = time.monotonic()
        try:
            client.patch(res.COMPUTE_DOMAIN_CLIQUES, name, ops_for(i), namespace=NS,
                         patch_type="json")  # fmt: skip
        except InvalidError:
            refused[0] += 1
        latencies[i] = time.monotonic() - started

    started = time.monotonic()
    if at_once:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for i in range(n):
            one(i)
    return time.monotonic() - started, latencies, refused[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--writers", type=int, default=18)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    n = args.writers
    cases: dict[str, tuple[int, Callable[[int], list[JSON]]]] = {
        "append": (1, lambda i: [{"op": "add", "path": "/daemons/-", "value": entry(i + 1)}]),
        "guarded": (
            1,
            lambda i: [
                {"op": "test", "path": "/daemons/0/nodeName", "value": "someone-else"},
                {"op": "add", "path": "/daemons/-", "value": entry(i + 1)},
            ],
        ),
        "status": (
            n,
            lambda i: [
                {"op": "add", "path": f"/daemons/{i}/status", "value": c.STATUS_READY},
            ],
        ),
    }
    workdir = Path(tempfile.mkdtemp(prefix="clique-contention-"))
    cluster = Cluster.start(bin_dir(), workdir, node_count=0)
    try:
        Driver.deploy(cluster.kubeconfig("admin"))
        client = RestClient(load_api_client(str(cluster.kubeconfig("admin"))))
        print("| case | round | at once: total / p50 / max (ms) | one by one: total / p50 / "
              "max (ms) | total at once / one by one | 422s at once |")  # fmt: skip
        print("| --- | --- | --- | --- | --- | --- |")
        for rnd in range(args.rounds):
            for case, (entries, ops_for) in cases.items():
                figures = []
                for at_once in (True, False):
                    name = f"{case}-{rnd}-{'once' if at_once else 'serial'}"
                    create_clique(client, name, entries)
                    total, lat, refused = send(client, name, ops_for, n, at_once=at_once)
                    figures.append((total, statistics.median(lat), max(lat), refused))
                (t1, p1, m1, r1), (t2, p2, m2, _) = figures
                print(f"| {case} | {rnd + 1} | {t1 * 1e3:.0f} / {p1 * 1e3:.0f} / {m1 * 1e3:.0f} "
                      f"| {t2 * 1e3:.0f} / {p2 * 1e3:.0f} / {m2 * 1e3:.0f} | {t1 / t2:.2f}x "
                      f"| {r1} |")  # fmt: skip
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
