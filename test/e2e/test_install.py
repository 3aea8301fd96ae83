"""Install: the driver deployed from ``config/`` on the real API server.

CRDs are Established and served; upstream-style ComputeDomain manifests (the shape of NVIDIA's
``demo/specs/imex/channel-injection.yaml``) are accepted; invalid ones are rejected by the real
apiserver's OpenAPI/CEL validation with a message that names the problem; the DeviceClasses and
ServiceAccounts exist; every simulated node's plugin published its ResourceSlice.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from kubeletsim import NodeFleet
from localcluster import Cluster
from testsupport.e2e_support import Driver, kubectl, wait_for

from pkg.api import constants as c
from pkg.kube.client import KubeClient
from pkg.kube.resources import (
    COMPUTE_DOMAINS,
    CUSTOM_RESOURCE_DEFINITIONS,
    DEVICE_CLASSES,
    RESOURCE_SLICES,
)

pytestmark = pytest.mark.e2e

UPSTREAM_CD = """
apiVersion: resource.nvidia.com/v1beta1
kind: ComputeDomain
metadata:
  name: imex-channel-injection
spec:
  numNodes: 1
  channel:
    resourceClaimTemplate:
      name: imex-channel-0
"""


def apply(cluster: Cluster, ns: str, doc: str, *, dry_run: bool = True) -> tuple[bool, str]:
    args = ["apply", "-n", ns, "-f", "-"] + (["--dry-run=server"] if dry_run else [])
    out = kubectl(cluster.kubeconfig("admin"), *args, stdin=doc, check=False)
    return ("created" in out or "configured" in out or "serverside-applied" in out), out


def test_crds_established_and_driver_objects_present(
    admin: KubeClient, driver: Driver, fleet: NodeFleet
) -> None:
    for name in ("computedomains.resource.nvidia.com", "computedomaincliques.resource.nvidia.com"):
        crd = admin.get(CUSTOM_RESOURCE_DEFINITIONS, name)
        conds = {x["type"]: x["status"] for x in crd["status"]["conditions"]}
        assert conds["Established"] == "True", conds
    for dc in (c.CHANNEL_DEVICE_CLASS, c.DAEMON_DEVICE_CLASS):
        assert admin.get(DEVICE_CLASSES, dc)["spec"]["selectors"]
    nodes = {n.name for n in fleet}

    def all_published() -> list[dict[str, Any]] | None:
        items: list[dict[str, Any]] = admin.list(RESOURCE_SLICES)["items"]
        return items if {x["spec"]["nodeName"] for x in items} >= nodes else None

    slices = wait_for("a ResourceSlice per node", all_published)
    for s in slices:
        assert s["spec"]["driver"] == c.DRIVER_NAME
        assert {d["name"] for d in s["spec"]["devices"]} == {"channel-0", "daemon-0"}


def test_upstream_manifest_accepted(cluster: Cluster, ns: str) -> None:
    ok, out = apply(cluster, ns, UPSTREAM_CD)
    assert ok, out
    all_mode = yaml.safe_load(UPSTREAM_CD)
    all_mode["spec"]["channel"]["allocationMode"] = "All"
    del all_mode["spec"]["numNodes"]
    ok, out = apply(cluster, ns, yaml.safe_dump(all_mode))
    assert ok, out


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: s.pop("channel"), "spec.channel: Required value"),
        (lambda s: s["channel"].update(allocationMode="Some"), 'Unsupported value: "Some"'),
        (lambda s: s.update(numNodes=-1), "spec.numNodes"),
        (lambda s: s["channel"].pop("resourceClaimTemplate"), "resourceClaimTemplate"),
    ],
    ids=["no-channel", "bad-allocation-mode", "negative-numNodes", "no-template"],
)
def test_invalid_manifest_rejected(cluster: Cluster, ns: str, mutate: object, message: str) -> None:
    doc = yaml.safe_load(UPSTREAM_CD)
    mutate(doc["spec"])  # type: ignore[operator]
    ok, out = apply(cluster, ns, yaml.safe_dump(doc))
    assert not ok, out
    assert "is invalid" in out and message in out, out


def test_spec_is_immutable(cluster: Cluster, admin: KubeClient, ns: str) -> None:
    ok, out = apply(cluster, ns, UPSTREAM_CD, dry_run=False)
    assert ok, out
    doc = yaml.safe_load(UPSTREAM_CD)
    doc["spec"]["numNodes"] = 2
    ok, out = apply(cluster, ns, yaml.safe_dump(doc))
    assert not ok
    assert "A computeDomain.spec is immutable" in out, out
    assert (
        admin.get(COMPUTE_DOMAINS, "imex-channel-injection", namespace=ns)["spec"]["numNodes"] == 1
    )
