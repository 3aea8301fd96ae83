"""config/components/monitoring: every PromQL expression names only metrics the binaries export."""

from __future__ import annotations

import re

import pytest
import yaml
from monitoringconfig import (
    MONITORING,
    REPO,
    alert_rules,
    dashboard,
    dashboard_exprs,
    documents,
    label_selector,
    metric_names,
    pod_monitors,
    rule_exprs,
)
from prometheus_client import CollectorRegistry

from pkg.base.clock import RealClock
from pkg.daemon.metrics import DaemonMetrics
from pkg.informers.metrics import QueueMetrics
from pkg.kubeletplugin.metrics import PluginMetrics
from pkg.reconcilers.metrics import DomainMetrics


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
    assert set(alert_rules()) == {
        "ComputeDomainNotReady",
        "ComputeDomainPrepareErrors",
        "ComputeDomainImexRestarts",
        "ComputeDomainCheckpointCorrupt",
    }
    assert dashboard()["panels"]
    # optional: the default installation does not pull it in
    default = (REPO / "config" / "default" / "kustomization.yaml").read_text()
    assert "monitoring" not in default


def test_every_pod_monitor_port_is_served() -> None:
    """Named ports exist in the shipped pod templates; the daemon port is the one the
    component's patch gives the daemons as METRICS_ADDRESS."""
    monitors = {m["metadata"]["name"]: m for m in pod_monitors()}
    assert set(monitors) == {
        "compute-domain-controller",
        "compute-domain-kubelet-plugin",
        "compute-domain-daemon",
    }
    templates = {
        "compute-domain-controller": REPO / "config" / "controller" / "deployment.yaml",
        "compute-domain-kubelet-plugin": REPO / "config" / "kubelet-plugin" / "daemonset.yaml",
    }
    for name, path in templates.items():
        (endpoint,) = monitors[name]["spec"]["podMetricsEndpoints"]
        obj = next(d for d in yaml.safe_load_all(path.read_text()) if d)
        ports = {
            p.get("name")
            for c in obj["spec"]["template"]["spec"]["containers"]
            for p in c.get("ports", [])
        }
        assert endpoint["port"] in ports, f"{name}: no container port {endpoint['port']!r}"
    (endpoint,) = monitors["compute-domain-daemon"]["spec"]["podMetricsEndpoints"]
    (patch,) = documents("daemon-metrics.yaml")
    (container,) = patch["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["CD_DAEMON_EXTRA_ENV"] == f"METRICS_ADDRESS=:{endpoint['portNumber']}"
    deployment = yaml.safe_load((templates["compute-domain-controller"]).read_text())
    (shipped,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["name"] == shipped["name"], "the patch must target the shipped container"


def test_daemon_monitor_selects_by_domain_label() -> None:
    daemon = next(m for m in pod_monitors() if m["metadata"]["name"] == "compute-domain-daemon")
    assert label_selector(daemon["spec"]["selector"]) == "resource.nvidia.com/computeDomain"
    assert (
        label_selector(
            {
                "matchLabels": {"a": "b"},
                "matchExpressions": [
                    {"key": "k", "operator": "In", "values": ["x", "y"]},
                    {"key": "m", "operator": "DoesNotExist"},
                ],
            }
        )
        == "a=b,k in (x,y),!m"
    )
    with pytest.raises(ValueError, match="Gt"):
        label_selector({"matchExpressions": [{"key": "k", "operator": "Gt"}]})


def test_alerted_series_exist_from_start_at_zero() -> None:
    """Every series an alert selects by label value exists, at 0, before anything happened: an
    alert on ``increase()``/``rate()`` needs the zero before the first event."""
    domains, plugin, daemon = CollectorRegistry(), CollectorRegistry(), CollectorRegistry()
    DomainMetrics(domains)
    PluginMetrics(registry=plugin, node_name="n")
    DaemonMetrics(daemon)
    driver = "compute-domain.nvidia.com"
    for registry, name, labels in [
        (domains, "nvidia_dra_compute_domain_info", {"status": "NotReady"}),
        (domains, "nvidia_dra_compute_domain_info", {"status": "Ready"}),
        (domains, "nvidia_dra_compute_domain_workload_waiting", {}),
        (plugin, "nvidia_dra_requests_total", {"driver": driver, "operation": "prepare"}),
        (
            plugin,
            "nvidia_dra_node_prepare_errors_total",
            {"driver": driver, "error_type": "retryable"},
        ),
        (
            plugin,
            "nvidia_dra_node_prepare_errors_total",
            {"driver": driver, "error_type": "permanent"},
        ),
        (plugin, "nvidia_dra_checkpoint_corruptions_total", {"driver": driver}),
        (daemon, "compute_domain_daemon_imex_restarts_total", {}),
    ]:
        assert registry.get_sample_value(name, labels) == 0, (name, labels)


# Labels Prometheus adds to every scraped series from the PodMonitor's target (not exported).
TARGET_LABELS = {"namespace", "pod", "container", "endpoint", "job", "instance", "service"}


def label_names() -> dict[str, set[str]]:
    """Every exported family's label names, by each sample name it produces."""
    registries = [CollectorRegistry() for _ in range(4)]
    DomainMetrics(registries[0])
    PluginMetrics(registry=registries[1], node_name="n")
    QueueMetrics("q", registries[2], RealClock())
    DaemonMetrics(registries[3])
    out: dict[str, set[str]] = {}
    for registry in registries:
        for collector, names in registry._collector_to_names.items():
            labels = set(getattr(collector, "_labelnames", ()))
            for name in names:
                out[name] = labels | ({"le"} if name.endswith("_bucket") else set())
    return out


def series_at_start() -> list[tuple[str, dict[str, str]]]:
    """Every (sample name, labels) the binaries export before anything happened."""
    registries = [CollectorRegistry() for _ in range(3)]
    DomainMetrics(registries[0])
    PluginMetrics(registry=registries[1], node_name="n")
    DaemonMetrics(registries[2])
    return [(s.name, dict(s.labels)) for r in registries for f in r.collect() for s in f.samples]


@pytest.mark.parametrize("expr", dashboard_exprs())
def test_every_panel_groups_by_labels_its_metric_has(expr: str) -> None:
    known = label_names()
    (metric,) = metric_names(expr)  # one metric per panel query
    for group in re.findall(r"\bby \(([^)]*)\)", expr):
        for label in (x.strip() for x in group.split(",")):
            assert label in known[metric] | TARGET_LABELS, f"{metric} has no label {label!r}"


@pytest.mark.parametrize("expr", rule_exprs() + dashboard_exprs())
def test_every_label_value_an_expression_selects_is_exported(expr: str) -> None:
    """A matcher ``metric{label="value"}`` selects a series the code creates (at 0 from the
    start); a value the code never uses (``operation="NodePrepareResources"``) is an empty
    expression and an alert that can never fire."""
    series = series_at_start()
    for metric, matchers in re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", expr):
        wanted = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"', matchers))
        assert any(
            name == metric and wanted.items() <= labels.items() for name, labels in series
        ), f"no series {metric}{wanted}"
