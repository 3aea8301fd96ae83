"""The switch lane's workload: one ComputeDomain, one busybox pod on each real node.

Each pod holds a claim from the domain's channel ResourceClaimTemplate and sleeps; its first
command lists ``/dev/nvidia-caps-imex-channels``, so its log shows the channel the container got
when it started. :func:`form` creates the domain and the pods at once and measures the time
until every container runs and has its channel (checked with ``kubectl exec``, which is not
counted: the clock stops at the first poll that sees every container running).
:func:`check_channels` re-checks a running workload after a switch (same pod UIDs, no container
restarts, the channel still there); :func:`delete` deletes its pods and checks on each node that
Unprepare removed the workload's claims from the plugin's checkpoint (decoded with
``pkg.kubeletplugin.checkpointformat``, which reads both drivers' files) and their CDI specs
from ``/var/run/cdi``, then deletes the domain; :func:`domain_gone` waits for that.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import yaml
from localcluster.realnode import RealNodes
from testsupport.realsupport import REAL_NODES, Kubectl, channel_pod, wait_for

from pkg.api import constants as c
from pkg.kubeletplugin.checkpointformat import decode_checkpoint

CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"
POD_CMD = f"ls {CHANNEL_DIR}; sleep 86400"
CHECKPOINT = f"/var/lib/kubelet/plugins/{c.DRIVER_NAME}/checkpoint.json"
CDI_DIR = "/var/run/cdi"


@dataclass
class Workload:
    """A ComputeDomain ``name`` in namespace ``ns`` with pod ``<name>-<node>`` per node."""

    ns: str
    name: str
    nodes: tuple[str, ...] = REAL_NODES
    pod_uids: dict[str, str] = field(default_factory=dict)
    channels: dict[str, str] = field(default_factory=dict)

    @property
    def rct(self) -> str:
        """The channel ResourceClaimTemplate the domain creates."""
        return f"{self.name}-channel"

    def pod_name(self, node: str) -> str:
        """This workload's pod on ``node``."""
        return f"{self.name}-{node}"

    def objects(self) -> list[dict[str, Any]]:
        """The ComputeDomain (numNodes = node count, Single channel) and the pods."""
        cd = {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "ComputeDomain",
            "metadata": {"name": self.name, "namespace": self.ns},
            "spec": {
                "numNodes": len(self.nodes),
                "channel": {
                    "resourceClaimTemplate": {"name": self.rct},
                    "allocationMode": "Single",
                },
            },
        }
        pods = [
            channel_pod(self.ns, self.pod_name(n), n, POD_CMD, self.rct, restart="Never")
            for n in self.nodes
        ]
        return [cd, *pods]

    def pods(self, kubectl: Kubectl) -> dict[str, dict[str, Any]]:
        """``{node: pod}`` of the pods that exist."""
        out = {}
        for n in self.nodes:
            got = kubectl(
                "-n", self.ns, "get", "pod", self.pod_name(n), "--ignore-not-found", "-o", "json"
            )
            if got.strip():
                out[n] = yaml.safe_load(got)
        return out


def _running(pod: dict[str, Any]) -> bool:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return bool(statuses) and all("running" in s.get("state", {}) for s in statuses)


def _restarts(pod: dict[str, Any]) -> int:
    return sum(int(s.get("restartCount", 0)) for s in pod["status"].get("containerStatuses", []))


def channel_of(kubectl: Kubectl, ns: str, pod: str) -> str:
    """The channel device names inside the pod's container (``kubectl exec ls``)."""
    return " ".join(kubectl("-n", ns, "exec", pod, "--", "ls", CHANNEL_DIR).split())


def form(kubectl: Kubectl, wl: Workload, timeout: float = 240) -> float:
    """Create the workload; seconds from ``kubectl apply`` to every container running. Then
    checks (untimed) that every container has a channel; records pod UIDs and channels."""
    kubectl("create", "namespace", wl.ns, check=False)
    t0 = time.monotonic()
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(wl.objects()))

    def all_running() -> float | None:
        pods = wl.pods(kubectl)
        if len(pods) == len(wl.nodes) and all(_running(p) for p in pods.values()):
            return time.monotonic() - t0
        return None

    elapsed = wait_for(f"{wl.ns}/{wl.name}: every container running", all_running, timeout, 0.2)
    for node, pod in wl.pods(kubectl).items():
        wl.pod_uids[node] = pod["metadata"]["uid"]
        wl.channels[node] = channel_of(kubectl, wl.ns, wl.pod_name(node))
        if "channel" not in wl.channels[node]:
            raise AssertionError(f"{wl.pod_name(node)} has no channel: {wl.channels[node]!r}")
    return elapsed


