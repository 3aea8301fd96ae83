"""Offline checks of the rendered kustomizations under ``config/``.

What operators apply must hold these invariants without a cluster: every kustomization renders;
namespaced objects land in the driver namespace and cluster-scoped ones carry none; every object
carries the part-of label; RBAC is exactly the reviewed table (no wildcard, no cluster-wide pod
writes for the daemon); the DeviceClass selectors are upstream's byte for byte; the workloads
have the probes, downward-API env, mounts and security settings the design needs.  The
real-apiserver counterpart is ``test/e2e/test_deploy_config.py``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from testsupport.manifests import (
    CONFIG,
    DEPLOYABLE,
    EXPECTED_RBAC,
    NS,
    REPO,
    Obj,
    Rule,
    find,
    kubectl,
    render,
    render_text,
)

from pkg.api import constants as c
from pkg.api.computedomain import parse_compute_domain
from pkg.api.opaque import is_uid
from pkg.kube.resources import COMPUTE_DOMAINS, RESOURCE_CLAIM_TEMPLATES, RESOURCE_CLAIMS
from pkg.kubeletplugin.driver import PluginConfig
from pkg.reconcilers.cliquelabel import MANAGED_ANNOTATION
from pkg.reconcilers.flags import parse_options
from pkg.reconcilers.objects import render_daemonset

# Every directory with a kustomization.yaml must render on its own.
KUSTOMIZATIONS = sorted(
    str(p.parent.relative_to(CONFIG)) for p in CONFIG.rglob("kustomization.yaml")
)


def containers(obj: Obj) -> Iterator[Obj]:
    spec = obj["spec"]["template"]["spec"]
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def env_of(container: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in container.get("env", [])}


PART_OF = ("app.kubernetes.io/part-of", "compute-domain-driver")
CLUSTER_SCOPED = {
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "DeviceClass",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
SERVICE_ACCOUNTS = (
    "compute-domain-controller",
    "compute-domain-kubelet-plugin",
    "compute-domain-daemon",
)

USER_ROLE_AGGREGATION = {
    "compute-domain-view": {"view", "edit", "admin"},
    "compute-domain-edit": {"edit", "admin"},
}


def test_user_roles_aggregate_into_the_default_roles() -> None:
    """Holders of view/edit/admin in a namespace get its ComputeDomains like its pods; the
    aggregated roles never reach the driver's own kinds or a domain's status writes."""
    roles = {o["metadata"]["name"]: o for o in render("default") if o["kind"] == "ClusterRole"}
    for name, targets in USER_ROLE_AGGREGATION.items():
        labels = roles[name]["metadata"]["labels"]
        got = {
            k.rsplit("aggregate-to-", 1)[1]
            for k, v in labels.items()
            if "aggregate-to-" in k and v == "true"
        }
        assert got == targets, name
        for rule in roles[name]["rules"]:
            assert rule["apiGroups"] == ["resource.nvidia.com"]
            assert not {"computedomaincliques"} & set(rule["resources"])
            if "computedomains/status" in rule["resources"]:
                assert set(rule["verbs"]) <= {"get", "list", "watch"}


CHANNEL_CEL = (
    "device.driver == 'compute-domain.nvidia.com' && "
    "device.attributes['compute-domain.nvidia.com'].type == 'channel' && "
    "device.attributes['compute-domain.nvidia.com'].id == 0"
)
DAEMON_CEL = (
    "device.driver == 'compute-domain.nvidia.com' && "
    "device.attributes['compute-domain.nvidia.com'].type == 'daemon'"
)


def _normalize(rules: list[Obj]) -> dict[Rule, set[str]]:
    out: dict[Rule, set[str]] = {}
    for r in rules:
        assert not r.get("nonResourceURLs"), r
        for g in r["apiGroups"]:
            for res in r["resources"]:
                key = (g, res, tuple(r.get("resourceNames", ())))
                out.setdefault(key, set()).update(r["verbs"])
    return out


@pytest.mark.parametrize("rel", KUSTOMIZATIONS)
def test_every_kustomization_renders(rel: str) -> None:
    assert render(rel), f"config/{rel} renders nothing"


def test_expected_kustomizations_exist() -> None:
    for rel in ("default", "overlays/kind-fake-gpu", "samples", "crd", "rbac", "admission"):
        assert rel in KUSTOMIZATIONS


@pytest.mark.parametrize("rel", DEPLOYABLE)
def test_namespace_and_labels(rel: str) -> None:
    for o in render(rel):
        meta, what = o["metadata"], f"{o['kind']}/{o['metadata']['name']}"
        if o["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in meta, f"cluster-scoped {what} has a namespace"
        else:
            assert meta.get("namespace") == NS, f"{what} not in {NS}"
        assert meta.get("labels", {}).get(PART_OF[0]) == PART_OF[1], f"{what} lacks {PART_OF}"
        for subject in o.get("subjects", []):
            assert subject == {"kind": "ServiceAccount", "name": subject["name"], "namespace": NS}


def test_namespace_object_is_the_driver_namespace() -> None:
    [ns] = [o for o in render("default") if o["kind"] == "Namespace"]
    assert ns["metadata"]["name"] == NS


@pytest.mark.parametrize("rel", DEPLOYABLE)
def test_rbac_is_exactly_the_reviewed_table(rel: str) -> None:
    objs = render(rel)
    roles = {
        (o["kind"], o["metadata"]["name"]): _normalize(o.get("rules", []))
        for o in objs
        if o["kind"] in ("Role", "ClusterRole")
    }
    assert roles == EXPECTED_RBAC
    for o in objs:
        if o["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            name = o["metadata"]["name"]
            assert o["roleRef"]["name"] == name
            assert o["roleRef"]["kind"] == o["kind"].replace("Binding", "")
            assert [s["name"] for s in o["subjects"]] == [name]
    sas = sorted(o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount")
    assert sas == sorted(SERVICE_ACCOUNTS)


@pytest.mark.parametrize("rel", DEPLOYABLE)
def test_rbac_has_no_wildcards_or_escalation(rel: str) -> None:
    for o in render(rel):
        for rule in o.get("rules", []):
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(field, []), (o["metadata"]["name"], rule)
            assert not {"escalate", "bind", "impersonate", "deletecollection"} & set(
                rule["verbs"]
            ), rule
            assert not {"secrets", "serviceaccounts/token", "clusterroles", "roles"} & set(
                rule["resources"]
            ), rule


def test_daemon_cannot_write_pods_cluster_wide() -> None:
    objs = render("default")
    bound_cluster_roles = {
        o["roleRef"]["name"]
        for o in objs
        if o["kind"] == "ClusterRoleBinding"
        and any(s["name"] == "compute-domain-daemon" for s in o["subjects"])
    }
    assert bound_cluster_roles == set()
    for o in objs:
        if o["kind"] == "ClusterRole":
            for key, verbs in _normalize(o["rules"]).items():
                if key[1] == "pods":
                    assert not verbs & {"create", "update", "patch", "delete"}, o["metadata"]


def test_every_rbac_rule_is_justified_by_a_comment() -> None:
    for path in sorted((CONFIG / "rbac").glob("*.yaml")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.startswith("- apiGroups:"):
                assert lines[i - 1].lstrip().startswith("#"), f"{path.name}:{i + 1} unexplained"


def test_device_classes_match_upstream() -> None:
    objs = render("default")
    classes = {
        o["metadata"]["name"]: [s["cel"]["expression"] for s in o["spec"]["selectors"]]
        for o in objs
        if o["kind"] == "DeviceClass"
    }
    assert classes == {c.CHANNEL_DEVICE_CLASS: [CHANNEL_CEL], c.DAEMON_DEVICE_CLASS: [DAEMON_CEL]}
    for o in objs:
        if o["kind"] == "DeviceClass":
            assert o["apiVersion"] == "resource.k8s.io/v1"
            assert "config" not in o["spec"]


@pytest.mark.parametrize("rel", DEPLOYABLE)
def test_admission_policies_match_the_real_service_accounts(rel: str) -> None:
    objs = render(rel)
    policies = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"}
    bindings = {
        o["metadata"]["name"]: o for o in objs if o["kind"] == "ValidatingAdmissionPolicyBinding"
    }
    expected_user = {
        "compute-domain-kubelet-plugin-resourceslices": "compute-domain-kubelet-plugin",
        "compute-domain-kubelet-plugin-nodes": "compute-domain-kubelet-plugin",
        "compute-domain-daemon-pods": "compute-domain-daemon",
        "compute-domain-daemon-cliques": "compute-domain-daemon",
    }
    assert (
        set(policies)
        == set(expected_user)
        | {DAEMON_DEVICE_POLICY, OPAQUE_CONFIG_POLICY}
        | set(CONTROLLER_POLICIES)
        == set(bindings)
    )
    for name, sa in expected_user.items():
        [cond] = policies[name]["spec"]["matchConditions"]
        assert cond["expression"] == (
            f'request.userInfo.username == "system:serviceaccount:{NS}:{sa}"'
        )
        assert policies[name]["spec"]["failurePolicy"] == "Fail"
        assert bindings[name]["spec"] == {"policyName": name, "validationActions": ["Deny"]}
        # Fail closed: the first validation rejects credentials without the node/pod claim.
        first = policies[name]["spec"]["validations"][0]["expression"]
        assert re.fullmatch(r'variables\.user(Node|Pod)Name != ""', first), first


DAEMON_DEVICE_POLICY = "compute-domain-daemon-device-claims"
OPAQUE_CONFIG_POLICY = "compute-domain-opaque-configs"


def test_opaque_config_policy_checks_the_uid_form_of_every_namespace() -> None:
    """The domainID rule is the plugin's (`pkg.api.opaque.is_uid`) and binds everywhere."""
    objs = render("default")
    policy = find(objs, "ValidatingAdmissionPolicy", OPAQUE_CONFIG_POLICY)["spec"]
    binding = find(objs, "ValidatingAdmissionPolicyBinding", OPAQUE_CONFIG_POLICY)["spec"]
    assert binding == {"policyName": OPAQUE_CONFIG_POLICY, "validationActions": ["Deny"]}
    assert policy["failurePolicy"] == "Fail"
    [variable] = [v for v in policy["variables"] if v["name"] == "badDomainIDs"]
    pattern = re.search(r"matches\('([^']+)'\)", variable["expression"])
    assert pattern is not None
    uid = "0b6e5c8e-4a0d-4c9e-9a51-3f1c2d7e8a90"
    re2 = pattern.group(1).replace("$", r"\Z")  # RE2's $ is the end of the text, no newline
    for value in (uid, uid.upper(), "/var/run/cdi", "../x", uid + "\n", "", "x" * 36):
        assert (re.search(re2, value) is not None) == is_uid(value), value


