"""What each binary imports before its first API request, and a deterministic measure of it.

Each start path is Python source that a fresh interpreter runs from the checkout: exactly the
imports (and the tracing set-up) the binary's entry point performs before it talks to the API
server, and the API client's construction (`CLIENT`: what ``load_api_client`` builds, minus
reading credentials), since building a client can import more than importing its module does
(the official ``ApiClient`` loads every generated model and pydantic when constructed).
`hack/bench/import_time.py` times these paths side by side with a bare interpreter;
`test/unit/test_import_budget.py` holds them to a recorded budget with `measure`, which counts
what they load instead of timing it, so the check does not depend on how busy the machine is.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[2]

CLIENT: Final = (
    "import kubernetes.config.incluster_config\n"
    "from kubernetes.client.configuration import Configuration\n"
    "from pkg.kube.client import RestClient\n"
    "from pkg.kube.config import Connection\n"
    "RestClient(Connection(Configuration()))\n"
)
# What ``compute-domain-daemon run`` imports before its first API request (the pod label,
# `pkg.daemon.podlabel`, sent on its own thread while the rest of DAEMON loads).
DAEMON_FIRST_REQUEST: Final = (
    "from pkg.daemon import logs\n"
    "from pkg.daemon.options import parse\n"
    "from pkg.base.clock import RealClock\n"
    "from pkg.daemon.podlabel import PodLabeller\n"
    "from pkg.kube.client import RestClient\n"
    "from pkg.kube.config import load_api_client\n"
    "from pkg.runtime.buildinfo import load_build_info\n"
    "from pkg.runtime.startupconfig import startup_config\n" + CLIENT
)
DAEMON: Final = (
    "from pkg.daemon.daemon import Daemon\n"
    "from pkg.daemon.metrics import DaemonMetrics\n"
    "from pkg.imex.supervisor import SubprocessRunner\n"
    "from pkg.kube.client import RestClient\n"
    "from pkg.kube.config import load_api_client\n"
    "from pkg.kube.events import EventRecorder\n"
    "from pkg.runtime.tracing import setup_tracing\n"
    "setup_tracing('compute-domain-daemon', env={})\n" + CLIENT
)
_PLUGIN_MAIN: Final = (
    REPO / "cmd" / "compute-domain-kubelet-plugin" / "compute_domain_kubelet_plugin.py"
)
PLUGIN: Final = (
    "import importlib.util\n"
    f"spec = importlib.util.spec_from_file_location('plugin_main', {str(_PLUGIN_MAIN)!r})\n"
    "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n" + CLIENT
)
CONTROLLER: Final = "from pkg.reconcilers.app import run\n" + CLIENT
BARE: Final = "pass\n"

_MEASURE: Final = """
import json, os, sys
before = set(sys.modules)
exec(compile(CODE, "<start path>", "exec"))
loaded = sorted(m for m in sys.modules if m not in before)
size = 0
for name in loaded:
    path = getattr(sys.modules[name], "__file__", None) or ""
    if path and os.path.isfile(path):
        size += os.path.getsize(path)
print(json.dumps({"modules": loaded, "bytes": size}))
"""


@dataclass(frozen=True)
class ImportCost:
    """What one start path loaded beyond the bare interpreter."""

    modules: tuple[str, ...]
    source_bytes: int

    def packages(self) -> dict[str, int]:
        """Loaded module count per top-level package, largest first."""
        counts: dict[str, int] = {}
        for name in self.modules:
            top = name.split(".", 1)[0]
            counts[top] = counts.get(top, 0) + 1
        return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def measure(code: str, *, python: str = sys.executable, timeout: float = 120.0) -> ImportCost:
    """Run ``code`` in a fresh interpreter from the checkout and report the modules it loaded
    (beyond those the interpreter had at start) and the size of their files on disk.

    Raises ``RuntimeError`` with the child's stderr if the start path fails to import.
    """
    script = f"CODE = {code!r}\n{_MEASURE}"
    done = subprocess.run(
        [python, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"start path failed to import:\n{done.stderr}")
    data = json.loads(done.stdout.strip().splitlines()[-1])
    return ImportCost(modules=tuple(data["modules"]), source_bytes=int(data["bytes"]))
