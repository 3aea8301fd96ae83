# ruff: noqa: E501  (the seeded objects read best one field per line, messages in full)
"""A ComputeDomain as ``kubectl computedomain`` shows it, seeded into the fake API server.

Three member nodes over two cliques (one not Ready), its conditions and dependents: what the
CLI's tests (``test/unit/cli/``) print, in-process and from the installed wheel.
"""

from __future__ import annotations

from pkg.api import constants as c
from pkg.kube import resources as res
from pkg.testing.fakeapiserver import FakeApiServer

NS, DRIVER_NS = "team", "nvidia-dra-driver"


def seed_domain(api: FakeApiServer) -> str:
    cd = api.seed(
        res.COMPUTE_DOMAINS,
        {
            "apiVersion": c.API_VERSION,
            "kind": c.COMPUTE_DOMAIN_KIND,
            "metadata": {"name": "train", "namespace": NS},
            "spec": {"numNodes": 3, "channel": {"resourceClaimTemplate": {"name": "imex-ch"}}},
        },
    )
    uid = str(cd["metadata"]["uid"])
    cd["status"] = {
        "status": "NotReady",
        "readyNodes": 2,
        "nodeCount": 3,
        "nodes": [
            {
                "name": "gpu-1",
                "ipAddress": "10.0.0.1",
                "cliqueID": "cl.0",
                "index": 0,
                "status": "Ready",
            },
            {
                "name": "gpu-2",
                "ipAddress": "10.0.0.2",
                "cliqueID": "cl.0",
                "index": 1,
                "status": "Ready",
            },
            {
                "name": "gpu-5",
                "ipAddress": "10.0.0.5",
                "cliqueID": "cl.1",
                "index": 0,
                "status": "NotReady",
            },
        ],
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "reason": "DaemonsNotReady",
                "message": "2/3 nodes ready; waiting for: gpu-5",
                "lastTransitionTime": "2023-11-14T22:13:20Z",
            },
            {
                "type": "SingleClique",
                "status": "False",
                "reason": "MultipleCliques",
                "message": "the domain's nodes span 2 NVLink cliques (clique cl.0: gpu-1, gpu-2; clique cl.1: gpu-5)",
                "lastTransitionTime": "2023-11-14T22:13:20Z",
            },
        ],
    }
    api.client().update(res.COMPUTE_DOMAINS, cd, subresource="status")
    for cid, daemons in (
        (
            "cl.0",
            [
                {
                    "nodeName": "gpu-1",
                    "ipAddress": "10.0.0.1",
                    "cliqueID": "cl.0",
                    "index": 0,
                    "status": "Ready",
                    "connectedPeers": 0,
                    "unreachablePeers": ["gpu-2"],
                },
                {
                    "nodeName": "gpu-2",
                    "ipAddress": "10.0.0.2",
                    "cliqueID": "cl.0",
                    "index": 1,
                    "status": "Ready",
                    "connectedPeers": 1,
                    "unreachablePeers": [],
                },
            ],
        ),
        (
            "cl.1",
            [
                {
                    "nodeName": "gpu-5",
                    "ipAddress": "10.0.0.5",
                    "cliqueID": "cl.1",
                    "index": 0,
                    "status": "NotReady",
                }
            ],
        ),
    ):
        api.seed(
            res.COMPUTE_DOMAIN_CLIQUES,
            {
                "apiVersion": c.API_VERSION,
                "kind": c.COMPUTE_DOMAIN_CLIQUE_KIND,
                "metadata": {
                    "name": f"{uid}.{cid}",
                    "namespace": DRIVER_NS,
                    "labels": {c.COMPUTE_DOMAIN_LABEL: uid, c.CLIQUE_ID_LABEL: cid},
                },
                "daemons": daemons,
            },
        )
    for node in ("gpu-1", "gpu-2", "gpu-5"):
        api.seed(
            res.PODS,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"train-daemon-{node}",
                    "namespace": DRIVER_NS,
                    "labels": {c.COMPUTE_DOMAIN_LABEL: uid},
                },
                "spec": {"nodeName": node, "containers": [{"name": "compute-domain-daemon"}]},
                "status": {
                    "phase": "Running",
                    "containerStatuses": [
                        {
                            "name": "compute-domain-daemon",
                            "ready": node != "gpu-5",
                            "restartCount": 2 if node == "gpu-5" else 0,
                            "state": {"waiting": {"reason": "CrashLoopBackOff"}}
                            if node == "gpu-5"
                            else {"running": {}},
                        }
                    ],
                },
            },
        )
    for i, (name, rct) in enumerate(
        (("worker-0", "imex-ch"), ("worker-1", "imex-ch"), ("other", "x"))
    ):
        api.seed(
            res.PODS,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": NS},
                "spec": {
                    "nodeName": f"gpu-{i + 1}",
                    "containers": [{"name": "w"}],
                    "resourceClaims": [{"name": "ch", "resourceClaimTemplateName": rct}],
                },
                "status": {"phase": "Pending"},
            },
        )
    for reason, kind, obj_uid in (
        ("MultipleCliques", "Warning", uid),
        ("NodeJoined", "Normal", uid),
        ("Unrelated", "Normal", "someone-else"),
    ):
        api.seed(
            res.EVENTS,
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"train.{reason}", "namespace": NS},
                "involvedObject": {
                    "kind": "ComputeDomain",
                    "name": "train",
                    "namespace": NS,
                    "uid": obj_uid,
                },
                "type": kind,
                "reason": reason,
                "message": f"{reason} happened",
                "count": 1,
                "lastTimestamp": "2023-11-14T22:13:20Z",
            },
        )
    return uid
