#!/usr/bin/env python3
"""Build the ``kubectl-computedomain`` wheel: the CLI alone, without the driver's stacks.

``pip install kubectl_computedomain-<version>-py3-none-any.whl`` puts ``kubectl-computedomain``
on ``PATH`` (kubectl then runs it as ``kubectl computedomain``) and pulls in only the Kubernetes
client and PyYAML: no gRPC, protobuf, NVML bindings, Prometheus client or OpenTelemetry, which
the driver distribution (``compute-domain-driver``) needs and a laptop does not.

The wheel holds exactly the ``pkg`` modules that ``pkg.cli.computedomain`` imports (found by
importing it in a child interpreter, so the list cannot drift from the code), each package's
``__init__.py``, and metadata generated here: the version and the ``kubernetes`` pin come from
the project's ``pyproject.toml``, the one place they are written. The build uses pip's
``setuptools`` backend without network access (``--no-build-isolation``).

Usage: ``hack/build-cli-dist.py [--out DIR]`` (default ``dist/``); prints the wheel's path.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DIST_NAME = "kubectl-computedomain"
ENTRY = "pkg.cli.computedomain"
# The CLI's own third-party imports (besides the Kubernetes client): -o yaml.
EXTRA_REQUIREMENTS = ("pyyaml>=6",)
# Imports the wheel must never carry (the driver's stacks); a module of ``pkg`` that pulls one
# in makes the build fail rather than ship a CLI that cannot start without them.
FORBIDDEN_TOP_LEVEL = (
    "grpc",
    "google.protobuf",
    "pynvml",
    "prometheus_client",
    "opentelemetry",
    "cachetools",
)

_PROBE = """
import json, sys
import {entry}
print(json.dumps(sorted(
    (name, getattr(mod, "__file__", None)) for name, mod in sys.modules.items()
    if name == "pkg" or name.startswith("pkg.")
)))
print(json.dumps(sorted(sys.modules)))
"""


class BuildError(RuntimeError):
    """The wheel cannot be built as specified (the message says why)."""


def cli_modules() -> list[tuple[str, Path]]:
    """``(module, source file)`` of every ``pkg`` module the CLI imports, by a child
    interpreter run from the checkout; raises `BuildError` when a forbidden stack is loaded."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(entry=ENTRY)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise BuildError(f"importing {ENTRY} failed:\n{done.stderr}")
    first, second = done.stdout.splitlines()[-2:]
    loaded = set(json.loads(second))
    heavy = [m for m in FORBIDDEN_TOP_LEVEL if m in loaded]
    if heavy:
        raise BuildError(f"{ENTRY} imports the driver's stacks: {', '.join(heavy)}")
    out = []
    for name, file in json.loads(first):
        if file is None:
            raise BuildError(f"{name} has no source file (namespace package?)")
        out.append((name, Path(file)))
    return out


def project_metadata() -> tuple[str, str]:
    """(version, the ``kubernetes`` requirement) from the project's pyproject.toml."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    kube = [d for d in project["dependencies"] if re.match(r"kubernetes\b", d)]
    if len(kube) != 1:
        raise BuildError("pyproject.toml must name the kubernetes client exactly once")
    return str(project["version"]), kube[0]


def _pyproject(version: str, requirements: list[str]) -> str:
    deps = ", ".join(json.dumps(r) for r in requirements)
    return f"""[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "{DIST_NAME}"
version = "{version}"
description = "kubectl computedomain: what a ComputeDomain is doing and why (CLI only)"
requires-python = ">=3.11"
license = "Apache-2.0"
dependencies = [{deps}]

[project.scripts]
kubectl-computedomain = "{ENTRY}:main"

[tool.setuptools]
include-package-data = false

[tool.setuptools.packages.find]
include = ["pkg*"]
"""


def stage(root: Path) -> None:
    """Write the distribution's source tree under ``root``."""
    version, kube = project_metadata()
    for name, source in cli_modules():
        rel = source.relative_to(REPO)
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        del name
    (root / "pyproject.toml").write_text(_pyproject(version, [kube, *EXTRA_REQUIREMENTS]))


def build(out: Path) -> Path:
    """Build the wheel into ``out``; returns its path. Raises `BuildError`."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cli-dist-") as tmp:
        src = Path(tmp) / "src"
        stage(src)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "--no-index",
                "--wheel-dir",
                str(out),
                str(src),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise BuildError(f"pip wheel failed:\n{done.stdout}\n{done.stderr}")
    version, _ = project_metadata()
    wheel = out / f"{DIST_NAME.replace('-', '_')}-{version}-py3-none-any.whl"
    if not wheel.is_file():
        raise BuildError(f"pip wheel did not produce {wheel.name}")
    return wheel


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "dist")
    args = parser.parse_args(argv)
    try:
        print(build(args.out))
    except BuildError as err:
        sys.stderr.write(f"build-cli-dist: {err}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
