"""Seeded chaos: N ComputeDomain lifecycles, each with one random SIGKILL (see ``chaos.py``).

``CHAOS_LIFECYCLES`` (default 8, what ``make test`` runs) and ``CHAOS_SEED`` (default: random,
printed) choose the run; the same seed replays the same targets, phases and nodes. After every
lifecycle: both pods reached Running with ``channel0``, the domain reached Ready (again, after
an after-Ready fault), after deletion nothing is left, no binary but the killed one exited, and
once the fault's phase reached its goal the informer caches of the controller and of every
plugin equalled a fresh LIST (``cachecheck``).
``CHAOS_REPORT=<file>`` writes the figures there (``make chaos`` -> ``docs/reliability.md``).
"""

from __future__ import annotations

import os
import random
import shlex
import sys
import time
from pathlib import Path

import pytest
from chaosreport import Lifecycle, report, write_report
from kubeletsim import NodeFleet
from localcluster import Cluster
from testsupport.chaos import PHASES, TARGETS, Env, run_lifecycle
from testsupport.e2e_support import Driver

from pkg.kube.client import KubeClient

LIFECYCLES = int(os.environ.get("CHAOS_LIFECYCLES", "8"))
# ~10-30 s a lifecycle; the suite-wide 300 s limit would cut a soak short.
pytestmark = [pytest.mark.e2e, pytest.mark.chaos, pytest.mark.timeout(120 + 90 * LIFECYCLES)]


def test_chaos_lifecycles(
    cluster: Cluster, admin: KubeClient, fleet: NodeFleet, driver: Driver, ns: str
) -> None:
    count = LIFECYCLES
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(2**31))
    print(f"\nchaos: CHAOS_SEED={seed} CHAOS_LIFECYCLES={count}", flush=True)
    env = Env(cluster=cluster, admin=admin, fleet=fleet, driver=driver, namespace=ns)
    results: list[Lifecycle] = []
    start = time.monotonic()
    for i in range(count):
        # One generator per lifecycle: a lifecycle's draws never shift the next one's.
        lc = run_lifecycle(env, i, random.Random(f"{seed}/{i}"))
        results.append(lc)
        print(f"chaos {lc.line()}", flush=True)
    command = f"CHAOS_SEED={seed} CHAOS_LIFECYCLES={count} " + " ".join(
        shlex.quote(a)
        for a in [Path(sys.executable).name, "-m", "pytest", "test/e2e", "-m", "chaos", "-s"]
    )
    text = report(
        results,
        targets=TARGETS,
        phases=PHASES,
        seed=seed,
        command=command,
        wall=time.monotonic() - start,
    )
    print(text)
    out = os.environ.get("CHAOS_REPORT")
    if out:
        write_report(Path(out), text)
    bad = [f"#{r.index} {r.target}@{r.phase}: {r.problems}" for r in results if r.problems]
    assert not bad, f"chaos seed {seed}: " + "; ".join(bad)
