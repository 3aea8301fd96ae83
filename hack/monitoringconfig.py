"""The optional monitoring component (``config/components/monitoring``) as data for tests.

Owns reading the component's PrometheusRule, dashboard and PodMonitors and naming the metrics a
PromQL expression uses, so the unit test (metrics the binaries register) and the real-node
test (metrics live pods serve, scraped the way the PodMonitors say) check the same set.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
MONITORING = REPO / "config" / "components" / "monitoring"

FUNCTIONS_AND_KEYWORDS = {
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "rate",
    "irate",
    "increase",
    "histogram_quantile",
    "clamp_min",
    "clamp_max",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "topk",
    "bottomk",
    "abs",
    "delta",
    "le",
}


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
    """The YAML documents of one file of the component."""
    return [d for d in yaml.safe_load_all((MONITORING / name).read_text()) if d]


def rule_groups() -> list[Any]:
    """The rule groups of the component's PrometheusRule (``spec.groups``): what a plain
    Prometheus rules file (``promtool check rules``) holds under ``groups:``."""
    (rule,) = documents("prometheusrule.yaml")
    groups: list[Any] = rule["spec"]["groups"]
    return groups


def alert_rules() -> dict[str, Any]:
    """Every alerting rule of the PrometheusRule by its ``alert`` name."""
    return {r["alert"]: r for g in rule_groups() for r in g["rules"] if "alert" in r}


def rule_exprs() -> list[str]:
    """Every alert expression of the component's PrometheusRule."""
    return [r["expr"] for g in rule_groups() for r in g["rules"]]


def dashboard() -> Any:
    """The Grafana dashboard JSON carried by the component's ConfigMap."""
    (cm,) = documents("dashboard.yaml")
    return json.loads(cm["data"]["compute-domain-driver.json"])


def dashboard_exprs() -> list[str]:
    """Every query of every dashboard panel."""
    return [t["expr"] for p in dashboard()["panels"] for t in p["targets"]]


def expression_metrics() -> set[str]:
    """Every metric name used by an alert or a dashboard panel."""
    return {n for e in rule_exprs() + dashboard_exprs() for n in metric_names(e)}


def pod_monitors() -> list[Any]:
    """The component's PodMonitor objects."""
    return [d for d in documents("podmonitors.yaml") if d.get("kind") == "PodMonitor"]


def label_selector(selector: dict[str, Any]) -> str:
    """A PodMonitor's ``selector`` as a kubectl ``-l`` string (matchLabels + matchExpressions
    with In / NotIn / Exists / DoesNotExist)."""
    terms = [f"{k}={v}" for k, v in sorted(selector.get("matchLabels", {}).items())]
    for e in selector.get("matchExpressions", []):
        op, key, values = e["operator"], e["key"], ",".join(e.get("values", []))
        if op == "Exists":
            terms.append(key)
        elif op == "DoesNotExist":
            terms.append(f"!{key}")
        elif op in ("In", "NotIn"):
            terms.append(f"{key} {op.lower()} ({values})")
        else:
            raise ValueError(f"unknown selector operator {op!r}")
    return ",".join(terms)
