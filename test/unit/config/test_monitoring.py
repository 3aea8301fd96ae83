"""config/components/monitoring: every PromQL expression names only metrics the binaries export."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from pkg.base.clock import RealClock
from pkg.daemon.metrics import DaemonMetrics
from pkg.informers.metrics import QueueMetrics
from pkg.kubeletplugin.metrics import PluginMetrics
from pkg.reconcilers.metrics import DomainMetrics

REPO = Path(__file__).resolve().parents[3]
MONITORING = REPO / "config" / "components" / "monitoring"

FUNCTIONS_AND_KEYWORDS = {
    "sum", "min", "max", "avg", "count", "rate", "irate", "increase", "histogram_quantile",
    "clamp_min", "clamp_max", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "and", "or", "unless", "offset", "topk", "bottomk", "abs", "delta", "le",
}  # fmt: skip


def exported_metrics() -> set[str]:
    """Every sample name the four metric owners register (``_total``/``_bucket``/... included)."""
    registries = [CollectorRegistry() for _ in range(4)]
    DomainMetrics(registries[0])
    PluginMetrics(registry=registries[1], node_name="n")
    QueueMetrics("q", registries[2], RealClock())
    DaemonMetrics(registries[3])
    names: set[str] = set()
    for registry in registries:
        for family in registry.collect():
            names.add(family.name)
            names.update(s.name for s in family.samples)
            if family.type == "counter":
                names.add(family.name + "_total")
            if family.type == "histogram":
                names.update(family.name + s for s in ("_bucket", "_sum", "_count"))
    return names


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers outside strings, label matchers,
    ranges and grouping clauses that are not function names or keywords."""
    text = re.sub(r'"[^"]*"', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range durations, $__rate_interval
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    found = set(re.findall(r"(?<![\w$.])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", text))
    return {n for n in found if n not in FUNCTIONS_AND_KEYWORDS and not re.fullmatch(r"\d.*", n)}


def documents(name: str) -> list[Any]:
    return [d for d in yaml.safe_load_all((MONITORING / name).read_text()) if d]


def rule_exprs() -> list[str]:
    (rule,) = documents("prometheusrule.yaml")
    return [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]


def dashboard() -> Any:
    (cm,) = documents("dashboard.yaml")
    return json.loads(cm["data"]["compute-domain-driver.json"])


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p["targets"]]


def test_extractor() -> None:
    expr = (
        'sum by (error_type) (rate(foo_total{operation="x y"}[5m])) / ignoring (a) '
        "group_left clamp_min(sum(rate(bar_bucket[$__rate_interval])), 1e-9) > 0.1"
    )
    assert metric_names(expr) == {"foo_total", "bar_bucket"}
    assert not metric_names("up_not_ours") <= exported_metrics()


@pytest.mark.parametrize("expr", rule_exprs() + dashboard_exprs())
def test_every_expression_names_only_exported_metrics(expr: str) -> None:
    names = metric_names(expr)
    assert names, f"no metric in {expr!r}"
    assert names <= exported_metrics(), f"not exported: {names - exported_metrics()}"


def test_component_shape_and_alerts() -> None:
    kust = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    assert kust["kind"] == "Component"
    for resource in kust["resources"]:
        assert (MONITORING / resource).is_file()
    alerts = {r["alert"] for g in documents("prometheusrule.yaml")[0]["spec"]["groups"]
              for r in g["rules"]}  # fmt: skip
    assert {
        "ComputeDomainNotReady",
        "ComputeDomainPrepareErrors",
        "ComputeDomainImexRestarts",
    } <= alerts
    assert dashboard()["panels"]
    # optional: the default installation does not pull it in
    default = (REPO / "config" / "default" / "kustomization.yaml").read_text()
    assert "monitoring" not in default
