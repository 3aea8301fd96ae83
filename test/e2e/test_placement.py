"""Placement SingleClique on the real scheduler: one job manifest, with and without the opt-in.

The nvbandwidth-style job: three workers allowed on gpu-node-1, gpu-node-2 (NVLink clique 0)
and gpu-node-5 (clique 1), preferring one worker per node. Without the opt-in the scheduler
spreads them over both cliques and the domain says ``SingleClique=False``. With
``resource.nvidia.com/placement: SingleClique`` on the ComputeDomain the controller pins the
workload template to clique 0 (the one with room) and the scheduler keeps every worker there:
two of them share a node's channel, and ``SingleClique=True``. A ``SingleClique`` domain that
asks for more nodes than any clique has waits with ``NoCliqueFits`` and gets no template.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubeletsim import NodeFleet
from testsupport.e2e_support import events_for, wait_for, workload_pod
from testsupport.workloads import (
    Workload,
    cd_status,
    create_cd,
    delete_cd,
    delete_pods,
    node_affinity,
    wait_bound,
    wait_cd_ready,
    wait_running,
)

from pkg.api.placement import PINNED_CLIQUE_ANNOTATION, PLACEMENT_ANNOTATION, clique_selector
from pkg.kube.client import KubeClient
from pkg.kube.errors import NotFoundError
from pkg.kube.resources import COMPUTE_DOMAINS, PODS, RESOURCE_CLAIM_TEMPLATES

pytestmark = pytest.mark.e2e

NODES = ["gpu-node-1", "gpu-node-2", "gpu-node-5"]
OPT_IN = {PLACEMENT_ANNOTATION: "SingleClique"}


def nvbandwidth_job(admin: KubeClient, w: Workload, workers: int = 3) -> None:
    """Workers allowed on ``NODES``, preferring one per node (a soft spread, as a job that
    does not know the cliques would ask)."""
    label = {"cd-workload": w.cd_name}
    affinity: dict[str, Any] = {
        **node_affinity(NODES),
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": label},
                    },
                }
            ]
        },
    }
    for i in range(workers):
        name = f"{w.cd_name}-{i}"
        admin.create(
            PODS, workload_pod(name, w.namespace, rct=w.rct, labels=label, affinity=affinity)
        )
        w.pods.append(name)


def single_clique(admin: KubeClient, w: Workload) -> dict[str, Any]:
    def cond() -> dict[str, Any] | None:
        for x in cd_status(admin, w).get("conditions") or []:
            if x["type"] == "SingleClique" and x["status"] in ("True", "False"):
                return dict(x)
        return None

    found: dict[str, Any] = wait_for("the SingleClique condition", cond, timeout=60)
    return found


def test_the_opt_in_keeps_the_job_in_one_clique(
    admin: KubeClient, fleet: NodeFleet, ns: str
) -> None:
    clique_of = {n: fleet[n].spec.clique_id for n in NODES}
    assert len(set(clique_of.values())) == 2, "the test needs nodes of two cliques"

    spread = create_cd(admin, ns, "spread")
    nvbandwidth_job(admin, spread)
    placed = wait_bound(admin, spread)
    wait_running(admin, fleet, spread)
    wait_cd_ready(admin, spread, len(set(placed.values())), timeout=120)
    assert len({clique_of[n] for n in placed.values()}) == 2, placed
    assert single_clique(admin, spread)["status"] == "False"
    delete_pods(admin, spread)
    delete_cd(admin, spread)

    kept = create_cd(admin, ns, "kept", annotations=OPT_IN)
    rct = admin.get(RESOURCE_CLAIM_TEMPLATES, kept.rct, namespace=ns)
    pinned = rct["metadata"]["annotations"][PINNED_CLIQUE_ANNOTATION]
    assert pinned == clique_of["gpu-node-1"], "clique 0 has the room (4 nodes against 1)"
    (request,) = rct["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["selectors"] == [clique_selector(pinned)]
    nvbandwidth_job(admin, kept)
    placed = wait_bound(admin, kept)
    wait_running(admin, fleet, kept)
    assert {clique_of[n] for n in placed.values()} == {pinned}, placed
    wait_cd_ready(admin, kept, len(set(placed.values())), timeout=120)
    cond = single_clique(admin, kept)
    assert cond["status"] == "True", cond
    assert any(e.get("reason") == "PinnedToClique" for e in events_for(admin, ns, "kept"))
    delete_pods(admin, kept)
    delete_cd(admin, kept)


def test_no_clique_with_room_waits_without_a_template(admin: KubeClient, ns: str) -> None:
    cd = admin.create(
        COMPUTE_DOMAINS,
        {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "ComputeDomain",
            "metadata": {"name": "huge", "namespace": ns, "annotations": OPT_IN},
            "spec": {"numNodes": 5, "channel": {"resourceClaimTemplate": {"name": "huge-channel"}}},
        },
    )

    def waiting() -> dict[str, Any] | None:
        st = admin.get(COMPUTE_DOMAINS, "huge", namespace=ns).get("status") or {}
        for x in st.get("conditions") or []:
            if x["type"] == "Ready" and x.get("reason") == "NoCliqueFits":
                return dict(x)
        return None

    cond = wait_for("Ready=False/NoCliqueFits", waiting, timeout=60)
    assert "needs 5 node(s)" in cond["message"], cond
    with pytest.raises(NotFoundError):
        admin.get(RESOURCE_CLAIM_TEMPLATES, "huge-channel", namespace=ns)
    admin.delete(COMPUTE_DOMAINS, "huge", namespace=ns)
    wait_for("the domain gone", lambda: _gone(admin, ns, str(cd["metadata"]["name"])), 60)


def _gone(admin: KubeClient, ns: str, name: str) -> bool:
    try:
        admin.get(COMPUTE_DOMAINS, name, namespace=ns)
    except NotFoundError:
        return True
    return False
