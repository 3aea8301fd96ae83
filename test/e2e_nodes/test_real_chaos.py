"""Seeded chaos on real nodes: N ComputeDomain lifecycles, each with one fault (``chaosreal``).

``CHAOS_REAL_LIFECYCLES`` (default 3, what ``make test`` runs) and ``CHAOS_REAL_SEED`` (default:
random, printed) choose the run; the same seed replays the same targets, phases and nodes.
``CHAOS_REAL_TARGETS=reboot,partition`` draws the faults from those targets only,
``CHAOS_REAL_PHASES=before-ready`` the phases.
Every lifecycle must end with: both pods Running with ``channel0`` and the domain Ready (again,
after an after-Ready fault), nothing left after deletion (API objects, node labels, channel
taints, checkpoint entries, CDI claim specs), every node's containerd, kubelet and kube-proxy
running, no driver container restarted that the fault did not hit, and every informer cache of
the controller and the plugins equal to a fresh LIST after the fault. The drivers' images are
rolled back to the suite's start at the end. ``CHAOS_REAL_REPORT=<file>`` writes the figures
there (``make chaos-real`` -> ``docs/reliability.md``).
"""

from __future__ import annotations

import os
import random
import shlex
import time
from pathlib import Path

import pytest
from chaosreport import Lifecycle, report, write_report
from localcluster import Cluster
from localcluster.realnode import RealNodes
from testsupport.chaosreal import (
    PHASES,
    TARGETS,
    Env,
    driver_settled,
    restore_images,
    run_lifecycle,
    tag_alternates,
)
from testsupport.realsupport import Kubectl

from pkg.kube.client import RestClient
from pkg.kube.config import load_api_client

LIFECYCLES = int(os.environ.get("CHAOS_REAL_LIFECYCLES", "3"))
# ~1-3 min a lifecycle (a partition lasts 30 s, a reboot restarts a node's every container).
pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300 + 400 * LIFECYCLES)]


def test_real_chaos_lifecycles(
    cluster: Cluster, kubectl: Kubectl, nodes: RealNodes, driver: str, ns: str
) -> None:
    count = LIFECYCLES
    seed = int(os.environ.get("CHAOS_REAL_SEED") or random.SystemRandom().randrange(2**31))
    print(f"\nchaos-real: CHAOS_REAL_SEED={seed} CHAOS_REAL_LIFECYCLES={count}", flush=True)
    admin = RestClient(load_api_client(str(cluster.kubeconfig("admin"))), user_agent="chaos-real")
    env = Env(kubectl=kubectl, admin=admin, nodes=nodes, driver=driver, namespace=ns)
    chosen = os.environ.get("CHAOS_REAL_TARGETS", "")
    if chosen:
        env.targets = tuple(t.strip() for t in chosen.split(",") if t.strip())
        unknown = set(env.targets) - set(TARGETS)
        assert not unknown, f"CHAOS_REAL_TARGETS: unknown {sorted(unknown)}; known: {TARGETS}"
    when = os.environ.get("CHAOS_REAL_PHASES", "")
    if when:
        env.phases = tuple(p.strip() for p in when.split(",") if p.strip())
        unknown = set(env.phases) - set(PHASES)
        assert not unknown, f"CHAOS_REAL_PHASES: unknown {sorted(unknown)}; known: {PHASES}"
    tag_alternates(env)
    original = dict(env.images)
    results: list[Lifecycle] = []
    start = time.monotonic()
    try:
        for i in range(count):
            # One generator per lifecycle: a lifecycle's draws never shift the next one's.
            lc = run_lifecycle(env, i, random.Random(f"{seed}/{i}"))
            results.append(lc)
            print(f"chaos-real {lc.line()}", flush=True)
    finally:
        restore_images(env, original)
    wall = time.monotonic() - start
    assert driver_settled(env), "the driver did not settle after the suite"
    command = f"CHAOS_REAL_SEED={seed} CHAOS_REAL_LIFECYCLES={count} " + " ".join(
        shlex.quote(a)
        for a in ["python", "-m", "pytest", "test/e2e_nodes/test_real_chaos.py", "-s"]
    )
    missed = "e.g. no daemon process on the node within the phase's wait"
    text = report(
        results,
        targets=TARGETS,
        phases=PHASES,
        seed=seed,
        command=command,
        wall=wall,
        missed_note=missed,
    )
    print(text)
    out = os.environ.get("CHAOS_REAL_REPORT")
    if out:
        write_report(Path(out), text, marker="chaos-real figures")
    bad = [f"#{r.index} {r.target}@{r.phase}: {r.problems}" for r in results if r.problems]
    assert not bad, f"chaos-real seed {seed}: " + "; ".join(bad)
