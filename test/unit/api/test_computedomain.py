"""Validation of ComputeDomain objects and the generated CRDs."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from pkg.api.computedomain import (
    MAX_NUM_NODES,
    InvalidComputeDomainError,
    parse_compute_domain,
)
from pkg.api.crds import custom_resource_definitions


def cd(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"channel": {"resourceClaimTemplate": {"name": "imex-channel"}}}
    base.update(spec)
    return {
        "metadata": {"namespace": "ns", "name": "cd1", "uid": "u1", "generation": 2},
        "spec": base,
    }


def test_upstream_manifest_parses_with_defaults() -> None:
    view = parse_compute_domain(cd(numNodes=2))
    assert view.key == "ns/cd1"
    assert (view.num_nodes, view.allocation_mode, view.resource_claim_template_name) == (
        2,
        "Single",
        "imex-channel",
    )
    assert not view.deleting


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        ({"metadata": {}}, "spec"),
        ({"metadata": {}, "spec": {}}, "spec.channel"),
        (cd(channel={}), "spec.channel.resourceClaimTemplate.name"),
        (cd(channel={"resourceClaimTemplate": {"name": "Bad_Name"}}), "resourceClaimTemplate.name"),
        (cd(numNodes=-1), "spec.numNodes"),
        (cd(numNodes=2**62), "spec.numNodes: Invalid value 4611686018427387904: must be less"),
        (
            cd(channel={"resourceClaimTemplate": {"name": "x"}, "allocationMode": "Some"}),
            "spec.channel.allocationMode",
        ),
    ],
    ids=[
        "no-spec",
        "no-channel",
        "no-rct",
        "bad-rct-name",
        "negative-nodes",
        "huge-nodes",
        "bad-mode",
    ],
)
def test_invalid_compute_domains_name_the_field(obj: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidComputeDomainError, match=field):
        parse_compute_domain(obj)


def test_crds_have_upstream_shape_and_extras() -> None:
    cd_crd, clique_crd = custom_resource_definitions()
    version = cd_crd["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    assert spec["x-kubernetes-validations"][0]["rule"] == "self == oldSelf"
    assert spec["properties"]["numNodes"]["minimum"] == 0
    assert spec["properties"]["numNodes"]["maximum"] == MAX_NUM_NODES == 5000
    assert parse_compute_domain(cd(numNodes=MAX_NUM_NODES)).num_nodes == MAX_NUM_NODES
    assert spec["properties"]["channel"]["properties"]["allocationMode"]["enum"] == [
        "All",
        "Single",
    ]
    assert version["subresources"] == {"status": {}}
    assert cd_crd["spec"]["names"]["shortNames"] == ["cd"]
    assert "conditions" in schema["properties"]["status"]["properties"]
    assert "subresources" not in clique_crd["spec"]["versions"][0]


def test_generated_crd_files_are_current() -> None:
    result = subprocess.run(
        [sys.executable, "hack/gen-crds.py", "--check"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