CONTROLLER_POLICIES = (
    "compute-domain-controller-daemonsets",
    "compute-domain-controller-nodes",
    "compute-domain-controller-claim-templates",
)


@pytest.mark.parametrize("rel", [*DEPLOYABLE, "components/host-managed-imex"])
def test_controller_policies_match_the_controller(rel: str) -> None:
    """What the controller writes is pinned by policies keyed on its real
    ServiceAccount; the DaemonSet policy's parameter is its own Deployment (same name and
    namespace), whose IMAGE_NAME and CD_DAEMON_SERVICE_ACCOUNT env are the values the controller
    renders its daemon DaemonSets with -- one source of truth, in every rendering (host-managed
    mode keeps the policies: its controller creates no DaemonSet at all)."""
    objs = render(rel)
    deployment = find(objs, "Deployment", "compute-domain-controller")
    sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    for name in CONTROLLER_POLICIES:
        policy = find(objs, "ValidatingAdmissionPolicy", name)["spec"]
        binding = find(objs, "ValidatingAdmissionPolicyBinding", name)["spec"]
        assert policy["failurePolicy"] == "Fail"
        assert policy["matchConditions"] == [
            {
                "name": "isController",
                "expression": f'request.userInfo.username == "system:serviceaccount:{NS}:{sa}"',
            }
        ]
        assert binding["policyName"] == name and binding["validationActions"] == ["Deny"]
        assert all(v["reason"] == "Forbidden" for v in policy["validations"])
    policy = find(objs, "ValidatingAdmissionPolicy", CONTROLLER_POLICIES[0])["spec"]
    binding = find(objs, "ValidatingAdmissionPolicyBinding", CONTROLLER_POLICIES[0])["spec"]
    assert policy["paramKind"] == {"apiVersion": "apps/v1", "kind": "Deployment"}
    assert binding["paramRef"] == {
        "name": deployment["metadata"]["name"],
        "namespace": deployment["metadata"]["namespace"],
        "parameterNotFoundAction": "Deny",
    }
    variables = {v["name"]: " ".join(v["expression"].split()) for v in policy["variables"]}
    [ctr] = containers(deployment)
    assert f'c.name == "{ctr["name"]}"' in variables["controllerEnv"]
    assert 'e.name == "IMAGE_NAME"' in variables["imageValues"]
    assert 'e.name == "CD_DAEMON_SERVICE_ACCOUNT"' in variables["serviceAccountValues"]
    env = env_of(ctr)
    assert "value" in env["IMAGE_NAME"], "the policy reads IMAGE_NAME as a literal value"
    daemon_env = ("IMAGE_NAME", "CD_DAEMON_SERVICE_ACCOUNT")
    opts = parse_options([], {"NAMESPACE": NS, **{k: env[k]["value"] for k in daemon_env}})
    assert opts.controller.image_name == env["IMAGE_NAME"]["value"]
    assert opts.controller.daemon_service_account == env["CD_DAEMON_SERVICE_ACCOUNT"]["value"]
    # The flag's default is the policy's default when the env is unset.
    assert f'"{opts.controller.daemon_service_account}"' in variables["daemonServiceAccount"]


