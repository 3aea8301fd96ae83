"""The ``kubectl-computedomain`` wheel installs and runs without the driver's heavy stacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from testsupport.cliseed import NS, seed_domain

from pkg.testing.fakeapiserver import FakeApiServer

REPO = Path(__file__).resolve().parents[3]
HEAVY = ("grpc", "google.protobuf", "pynvml", "prometheus_client", "opentelemetry", "cachetools")

# Run the installed CLI with the driver's stacks made unimportable and the checkout out of
# reach: only the wheel's files and the venv's third-party packages can be imported. The import
# path is the wheel's target (PYTHONPATH), the standard library and the venv's site-packages
# (`-P`: no working directory); the editable install's finder is dropped here.
RUNNER = """
import importlib.abc, sys
target, heavy, argv = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == h or name.startswith(h + ".") for h in heavy):
            raise ImportError(f"blocked for this test: {name}")
        return None

sys.meta_path = [Block()] + [f for f in sys.meta_path if "editable" not in type(f).__module__]
import pkg.cli.computedomain as cli
assert cli.__file__.startswith(target), cli.__file__
code = cli.main(argv)
loaded = sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in heavy))
sys.stderr.write("LOADED=" + ",".join(loaded) + "\\n")
sys.exit(code)
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    script = REPO / "hack" / "build-cli-dist.py"
    done = subprocess.run(
        [sys.executable, str(script), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


def test_wheel_holds_the_cli_and_requires_only_the_kubernetes_client(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry = zf.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    modules = {n for n in names if n.startswith("pkg/")}
    assert "pkg/cli/computedomain.py" in modules and "pkg/kube/client.py" in modules
    for heavy_pkg in ("pkg/kubeletplugin/", "pkg/draplugin/", "pkg/reconcilers/", "pkg/daemon/"):
        assert not any(n.startswith(heavy_pkg) for n in modules), heavy_pkg
    requires = sorted(
        line.split(": ", 1)[1] for line in meta.splitlines() if line.startswith("Requires-Dist: ")
    )
    assert [r.split("=")[0].split(">")[0] for r in requires] == ["kubernetes", "pyyaml"]
    assert "kubectl-computedomain = pkg.cli.computedomain:main" in entry


def test_installed_wheel_runs_without_grpc_nvml_metrics_or_tracing(
    wheel: Path, tmp_path: Path
) -> None:
    target = tmp_path / "site"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (target / "bin" / "kubectl-computedomain").exists()
    with FakeApiServer() as api:
        seed_domain(api)
        cfg = tmp_path / "kubeconfig"
        cfg.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "c",
                    "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
                    "users": [{"name": "u", "user": {}}],
                    "contexts": [{"name": "c", "context": {"cluster": "fake", "user": "u"}}],
                }
            )
        )
        run = subprocess.run(
            [
                sys.executable,
                "-P",
                "-c",
                RUNNER,
                str(target),
                ",".join(HEAVY),
                "--kubeconfig",
                str(cfg),
                "describe",
                "train",
                "-n",
                NS,
                "-o",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(target)},
        )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["computeDomain"]["metadata"]["name"] == "train"
    assert "LOADED=\n" in run.stderr
