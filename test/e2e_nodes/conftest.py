"""Session fixtures of the real-node e2e lane: real kubelets + containerd, the driver as pods.

* ``cluster``: ``localcluster.Cluster`` started with ``advertise_address`` = the host end of the
  nodes' bridge (``hostnet.HOST_IP``), ServiceAccount admission and every controller on, and a
  node identity for each of ``REAL_NODES`` and ``ARM64_NODE`` (which only
  ``test_real_arm64`` starts, for its own duration).
* ``nodes``: ``REAL_NODES`` as ``localcluster.RealNodes`` — per node its own network + mount
  namespace, containerd v2, kubelet v1.37 and kube-proxy, fake GPUs (``FAKE_GPUS``) and the
  images of ``hack/nodeimages`` imported (the driver's three, pause, busybox), and a fake driver
  root (``pkg.testing.fakedriverroot``) whose simulated ``nvidia-imex`` the daemons receive
  through CDI only.
* ``driver``: ``config/overlays/e2e-real-nodes`` applied with ``kubectl apply --server-side -k``;
  the controller Deployment and the kubelet-plugin DaemonSet run from our images.
* ``ns``: a namespace per test, deleted afterwards; nothing of the test may be left.

Teardown stops every node and checks that the host is as it was found (``hostnet.leftovers``):
a leftover fails the session. Missing binaries or host tools FAIL with the command to run
(``SKIP_E2E=1`` skips the lane instead).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from localcluster import Cluster, bin_dir
from localcluster.hostnet import HOST_IP
from localcluster.processes import teardown_on_sigterm
from localcluster.realnode import RealNodes, missing_prerequisites
from nodeimages import PAUSE_IMAGE, build_all
from testsupport.realsupport import (
    ARM64_NODE,
    GPU_NODE_LABELS,
    OVERLAY,
    REAL_NODES,
    Kubectl,
    deploy_driver,
    pod_ready,
    pod_summary,
    prepare_node,
)

SESSION: dict[str, Any] = {}


def pytest_configure(config: pytest.Config) -> None:
    """A SIGTERM (CI timeout, ``kill``) tears the session down like Ctrl-C does."""
    teardown_on_sigterm()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.e2e)
    # A module that runs a lane of its own in a child pytest (test_sigterm_lane) goes first:
    # this process claims the host lock on its first sweep and keeps it, and its session nodes
    # run until the session ends; the child could take neither the lock nor the host.
    items.sort(key=lambda item: item.get_closest_marker("own_lane") is None)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    if os.environ.get("SKIP_E2E") == "1":
        pytest.skip("SKIP_E2E=1")
    bins = bin_dir()
    missing = missing_prerequisites(bins)
    if missing:
        pytest.fail(
            "real-node e2e: missing " + ", ".join(missing) + "; set SKIP_E2E=1 to skip.",
            pytrace=False,
        )
    workdir = Path(tempfile.mkdtemp(prefix="cdreal-", dir="/tmp"))
    c = Cluster.start(
        bins,
        workdir,
        node_names=(*REAL_NODES, ARM64_NODE),
        advertise_address=HOST_IP,
        controller_manager_args=["--node-monitor-grace-period=20s", "--node-monitor-period=2s"],
    )
    SESSION["cluster"] = c
    yield c
    c.stop()
    if os.environ.get("E2E_KEEP") != "1":
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def kubectl(cluster: Cluster) -> Kubectl:
    return Kubectl(cluster.kubeconfig("admin"))


@pytest.fixture(scope="session")
def nodes(cluster: Cluster) -> Iterator[RealNodes]:
    images = build_all()
    fleet = RealNodes.start(
        cluster,
        cluster.workdir / "nodes",
        REAL_NODES,
        images=list(images.values()),
        pause_image=PAUSE_IMAGE,
        prepare=prepare_node,
        labels=GPU_NODE_LABELS,
    )
    SESSION["nodes"] = fleet
    yield fleet
    left = fleet.stop()
    assert not left, f"real-node tier left this on the host: {left}"


@pytest.fixture(scope="session")
def driver(nodes: RealNodes, kubectl: Kubectl) -> Iterator[str]:
    """Apply the overlay; wait for the controller and one Ready plugin pod per node."""
    namespace = deploy_driver(kubectl)
    yield namespace
    kubectl("delete", "--wait=true", "--timeout=120s", "-k", str(OVERLAY), check=False)


@pytest.fixture
def ns(request: pytest.FixtureRequest, kubectl: Kubectl, driver: str) -> Generator[str]:
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    name = f"{name}-{secrets.token_hex(2)}"
    kubectl("create", "namespace", name)
    yield name
    kubectl("delete", "namespace", name, "--wait=true", "--timeout=180s")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and "cluster" in SESSION:
        c: Cluster = SESSION["cluster"]
        report.sections.append(("component logs", c.dump_logs(60)))
        try:
            k = Kubectl(c.kubeconfig("admin"))
        except KeyError:  # a session teardown failed after the cluster stopped: nothing to ask
            return
        report.sections.append(("pods", k("get", "pods", "-A", "-o", "wide", check=False)))
        report.sections.append(("container logs", _container_logs(k)))
        report.sections.append(
            ("cliques", k("get", "computedomaincliques", "-A", "-o", "yaml", check=False))
        )
        report.sections.append(
            ("events", k("get", "events", "-A", "--sort-by=.lastTimestamp", check=False))
        )
        # Last, because CI keeps only the end of the output: the pods that are not Ready.
        report.sections.append(("pods not ready", _unready_pods(k)))


def _unready_pods(k: Kubectl, *, lines: int = 15, limit: int = 6) -> str:
    """Up to ``limit`` pods that are neither Ready nor Succeeded, each as `pod_summary` says
    with its last ``lines`` log lines: the short form of the sections above."""
    try:
        listed = k.items("pods", "-A")
    except AssertionError as err:
        return f"cannot list pods: {err}"
    unready = [
        p for p in listed if not pod_ready(p) and p.get("status", {}).get("phase") != "Succeeded"
    ]
    parts = []
    for pod in unready[:limit]:
        meta = pod["metadata"]
        log = k(
            "logs",
            "-n",
            meta["namespace"],
            meta["name"],
            "--all-containers",
            f"--tail={lines}",
            check=False,
        )
        parts.append(f"== {pod_summary(pod)}\n{log.rstrip()}")
    more = f"\n({len(unready) - limit} more)" if len(unready) > limit else ""
    return ("\n".join(parts) or "every pod is Ready or Succeeded") + more


def _container_logs(k: Kubectl, *, pods: int = 30, lines: int = 80) -> str:
    """The last ``lines`` lines of every container (previous instance too) of up to ``pods``
    pods: the driver's own logs are what explains a real-node failure."""
    try:
        listed = k.items("pods", "-A")
    except AssertionError as err:
        return f"cannot list pods: {err}"
    parts = []
    for pod in listed[:pods]:
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        for previous in ("false", "true"):
            out = k(
                "logs",
                "-n",
                namespace,
                name,
                "--all-containers",
                "--prefix",
                f"--previous={previous}",
                f"--tail={lines}",
                check=False,
            )
            if out.strip():
                label = "previous" if previous == "true" else "current"
                parts.append(f"===== {namespace}/{name} ({label}) =====\n{out}")
    return "\n".join(parts)