def _policy_text(name: str) -> str:
    """Every CEL expression of the policy, whitespace collapsed."""
    policy = find(render("default"), "ValidatingAdmissionPolicy", name)["spec"]
    exprs = [v["expression"] for v in policy.get("variables", []) + policy["validations"]]
    return " ".join(" ".join(exprs).split())


def test_controller_daemonset_policy_pins_the_daemon_pod() -> None:
    """What the CEL inspects (its behaviour against the real API server, and that the real
    rendered DaemonSet passes: ``test/e2e/test_adversarial_controller.py``)."""
    text = _policy_text("compute-domain-controller-daemonsets")
    policy = find(
        render("default"), "ValidatingAdmissionPolicy", "compute-domain-controller-daemonsets"
    )["spec"]
    rule = policy["matchConstraints"]["resourceRules"]
    assert rule == [
        {
            "apiGroups": ["apps"],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["daemonsets"],
        }
    ]
    # The daemon object name, a UID after it.
    assert c.daemon_object_name("") in text
    for needle in (
        "c.image == variables.daemonImage",
        "serviceAccountName",
        "has(v.emptyDir)",
        "hostNetwork",
        "hostPID",
        "hostIPC",
        "hostPort",
        "privileged",
        "allowPrivilegeEscalation.orValue(true)",
        "capabilities.add",
        '"ALL" in',
        '["RuntimeDefault", "Localhost"]',
        "procMount",
        "resourceClaimTemplateName",
        "ephemeralContainers",
        'e.name == "IMEX_MODE"',
        '"hostManaged"',
    ):
        assert needle in text, needle
    # Only a pod-template change is checked (adoption and finalizer strips are not).
    assert policy["variables"][0] == {
        "name": "podsUnchanged",
        "expression": (
            'request.operation == "UPDATE" && object.spec.template == oldObject.spec.template'
        ),
    }
    assert all(
        v["expression"].startswith("variables.podsUnchanged ||") for v in policy["validations"]
    )