def check_channels(kubectl: Kubectl, wl: Workload) -> list[str]:
    """Problems of a workload that should have survived a switch (``[]``: none)."""
    problems = []
    pods = wl.pods(kubectl)
    for node in wl.nodes:
        pod = pods.get(node)
        name = wl.pod_name(node)
        if pod is None:
            problems.append(f"{name} is gone")
            continue
        if pod["metadata"]["uid"] != wl.pod_uids.get(node):
            problems.append(f"{name} was replaced")
        if not _running(pod) or _restarts(pod):
            problems.append(f"{name} not running or restarted ({_restarts(pod)} restarts)")
            continue
        now = channel_of(kubectl, wl.ns, name)
        if now != wl.channels.get(node):
            problems.append(f"{name}: channels {now!r}, had {wl.channels.get(node)!r}")
    return problems


def claim_uids(kubectl: Kubectl, wl: Workload) -> dict[str, str]:
    """``{claim uid: node}`` of the workload's pods' claims."""
    out = {}
    for node, pod in wl.pods(kubectl).items():
        for st in pod.get("status", {}).get("resourceClaimStatuses") or []:
            claim = kubectl.json("-n", wl.ns, "get", "resourceclaim", st["resourceClaimName"])
            out[claim["metadata"]["uid"]] = node
    return out


def checkpoint_claims(nodes: RealNodes, node: str) -> dict[str, str]:
    """``{claim uid: "ns/name state"}`` in the node's plugin checkpoint (``{}``: no file)."""
    path = nodes[node].ns.path(CHECKPOINT)
    if not path.is_file():
        return {}
    decoded = decode_checkpoint(path.read_bytes())
    return {uid: f"{e.namespace}/{e.name} {e.state}".strip() for uid, e in decoded.entries.items()}


def cdi_specs(nodes: RealNodes, node: str) -> list[str]:
    """The CDI spec files on the node."""
    cdi = nodes[node].ns.path(CDI_DIR)
    return sorted(p.name for p in cdi.iterdir()) if cdi.is_dir() else []


def cdi_specs_naming(nodes: RealNodes, node: str, uid: str) -> list[str]:
    """CDI spec files on the node whose name or content names claim ``uid``."""
    cdi = nodes[node].ns.path(CDI_DIR)
    if not cdi.is_dir():
        return []
    return sorted(
        p.name for p in cdi.iterdir() if p.is_file() and (uid in p.name or uid in p.read_text())
    )


def delete(kubectl: Kubectl, nodes: RealNodes, wl: Workload, timeout: float = 180) -> list[str]:
    """Delete the pods and then the domain (not waiting for it: :func:`domain_gone`); problems
    the workload's claims left on the nodes (checkpoint entries, CDI specs) once the pods are
    gone. ``[]``: Unprepare was clean."""
    uids = claim_uids(kubectl, wl)
    if len(uids) != len(wl.nodes):
        return [f"expected {len(wl.nodes)} claims, found {uids}"]
    kubectl("-n", wl.ns, "delete", "pod", *map(wl.pod_name, wl.nodes), "--wait=false")
    wait_for(f"{wl.ns} pods gone", lambda: not wl.pods(kubectl), timeout)
    kubectl("-n", wl.ns, "delete", "computedomain", wl.name, "--wait=false")
    problems = []

    def claims_unprepared() -> bool:
        return not any(uid in checkpoint_claims(nodes, n) for uid, n in uids.items())

    try:
        wait_for("the workload's claims gone from the checkpoints", claims_unprepared, 60)
    except AssertionError:
        for uid, n in uids.items():
            if uid in checkpoint_claims(nodes, n):
                problems.append(f"{n}: checkpoint still holds {uid}")
    for uid, n in uids.items():
        specs = cdi_specs_naming(nodes, n, uid)
        if specs:
            problems.append(f"{n}: CDI specs of {uid} left: {specs}")
    return problems


def domain_gone(kubectl: Kubectl, wl: Workload, timeout: float) -> bool:
    """Wait up to ``timeout`` for the workload's ComputeDomain to be deleted."""

    def gone() -> bool:
        out = kubectl(
            "-n", wl.ns, "get", "computedomain", wl.name, "--ignore-not-found", "-o", "name"
        )
        return not out.strip()

    try:
        wait_for(f"computedomain {wl.ns}/{wl.name} gone", gone, timeout)
    except AssertionError:
        return False
    return True
