"""The controller's ``-v`` levels mean what upstream's do, on the real API server.

The session's controller is restarted at ``-v`` 0, 2, 3 and 6 in turn (SIGTERM, so its Lease is
released and the next one leads at once); at each level a ComputeDomain is reconciled and the
log of that run must hold exactly the lines of its level and below: the start-up dump at 0,
``Processing added or updated ComputeDomain`` and ``Caches populated`` at 2, the reflectors'
``Listing and watching`` at 3, one ``"Response"`` line per API round trip at 6. The controller
is left running with the manifest's settings.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from localcluster import Cluster
from testsupport.e2e_support import Driver, free_port
from testsupport.workloads import create_cd

from pkg.kube.client import KubeClient

pytestmark = pytest.mark.e2e

# level -> (lines that must appear at that level)
LINES = {
    0: "Feature gates: map[string]bool{",
    2: "Processing added or updated ComputeDomain: ",
    3: '"Listing and watching" type="ComputeDomain"',
    6: '"Response" verb="GET"',
}


@pytest.fixture
def restore(cluster: Cluster, driver: Driver) -> Iterator[None]:
    yield
    driver.kill_controller(signal.SIGTERM)
    kubeconfig = cluster.kubeconfig("compute-domain-controller")
    driver.start_controller(
        kubeconfig=kubeconfig, log_file=cluster.log_path("controller"), http_port=free_port()
    )


def run_at(
    level: int, cluster: Cluster, admin: KubeClient, driver: Driver, ns: str, log: Path
) -> str:
    """The log of a controller run at ``-v level`` that reconciled one new domain."""
    driver.kill_controller(signal.SIGTERM)
    driver.start_controller(
        kubeconfig=cluster.kubeconfig("compute-domain-controller"),
        log_file=log,
        http_port=free_port(),
        extra_env={"LOG_VERBOSITY": str(level)},
    )
    create_cd(admin, ns, f"v{level}")  # returns once its workload template exists
    return log.read_text()


def test_each_verbosity_level_adds_upstreams_lines(
    cluster: Cluster, admin: KubeClient, driver: Driver, ns: str, tmp_path: Path, restore: None
) -> None:
    del restore
    for level in (0, 2, 3, 6):
        text = run_at(level, cluster, admin, driver, ns, tmp_path / f"v{level}.log")
        for line_level, needle in LINES.items():
            if line_level <= level:
                assert needle in text, f"-v {level}: missing {needle!r}"
            else:
                assert needle not in text, f"-v {level}: {needle!r} is for -v {line_level}"
        assert f"klogVerbosity: (int) {level}," in text