def test_controller_daemon_daemonset_satisfies_its_policy() -> None:
    """The rendered daemon pod (pkg/reconcilers/objects.py, hardened) meets each rule the
    policy states, checked here in Python so a change to either side fails offline too."""
    objs = render("default")
    [ctr] = containers(find(objs, "Deployment", "compute-domain-controller"))
    env = {k: env_of(ctr)[k]["value"] for k in ("IMAGE_NAME", "CD_DAEMON_SERVICE_ACCOUNT")}
    config = parse_options([], {**env, "NAMESPACE": NS}).controller
    cd = parse_compute_domain(
        {
            "apiVersion": c.API_VERSION,
            "kind": c.COMPUTE_DOMAIN_KIND,
            "metadata": {
                "name": "x",
                "namespace": "team",
                "uid": "0f0e0d0c-0b0a-4908-8706-050403020100",
            },
            "spec": {"channel": {"resourceClaimTemplate": {"name": "x-channel"}}},
        }
    )
    ds = render_daemonset(cd, config)
    assert re.fullmatch(
        r"computedomain-daemon-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        ds["metadata"]["name"],
    )
    pod = ds["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == env["CD_DAEMON_SERVICE_ACCOUNT"]
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    assert all(
        set(v) <= {"name", "emptyDir", "configMap", "downwardAPI"} for v in pod.get("volumes", [])
    )
    assert all(
        r["resourceClaimTemplateName"] == ds["metadata"]["name"] for r in pod["resourceClaims"]
    )
    for container in pod["containers"] + pod.get("initContainers", []):
        assert container["image"] == env["IMAGE_NAME"]
        sc = container["securityContext"]
        assert not sc.get("privileged") and sc["allowPrivilegeEscalation"] is False
        assert "ALL" in sc["capabilities"]["drop"] and not sc["capabilities"].get("add")
        seccomp = sc.get("seccompProfile") or pod.get("securityContext", {}).get("seccompProfile")
        assert seccomp["type"] in ("RuntimeDefault", "Localhost")
        assert not any(p.get("hostPort") for p in container.get("ports", []))


def test_controller_node_policy_allows_only_its_labels() -> None:
    """The labels and annotation the controller's reconcilers write are exactly the policy's."""
    policy = find(
        render("default"), "ValidatingAdmissionPolicy", "compute-domain-controller-nodes"
    )["spec"]
    variables = {v["name"]: v["expression"] for v in policy["variables"]}
    assert variables["domainLabel"] == f"'{c.COMPUTE_DOMAIN_LABEL}'"
    assert variables["cliqueLabel"] == f"'{c.GPU_CLIQUE_NODE_LABEL}'"
    assert variables["labels"] == "[variables.domainLabel, variables.cliqueLabel]"
    assert variables["owner"] == f"'{MANAGED_ANNOTATION}'"
    text = _policy_text("compute-domain-controller-nodes")
    assert f"'{c.GPU_CLIQUE_MANAGED_BY_PLUGIN}'" in text
    assert "object.spec == oldObject.spec" in text
    assert "finalizers" in text and "ownerReferences" in text
    rule = policy["matchConstraints"]["resourceRules"]
    assert rule == [
        {"apiGroups": [""], "apiVersions": ["*"], "operations": ["UPDATE"], "resources": ["nodes"]}
    ]
    # Every node write of the controller goes through this one helper (metadata merge patch).
    pkg = REPO / "pkg" / "reconcilers"
    writers = sorted(
        p.name
        for p in pkg.glob("*.py")
        if "NODES" in p.read_text() and re.search(r"\.(patch|update)\(\s*NODES", p.read_text())
    )
    assert writers == ["nodecache.py"], writers


def test_controller_template_policy_names_the_driver_classes() -> None:
    policy = find(
        render("default"), "ValidatingAdmissionPolicy", "compute-domain-controller-claim-templates"
    )["spec"]
    variables = {v["name"]: v["expression"] for v in policy["variables"]}
    assert variables["classes"] == f"['{c.CHANNEL_DEVICE_CLASS}', '{c.DAEMON_DEVICE_CLASS}']"
    text = _policy_text("compute-domain-controller-claim-templates")
    assert f'"{c.DRIVER_NAME}"' in text and "adminAccess" in text
    assert policy["matchConstraints"]["matchPolicy"] == "Equivalent"
    for name in ("compute-domain-default-channel.nvidia.com", "compute-domain-daemon.nvidia.com"):
        find(render("default"), "DeviceClass", name)


@pytest.mark.parametrize("rel", DEPLOYABLE)
def test_daemon_device_policy_binds_outside_the_driver_namespace_only(rel: str) -> None:
    """Every namespace but the driver's, for every user (no matchConditions)."""
    objs = render(rel)
    policy = find(objs, "ValidatingAdmissionPolicy", DAEMON_DEVICE_POLICY)["spec"]
    binding = find(objs, "ValidatingAdmissionPolicyBinding", DAEMON_DEVICE_POLICY)["spec"]
    assert binding == {
        "policyName": DAEMON_DEVICE_POLICY,
        "validationActions": ["Deny"],
        "matchResources": {
            "namespaceSelector": {
                "matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [NS]}
                ]
            }
        },
    }
    assert policy["failurePolicy"] == "Fail" and "matchConditions" not in policy
    constraints = policy["matchConstraints"]
    # Every version the driver runs on (1.32: v1beta1 only), each checked as sent; Equivalent
    # converts only to a served version (test_admission_cel.py evaluates the CEL in each).
    assert constraints["matchPolicy"] == "Equivalent"
    assert constraints["resourceRules"] == [
        {
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["v1", "v1beta2", "v1beta1"],
            # CREATE only: the spec is immutable, and an UPDATE may be a finalizer's removal.
            "operations": ["CREATE"],
            "resources": ["resourceclaims", "resourceclaimtemplates"],
        }
    ]


