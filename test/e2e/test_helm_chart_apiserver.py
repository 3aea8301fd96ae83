"""The Helm chart against the real API server.

``helm template`` of deployments/helm/compute-domain-driver, with the server's version and the
resource API it serves, must pass a server-side dry-run apply into the deployed driver's
namespace: every object (schema, CEL of the admission policies, defaulting, admission). The
offline comparison with config/default is test/unit/helm; here the API server has its say.
A real ``helm install`` is not run: the session's driver (installed from config/default) owns
the same cluster-scoped names, and one release per cluster is the chart's contract.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import yaml
from localcluster import Cluster
from testsupport.e2e_support import KUBECTL, REPO, Driver

pytestmark = pytest.mark.e2e

CHART = REPO / "deployments" / "helm" / "compute-domain-driver"


def _helm() -> str:
    done = subprocess.run(
        [str(REPO / "hack" / "helm.sh")], capture_output=True, text=True, check=False, timeout=1800
    )
    assert done.returncode == 0, f"hack/helm.sh failed:\n{done.stderr}"
    return done.stdout.strip().splitlines()[-1]


def _kubectl(cluster: Cluster, *args: str, stdin: str = "") -> str:
    done = subprocess.run(
        [str(KUBECTL), f"--kubeconfig={cluster.kubeconfig('admin')}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, f"kubectl {' '.join(args)}:\n{done.stderr}"
    return done.stdout


@pytest.mark.parametrize(
    "sets",
    [
        (),
        (
            "resources.computeDomains.imex.mode=hostManaged",
            "featureGates.HostManagedIMEXDaemon=true",
        ),
    ],
    ids=["driverManaged", "hostManaged"],
)
def test_chart_passes_server_side_dry_run(
    cluster: Cluster, driver: Driver, sets: tuple[str, ...]
) -> None:
    version = json.loads(_kubectl(cluster, "version", "-o", "json"))["serverVersion"]
    served = _kubectl(cluster, "api-versions").split()
    assert "resource.k8s.io/v1" in served
    args = [
        _helm(),
        "template",
        "cdd",
        str(CHART),
        "--namespace",
        driver.namespace,
        "--kube-version",
        version["gitVersion"],
        "--include-crds",
    ]
    for api in served:
        args += ["--api-versions", api]
    for pair in sets:
        args += ["--set", pair]
    done = subprocess.run(args, capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    docs: list[dict[str, Any]] = [d for d in yaml.safe_load_all(done.stdout) if d]
    out = _kubectl(
        cluster,
        "apply",
        "--server-side",
        "--dry-run=server",
        "--force-conflicts",
        "--field-manager=test-helm-chart",
        "-o",
        "name",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(docs),
    ).split()
    assert len(out) == len(docs), out
    kinds = {d["kind"] for d in docs}
    assert {
        "Deployment",
        "DaemonSet",
        "ValidatingAdmissionPolicy",
        "DeviceClass",
        "CustomResourceDefinition",
    } <= kinds
