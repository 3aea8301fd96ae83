"""docs/development.md names only files and folders that exist, so the map cannot drift from the
tree: a module moved or renamed without updating the map fails here."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "development.md"
_TOP = ("pkg", "cmd", "hack", "config", "deployments", "docs", "test")
_PATH = re.compile(r"`((?:" + "|".join(_TOP) + r")/[^`\s]*)`")


def test_every_path_named_in_the_development_map_exists() -> None:
    named = sorted(set(_PATH.findall(DOC.read_text())))
    assert len(named) > 40, named  # the map names files; a broken pattern would find none
    missing = [p for p in named if not (REPO / p.rstrip("/")).exists()]
    assert missing == []


def test_the_map_covers_every_component_and_shared_module() -> None:
    text = DOC.read_text()
    for module in (
        "pkg/api/daemonentry.py",
        "pkg/api/daemoncontract.py",
        "pkg/reconcilers/conditions.py",
        "pkg/testing/eventually.py",
    ):
        assert f"`{module}`" in text, module
