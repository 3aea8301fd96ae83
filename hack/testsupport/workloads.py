"""ComputeDomain workloads as tests, the demo and the benchmark drive them.

Owns the steps of one CD lifecycle against the real cluster: create a ComputeDomain, wait for
its workload ResourceClaimTemplate, create N pods that reference it (spread one per node over a
chosen node set), wait until they run with their channel, read the CD's status, and tear it all
down. Returns plain data; the callers assert.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kubeletsim import NodeFleet

from pkg.api import constants as c
from pkg.kube.client import KubeClient
from pkg.kube.errors import NotFoundError
from pkg.kube.resources import (
    COMPUTE_DOMAINS,
    DAEMONSETS,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
)
from testsupport.e2e_support import (
    channels_seen,
    compute_domain,
    pod_ready,
    spread_affinity,
    wait_for,
    workload_pod,
)


@dataclass
class Workload:
    namespace: str
    cd_name: str
    rct: str
    pods: list[str]
    cd_uid: str = ""
    bound_at: float = 0.0
    running_at: float = 0.0

    @property
    def time_to_ready(self) -> float:
        return self.running_at - self.bound_at


def node_affinity(nodes: Sequence[str]) -> dict[str, Any]:
    term = {
        "matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": list(nodes)}
        ]
    }
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }


def create_cd(
    client: KubeClient,
    ns: str,
    name: str,
    *,
    mode: str = "Single",
    num_nodes: int | None = None,
    timeout: float = 60,
    annotations: dict[str, str] | None = None,
) -> Workload:
    rct = f"{name}-channel"
    cd = client.create(
        COMPUTE_DOMAINS,
        compute_domain(name, ns, rct=rct, mode=mode, num_nodes=num_nodes, annotations=annotations),
    )
    wait_for(
        f"RCT {ns}/{rct}",
        lambda: _exists(client, RESOURCE_CLAIM_TEMPLATES, rct, ns),
        timeout=timeout,
        every=0.1,
    )
    return Workload(namespace=ns, cd_name=name, rct=rct, pods=[], cd_uid=cd["metadata"]["uid"])


def start_pods(client: KubeClient, w: Workload, count: int, nodes: Sequence[str]) -> None:
    label = {"cd-workload": w.cd_name}
    affinity = {**spread_affinity(label), **node_affinity(nodes)}
    for i in range(count):
        name = f"{w.cd_name}-{i}"
        client.create(
            PODS, workload_pod(name, w.namespace, rct=w.rct, labels=label, affinity=affinity)
        )
        w.pods.append(name)


def wait_bound(client: KubeClient, w: Workload, timeout: float = 60) -> dict[str, str]:
    def bound() -> dict[str, str] | None:
        out = {}
        for p in w.pods:
            node = client.get(PODS, p, namespace=w.namespace)["spec"].get("nodeName")
            if not node:
                return None
            out[p] = node
        return out

    placement: dict[str, str] = wait_for("pods bound", bound, timeout=timeout, every=0.05)
    w.bound_at = time.monotonic()
    return placement


def wait_running(
    client: KubeClient,
    fleet: NodeFleet,
    w: Workload,
    *,
    channels: int = 1,
    timeout: float = 120,
    every: float = 0.1,
) -> None:
    def running() -> bool:
        return all(
            pod_ready(client, w.namespace, p)
            and len(channels_seen(fleet, w.namespace, p)) >= channels
            for p in w.pods
        )

    wait_for(
        f"pods of {w.cd_name} running with their channel", running, timeout=timeout, every=every
    )
    w.running_at = time.monotonic()


def cd_status(client: KubeClient, w: Workload) -> dict[str, Any]:
    return dict(client.get(COMPUTE_DOMAINS, w.cd_name, namespace=w.namespace).get("status") or {})


def wait_cd_ready(
    client: KubeClient, w: Workload, nodes: int, timeout: float = 60
) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        st = cd_status(client, w)
        entries = st.get("nodes") or []
        ok = (
            st.get("status") == c.STATUS_READY
            and len(entries) == nodes
            and all(e.get("status") == c.STATUS_READY for e in entries)
        )
        return st if ok else None

    st: dict[str, Any] = wait_for(
        f"CD {w.cd_name} Ready with {nodes} nodes", ready, timeout=timeout
    )
    return st


def daemon_pods(client: KubeClient, driver_ns: str, cd_uid: str) -> list[dict[str, Any]]:
    items = client.list(
        PODS, namespace=driver_ns, label_selector=f"{c.COMPUTE_DOMAIN_LABEL}={cd_uid}"
    )
    return list(items.get("items", []))


def daemonset(client: KubeClient, driver_ns: str, cd_uid: str) -> dict[str, Any] | None:
    try:
        return client.get(DAEMONSETS, c.daemon_object_name(cd_uid), namespace=driver_ns)
    except NotFoundError:
        return None


def delete_pods(client: KubeClient, w: Workload, timeout: float = 90) -> None:
    for p in w.pods:
        with contextlib.suppress(NotFoundError):
            client.delete(PODS, p, namespace=w.namespace)
    wait_for(
        "workload pods gone",
        lambda: all(not _exists(client, PODS, p, w.namespace) for p in w.pods),
        timeout=timeout,
    )


def delete_cd(client: KubeClient, w: Workload, timeout: float = 90) -> None:
    try:
        client.delete(COMPUTE_DOMAINS, w.cd_name, namespace=w.namespace)
    except NotFoundError:
        return
    wait_for(
        f"CD {w.cd_name} gone",
        lambda: not _exists(client, COMPUTE_DOMAINS, w.cd_name, w.namespace),
        timeout=timeout,
    )


def _exists(client: KubeClient, res: Any, name: str, ns: str) -> bool:
    try:
        client.get(res, name, namespace=ns)
    except NotFoundError:
        return False
    return True
