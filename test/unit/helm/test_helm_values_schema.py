"""The chart refuses at render time what it would otherwise ignore or crash-loop on: keys it
does not have (in every subtree, upstream's webhook and GPU-container keys included), unknown
feature gates, and gate combinations the binaries refuse at start."""

from __future__ import annotations

import itertools
import json
import re

import pytest
from testsupport.helmchart import CHART, refusal, template_result

from pkg.featuregates import DEFAULTS, STAGES, UPSTREAM_ONLY, FeatureGateError, FeatureGates
from pkg.featuregates import known_gates as gate_names


@pytest.mark.parametrize(
    ("pair", "where", "key"),
    [
        ("webhook.nonexistent=1", "/webhook", "nonexistent"),
        ("webhook.tls.certManager.bogus=1", "/webhook/tls/certManager", "bogus"),
        ("global.x=1", "/global", "x"),
        ("featureGates.Bogus=true", "/featureGates", "Bogus"),
        ("kubeletPlugin.containers.gpus.bogus=1", "/kubeletPlugin/containers/gpus", "bogus"),
        ("kubeletPlugin.containers.init.bogus=1", "/kubeletPlugin/containers/init", "bogus"),
        ("controller.networkPolicy.bogus=1", "/controller/networkPolicy", "bogus"),
    ],
)
def test_an_unknown_key_is_refused_naming_it(pair: str, where: str, key: str) -> None:
    err = refusal(pair)
    assert f"at '{where}': additional properties '{key}' not allowed" in err, err


def test_a_feature_gate_value_must_be_a_boolean() -> None:
    err = refusal("featureGates.ComputeDomainCliques=maybe")
    assert "/featureGates/ComputeDomainCliques" in err, err


def test_upstreams_webhook_keys_are_accepted() -> None:
    """Every key of upstream's `webhook` values (its chart's defaults) renders."""
    sets = (
        "webhook.replicas=1",
        "webhook.servicePort=443",
        "webhook.containerPort=443",
        "webhook.priorityClassName=system-cluster-critical",
        "webhook.strategy.type=RollingUpdate",
        "webhook.strategy.rollingUpdate.maxUnavailable=100%",
        "webhook.containers.webhook.securityContext.privileged=false",
        "webhook.serviceAccount.create=true",
        "webhook.failurePolicy=Fail",
        "webhook.tls.mode=secret",
        "webhook.tls.certManager.issuerType=clusterissuer",
        "webhook.tls.secret.name=x",
        "webhook.tls.secret.caBundle=Y2E=",
    )
    res = template_result(*sets)
    assert res.rc == 0, res.err


def test_the_schema_names_exactly_the_gates_the_binaries_accept() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert sorted(schema["properties"]["featureGates"]["properties"]) == gate_names()


def test_the_templates_gate_table_is_pkg_featuregates() -> None:
    """The render-time check's defaults and stages are the binaries' (every non-switch gate)."""
    text = (CHART / "templates" / "_helpers.tpl").read_text()
    rows = re.findall(r'^\s+"(\w+)" \(list (true|false) "(Alpha|Beta)"\)$', text, flags=re.M)
    table = {name: (default == "true", stage) for name, default, stage in rows}
    ours = {name: (DEFAULTS[name], STAGES[name]) for name in DEFAULTS}
    assert table == {**ours, **UPSTREAM_ONLY}


def _binaries_refuse(spec: dict[str, bool]) -> bool:
    text = ",".join(f"{k}={str(v).lower()}" for k, v in spec.items())
    try:
        FeatureGates.parse(text).validate()
    except FeatureGateError:
        return True
    return False


# Every combination of the gates the dependency rules name, plus the stage switches.
_RULE_GATES = (
    "IMEXDaemonsWithDNSNames",
    "ComputeDomainCliques",
    "DynamicMIG",
    "PassthroughSupport",
)
SPECS = [
    {},
    {"AllAlpha": True},
    {"AllBeta": False},
    {"AllBeta": False, "ComputeDomainCliques": True},
    {"AllAlpha": True, "DynamicMIG": False},
    {"AllAlpha": True, "DynamicMIG": False, "NVMLDeviceHealthCheck": False},
    {"DeviceMetadata": True},
    {"DeviceMetadata": True, "PassthroughSupport": True},
    {"DynamicMIG": True, "MPSSupport": True},
    *(
        dict(zip(_RULE_GATES, values, strict=True))
        for values in itertools.product((True, False), repeat=len(_RULE_GATES))
        if values[0] is False or values[2] is True
    ),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_render_refuses_exactly_what_the_binaries_refuse(spec: dict[str, bool]) -> None:
    sets = [f"featureGates.{name}={str(on).lower()}" for name, on in spec.items()]
    res = template_result(*sets)
    if _binaries_refuse(spec):
        assert res.rc != 0 and "featureGates: " in res.err, res.err
    else:
        assert res.rc == 0, res.err
