"""Manifests for kubelet-less ("fake") Nodes that the real scheduler will place pods on.

Owns what such a Node needs: ``status.conditions`` Ready=True, capacity/allocatable for cpu,
memory and pods, and no not-ready taint (the cluster disables TaintNodesByCondition admission
and node-lifecycle-controller, so nothing adds one). Plain dicts, usable with any client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def fake_node(
    name: str,
    labels: Mapping[str, str] | None = None,
    *,
    cpu: str = "32",
    memory: str = "256Gi",
    pods: str = "110",
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A Node object that is Ready and schedulable. Create it with status in one POST:
    the apiserver keeps ``status`` on create (``kubectl create`` / ``create_node``)."""
    resources = {"cpu": cpu, "memory": memory, "pods": pods}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                **(labels or {}),
            },
        },
        "spec": {"taints": taints} if taints else {},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "fake node (no kubelet)",
                }
            ],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "nodeInfo": {
                "kubeletVersion": "v1.37.1",
                "operatingSystem": "linux",
                "architecture": "amd64",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": "",
                "osImage": "",
                "containerRuntimeVersion": "",
                "kubeProxyVersion": "",
            },
        },
    }