def test_daemon_device_policy_checks_both_request_forms_and_the_config() -> None:
    """What the CEL inspects (its behaviour against the real API server:
    ``test/e2e/test_deploy_config.py::test_daemon_device_claims_only_in_the_driver_namespace``)."""
    policy = find(render("default"), "ValidatingAdmissionPolicy", DAEMON_DEVICE_POLICY)["spec"]
    variables = {v["name"]: " ".join(v["expression"].split()) for v in policy["variables"]}
    # Templates nest the claim spec one level deeper.
    assert variables["devices"] == (
        'request.resource.resource == "resourceclaimtemplates" ? '
        "dyn(object.spec.spec).?devices.orValue({}) : dyn(object.spec).?devices.orValue({})"
    )
    # The class the rule protects is the shipped daemon DeviceClass.
    assert variables["daemonClass"] == f"'{c.DAEMON_DEVICE_CLASS}'"
    find(render("default"), "DeviceClass", c.DAEMON_DEVICE_CLASS)
    requests = variables["requestsDaemonClass"]
    # v1/v1beta2 nest the class in `exactly`, v1beta1 has it flat.
    class_of_request = 'r.?exactly.deviceClassName.orValue(r.?deviceClassName.orValue(""))'
    assert f"{class_of_request} == variables.daemonClass" in requests
    assert (
        "r.?firstAvailable.orValue([]).exists(s, s.deviceClassName == variables.daemonClass)"
        in requests
    )
    config = variables["carriesDaemonConfig"]
    assert f'c.?opaque.driver.orValue("") == "{c.DRIVER_NAME}"' in config
    assert f'c.?opaque.parameters.kind.orValue("") == "{c.DAEMON_CONFIG_KIND}"' in config
    rules = {v["expression"]: " ".join(v["message"].split()) for v in policy["validations"]}
    assert set(rules) == {"!variables.requestsDaemonClass", "!variables.carriesDaemonConfig"}
    for message in rules.values():
        assert message.endswith(
            "ComputeDomain daemon claims are only allowed in the driver namespace"
        )
    assert all(v["reason"] == "Forbidden" for v in policy["validations"])


def test_slice_policy_pins_node_and_driver() -> None:
    policy = find(
        render("default"),
        "ValidatingAdmissionPolicy",
        "compute-domain-kubelet-plugin-resourceslices",
    )
    text = str(policy["spec"])
    assert "authentication.kubernetes.io/node-name" in text
    assert f'variables.slice.spec.driver == "{c.DRIVER_NAME}"' in text
    rule = policy["spec"]["matchConstraints"]["resourceRules"][0]
    assert rule["operations"] == ["CREATE", "UPDATE", "DELETE"]
    assert rule["resources"] == ["resourceslices"]


def _config_map(objs: list[Obj]) -> Obj:
    [cm] = [o for o in objs if o["kind"] == "ConfigMap"]
    return cm


@pytest.mark.parametrize("rel", DEPLOYABLE)
def test_images_and_config_set_in_one_place(rel: str) -> None:
    objs = render(rel)
    cm = _config_map(objs)
    assert cm["metadata"]["name"].startswith("compute-domain-driver-config-")
    assert set(cm["data"]) == {"LOG_VERBOSITY", "FEATURE_GATES"}
    images = set()
    for o in objs:
        if o["kind"] not in ("Deployment", "DaemonSet"):
            continue
        for ctr in containers(o):
            images.add(ctr["image"])
            for e in ctr.get("env", []):
                ref = e.get("valueFrom", {}).get("configMapKeyRef")
                if ref:
                    assert ref["name"] == cm["metadata"]["name"], e
                    assert ref["key"] in cm["data"], e
            assert ctr["args"] == ["-v", "$(LOG_VERBOSITY)"]
            assert "LOG_VERBOSITY" in env_of(ctr)
    controller = next(containers(find(objs, "Deployment", "compute-domain-controller")))
    images.add(env_of(controller)["IMAGE_NAME"]["value"])
    assert images == {
        f"localhost/compute-domain-{n}:0.1.0" for n in ("controller", "kubelet-plugin", "daemon")
    }
    assert "placeholder.invalid" not in str(objs)


