"""Session fixtures of the e2e suite: one real control plane, the driver, one node fleet.

* ``cluster``: ``localcluster.Cluster`` from the binaries of ``hack/build-control-plane.sh``.
  Missing binaries FAIL the e2e tests with the command to run (``SKIP_E2E=1`` skips instead).
* ``driver``: ``config/`` rendered with ``kubectl kustomize`` and applied (CRDs, RBAC,
  DeviceClasses, admission policies); the controller runs as a local process with its
  ServiceAccount's kubeconfig.
* ``fleet``: simulated GPU nodes (``kubeletsim``): ``gpu-node-1..4`` in NVLink clique 0,
  ``gpu-node-5`` in clique 1, ``gpu-node-6`` without NVLink.
  The controller and the plugins run with ``DEBUG_ENDPOINTS=true`` (``cachecheck`` reads their
  ``/debug/informers``).
* ``ns``: a namespace per test; after the test every ComputeDomain and pod in it is deleted and
  the leak check (``e2e_support.leak_report``) must come back empty.

When a test fails, the tails of every component log (control plane, controller, plugins,
daemons) are attached to its report.
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
from kubeletsim import NodeFleet, config_from_cluster, layout
from localcluster import Cluster, bin_dir
from localcluster.processes import teardown_on_sigterm
from testsupport.e2e_support import Driver, free_port, leak_report, teardown_namespace, wait_for

from pkg.kube.client import KubeClient, RestClient
from pkg.kube.config import load_api_client
from pkg.kube.resourceapi import discover_resource_api
from pkg.kube.resources import NAMESPACES

REQUIRED = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "cdi-resolve")
CLIQUES: list[int | None] = [0, 0, 0, 0, 1, None]
NODE_NAMES = [s.name for s in layout(CLIQUES)]
SESSION: dict[str, Any] = {}


def pytest_configure(config: pytest.Config) -> None:
    """A SIGTERM (CI timeout, ``kill``) tears the session down like Ctrl-C does."""
    teardown_on_sigterm()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    if os.environ.get("SKIP_E2E") == "1":
        pytest.skip("SKIP_E2E=1")
    bins = bin_dir()
    missing = [b for b in REQUIRED if not (bins / b).is_file()]
    if missing:
        pytest.fail(
            f"e2e: control-plane binaries missing in {bins}: {', '.join(missing)}. "
            "Build them with `hack/build-control-plane.sh` (or `make control-plane`); "
            "set SKIP_E2E=1 to skip the e2e suite.",
            pytrace=False,
        )
    # Short path: Unix socket paths of the simulated nodes must stay under 108 bytes.
    workdir = Path(tempfile.mkdtemp(prefix="cde2e-", dir="/tmp"))
    c = Cluster.start(bins, workdir, node_names=NODE_NAMES)
    SESSION["cluster"] = c
    yield c
    c.stop()
    if os.environ.get("E2E_KEEP") != "1":
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(autouse=True)
def _fresh_controllers_after_apiserver_restarts(
    request: pytest.FixtureRequest,
) -> Iterator[None]:
    """A test that restarted the shared kube-apiserver leaves kube-scheduler and
    kube-controller-manager restarted too (`Cluster.restart_controllers`): otherwise their
    reflectors' backoff from that test's outages delays the next test by up to a minute."""
    if "cluster" not in request.fixturenames:
        yield
        return
    c: Cluster = request.getfixturevalue("cluster")
    before = c.apiserver_restarts
    yield
    if c.apiserver_restarts != before:
        c.restart_controllers()


@pytest.fixture(scope="session")
def admin(cluster: Cluster) -> KubeClient:
    client = RestClient(load_api_client(str(cluster.kubeconfig("admin"))), user_agent="e2e")
    # Tests speak v1 shapes; on Kubernetes 1.32/1.33 the client converts (pkg.kube.resourceapi).
    client.use_resource_api(discover_resource_api(client))
    return client


@pytest.fixture(scope="session")
def driver(cluster: Cluster) -> Iterator[Driver]:
    d = Driver.deploy(cluster.kubeconfig("admin"))
    assert d.namespace == cluster.driver_namespace, "config/ and localcluster disagree"
    d.start_controller(
        kubeconfig=cluster.kubeconfig("compute-domain-controller"),
        log_file=cluster.log_path("controller"),
        http_port=free_port(),
    )
    SESSION["driver"] = d
    yield d
    d.kill_controller()


@pytest.fixture(scope="session")
def fleet(cluster: Cluster, driver: Driver) -> Iterator[NodeFleet]:
    f = NodeFleet(config_from_cluster(cluster, cluster.workdir / "n", debug_endpoints=True))
    SESSION["fleet"] = f
    f.add(layout(CLIQUES))
    yield f
    f.stop()


@pytest.fixture
def ns(
    request: pytest.FixtureRequest, admin: KubeClient, fleet: NodeFleet, driver: Driver
) -> Generator[str, None, None]:
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    name = f"{name}-{secrets.token_hex(2)}"
    admin.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    teardown_namespace(admin, name)
    leaks = wait_for_clean(admin, fleet, driver.namespace, [name])
    assert not leaks, f"leaked after test: {leaks}"
    admin.delete(NAMESPACES, name)


def wait_for_clean(
    admin: KubeClient, fleet: NodeFleet, driver_ns: str, namespaces: list[str], timeout: float = 60
) -> dict[str, Any]:
    try:
        wait_for(
            "no leaks",
            lambda: not leak_report(admin, fleet, driver_ns, namespaces),
            timeout=timeout,
            every=0.5,
        )
    except AssertionError:
        leaks: dict[str, Any] = leak_report(admin, fleet, driver_ns, namespaces)
        return leaks
    return {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and "cluster" in SESSION:
        report.sections.append(("component logs", component_logs()))


def component_logs(lines: int = 60) -> str:
    c: Cluster = SESSION["cluster"]
    parts = [c.dump_logs(lines)]
    fleet: NodeFleet | None = SESSION.get("fleet")
    if fleet is not None:
        for name, path in fleet.logs().items():
            if path.parent != c.log_dir:
                parts.append(f"===== {name} (last {lines} lines) =====\n{_tail(path, lines)}")
    return "\n".join(parts)


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"<{e}>"
