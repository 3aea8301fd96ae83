"""`make flake TEST=... N=...` (hack/flake-check.sh): one test run N times, every run counted.

The runs here use a test file that fails on purpose in one of its runs (a counter beside it), and
no busy loops (LOAD=0), so the outcome does not depend on the machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "flake-check.sh"

FLAKY = """
from pathlib import Path

def test_fails_in_run_two() -> None:
    counter = Path(__file__).with_suffix(".count")
    runs = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(runs))
    assert runs != {fail_in}
"""


def flake(tmp_path: Path, *, n: str, fail_in: int) -> subprocess.CompletedProcess[str]:
    test = tmp_path / "test_subject.py"
    test.write_text(FLAKY.format(fail_in=fail_in))
    env = {
        **os.environ,
        "TEST": f"{test}::test_fails_in_run_two",
        "N": n,
        "LOAD": "0",
        "OUT": str(tmp_path / "out"),
        "VENV": str(Path(sys.executable).parent.parent),
    }
    return subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=240, check=False
    )


def test_a_test_failing_in_one_run_fails_the_whole_and_keeps_that_log(tmp_path: Path) -> None:
    done = flake(tmp_path, n="3", fail_in=2)
    assert done.returncode != 0, done.stdout
    assert "==> flake: 1 failed run(s) of 3" in done.stdout
    assert "run 2: FAILED" in done.stdout and "run 3: passed" in done.stdout
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["run-2.log"]


def test_a_stable_test_passes_every_run(tmp_path: Path) -> None:
    done = flake(tmp_path, n="2", fail_in=0)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "==> flake: 0 failed run(s) of 2" in done.stdout


@pytest.mark.parametrize("n", ["0", "x", "-3"])
def test_a_bad_count_is_refused_before_any_run(tmp_path: Path, n: str) -> None:
    done = flake(tmp_path, n=n, fail_in=0)
    assert done.returncode == 2
    assert f"N must be a positive count of runs, not '{n}'" in done.stderr
    assert not (tmp_path / "test_subject.count").exists()