def test_controller_deployment() -> None:
    dep = find(render("default"), "Deployment", "compute-domain-controller")
    pod = dep["spec"]["template"]["spec"]
    [ctr] = pod["containers"]
    env = env_of(ctr)
    assert pod["serviceAccountName"] == "compute-domain-controller"
    assert env["LEADER_ELECTION_ENABLED"]["value"] == "true"
    assert env["LEADER_ELECTION_LEASE_LOCK_NAME"]["value"] == "compute-domain-controller"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["CD_DAEMON_SERVICE_ACCOUNT"]["value"] == "compute-domain-daemon"
    port = int(env["HTTP_ENDPOINT"]["value"].rsplit(":", 1)[1])
    assert ctr["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    assert ctr["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert ctr["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert ctr["resources"]["requests"] and ctr["resources"]["limits"]["memory"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    sc = ctr["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert dep["spec"]["replicas"] >= 2


def _plugin(rel: str) -> tuple[Obj, Obj]:
    ds = find(render(rel), "DaemonSet", "compute-domain-kubelet-plugin")
    pod = ds["spec"]["template"]["spec"]
    [ctr] = pod["containers"]
    return ds, ctr


@pytest.mark.parametrize("rel", DEPLOYABLE)
def test_kubelet_plugin_daemonset(rel: str) -> None:
    ds, ctr = _plugin(rel)
    pod = ds["spec"]["template"]["spec"]
    env = env_of(ctr)
    assert pod["serviceAccountName"] == "compute-domain-kubelet-plugin"
    assert pod["priorityClassName"] == "system-node-critical"
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0},
    }
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m["mountPath"] for m in ctr["volumeMounts"]}
    for path in (PLUGIN_DIR, "/var/lib/kubelet/plugins_registry", "/var/run/cdi"):
        [vol] = [n for n, p in host_paths.items() if p == path]
        assert mounts[vol] == path, f"{path} must be mounted at the identical path"
    assert env["CDI_ROOT"]["value"] == "/var/run/cdi"
    assert env["KUBELET_PLUGINS_DIRECTORY_PATH"]["value"] == "/var/lib/kubelet/plugins"
    assert env["KUBELET_REGISTRAR_DIRECTORY_PATH"]["value"] == "/var/lib/kubelet/plugins_registry"
    health_port = int(env["HEALTHCHECK_PORT"]["value"])
    assert ctr["livenessProbe"]["grpc"]["port"] == health_port
    assert ctr["securityContext"]["readOnlyRootFilesystem"] is True
    # The driver root as upstream: NVIDIA_DRIVER_ROOT is the host path the driver-root volume
    # mounts at DRIVER_ROOT_CTR_PATH (the plugin turns container paths back into host paths).
    assert env["NVIDIA_DRIVER_ROOT"]["value"] == host_paths["driver-root"]
    assert env["DRIVER_ROOT_CTR_PATH"]["value"] == mounts["driver-root"] == "/driver-root"
    # NVML is loaded by absolute path: no LD_LIBRARY_PATH (it would load the host's libc).
    assert "LD_LIBRARY_PATH" not in env


# The driver's own directory of the kubelet's plugins directory (KUBELET_PLUGINS_DIRECTORY_PATH
# stays the kubelet's directory, upstream's meaning; the plugin only uses <that>/<driver>).
PLUGIN_DIR = f"/var/lib/kubelet/plugins/{c.DRIVER_NAME}"

# Every hostPath the kubelet plugin pod may mount, in any rendering of config/, and why it needs
# exactly that much: (read-only, fake-GPU overlays only, why).  Nothing broader: not the kubelet's
# plugins directory (other drivers' sockets and state), not /var/lib/kubelet, not /dev or /proc.
PLUGIN_HOST_PATHS: dict[str, tuple[bool, bool, str]] = {
    "/var/lib/kubelet/plugins_registry": (
        False,
        False,
        "the kubelet's plugin watcher finds <driver>-reg.sock in this directory (upstream's "
        "socket path; the plugin creates and removes the socket, so the directory is mounted)",
    ),
    PLUGIN_DIR: (
        False,
        False,
        "the driver's own directory: dra.sock (the kubelet dials it), checkpoint.json, pu.lock "
        "and the domains/<uid> directories bind-mounted into the IMEX daemons through CDI",
    ),
    "/var/run/cdi": (
        False,
        False,
        "per-claim CDI spec files; the container runtime reads this directory as it is",
    ),
    "/": (
        True,
        False,
        "NVIDIA_DRIVER_ROOT of a host-installed driver (upstream's default): NVML, nvidia-imex, "
        "nvidia-imex-ctl and the driver libraries the CDI spec hands to the daemons; read-only",
    ),
    "/var/lib/compute-domain-fake/driver-root": (
        True,
        True,
        "the fake driver root of the kind and real-node lanes (simulated IMEX)",
    ),
    "/etc/compute-domain-fake": (True, True, "kind: the node's fake GPU inventory"),
    "/var/lib/compute-domain-fake": (
        True,
        True,
        "real-node lane: the node-private fake GPU inventory (/etc is the host's)",
    ),
}


@pytest.mark.parametrize("rel", KUSTOMIZATIONS)
def test_kubelet_plugin_host_paths_are_only_what_it_needs(rel: str) -> None:
    """The plugin pod mounts no hostPath broader than it needs (PLUGIN_HOST_PATHS
    says why each one), at the identical path where the kubelet or runtime follows a path the
    plugin reports, and read-write only where it writes."""
    objs = render(rel)
    if not any(
        o["kind"] == "DaemonSet" and o["metadata"]["name"] == "compute-domain-kubelet-plugin"
        for o in objs
    ):
        pytest.skip(f"config/{rel} renders no kubelet plugin")
    ds, ctr = _plugin(rel)
    pod = ds["spec"]["template"]["spec"]
    fake = env_of(ctr).get("DEVICE_DISCOVERY", {}).get("value") == "fake"
    mounts = {m["name"]: m for m in ctr["volumeMounts"]}
    seen = set()
    for vol in pod["volumes"]:
        if "hostPath" not in vol:
            continue
        path = vol["hostPath"]["path"]
        assert path in PLUGIN_HOST_PATHS, f"config/{rel}: hostPath {path} is not in the table"
        read_only, fake_only, _why = PLUGIN_HOST_PATHS[path]
        assert fake or not fake_only, f"config/{rel}: {path} is for the fake-GPU lanes only"
        mount = mounts[vol["name"]]
        assert bool(mount.get("readOnly")) == read_only, f"config/{rel}: {path} readOnly"
        if not read_only:
            assert mount["mountPath"] == path, f"{path} must be mounted at the identical path"
            assert vol["hostPath"]["type"] == "DirectoryOrCreate"
        seen.add(path)
    assert {PLUGIN_DIR, "/var/lib/kubelet/plugins_registry", "/var/run/cdi"} <= seen
    # The plugin's directory is the one its flags compute from the kubelet's directory.
    cfg = PluginConfig(
        node_name="n",
        namespace=NS,
        plugins_dir=Path(env_of(ctr)["KUBELET_PLUGINS_DIRECTORY_PATH"]["value"]),
    )
    assert str(cfg.plugin_dir) == PLUGIN_DIR and cfg.dra_socket.parent == cfg.plugin_dir


