"""The driver's three binaries started for real, with flags and an environment that get them past
parsing and no further: no cluster is reachable from ``/`` with a scrubbed environment.

The runtime tests read what each writes at start (its log lines, its configuration dump).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

BINARIES = {
    "compute-domain-controller": ["--image-name=img", "--kubeconfig=/nonexistent"],
    "compute-domain-kubelet-plugin": [
        "--node-name=n",
        "--device-discovery=fake",
        "--kubeconfig=/nonexistent",
    ],
    "compute-domain-daemon": ["run"],
}
DAEMON_ENV = {
    "NODE_NAME": "n",
    "POD_NAMESPACE": "drv",
    "COMPUTE_DOMAIN_UUID": "u",
    "COMPUTE_DOMAIN_NAME": "cd",
    "COMPUTE_DOMAIN_NAMESPACE": "ns",
    "KUBECONFIG": "/nonexistent",
}


def start_binary(binary: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """The real entry point with a scrubbed environment, run from ``/`` (no cluster reachable)."""
    script = REPO / "cmd" / binary / f"{binary.replace('-', '_')}.py"
    env = DAEMON_ENV if binary == "compute-domain-daemon" else {}
    return subprocess.run(
        [sys.executable, str(script), *extra, *BINARIES[binary]],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
