"""``helm install`` and ``helm uninstall`` of the chart on a real API server of its own.

A fresh control plane (not the session's, whose driver came from config/default and owns the
same cluster-scoped names) whose driver namespace is not config/default's: ``helm install``
into it must create every object ``helm template`` renders, with the release namespace in the
admission policies; ``helm uninstall`` must remove the driver but keep the CRDs and the
ComputeDomains (Helm never deletes crds/). No driver process runs: this is about what the chart
puts into the API server, the simulated and real-node lanes run the driver itself.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from localcluster import Cluster, bin_dir
from testsupport.e2e_support import KUBECTL, REPO

pytestmark = pytest.mark.e2e

CHART = REPO / "deployments" / "helm" / "compute-domain-driver"
NS = "cd-helm"  # the release namespace (config/default's is nvidia-dra-driver)
USER_NS = "team-a"


@pytest.fixture(scope="module")
def helm_cluster() -> Iterator[Cluster]:
    workdir = Path(tempfile.mkdtemp(prefix="cdhelm-", dir="/tmp"))
    cluster = Cluster.start(bin_dir(), workdir, driver_namespace=NS, node_count=1)
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def helm(cluster: Cluster, *args: str) -> str:
    found = subprocess.run(
        [str(REPO / "hack" / "helm.sh")], capture_output=True, text=True, check=False, timeout=1800
    )
    assert found.returncode == 0, f"hack/helm.sh failed:\n{found.stderr}"
    done = subprocess.run(
        [
            found.stdout.strip().splitlines()[-1],
            f"--kubeconfig={cluster.kubeconfig('admin')}",
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, f"helm {' '.join(args)}:\n{done.stderr}"
    return done.stdout


def kubectl(cluster: Cluster, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KUBECTL), f"--kubeconfig={cluster.kubeconfig('admin')}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def exists(cluster: Cluster, obj: dict[str, Any]) -> bool:
    meta = obj["metadata"]
    args = [
        "get",
        f"{obj['kind']}.{obj['apiVersion'].split('/')[0]}"
        if "/" in obj["apiVersion"]
        else obj["kind"],
        meta["name"],
        "-o",
        "json",
    ]
    if "namespace" in meta:
        args += ["-n", meta["namespace"]]
    done = kubectl(cluster, *args)
    if done.returncode == 0:
        return True
    assert "NotFound" in done.stderr, done.stderr
    return False


def test_install_then_uninstall_keeps_crds_and_compute_domains(helm_cluster: Cluster) -> None:
    rendered = [
        d
        for d in yaml.safe_load_all(
            helm(helm_cluster, "template", "cdd", str(CHART), "-n", NS, "--include-crds")
        )
        if d
    ]
    helm(helm_cluster, "install", "cdd", str(CHART), "-n", NS, "--create-namespace")
    missing = [
        f"{d['kind']}/{d['metadata']['name']}" for d in rendered if not exists(helm_cluster, d)
    ]
    assert not missing, f"helm install did not create: {missing}"
    got = kubectl(
        helm_cluster,
        "get",
        "validatingadmissionpolicy",
        "compute-domain-kubelet-plugin-nodes",
        "-o",
        "json",
    )
    policy = json.loads(got.stdout)
    [cond] = policy["spec"]["matchConditions"]
    assert f"system:serviceaccount:{NS}:compute-domain-kubelet-plugin" in cond["expression"]

    assert kubectl(helm_cluster, "create", "namespace", USER_NS).returncode == 0
    domain = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": "kept", "namespace": USER_NS},
        "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "kept-channel"}}},
    }
    created = kubectl(helm_cluster, "create", "-f", "-", stdin=yaml.safe_dump(domain))
    assert created.returncode == 0, created.stderr

    helm(helm_cluster, "uninstall", "cdd", "-n", NS, "--wait")
    crds = [d for d in rendered if d["kind"] == "CustomResourceDefinition"]
    assert len(crds) == 2 and all(exists(helm_cluster, d) for d in crds)
    assert exists(helm_cluster, domain), "helm uninstall deleted a ComputeDomain"
    left = [
        f"{d['kind']}/{d['metadata']['name']}"
        for d in rendered
        if d["kind"] != "CustomResourceDefinition" and exists(helm_cluster, d)
    ]
    assert not left, f"helm uninstall left: {left}"
