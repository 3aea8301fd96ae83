"""What a release is made of agrees with itself: one version (pyproject.toml) in the chart and
the changelog, and the licence file is the licence pyproject.toml declares."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "deployments" / "helm" / "compute-domain-driver" / "Chart.yaml"


def project() -> dict[str, object]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert isinstance(data, dict)
    return data


def test_the_chart_carries_the_project_version() -> None:
    chart = yaml.safe_load(CHART.read_text())
    version = project()["version"]
    assert (chart["version"], chart["appVersion"]) == (version, version)


def test_the_changelog_has_a_section_for_the_project_version() -> None:
    text = (REPO / "CHANGELOG.md").read_text()
    released = re.findall(r"^## (\d+\.\d+\.\d+) - (\d{4}-\d{2}-\d{2})$", text, flags=re.M)
    assert released, "no released version in CHANGELOG.md"
    assert released[0][0] == project()["version"], "the newest section is not pyproject's version"
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert headings[0] == "Unreleased" and headings[1] == released[0][0] + " - " + released[0][1]
    subsections = set(re.findall(r"^### (.+)$", text, flags=re.M))
    assert subsections <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def test_the_licence_file_is_the_declared_apache_2_0() -> None:
    assert project()["license"] == "Apache-2.0"
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
