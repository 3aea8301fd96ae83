"""Commit messages keep the rule of docs/development.md "Commits": a subject of at most 72
characters with the detail in the body, checked by hack/check-commit-msg.sh (the pre-commit
`commit-msg` hook) and here over every commit made since the rule."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "check-commit-msg.sh"
# The last commit before the rule: commits after it keep it.
RULE_SINCE = "2831ff7"


def check(tmp_path: Path, message: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message)
    return subprocess.run(
        ["bash", str(SCRIPT), str(path)], capture_output=True, text=True, check=False, timeout=30
    )


@pytest.mark.parametrize(
    ("message", "refusal"),
    [
        ("Short subject\n\nA body line.\n", ""),
        ("x" * 72 + "\n", ""),
        ("# git's template\nSubject after a comment\n", ""),
        ("x" * 73 + "\n", "the subject has 73 characters; at most 72"),
        ("Subject\nbody without the blank line\n", "leave the second line empty"),
        ("\n\nbody\n", "the subject (first line) is empty"),
    ],
    ids=["ok", "72-chars", "comment-skipped", "73-chars", "no-blank-line", "empty-subject"],
)
def test_the_commit_msg_hook(tmp_path: Path, message: str, refusal: str) -> None:
    done = check(tmp_path, message)
    assert (done.returncode == 0) == (not refusal), done.stderr
    assert refusal in done.stderr


def _subjects_since_the_rule() -> list[str] | None:
    known = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{RULE_SINCE}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    if known.returncode != 0:
        return None
    log = subprocess.run(
        ["git", "-C", str(REPO), "log", "--format=%s", f"{RULE_SINCE}..HEAD"],
        capture_output=True,
        text=True,
        check=True,
    )
    return log.stdout.splitlines()


def test_every_commit_since_the_rule_keeps_it() -> None:
    subjects = _subjects_since_the_rule()
    if subjects is None:
        pytest.skip(f"history without {RULE_SINCE} (a shallow clone): nothing to check")
    assert subjects, "no commit since the rule: the range is wrong"
    assert [s for s in subjects if len(s) > 72] == []
