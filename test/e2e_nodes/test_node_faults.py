"""The node faults of the real-node harness (``localcluster.realnode``), on real nodes: what
the real-node chaos suite (``chaosreal``) relies on, each shown to do what it says.

* boot ID: a container reads its node's own boot ID as ``/proc/sys/kernel/random/boot_id``
  (containerd's base runtime spec binds it there), not the host kernel's;
* containerd and the kubelet SIGKILLed and restarted (``RealNode.kill`` / ``restart``): the
  pod's container keeps running, unrestarted;
* reboot (``RealNode.reboot``): the container is restarted by the kubelet after the node's
  return, under a new boot ID; ``/run`` was emptied, ``/var/lib`` kept; the Node is Ready again.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from localcluster.realnode import RealNodes
from testsupport.realsupport import REAL_NODES, Kubectl, apply, wait_for

HOST_BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _pod(ns: str, node: str) -> dict[str, Any]:
    """A busybox pod on ``node`` that prints the boot ID it sees, then sleeps."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "boot", "namespace": ns},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "c",
                    "image": "busybox:1.37",
                    "command": ["sh", "-c", "cat /proc/sys/kernel/random/boot_id; sleep 3600"],
                }
            ],
        },
    }


def _status(kubectl: Kubectl, ns: str) -> dict[str, Any] | None:
    """The pod's container status once it runs, else None."""
    pod = kubectl.json("-n", ns, "get", "pod", "boot")
    for st in pod.get("status", {}).get("containerStatuses", []):
        if "running" in st.get("state", {}):
            return dict(st)
    return None


def test_boot_id_kill_restart_and_reboot(kubectl: Kubectl, nodes: RealNodes, ns: str) -> None:
    node = nodes[REAL_NODES[1]]
    apply(kubectl, _pod(ns, node.name))
    first = wait_for("the pod to run", lambda: _status(kubectl, ns), 120)
    seen = kubectl("-n", ns, "logs", "boot").strip()
    assert seen == node.boot_id, f"container saw boot ID {seen}, node has {node.boot_id}"
    assert seen != HOST_BOOT_ID

    for component in ("containerd", "kubelet"):
        node.kill(component)
        time.sleep(1)
        node.restart(component)
    nodes.wait_ready([node.name], timeout=90)
    time.sleep(3)  # a kubelet that would restart the container decides within its first sync
    again = wait_for("the pod running", lambda: _status(kubectl, ns), 60)
    assert again["containerID"] == first["containerID"], "a component restart restarted the pod"
    assert again["restartCount"] == first["restartCount"]

    before = node.boot_id
    marker_run = node.ns.path("/run/cde2e-reboot-marker")
    marker_lib = node.ns.path("/var/lib/cde2e-reboot-marker")
    marker_run.write_text("x")
    marker_lib.write_text("x")
    try:
        node.reboot()
        assert node.boot_id != before
        assert not marker_run.exists(), "/run survived the reboot"
        assert marker_lib.exists(), "/var/lib did not survive the reboot"
        nodes.wait_ready([node.name], timeout=120)

        def restarted() -> dict[str, Any] | None:
            st = _status(kubectl, ns)
            return st if st and st["restartCount"] > first["restartCount"] else None

        wait_for("the pod restarted after the reboot", restarted, 180)
        seen = kubectl("-n", ns, "logs", "boot").strip()
        assert seen == node.boot_id, f"after the reboot the container saw {seen}"
    finally:
        marker_lib.unlink(missing_ok=True)
    kubectl("-n", ns, "delete", "pod", "boot", "--wait=true", "--timeout=60s")
