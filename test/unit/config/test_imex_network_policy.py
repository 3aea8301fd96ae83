"""config/components/imex-network-policy: only IMEX daemon pods reach the daemons' IMEX ports.

The policy is evaluated here the way a NetworkPolicy-enforcing CNI evaluates it (label selectors
against pod labels, port lists), against the pods the driver really runs: the daemon pod template
the controller renders (`pkg.reconcilers.objects.render_daemonset`) and the controller's and
kubelet plugin's pod templates of config/default. None of our test clusters runs a CNI that
enforces NetworkPolicy, so this offline evaluation is the check.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from pkg.api import constants as c
from pkg.api.computedomain import parse_compute_domain
from pkg.daemon import options
from pkg.imex.config import DEFAULT_CMD_PORT, DEFAULT_SERVER_PORT
from pkg.reconcilers.config import ControllerConfig
from pkg.reconcilers.objects import render_daemonset

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "config"
COMPONENT = CONFIG / "components" / "imex-network-policy"
KUBECTL = Path(sys.executable).parent / "kubectl"  # the venv running the tests
Obj = dict[str, Any]


def render(*, namespace: str | None = None, monitoring: bool = False) -> list[Obj]:
    """``config/default`` plus this component (and the monitoring one), as an overlay would."""
    if not KUBECTL.is_file():
        pytest.fail(f"{KUBECTL} not found: the manifest tests need kubectl in the venv")
    components = [COMPONENT] + ([CONFIG / "components" / "monitoring"] if monitoring else [])
    with tempfile.TemporaryDirectory(prefix="kustomize-") as scratch:
        kustomization: Obj = {
            "resources": [os.path.relpath(CONFIG / "default", scratch)],
            "components": [os.path.relpath(p, scratch) for p in components],
        }
        if namespace:
            kustomization["namespace"] = namespace
        (Path(scratch) / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        out = subprocess.run(
            [str(KUBECTL), "kustomize", scratch],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
    return [o for o in yaml.safe_load_all(out.stdout) if o]


def policy_of(objs: list[Obj]) -> Obj:
    (policy,) = [o for o in objs if o["kind"] == "NetworkPolicy"]
    return policy


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics (matchLabels AND every matchExpression)."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
            "In": labels.get(key) in values,
            "NotIn": key not in labels or labels[key] not in values,
        }[op]
        if not ok:
            return False
    return True


def daemon_pod_labels(uid: str, **extra: str) -> dict[str, str]:
    """The labels of a daemon pod: the controller's template, plus the clique label the daemon
    adds to its own pod."""
    cd = parse_compute_domain(
        {
            "metadata": {"namespace": "team", "name": "cd", "uid": uid, "generation": 1},
            "spec": {"channel": {"resourceClaimTemplate": {"name": "chan"}}},
        }
    )
    config = ControllerConfig(namespace=c.DEFAULT_DRIVER_NAMESPACE, image_name="img:1")
    config = replace(config, extra_daemon_labels=extra)
    labels = dict(render_daemonset(cd, config)["spec"]["template"]["metadata"]["labels"])
    return {**labels, f"{c.COMPUTE_DOMAIN_LABEL}.cliqueID": "clique.1"}


def driver_pod_labels(objs: list[Obj]) -> dict[str, dict[str, str]]:
    """Pod template labels of every other workload config/default runs in the namespace."""
    return {
        f"{o['kind']}/{o['metadata']['name']}": o["spec"]["template"]["metadata"].get("labels", {})
        for o in objs
        if o["kind"] in ("Deployment", "DaemonSet")
    }


def imex_rule(policy: Obj) -> Obj:
    rules: list[Obj] = [r for r in policy["spec"]["ingress"] if "from" in r]
    (rule,) = rules
    return rule


def test_policy_guards_every_daemon_pod_and_no_other_pod() -> None:
    objs = render()
    policy = policy_of(objs)
    assert policy["metadata"]["namespace"] == c.DEFAULT_DRIVER_NAMESPACE
    assert policy["metadata"]["labels"]["app.kubernetes.io/part-of"] == "compute-domain-driver"
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress stays open: the API server
    target = policy["spec"]["podSelector"]
    for uid in ("11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222"):
        assert selects(target, daemon_pod_labels(uid))
        assert selects(target, daemon_pod_labels(uid, team="a"))  # extra daemon labels
    others = driver_pod_labels(objs)
    assert {
        "Deployment/compute-domain-controller",
        "DaemonSet/compute-domain-kubelet-plugin",
    } <= set(others)
    for name, labels in others.items():
        assert not selects(target, labels), f"the policy would cut off {name}"


def test_imex_ports_admit_daemon_pods_only() -> None:
    policy = policy_of(render())
    rule = imex_rule(policy)
    assert {(p["protocol"], p["port"]) for p in rule["ports"]} == {
        ("TCP", DEFAULT_SERVER_PORT),
        ("TCP", DEFAULT_CMD_PORT),
    }
    # ... which are the ports the daemon configures nvidia-imex with by default.
    opts = options.parse(["run"], {})
    assert (opts.server_port, opts.cmd_port) == (DEFAULT_SERVER_PORT, DEFAULT_CMD_PORT)
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}  # the policy's own namespace: the driver's
    assert selects(peer["podSelector"], daemon_pod_labels("33333333-3333-3333-3333-333333333333"))
    for name, labels in driver_pod_labels(render()).items():
        assert not selects(peer["podSelector"], labels), f"{name} would reach IMEX"
    # A tenant's workload pod (another namespace, whatever its labels) matches no peer: a bare
    # podSelector only ever selects pods of the policy's namespace.
    assert "namespaceSelector" not in peer and "ipBlock" not in peer


def test_only_the_metrics_port_is_open_to_others() -> None:
    objs = render(monitoring=True)
    policy = policy_of(objs)
    open_rules = [r for r in policy["spec"]["ingress"] if "from" not in r]
    (metrics,) = open_rules
    (daemon_monitor,) = [
        o
        for o in objs
        if o["kind"] == "PodMonitor" and o["metadata"]["name"] == "compute-domain-daemon"
    ]
    (endpoint,) = daemon_monitor["spec"]["podMetricsEndpoints"]
    assert metrics["ports"] == [{"protocol": "TCP", "port": endpoint["portNumber"]}]
    assert imex_rule(policy)["ports"] != metrics["ports"]


def test_policy_follows_the_overlay_namespace() -> None:
    assert policy_of(render(namespace="gpu-system"))["metadata"]["namespace"] == "gpu-system"
