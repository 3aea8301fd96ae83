"""The ``resource.k8s.io`` admission policies evaluated, in every version the driver runs on.

Three ValidatingAdmissionPolicies of ``config/admission`` check ResourceClaims and
ResourceClaimTemplates: ``compute-domain-daemon-device-claims``,
``compute-domain-opaque-configs`` and ``compute-domain-controller-claim-templates``. Their CEL
runs here on Google's CEL runtime (``cel-expr-python``: cel-cpp, with the optional-types
extension the API server enables, and the strings extension for ``substring``), the way the API
server applies a policy: match the request against ``matchConstraints`` (exactly, then with
matchPolicy Equivalent against the versions the server *serves*), ``matchConditions``, the
binding's ``namespaceSelector``, the ``variables`` in order, then each validation.

Each case is sent as Kubernetes 1.34+ (v1), 1.33 (v1beta2) and 1.32 (v1beta1) would receive it:
a v1-shaped object converted by ``pkg.kube.resourceconvert.to_served`` (v1beta1: the ``exactly``
fields flat), through a server serving only what that release serves. The objects the
controller itself writes pass in every version; the refusals are the same in every version.
Not modelled: authentication, the API server's own validation and field dropping (1.32
drops ``adminAccess`` without the DRAAdminAccess gate), and its type check of the policies
(warnings only; the ``dyn()`` in the policies keeps it quiet).
``test/e2e/test_adversarial_tenant.py`` and ``test/e2e/test_deploy_config.py`` send the same
kinds of requests to a real API server.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
from cel_expr_python import cel
from cel_expr_python.ext import ext_optional, ext_strings
from testsupport.manifests import NS, find, render

from pkg.api import constants as c
from pkg.api.computedomain import parse_compute_domain
from pkg.kube.resourceconvert import to_served
from pkg.reconcilers.flags import parse_options
from pkg.reconcilers.objects import render_daemon_rct, render_workload_rct

Obj = dict[str, Any]

DAEMON_POLICY = "compute-domain-daemon-device-claims"
OPAQUE_POLICY = "compute-domain-opaque-configs"
TEMPLATE_POLICY = "compute-domain-controller-claim-templates"
CONTROLLER = f"system:serviceaccount:{NS}:compute-domain-controller"
TENANT = "system:serviceaccount:team:alice"
UID = "0f0e0d0c-0b0a-4908-8706-050403020100"

# What each Kubernetes release serves of resource.k8s.io, newest first (the order the API
# server lists equivalents in does not matter here: the policies list all three).
SERVED = {
    "1.34+": ("v1", "v1beta2", "v1beta1"),
    "1.33": ("v1beta2", "v1beta1"),
    "1.32": ("v1beta1",),
}
# The version each release's clients (the driver's, kubectl's) send.
SENT = {"1.34+": "v1", "1.33": "v1beta2", "1.32": "v1beta1"}
KINDS = {"resourceclaims": "ResourceClaim", "resourceclaimtemplates": "ResourceClaimTemplate"}


@functools.cache
def _env() -> cel.Env:
    names = ("object", "oldObject", "request", "params", "variables")
    return cel.NewEnv(
        variables=dict.fromkeys(names, cel.Type.DYN),
        extensions=[ext_optional.ExtOptional(), ext_strings.ExtStrings()],
    )


@functools.cache
def _compiled(expression: str) -> cel.Expression:
    return _env().compile(expression)


def _eval(expression: str, data: Obj) -> Any:
    return _compiled(expression).eval(data=data).plain_value()


def _policy(name: str) -> tuple[Obj, Obj]:
    objs = render("default")
    policy = find(objs, "ValidatingAdmissionPolicy", name)["spec"]
    binding = find(objs, "ValidatingAdmissionPolicyBinding", name)["spec"]
    return policy, binding


def _rule_matches(rule: Obj, version: str, resource: str, operation: str) -> bool:
    def has(key: str, value: str) -> bool:
        return "*" in rule[key] or value in rule[key]

    return (
        has("apiGroups", "resource.k8s.io")
        and has("apiVersions", version)
        and has("resources", resource)
        and has("operations", operation)
    )


def _matched_version(
    policy: Obj, served: tuple[str, ...], sent: str, resource: str, operation: str
) -> str | None:
    """The version the API server hands the policy the object in, or None (no match):
    the request's own if a rule lists it, else (Equivalent) a served version a rule lists."""
    constraints = policy["matchConstraints"]
    rules = constraints["resourceRules"]
    if any(_rule_matches(r, sent, resource, operation) for r in rules):
        return sent
    if constraints.get("matchPolicy", "Equivalent") != "Equivalent":
        return None
    for rule in rules:
        for version in served:
            if _rule_matches(rule, version, resource, operation):
                return version
    return None


