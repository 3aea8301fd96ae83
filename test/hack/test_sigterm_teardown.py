"""``localcluster.processes.teardown_on_sigterm``: a SIGTERMed pytest still runs its teardown.

The e2e lanes start clusters, nodes and driver processes in their own sessions; without the
handler a SIGTERM (CI timeout, ``kill``) ends pytest at once and they outlive it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pkg.testing.eventually import eventually

REPO = Path(__file__).resolve().parents[2]

CONFTEST = """
from localcluster.processes import teardown_on_sigterm


def pytest_configure(config):
    if {install}:
        teardown_on_sigterm()
"""

TEST = """
import pathlib
import time

import pytest

OUT = pathlib.Path({out!r})


@pytest.fixture(scope="session")
def cluster():
    (OUT / "setup").touch()
    yield
    (OUT / "teardown").touch()


def test_long(cluster):
    time.sleep(60)
"""


@pytest.mark.parametrize("install", [True, False], ids=["handler", "without"])
def test_sigterm_runs_session_teardown(tmp_path: Path, install: bool) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(CONFTEST.format(install=install))
    (suite / "test_long.py").write_text(TEST.format(out=str(tmp_path)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "hack")])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        eventually((tmp_path / "setup").exists, 30, what="the session fixture ran")
        time.sleep(0.2)  # inside the test's sleep
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (tmp_path / "teardown").exists() is install
