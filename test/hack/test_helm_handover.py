"""hack/helm-handover.py's plan for handing a release back to kustomize: which release objects
are replaced by their kustomize rendering and which are deleted (never one kustomize renders)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "helm-handover.py"
NS = "nvidia-dra-driver"


@pytest.fixture(scope="module")
def handover() -> ModuleType:
    spec = importlib.util.spec_from_file_location("helm_handover", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def obj(api: str, kind: str, name: str, ns: str | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, **({"namespace": ns} if ns else {})}
    return {"apiVersion": api, "kind": kind, "metadata": meta, **extra}


def test_release_objects_are_replaced_by_their_kustomize_rendering(handover: ModuleType) -> None:
    chart_ds = obj("apps/v1", "DaemonSet", "plugin", NS, spec={"from": "chart"})
    ours_ds = obj("apps/v1", "DaemonSet", "plugin", NS, spec={"from": "kustomize"})
    chart_role = obj("rbac.authorization.k8s.io/v1", "ClusterRole", "ctrl", rules=["chart"])
    ours_role = obj("rbac.authorization.k8s.io/v1", "ClusterRole", "ctrl", rules=["ours"])
    chart_cm = obj("v1", "ConfigMap", "config-chartsuffix", NS)
    ours_only = obj("v1", "Namespace", NS)
    replace, delete = handover.plan_release(
        [chart_ds, chart_role, chart_cm], [ours_only, ours_role, ours_ds], NS
    )
    assert replace == [ours_ds, ours_role]
    assert delete == [chart_cm]


def test_a_namespaced_object_without_namespace_matches_the_release_namespace(
    handover: ModuleType,
) -> None:
    chart_sa = obj("v1", "ServiceAccount", "ctrl")  # the chart left the namespace to Helm
    ours_sa = obj("v1", "ServiceAccount", "ctrl", NS)
    replace, delete = handover.plan_release([chart_sa], [ours_sa], NS)
    assert (replace, delete) == ([ours_sa], [])
    # Another namespace's object of the same name is not the same object.
    other = obj("v1", "ServiceAccount", "ctrl", "elsewhere")
    replace, delete = handover.plan_release([other], [ours_sa], NS)
    assert (replace, delete) == ([], [other])


def test_group_and_kind_tell_objects_apart(handover: ModuleType) -> None:
    dc = obj("resource.k8s.io/v1", "DeviceClass", "x")
    vap = obj("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy", "x")
    replace, delete = handover.plan_release([dc], [vap], NS)
    assert (replace, delete) == ([], [dc])
