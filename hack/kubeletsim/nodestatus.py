"""The kubelet's node-level duties: register the Node, keep it Ready, renew its Lease.

Owns the Node object's ``status`` (conditions, capacity/allocatable, addresses, nodeInfo) and the
``kube-node-lease/<node>`` Lease, written with the node's own identity (``system:node:<name>``,
allowed by the Node authorizer and NodeRestriction admission). Labels other components add (the
ComputeDomain node label, clique labels) are never overwritten: registration creates the Node
once and afterwards only ``nodes/status`` is patched.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Mapping
from typing import Any

from pkg.kube.client import KubeClient
from pkg.kube.errors import AlreadyExistsError, ApiError, NotFoundError
from pkg.kube.resources import LEASES, NODES

log = logging.getLogger(__name__)

LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_SECONDS = 40
KUBELET_VERSION = "v1.37.1"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _time(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_time(t: dt.datetime) -> str:
    # metav1.MicroTime needs exactly 6 fractional digits.
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_status(
    *, ip: str, cpu: str, memory: str, pods: str, ready: bool, heartbeat: dt.datetime
) -> dict[str, Any]:
    resources = {"cpu": cpu, "memory": memory, "pods": pods}
    ts = _time(heartbeat)

    def cond(type_: str, status: bool, reason: str, message: str) -> dict[str, str]:
        return {
            "type": type_,
            "status": "True" if status else "False",
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": ts,
        }

    return {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [
            cond("MemoryPressure", False, "KubeletHasSufficientMemory", "simulated"),
            cond("DiskPressure", False, "KubeletHasNoDiskPressure", "simulated"),
            cond("PIDPressure", False, "KubeletHasSufficientPID", "simulated"),
            cond(
                "Ready",
                ready,
                "KubeletReady" if ready else "KubeletNotReady",
                "kubelet stand-in (kubeletsim) is posting ready status"
                if ready
                else "kubelet stand-in stopped",
            ),
        ],
        "addresses": [
            {"type": "InternalIP", "address": ip},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
            "kernelVersion": "",
            "osImage": "kubeletsim",
            "containerRuntimeVersion": "kubeletsim://0.1",
        },
    }


class NodeAgent:
    """Registers one Node and heartbeats it (status every ``status_period``, Lease renewals)."""

    def __init__(
        self,
        client: KubeClient,
        *,
        name: str,
        ip: str,
        labels: Mapping[str, str],
        cpu: str = "64",
        memory: str = "512Gi",
        pods: str = "110",
        lease_period: float = 10.0,
        status_period: float = 60.0,
    ) -> None:
        self._client = client
        self.name = name
        self.ip = ip
        self._labels = dict(labels)
        self._resources = {"cpu": cpu, "memory": memory, "pods": pods}
        self._lease_period = lease_period
        self._status_period = status_period
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def register(self) -> None:
        """Create the Node (with status) or, if it exists, post a Ready status for it."""
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": {
                    "kubernetes.io/hostname": self.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    **self._labels,
                },
            },
            "spec": {},
            "status": self._status(ready=True),
        }
        try:
            self._client.create(NODES, node)
        except AlreadyExistsError:
            self.post_status(ready=True)
        self.renew_lease()

    def _status(self, *, ready: bool) -> dict[str, Any]:
        return node_status(ip=self.ip, ready=ready, heartbeat=_now(), **self._resources)

    def post_status(self, *, ready: bool) -> None:
        self._client.patch(
            NODES,
            self.name,
            {"status": self._status(ready=ready)},
            patch_type="strategic",
            subresource="status",
        )

    def renew_lease(self) -> None:
        now = _micro_time(_now())
        try:
            lease = self._client.get(LEASES, self.name, namespace=LEASE_NAMESPACE)
        except NotFoundError:
            self._client.create(
                LEASES,
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": LEASE_NAMESPACE},
                    "spec": {
                        "holderIdentity": self.name,
                        "leaseDurationSeconds": LEASE_DURATION_SECONDS,
                        "renewTime": now,
                    },
                },
            )
            return
        lease["spec"]["renewTime"] = now
        lease["spec"]["holderIdentity"] = self.name
        lease["spec"]["leaseDurationSeconds"] = LEASE_DURATION_SECONDS
        self._client.update(LEASES, lease)

    def start(self) -> None:
        self.register()
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"heartbeat:{self.name}", daemon=True
        )
        self._thread.start()

    def stop(self, *, mark_not_ready: bool = False) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        if mark_not_ready:
            try:
                self.post_status(ready=False)
            except ApiError as e:
                log.warning("node %s: could not post NotReady: %s", self.name, e)

    def _run(self) -> None:
        since_status = 0.0
        while not self._stop.wait(self._lease_period):
            try:
                self.renew_lease()
                since_status += self._lease_period
                if since_status >= self._status_period:
                    since_status = 0.0
                    self.post_status(ready=True)
            except Exception as e:
                log.warning("node %s heartbeat failed: %s", self.name, e)
