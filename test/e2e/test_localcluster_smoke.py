"""The local control plane's self-check (``hack/localcluster/smoke.py``) on a cluster of its own.

The smoke creates fake Nodes, a hand-made ResourceSlice and a DaemonSet, and asserts that
stopping its cluster leaves no process behind, so it gets a fresh ``Cluster`` (about 5 s to
start and stop) rather than the session's, whose scheduler would otherwise see its nodes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from localcluster import bin_dir
from localcluster.smoke import smoke

pytestmark = pytest.mark.e2e

REQUIRED = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")


def test_localcluster_smoke() -> None:
    if os.environ.get("SKIP_E2E") == "1":
        pytest.skip("SKIP_E2E=1")
    bins = bin_dir()
    missing = [b for b in REQUIRED if not (bins / b).is_file()]
    if missing:
        pytest.fail(
            f"control-plane binaries missing in {bins}: {', '.join(missing)}; "
            "build them with `hack/build-control-plane.sh`",
            pytrace=False,
        )
    workdir = Path(tempfile.mkdtemp(prefix="cdsmoke-", dir="/tmp"))
    try:
        stray = smoke(bins, workdir)
    finally:
        if os.environ.get("E2E_KEEP") != "1":
            shutil.rmtree(workdir, ignore_errors=True)
    assert stray == [], f"processes left after Cluster.stop: {stray}"
