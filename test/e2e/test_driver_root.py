"""The IMEX daemons run IMEX from the node's driver root, through CDI only.

Every simulated node has a fake driver root (``pkg.testing.fakedriverroot``: the IMEX simulator
as ``usr/bin/nvidia-imex``/``nvidia-imex-ctl``) as the plugin's ``NVIDIA_DRIVER_ROOT``. The
daemon finds ``nvidia-imex`` only through ``PATH`` in its emulated container filesystem, which
holds exactly the CDI mounts the real CDI library resolved from the plugin's specs. A driver
root without ``nvidia-imex`` makes the daemon pod report ``DriverRootIncomplete`` (Event) and
the ComputeDomain's Ready condition say so; fixing the root and recreating the daemon recovers.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubeletsim import NodeFleet
from kubeletsim.node import SimulatedNode
from testsupport.e2e_support import Driver, events_for, wait_for
from testsupport.workloads import (
    cd_status,
    create_cd,
    daemon_pods,
    start_pods,
    wait_cd_ready,
    wait_running,
)

from pkg.api import constants as c
from pkg.kube.client import KubeClient
from pkg.kube.errors import NotFoundError
from pkg.kube.resources import PODS
from pkg.testing.fakedriverroot import host_arch, lib_dir_for

pytestmark = pytest.mark.e2e


def _daemon_record(node: SimulatedNode, driver_ns: str) -> dict[str, Any] | None:
    for path in node.container_records():
        if path.name.startswith(f"{driver_ns}_") and path.name.endswith(
            f"_{c.DAEMON_CONTAINER_NAME}.json"
        ):
            doc: dict[str, Any] = json.loads(path.read_text())
            return doc
    return None


def test_daemons_run_imex_from_the_driver_root_via_cdi(
    admin: KubeClient, fleet: NodeFleet, driver: Driver, ns: str
) -> None:
    node = fleet["gpu-node-5"]  # alone in NVLink clique 1
    w = create_cd(admin, ns, "cd", num_nodes=1)
    start_pods(admin, w, 1, [node.name])
    wait_running(admin, fleet, w)
    wait_cd_ready(admin, w, 1)
    record = wait_for("daemon container record", lambda: _daemon_record(node, driver.namespace))
    mounts = {m["destination"]: m["source"] for m in record["mounts"]}
    root = node.dirs.driver_root
    assert mounts["/usr/bin/nvidia-imex"] == str(root / "usr/bin/nvidia-imex")
    assert mounts["/usr/bin/nvidia-imex-ctl"] == str(root / "usr/bin/nvidia-imex-ctl")
    # The simulated nodes' fake roots have this host's library layout (x86_64 or aarch64).
    assert mounts[f"/{lib_dir_for(host_arch())}/libnvidia-ml.so.1"].startswith(str(root))
    paths = {d["path"] for d in record["deviceNodes"]}
    assert {"/dev/nvidiactl", "/dev/nvidia-caps/nvidia-cap512"} <= paths
    assert f"{c.CDI_VENDOR}/device=all" in record["cdiDevices"]


@pytest.fixture
def incomplete_root(fleet: NodeFleet) -> Iterator[SimulatedNode]:
    """gpu-node-5 with a driver root lacking nvidia-imex (restored afterwards)."""
    node = fleet["gpu-node-5"]
    node.dirs.write_driver_root(omit=("nvidia-imex",))
    node.restart_plugin()  # the base CDI spec is written at plugin start
    node.wait_plugin_registered()
    try:
        yield node
    finally:
        node.dirs.write_driver_root()
        node.restart_plugin()
        node.wait_plugin_registered()


def test_missing_imex_gives_an_event_and_a_condition_then_recovers(
    admin: KubeClient, fleet: NodeFleet, driver: Driver, ns: str, incomplete_root: SimulatedNode
) -> None:
    node = incomplete_root
    w = create_cd(admin, ns, "cd", num_nodes=1)
    start_pods(admin, w, 1, [node.name])

    def condition() -> dict[str, Any] | None:
        for cond in cd_status(admin, w).get("conditions") or []:
            if cond["type"] == "Ready" and cond["reason"] == c.REASON_DRIVER_ROOT_INCOMPLETE:
                return dict(cond)
        return None

    cond = wait_for("DriverRootIncomplete condition", condition, timeout=90)
    assert cond["status"] == "False"
    assert "nvidia-imex not found" in cond["message"] and node.name in cond["message"]
    assert "nvidiaDriverRoot" in cond["message"]

    (daemon,) = daemon_pods(admin, driver.namespace, w.cd_uid)
    name = daemon["metadata"]["name"]

    def pod_event() -> dict[str, Any] | None:
        for ev in events_for(admin, driver.namespace, name):
            if ev["reason"] == c.REASON_DRIVER_ROOT_INCOMPLETE and ev["type"] == "Warning":
                return ev
        return None

    event = wait_for("DriverRootIncomplete Event on the daemon pod", pod_event, timeout=30)
    assert "nvidia-imex not found" in event["message"]
    assert event["involvedObject"]["kind"] == "Pod"
    cd_events = events_for(admin, ns, w.cd_name)
    assert any(e["reason"] == c.REASON_DRIVER_ROOT_INCOMPLETE for e in cd_events), cd_events

    # Fix the driver root: the plugin writes a complete spec at its restart, and the daemon's
    # next container receives nvidia-imex (the stand-in re-resolves CDI only for a new pod).
    node.dirs.write_driver_root()
    node.restart_plugin()
    node.wait_plugin_registered()
    with contextlib.suppress(NotFoundError):
        admin.delete(PODS, name, namespace=driver.namespace)
    wait_running(admin, fleet, w)
    wait_cd_ready(admin, w, 1, timeout=90)