def _selected(binding: Obj, namespace: str) -> bool:
    selector = (binding.get("matchResources") or {}).get("namespaceSelector") or {}
    labels = {"kubernetes.io/metadata.name": namespace}
    for e in selector.get("matchExpressions", []):
        value = labels.get(e["key"])
        if e["operator"] == "NotIn" and value in e["values"]:
            return False
        if e["operator"] == "In" and value not in e["values"]:
            return False
        assert e["operator"] in ("In", "NotIn"), e
    return True


def admit(
    name: str, release: str, obj_v1: Obj, *, user: str = TENANT, operation: str = "CREATE"
) -> list[str] | None:
    """None if the policy does not apply to the request, else the messages of the validations
    that refuse it ([] = admitted). ``obj_v1`` is v1-shaped; it is sent as ``release``'s
    clients send it."""
    policy, binding = _policy(name)
    resource = {v: k for k, v in KINDS.items()}[obj_v1["kind"]]
    sent = SENT[release]
    version = _matched_version(policy, SERVED[release], sent, resource, operation)
    namespace = obj_v1["metadata"]["namespace"]
    if version is None or not _selected(binding, namespace):
        return None
    obj = to_served(obj_v1["kind"], obj_v1, version)
    data: Obj = {
        "object": obj,
        "oldObject": obj if operation == "UPDATE" else None,
        "params": None,
        "request": {
            "operation": operation,
            "namespace": namespace,
            "name": obj["metadata"]["name"],
            "resource": {"group": "resource.k8s.io", "version": version, "resource": resource},
            "userInfo": {"username": user, "groups": ["system:authenticated"]},
        },
        "variables": {},
    }
    if not all(_eval(m["expression"], data) for m in policy.get("matchConditions", [])):
        return None
    variables: Obj = {}
    for v in policy.get("variables", []):
        data["variables"] = dict(variables)
        variables[v["name"]] = _eval(v["expression"], data)
    data["variables"] = variables
    refused = []
    for v in policy["validations"]:
        if not _eval(v["expression"], data):
            message = _eval(v["messageExpression"], data) if "messageExpression" in v else None
            refused.append(" ".join((message or v["message"]).split()))
    return refused


def _claim(devices: Obj, ns: str = "team") -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": ns},
        "spec": {"devices": devices},
    }


def _template(devices: Obj, ns: str = "team") -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": ns},
        "spec": {"spec": {"devices": devices}},
    }


def _exactly(cls: str, **fields: Any) -> Obj:
    return {"requests": [{"name": "r", "exactly": {"deviceClassName": cls, **fields}}]}


def _first_available(*classes: str) -> Obj:
    subs = [{"name": f"s{i}", "deviceClassName": cls} for i, cls in enumerate(classes)]
    return {"requests": [{"name": "r", "firstAvailable": subs}]}


def _config(kind: str, domain_id: str, driver: str = c.DRIVER_NAME) -> Obj:
    params = {"apiVersion": c.API_VERSION, "kind": kind, "domainID": domain_id}
    return {"requests": [], "opaque": {"driver": driver, "parameters": params}}


def _channel(domain_id: str = UID, **fields: Any) -> Obj:
    return {
        **_exactly(c.CHANNEL_DEVICE_CLASS, **fields),
        "config": [_config(c.CHANNEL_CONFIG_KIND, domain_id)],
    }


RELEASES = list(SERVED)
BOTH = [_claim, _template]

DAEMON_RULE = "the DeviceClass compute-domain-daemon.nvidia.com is reserved for the driver's"
DAEMON_CONFIG_RULE = "a ComputeDomainDaemonConfig is reserved for the driver's IMEX daemons"


