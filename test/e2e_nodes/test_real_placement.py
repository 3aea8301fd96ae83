"""Placement SingleClique on real kubelets and containerd (``pkg.api.placement``).

For this module the two real nodes are put in two NVLink cliques: ``real-2``'s fake GPUs get
another clique ID and its plugin pod is restarted, so it publishes the new ``cliqueID`` (the
module puts it back afterwards). One nvbandwidth-style manifest, two workers that prefer one per
node: without the opt-in the real scheduler spreads them over both nodes, so over both cliques,
and the domain says ``SingleClique=False``; with ``resource.nvidia.com/placement: SingleClique``
the controller pins the channel template to one clique and both workers run on that clique's
node, sharing its channel, with ``SingleClique=True``. Deleting everything leaves nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from localcluster.realnode import RealNodes
from testsupport.realsupport import (
    CD_LABEL,
    DRIVER_NAMESPACE,
    FAKE_GPUS,
    REAL_NODES,
    Kubectl,
    apply,
    channel_devices,
    domain,
    wait_for,
)

from pkg.api.placement import PINNED_CLIQUE_ANNOTATION, PLACEMENT_ANNOTATION

PLUGIN_LABEL = "app.kubernetes.io/name=compute-domain-kubelet-plugin"
OTHER_CLIQUE = 2


def _slice_cliques(kubectl: Kubectl) -> dict[str, str]:
    """Each node's published ``channel-0`` cliqueID."""
    return {n: d["attributes"]["cliqueID"]["string"] for n, d in channel_devices(kubectl).items()}


def _set_clique(kubectl: Kubectl, nodes: RealNodes, node: str, clique_id: int) -> str:
    """Give ``node``'s fake GPUs ``clique_id`` and restart its plugin; its published clique."""
    path = nodes[node].ns.path("/var/lib/compute-domain-fake/fake-gpus.json")
    path.write_text(json.dumps({**FAKE_GPUS, "cliqueId": clique_id}))
    for p in kubectl.items("pods", "-n", DRIVER_NAMESPACE, "-l", PLUGIN_LABEL):
        if p["spec"]["nodeName"] == node:
            kubectl("-n", DRIVER_NAMESPACE, "delete", "pod", p["metadata"]["name"], "--wait=true")
    want = f"{FAKE_GPUS['clusterUUID']}.{clique_id}"
    wait_for(
        f"{node} to publish clique {want}",
        lambda: _slice_cliques(kubectl).get(node) == want,
        timeout=120,
        every=1,
    )
    kubectl(
        "-n",
        DRIVER_NAMESPACE,
        "rollout",
        "status",
        "daemonset/compute-domain-kubelet-plugin",
        "--timeout=120s",
    )
    return want


@pytest.fixture(scope="module")
def two_cliques(kubectl: Kubectl, nodes: RealNodes, driver: str) -> Iterator[dict[str, str]]:
    other = REAL_NODES[1]
    _set_clique(kubectl, nodes, other, OTHER_CLIQUE)
    try:
        yield _slice_cliques(kubectl)
    finally:
        _set_clique(kubectl, nodes, other, int(FAKE_GPUS["cliqueId"]))  # type: ignore[call-overload]


def _job(ns: str, cd: str) -> list[dict[str, Any]]:
    """Two workers of ``cd`` on the real nodes, each preferring a node of its own."""
    label = {"job": cd}
    pods = []
    for i in range(2):
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"{cd}-{i}", "namespace": ns, "labels": label},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "affinity": {
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
                        }
                    },
                    "nodeSelector": {"nvidia.com/gpu.present": "true"},
                    "containers": [
                        {
                            "name": "w",
                            "image": "busybox:1.37",
                            "command": [
                                "sh",
                                "-c",
                                "ls /dev/nvidia-caps-imex-channels; sleep 3600",
                            ],
                            "resources": {"claims": [{"name": "ch"}]},
                        }
                    ],
                    "resourceClaims": [{"name": "ch", "resourceClaimTemplateName": f"{cd}-rct"}],
                },
            }
        )
    return pods


def _run(kubectl: Kubectl, ns: str, cd_name: str, opt_in: bool) -> tuple[dict[str, str], str]:
    """Create the domain and the job; once both run with their channel, the node of each
    worker and the domain's ``SingleClique`` status."""
    cd = domain(ns, cd_name)
    if opt_in:
        cd["metadata"]["annotations"] = {PLACEMENT_ANNOTATION: "SingleClique"}
    apply(kubectl, cd, *_job(ns, cd_name))
    names = [f"{cd_name}-{i}" for i in range(2)]

    def running() -> dict[str, str] | None:
        placed = {}
        for n in names:
            p = kubectl.json("-n", ns, "get", "pod", n)
            if p.get("status", {}).get("phase") != "Running":
                return None
            if "channel0" not in kubectl("-n", ns, "logs", n, check=False):
                return None
            placed[n] = p["spec"]["nodeName"]
        return placed

    placed = wait_for(f"the workers of {cd_name} running with channel0", running, 180, 1)

    def single_clique() -> str | None:
        st = kubectl.json("-n", ns, "get", f"computedomain/{cd_name}").get("status", {})
        want = len(set(placed.values()))
        if st.get("status") != "Ready" or len(st.get("nodes") or []) != want:
            return None
        for cond in st.get("conditions") or []:
            if cond["type"] == "SingleClique" and cond["status"] in ("True", "False"):
                return str(cond["status"])
        return None

    return placed, wait_for(f"{cd_name} Ready with its SingleClique condition", single_clique, 120)


def _delete(kubectl: Kubectl, ns: str, cd_name: str) -> None:
    kubectl(
        "-n", ns, "delete", "pod", f"{cd_name}-0", f"{cd_name}-1", "--wait=true", "--timeout=120s"
    )
    uid = kubectl.json("-n", ns, "get", f"computedomain/{cd_name}")["metadata"]["uid"]
    kubectl("-n", ns, "delete", f"computedomain/{cd_name}", "--wait=true", "--timeout=120s")

    def nothing_left() -> bool:
        left = kubectl.items("resourceclaims", "-n", ns)
        left += kubectl.items("pods", "-n", DRIVER_NAMESPACE, "-l", f"{CD_LABEL}={uid}")
        left += [
            n
            for n in kubectl.items("nodes")
            if n["metadata"].get("labels", {}).get(CD_LABEL) == uid
        ]
        return not left

    wait_for(f"nothing of {cd_name} left", nothing_left, 120, 1)


def test_the_opt_in_keeps_the_job_in_one_clique_on_real_nodes(
    kubectl: Kubectl, two_cliques: dict[str, str], ns: str
) -> None:
    assert len(set(two_cliques.values())) == 2, two_cliques
    placed, single = _run(kubectl, ns, "spread", opt_in=False)
    assert {two_cliques[n] for n in placed.values()} == set(two_cliques.values()), placed
    assert single == "False"
    _delete(kubectl, ns, "spread")

    placed, single = _run(kubectl, ns, "kept", opt_in=True)
    rct = kubectl.json("-n", ns, "get", "resourceclaimtemplate", "kept-rct")
    pinned = rct["metadata"]["annotations"][PINNED_CLIQUE_ANNOTATION]
    assert pinned == min(two_cliques.values()), "a tie goes to the smaller clique ID"
    assert {two_cliques[n] for n in placed.values()} == {pinned}, placed
    assert len(set(placed.values())) == 1, "both workers share the clique's one node"
    assert single == "True"
    _delete(kubectl, ns, "kept")
