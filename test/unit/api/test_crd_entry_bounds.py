"""The membership entries' schema: every string and list bounded, the IP by CEL.

The real API server evaluates it in ``test/e2e/test_adversarial_entries.py``; here: nothing in
an entry is left unbounded, and the bounds agree with what the controller accepts.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from pkg.api import daemonentry as de
from pkg.api.computedomain import MAX_NUM_NODES
from pkg.api.crds import CANONICAL_IP_RULE, custom_resource_definitions
from pkg.reconcilers.config import ControllerConfig


def schemas() -> dict[str, Any]:
    out = {}
    for crd in custom_resource_definitions():
        out[crd["spec"]["names"]["kind"]] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return out


def unbounded(schema: dict[str, Any], path: str) -> list[str]:
    """Paths under ``schema`` of strings without maxLength/enum and arrays without maxItems."""
    out = []
    if schema.get("type") == "string" and "maxLength" not in schema and "enum" not in schema:
        out.append(path)
    if schema.get("type") == "array":
        if "maxItems" not in schema:
            out.append(path)
        out += unbounded(schema["items"], path + "[]")
    for name, sub in (schema.get("properties") or {}).items():
        out += unbounded(sub, f"{path}.{name}")
    return out


def test_every_entry_field_is_bounded() -> None:
    s = schemas()
    daemons = s["ComputeDomainClique"]["properties"][de.DAEMONS]
    nodes = s["ComputeDomain"]["properties"]["status"]["properties"][de.STATUS_NODES]
    assert unbounded(daemons, "daemons") == []
    assert unbounded(nodes, "status.nodes") == []
    assert daemons["maxItems"] == de.MAX_CLIQUE_DAEMONS and nodes["maxItems"] == MAX_NUM_NODES
    for items in (daemons["items"], nodes["items"]):
        ip = items["properties"][de.IP_ADDRESS]
        assert [r["rule"] for r in ip["x-kubernetes-validations"]] == [CANONICAL_IP_RULE]
        assert items["properties"][de.INDEX]["maximum"] == de.MAX_CLIQUE_DAEMONS - 1


def test_the_controller_refuses_more_daemons_per_clique_than_the_crd_holds() -> None:
    base = ControllerConfig(namespace="nvidia-dra-driver", image_name="img")
    assert replace(base, max_nodes_per_imex_domain=de.MAX_CLIQUE_DAEMONS).validate()
    with pytest.raises(ValueError, match="max-nodes-per-imex-domain: must be between 1 and 1024"):
        replace(base, max_nodes_per_imex_domain=de.MAX_CLIQUE_DAEMONS + 1).validate()