def test_a_v1_only_rule_never_matched_where_v1_is_not_served() -> None:
    """Why the rules list three versions: Equivalent converts only to a served version."""
    policy, _ = _policy(DAEMON_POLICY)
    v1_only = {
        **policy,
        "matchConstraints": {
            **policy["matchConstraints"],
            "resourceRules": [
                {**policy["matchConstraints"]["resourceRules"][0], "apiVersions": ["v1"]}
            ],
        },
    }
    for release in RELEASES:
        version = _matched_version(
            v1_only, SERVED[release], SENT[release], "resourceclaims", "CREATE"
        )
        assert version == ("v1" if release == "1.34+" else None), release
    # On 1.34+ an older client's request is converted to v1; the policies now see it as sent.
    assert _matched_version(v1_only, SERVED["1.34+"], "v1beta1", "resourceclaims", "CREATE") == "v1"


@pytest.mark.parametrize("name", [DAEMON_POLICY, OPAQUE_POLICY, TEMPLATE_POLICY])
def test_rules_list_every_version_the_driver_runs_on(name: str) -> None:
    policy, _ = _policy(name)
    assert policy["matchConstraints"]["matchPolicy"] == "Equivalent"
    for rule in policy["matchConstraints"]["resourceRules"]:
        assert rule["apiVersions"] == ["v1", "v1beta2", "v1beta1"], rule
    for release in RELEASES:
        for resource in ("resourceclaims", "resourceclaimtemplates"):
            templates_only = name == TEMPLATE_POLICY and resource == "resourceclaims"
            want = None if templates_only else SENT[release]
            for operation in ("CREATE", "UPDATE"):
                # The daemon-device policy matches CREATE only (a claim's spec is immutable).
                create_only = name == DAEMON_POLICY and operation == "UPDATE"
                got = _matched_version(policy, SERVED[release], SENT[release], resource, operation)
                assert got == (None if create_only else want), (release, resource, operation)


@pytest.mark.parametrize("release", RELEASES)
def test_a_daemon_template_elsewhere_can_lose_its_finalizer(release: str) -> None:
    """Upstream's daemon claim template, left in its namespace by `helm uninstall`: our
    controller removes its finalizer (an UPDATE) so that its ComputeDomain can go. The policy
    refuses creating such a template there, never updating one (seen on real nodes: matching
    UPDATE kept the ComputeDomain Terminating forever)."""
    upstream = _template(_exactly(c.DAEMON_DEVICE_CLASS), ns="nvidia-dra-driver-gpu")
    assert admit(DAEMON_POLICY, release, upstream, user=CONTROLLER, operation="UPDATE") is None
    assert admit(DAEMON_POLICY, release, upstream, user=CONTROLLER)  # CREATE: refused


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("make", BOTH, ids=["claim", "template"])
def test_daemon_device_refused_outside_the_driver_namespace(release: str, make: Any) -> None:
    daemon_config = [_config(c.DAEMON_CONFIG_KIND, UID)]
    foreign_config = [_config(c.DAEMON_CONFIG_KIND, UID, driver="x.example.com")]
    cases = {
        "exactly": (_exactly(c.DAEMON_DEVICE_CLASS), [DAEMON_RULE]),
        "firstAvailable": (
            _first_available(c.CHANNEL_DEVICE_CLASS, c.DAEMON_DEVICE_CLASS),
            [DAEMON_RULE],
        ),
        "daemon config": ({**_channel(), "config": daemon_config}, [DAEMON_CONFIG_RULE]),
        "both": (
            {**_exactly(c.DAEMON_DEVICE_CLASS), "config": daemon_config},
            [DAEMON_RULE, DAEMON_CONFIG_RULE],
        ),
        "channel": (_channel(), []),
        "channel firstAvailable": (
            _first_available("gpu.example.com", c.CHANNEL_DEVICE_CLASS),
            [],
        ),
        "other driver's daemon-like config": ({**_channel(), "config": foreign_config}, []),
        "no devices": ({}, []),
    }
    for case, (devices, want) in cases.items():
        refused = admit(DAEMON_POLICY, release, make(devices))
        assert refused is not None and len(refused) == len(want), (case, refused)
        assert all(m.startswith(w) for m, w in zip(refused, want, strict=True)), (case, refused)
        # The driver namespace is not bound: the controller's daemon templates live there.
        assert admit(DAEMON_POLICY, release, make(devices, ns=NS)) is None, case


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("make", BOTH, ids=["claim", "template"])
def test_opaque_config_domain_id_must_be_a_uid(release: str, make: Any) -> None:
    assert admit(OPAQUE_POLICY, release, make(_channel())) == []
    for bad in ("/var/run/cdi", "../x", UID.upper(), "x" * 100):
        [message] = admit(OPAQUE_POLICY, release, make(_channel(bad))) or [""]
        assert message.startswith(
            "devices.config[].opaque.parameters.domainID must be the UID of a ComputeDomain"
        ), (bad, message)
        assert f"not '{bad[:64]}'" in message, message
        # Every namespace, the driver's too.
        assert admit(OPAQUE_POLICY, release, make(_channel(bad), ns=NS)), bad
    other = {**_channel(), "config": [_config(c.CHANNEL_CONFIG_KIND, "../x", "x.example.com")]}
    assert admit(OPAQUE_POLICY, release, make(other)) == []


