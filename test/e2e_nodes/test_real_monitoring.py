"""The optional monitoring component against the real thing.

The lane's overlay includes ``config/components/monitoring``, so ``deploy_driver`` has already
applied its PodMonitors, PrometheusRule and dashboard ConfigMap to a real API server that
validates them with the Prometheus Operator's own CRDs (``install_monitoring_crds``). Here a
domain forms on both nodes, and then every pod each PodMonitor selects is scraped the way
Prometheus would (its pod IP, the endpoint's named port or port number, its path), from inside
the pod's node. Every metric an alert or a dashboard panel uses must be served by one of those
pods: an expression naming a metric nobody serves, or a PodMonitor that selects no pod or the
wrong port, would be an alert that can never fire.
"""

from __future__ import annotations

from typing import Any

from localcluster.realnode import RealNodes
from monitoringconfig import expression_metrics, label_selector, pod_monitors
from prometheus_client.parser import text_string_to_metric_families
from testsupport.realsupport import (
    REAL_NODES,
    Kubectl,
    apply,
    channel_pod,
    domain,
    phase,
    ready_daemon,
    scrape,
    wait_for,
)


def _port(pod: dict[str, Any], endpoint: dict[str, Any]) -> int:
    """The port a PodMonitor endpoint scrapes on ``pod``: the named container port, else
    ``portNumber``."""
    if "port" in endpoint:
        ports = {
            p.get("name"): p["containerPort"]
            for c in pod["spec"]["containers"]
            for p in c.get("ports", [])
        }
        assert endpoint["port"] in ports, (
            f"pod {pod['metadata']['name']} has no container port named {endpoint['port']!r}"
        )
        return int(ports[endpoint["port"]])
    return int(endpoint["portNumber"])


def _samples(text: str) -> set[str]:
    """Family and sample names of a Prometheus text exposition."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(s.name for s in family.samples)
        if family.type == "counter":
            names.add(family.name + "_total")
        if family.type == "histogram":
            names.update(family.name + s for s in ("_bucket", "_sum", "_count"))
    return names


def test_every_alert_and_panel_metric_is_scraped_from_live_pods(
    kubectl: Kubectl, nodes: RealNodes, driver: str, ns: str
) -> None:
    installed = {
        (o["kind"], o["metadata"]["name"])
        for kind in ("podmonitors", "prometheusrules")
        for o in kubectl.items(kind, "-n", driver)
    }
    assert installed >= {("PodMonitor", m["metadata"]["name"]) for m in pod_monitors()}
    assert ("PrometheusRule", "compute-domain-driver") in installed

    apply(
        kubectl,
        domain(ns),
        *(channel_pod(ns, f"w{i}", node, "sleep 3600") for i, node in enumerate(REAL_NODES)),
    )
    uid = kubectl.json("-n", ns, "get", "computedomain/cd")["metadata"]["uid"]
    for i, node in enumerate(REAL_NODES):
        workload = f"w{i}"

        def running(workload: str = workload) -> bool:
            return phase(kubectl, ns, workload) == "Running"

        def daemon_ready(node: str = node) -> dict[str, Any] | None:
            return ready_daemon(kubectl, driver, uid, node)

        wait_for(f"workload {workload} to run", running, 180, 1)
        wait_for(f"the daemon on {node} Ready", daemon_ready, 60)

    served: set[str] = set()
    scraped: dict[str, int] = {}
    for monitor in pod_monitors():
        name = monitor["metadata"]["name"]
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        selector = label_selector(monitor["spec"]["selector"])
        pods = [
            p
            for p in kubectl.items("pods", "-n", driver, "-l", selector)
            if p["status"].get("podIP") and p["status"].get("phase") == "Running"
        ]
        assert pods, f"PodMonitor {name} ({selector}) selects no running pod"
        for pod in pods:
            text = scrape(nodes, pod, _port(pod, endpoint), endpoint.get("path", "/metrics"))
            served |= _samples(text)
        scraped[name] = len(pods)
    assert scraped["compute-domain-daemon"] == len(REAL_NODES), scraped
    assert scraped["compute-domain-kubelet-plugin"] == len(REAL_NODES), scraped
    missing = expression_metrics() - served
    assert not missing, f"alerts/panels use metrics no scraped pod serves: {sorted(missing)}"
