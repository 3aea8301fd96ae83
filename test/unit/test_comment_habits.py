"""Comments and docstrings say why, never which of this project's issues asked for a thing: an
issue number means nothing to a reader of the code and goes stale. Upstream's issues (named as
upstream's, e.g. ``upstream #1418``) are facts about another project and stay."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OWN_ISSUE = re.compile(r"\b[Ii]ssue \d+\b")


def own_issue_references(text: str) -> list[int]:
    """Line numbers of ``text`` that cite an issue of this project."""
    return [
        n
        for n, line in enumerate(text.splitlines(), 1)
        if OWN_ISSUE.search(line) and "upstream" not in line.lower()
    ]


def test_no_comment_cites_an_issue_of_this_project() -> None:
    found = [
        f"{path.relative_to(REPO)}:{n}"
        for root in ("pkg", "cmd", "hack", "test")
        for path in sorted((REPO / root).rglob("*.py"))
        if path.name != Path(__file__).name
        for n in own_issue_references(path.read_text())
    ]
    assert found == []


def test_the_check_tells_ours_from_upstreams() -> None:
    text = "# the daemon waits (issue 33)\n# as upstream issue 816 reports\n# no timer\n"
    assert own_issue_references(text) == [1]