def _controller_templates() -> list[Obj]:
    env = {"NAMESPACE": NS, "IMAGE_NAME": "example.com/compute-domain-daemon:1"}
    config = parse_options([], env).controller
    cd = parse_compute_domain(
        {
            "apiVersion": c.API_VERSION,
            "kind": c.COMPUTE_DOMAIN_KIND,
            "metadata": {"name": "x", "namespace": "team", "uid": UID},
            "spec": {"channel": {"resourceClaimTemplate": {"name": "x-channel"}}},
        }
    )
    return [render_workload_rct(cd), render_daemon_rct(cd, config)]


@pytest.mark.parametrize("release", RELEASES)
def test_what_the_controller_writes_passes_in_every_version(release: str) -> None:
    for template in _controller_templates():
        assert admit(TEMPLATE_POLICY, release, template, user=CONTROLLER) == [], template
        for operation in ("CREATE", "UPDATE"):
            assert (
                admit(TEMPLATE_POLICY, release, template, user=CONTROLLER, operation=operation)
                == []
            )
        assert admit(OPAQUE_POLICY, release, template, user=CONTROLLER) == []
        ns = template["metadata"]["namespace"]
        assert admit(DAEMON_POLICY, release, template, user=CONTROLLER) == (
            None if ns == NS else []
        )


@pytest.mark.parametrize("release", RELEASES)
def test_controller_templates_are_pinned_in_every_version(release: str) -> None:
    rule = "the controller's ResourceClaimTemplates may request only the DeviceClasses"
    config_rule = "the controller's ResourceClaimTemplates may carry only opaque configs of"
    cases = {
        "other class": (_exactly("gpu.example.com"), [rule]),
        "adminAccess": (_channel(adminAccess=True), [rule]),
        "adminAccess false": (_channel(adminAccess=False), []),
        "firstAvailable": (_first_available(c.CHANNEL_DEVICE_CLASS), [rule]),
        "other driver's config": (
            {**_channel(), "config": [_config(c.CHANNEL_CONFIG_KIND, UID, "x.example.com")]},
            [config_rule],
        ),
        "daemon class": (_exactly(c.DAEMON_DEVICE_CLASS), []),
        "channel": (_channel(), []),
    }
    for case, (devices, want) in cases.items():
        refused = admit(TEMPLATE_POLICY, release, _template(devices), user=CONTROLLER)
        assert refused is not None and len(refused) == len(want), (case, refused)
        assert all(m.startswith(w) for m, w in zip(refused, want, strict=True)), (case, refused)
        # Only the controller is pinned by this policy.
        assert admit(TEMPLATE_POLICY, release, _template(devices)) is None, case


@pytest.mark.parametrize(
    ("sysctls", "admitted"),
    [
        (None, True),
        ([{"name": "net.ipv4.ip_local_reserved_ports", "value": "50000,50005"}], True),
        ([{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}], False),
        (
            [
                {"name": "net.ipv4.ip_local_reserved_ports", "value": "50000,50005"},
                {"name": "kernel.shm_rmid_forced", "value": "1"},
            ],
            False,
        ),
    ],
    ids=["none", "reserved-ports", "another-safe-sysctl", "one-more"],
)
def test_the_controllers_daemonsets_may_set_only_the_reserved_ports_sysctl(
    sysctls: list[Obj] | None, admitted: bool
) -> None:
    policy, _binding = _policy("compute-domain-controller-daemonsets")
    [rule] = [v for v in policy["validations"] if "sysctls" in v["expression"]]
    pod: Obj = {"containers": []}
    if sysctls is not None:
        pod["securityContext"] = {"sysctls": sysctls}
    data = {"variables": {"podsUnchanged": False, "pod": pod}}
    assert _eval(rule["expression"], data) is admitted
