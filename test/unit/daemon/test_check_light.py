"""The daemon's ``check`` (its exec probe, run every second per node) stays light to import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
ENTRY = REPO / "cmd" / "compute-domain-daemon" / "compute_domain_daemon.py"
HEAVY = ("pkg.kube.client", "pkg.informers", "pkg.daemon.daemon", "opentelemetry", "kubernetes")


def test_check_path_does_not_import_the_api_client_informers_or_tracing() -> None:
    probe = (
        "import runpy, sys\n"
        f"runpy.run_path({str(ENTRY)!r})\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""