def test_default_driver_root_is_a_host_install() -> None:
    _, ctr = _plugin("default")
    assert env_of(ctr)["NVIDIA_DRIVER_ROOT"]["value"] == "/"


def test_kind_overlay_uses_fake_gpus_without_privileges() -> None:
    _, base = _plugin("default")
    _, ctr = _plugin("overlays/kind-fake-gpu")
    # Not rendered: the binary's default (nvml), so an overlay or values file adds it once.
    assert "DEVICE_DISCOVERY" not in env_of(base)
    assert base["securityContext"]["privileged"] is True
    env = env_of(ctr)
    assert env["DEVICE_DISCOVERY"]["value"] == "fake"
    mounts = {m["mountPath"] for m in ctr["volumeMounts"]}
    assert "/etc/compute-domain-fake" in mounts
    for key in ("FAKE_GPU_CONFIG", "ALT_PROC_DEVICES_PATH"):
        assert env[key]["value"].startswith("/etc/compute-domain-fake/")
    assert ctr["securityContext"]["privileged"] is False
    assert ctr["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # The simulated IMEX comes from a fake driver root, through the plugin's CDI spec.
    assert env["NVIDIA_DRIVER_ROOT"]["value"] == "/var/lib/compute-domain-fake/driver-root"
    # The controller (and so every IMEX daemon) is config/default's, unchanged.
    assert find(render("overlays/kind-fake-gpu"), "Deployment", "compute-domain-controller") == (
        find(render("default"), "Deployment", "compute-domain-controller")
    )
    create = (REPO / "hack/kind/create-cluster.sh").read_text()
    assert "pkg.testing.fakedriverroot" in create
    assert "NODE_DRIVER_ROOT=/var/lib/compute-domain-fake/driver-root" in create


# Where the Dockerfile puts pkg/ inside the images.
IMAGE_SOURCE_ROOT = "/opt/compute-domain-driver"
# Ways to point an IMEX daemon at the simulator instead of what CDI injects.
BACK_DOORS = (
    "IMEX_BIN_DIR",
    "IMEX_BINARY",
    "IMEX_CTL_BINARY",
    "imex/sim",
    "imex.sim",
    "--imex-binary",
    "--imex-ctl-binary",
)


@pytest.mark.parametrize("rel", KUSTOMIZATIONS)
def test_no_shipped_manifest_has_a_simulator_back_door(rel: str) -> None:
    text = render_text(rel)
    for door in BACK_DOORS:
        assert door not in text, f"config/{rel} sets {door}"


def test_images_contain_no_simulator() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert f"COPY pkg/ {IMAGE_SOURCE_ROOT}/pkg/" in dockerfile
    assert f"app={IMAGE_SOURCE_ROOT};" in dockerfile
    assert 'rm -rf "${app}/pkg/imex/sim" "${app}/pkg/testing";' in dockerfile
    # The built images are checked too: hack/nodeimages/driver.py FORBIDDEN.
    assert "IMEX_BIN_DIR" not in dockerfile
    assert not (REPO / "pkg/imex/sim/bin").exists()
    assert '"IMEX_BIN_DIR"' not in (REPO / "pkg/daemon/options.py").read_text()


def test_daemon_service_account_default_is_the_shipped_one() -> None:
    """The controller's default must be the ServiceAccount config/rbac binds to the daemon."""
    objs = render("default")
    default_sa = parse_options(["--image-name=x"], {}).controller.daemon_service_account
    binding = find(objs, "RoleBinding", "compute-domain-daemon")
    assert [s["name"] for s in binding["subjects"]] == [default_sa]
    find(objs, "ServiceAccount", default_sa)


def test_binding_subjects_follow_a_changed_driver_namespace(tmp_path: Path) -> None:
    """Operators change `namespace:` in config/default; every binding subject must follow.

    kustomize rewrites only subject namespaces that are empty or "default", so a literal
    namespace in config/rbac would silently bind a ServiceAccount that does not exist.
    """
    copy = tmp_path / "config"
    shutil.copytree(CONFIG, copy)
    kustomization = copy / "default" / "kustomization.yaml"
    text = kustomization.read_text()
    assert f"\nnamespace: {NS}\n" in text
    kustomization.write_text(text.replace(f"\nnamespace: {NS}\n", "\nnamespace: other-ns\n"))
    proc = subprocess.run(
        [str(kubectl()), "kustomize", str(copy / "default")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    bindings = [
        o
        for o in yaml.safe_load_all(proc.stdout)
        if o and o["kind"] in ("RoleBinding", "ClusterRoleBinding")
    ]
    assert bindings
    for o in bindings:
        for subject in o["subjects"]:
            assert subject["namespace"] == "other-ns", (o["kind"], o["metadata"]["name"])
    # The admission policies follow too: usernames and the daemon-device namespaceSelector.
    rendered = [o for o in yaml.safe_load_all(proc.stdout) if o]
    admission = yaml.safe_dump(
        [o for o in rendered if o["kind"].startswith("ValidatingAdmissionPolicy")]
    )
    assert NS not in admission and "system:serviceaccount:other-ns:" in admission
    binding = find(rendered, "ValidatingAdmissionPolicyBinding", DAEMON_DEVICE_POLICY)
    [expr] = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert expr["values"] == ["other-ns"]


def test_samples_use_the_driver_contract() -> None:
    objs = render("samples")
    cd = find(objs, "ComputeDomain", "training-domain")
    job = find(objs, "Job", "training-job")
    rct = cd["spec"]["channel"]["resourceClaimTemplate"]["name"]
    pod: Any = job["spec"]["template"]["spec"]
    assert pod["resourceClaims"] == [{"name": "imex-channel", "resourceClaimTemplateName": rct}]
    [term] = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == c.GPU_CLIQUE_NODE_LABEL


def test_single_clique_sample_opts_in_on_the_domain_only() -> None:
    """config/samples/single-clique: the annotation is the whole opt-in (pkg.api.placement);
    the Job is ordinary (no podAffinity on the clique label) and uses the domain's template."""
    objs = render("samples/single-clique")
    cd = find(objs, "ComputeDomain", "clique-domain")
    assert parse_compute_domain(cd).single_clique
    pod: Any = find(objs, "Job", "clique-job")["spec"]["template"]["spec"]
    rct = cd["spec"]["channel"]["resourceClaimTemplate"]["name"]
    assert pod["resourceClaims"] == [{"name": "imex-channel", "resourceClaimTemplateName": rct}]
    assert "podAffinity" not in pod["affinity"]


# Env vars the manifests set that no Python code reads, on purpose.
ENV_NOT_READ_BY_CODE = {
    "POD_UID": "upstream's rolling-update contract; reserved, see the DaemonSet comment",
}
ENTRY_POINTS = {
    "compute-domain-controller": REPO
    / "cmd/compute-domain-controller/compute_domain_controller.py",
    "compute-domain-kubelet-plugin": REPO
    / "cmd/compute-domain-kubelet-plugin/compute_domain_kubelet_plugin.py",
}


@pytest.mark.parametrize("workload", sorted(ENTRY_POINTS))
def test_every_env_var_is_read_by_the_code(workload: str) -> None:
    """A renamed flag or env var in the code must not leave the manifests silently stale."""
    entry = ENTRY_POINTS[workload]
    assert entry.is_file(), f"{entry.relative_to(REPO)} is missing"
    sources = "\n".join(
        p.read_text() for d in (REPO / "pkg", entry.parent) for p in d.rglob("*.py")
    )
    for rel in DEPLOYABLE:
        objs = render(rel)
        kind = "Deployment" if workload.endswith("controller") else "DaemonSet"
        for ctr in containers(find(objs, kind, workload)):
            for name in env_of(ctr):
                if name in ENV_NOT_READ_BY_CODE:
                    continue
                assert f'"{name}"' in sources, f"{rel}: {workload} sets {name}, nothing reads it"


@pytest.mark.parametrize("rel", DEPLOYABLE)
def test_debug_endpoints_are_off_in_shipped_manifests(rel: str) -> None:
    """``/debug/informers`` lists every cached object's name: an opt-in, never shipped on."""
    for obj in render(rel):
        if obj["kind"] not in ("Deployment", "DaemonSet"):
            continue
        for ctr in containers(obj):
            assert "DEBUG_ENDPOINTS" not in env_of(ctr), f"{rel}: {obj['metadata']['name']}"
            args = [*ctr.get("command", []), *ctr.get("args", [])]
            assert not [a for a in args if "debug-endpoints" in str(a)], f"{rel}: {args}"


def test_quota_sample_names_real_resources() -> None:
    """The per-namespace quota example (config/samples/quota, docs/operators.md)
    renders into the sample namespace and names only resources and DeviceClasses the driver
    really serves (a misspelt quota key is accepted by the API server and limits nothing).
    Its enforcement on the real API server: ``test/e2e/test_adversarial_controller.py``."""
    [quota] = render("samples/quota")
    assert quota["kind"] == "ResourceQuota"
    assert quota["metadata"]["namespace"] == render("samples")[0]["metadata"]["namespace"]
    hard = quota["spec"]["hard"]
    crds = {f"{o['spec']['names']['plural']}.{o['spec']['group']}" for o in render("crd")}
    counted = {f"{r.plural}.{r.group}" for r in (RESOURCE_CLAIMS, RESOURCE_CLAIM_TEMPLATES)}
    assert f"{COMPUTE_DOMAINS.plural}.{COMPUTE_DOMAINS.group}" in crds
    classes = {o["metadata"]["name"] for o in render("deviceclasses")}
    assert classes == {c.CHANNEL_DEVICE_CLASS, c.DAEMON_DEVICE_CLASS}
    for key in hard:
        if key.startswith("count/"):
            assert key.removeprefix("count/") in crds | counted, key
        else:
            assert key.endswith(".deviceclass.resource.k8s.io/devices"), key
            assert key.removesuffix(".deviceclass.resource.k8s.io/devices") in classes, key
    assert int(hard[f"count/{COMPUTE_DOMAINS.plural}.{COMPUTE_DOMAINS.group}"]) > 0
    # A domain's workload template counts here too: never fewer templates than domains.
    assert int(hard["count/resourceclaimtemplates.resource.k8s.io"]) >= int(
        hard["count/computedomains.resource.nvidia.com"]
    )
    assert int(hard[f"{c.CHANNEL_DEVICE_CLASS}.deviceclass.resource.k8s.io/devices"]) > 0
    assert hard[f"{c.DAEMON_DEVICE_CLASS}.deviceclass.resource.k8s.io/devices"] == "0"
