"""docs/security.md's RBAC table is the RBAC config/default renders: every rule, no more."""

from __future__ import annotations

import re
from pathlib import Path

from testsupport.manifests import EXPECTED_RBAC, render

DOC = Path(__file__).resolve().parents[3] / "docs" / "security.md"

Row = tuple[str, str, str, str, tuple[str, ...], frozenset[str]]


def _doc_rows() -> set[Row]:
    text = DOC.read_text()
    section = text.split("## RBAC: every rule and why", 1)[1].split("\n## ", 1)[0]
    rows: set[Row] = set()
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].startswith(("Role ", "ClusterRole ")):
            continue
        kind, name = cells[0].split(" ", 1)
        group = "" if cells[1] == "(core)" else cells[1]
        match = re.fullmatch(r"([a-z/]+)(?: \(([^)]*)\))?", cells[2])
        assert match, cells[2]
        names = tuple(n.strip() for n in match.group(2).split(",")) if match.group(2) else ()
        verbs = frozenset(v.strip() for v in cells[3].split(","))
        assert cells[4], f"no reason given for {cells[:4]}"
        rows.add((kind, name, group, match.group(1), names, verbs))
    return rows


def _rendered_rows() -> set[Row]:
    rows: set[Row] = set()
    for o in render("default"):
        if o["kind"] not in ("Role", "ClusterRole"):
            continue
        merged: dict[tuple[str, str, tuple[str, ...]], set[str]] = {}
        for rule in o.get("rules", []):
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    key = (group, resource, tuple(rule.get("resourceNames", ())))
                    merged.setdefault(key, set()).update(rule["verbs"])
        for (group, resource, names), verbs in merged.items():
            rows.add((o["kind"], o["metadata"]["name"], group, resource, names, frozenset(verbs)))
    return rows


def test_the_rbac_table_is_the_rendered_rbac() -> None:
    doc, rendered = _doc_rows(), _rendered_rows()
    assert doc == rendered, {"only in the doc": doc - rendered, "not in the doc": rendered - doc}
    assert {(k, n) for k, n, *_ in rendered} == set(EXPECTED_RBAC)
