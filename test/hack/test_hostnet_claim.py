"""``localcluster.hostnet.claim_host``: one process at a time runs real nodes on a host.

``hostnet.sweep`` removes every real node on the machine, so a second real-node run (a second
``make test``, a demo, a hand-run lane) must fail instead of sweeping the first one's nodes.
Each claimant here is its own process, with its own state directory (``CD_E2E_CACHE``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CLAIM = """
import sys, time
from localcluster import hostnet
from localcluster.processes import ClusterError
try:
    hostnet.claim_host()
    hostnet.claim_host()  # idempotent within the process
except ClusterError as e:
    print("refused:", e, flush=True)
    sys.exit(3)
print("claimed", flush=True)
time.sleep(float(sys.argv[1]))
"""


def _claimant(tmp: Path, hold: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CLAIM, str(hold)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "CD_E2E_CACHE": str(tmp)},
    )


def test_second_claimant_is_refused_until_the_first_exits(tmp_path: Path) -> None:
    first = _claimant(tmp_path, 60)
    try:
        assert first.stdout is not None
        assert first.stdout.readline().strip() == "claimed"
        second = _claimant(tmp_path, 0)
        out, _ = second.communicate(timeout=30)
        assert second.returncode == 3, out
        assert f"another real-node run (pid {first.pid})" in out
    finally:
        first.kill()  # an interrupted run: the kernel drops its lock
        first.wait(10)
    third = _claimant(tmp_path, 0)
    out, _ = third.communicate(timeout=30)
    assert third.returncode == 0 and out.strip() == "claimed", out
