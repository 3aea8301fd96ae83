"""The admission policy ``compute-domain-daemon-cliques`` as rendered.

A daemon may write only its own domain's ComputeDomainClique and its own node's entry in it.
These tests pin what the rendered policy matches and which names and claims its CEL derives the
domain and node from, against the constants the controller and daemon name their objects with;
its behaviour against the real API server (a "compromised daemon" impersonated with another
pod's and node's claims, and every write a real daemon makes) is
``test/e2e/test_adversarial_daemon.py``.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from testsupport.manifests import (
    DEPLOYABLE,
    NS,
    find,
    render,
)

from pkg.api import constants as c
from pkg.api.daemonentry import DAEMONS, NODE_NAME

POLICY = "compute-domain-daemon-cliques"
POD_CLAIM = "authentication.kubernetes.io/pod-name"
NODE_CLAIM = "authentication.kubernetes.io/node-name"
POD_UID_CLAIM = "authentication.kubernetes.io/pod-uid"
REPO = Path(__file__).resolve().parents[3]


def _policy(rel: str = "default") -> dict[str, object]:
    spec: dict[str, object] = find(render(rel), "ValidatingAdmissionPolicy", POLICY)["spec"]
    return spec


def _variables(spec: dict[str, object]) -> dict[str, str]:
    return {v["name"]: " ".join(v["expression"].split()) for v in spec["variables"]}  # type: ignore[attr-defined]


@pytest.mark.parametrize("rel", [*DEPLOYABLE, "overlays/other-namespace"])
def test_policy_matches_the_daemon_service_account_of_the_rendered_namespace(rel: str) -> None:
    objs = render(rel)
    ns = "compute-domain-system" if rel == "overlays/other-namespace" else NS
    policy = find(objs, "ValidatingAdmissionPolicy", POLICY)["spec"]
    binding = find(objs, "ValidatingAdmissionPolicyBinding", POLICY)["spec"]
    assert binding == {"policyName": POLICY, "validationActions": ["Deny"]}
    assert policy["failurePolicy"] == "Fail"
    [cond] = policy["matchConditions"]
    assert cond == {
        "name": "isDaemon",
        "expression": (
            f'request.userInfo.username == "system:serviceaccount:{ns}:compute-domain-daemon"'
        ),
    }
    sa = find(objs, "ServiceAccount", "compute-domain-daemon")
    assert sa["metadata"]["namespace"] == ns


def test_policy_covers_every_write_of_a_clique() -> None:
    """Create, update/patch (of the object and of a status subresource, should one be added)
    and delete, in every served version."""
    [rule] = _policy()["matchConstraints"]["resourceRules"]  # type: ignore[index]
    assert rule == {
        "apiGroups": [c.GROUP],
        "apiVersions": ["*"],
        "operations": ["CREATE", "UPDATE", "DELETE"],
        "resources": ["computedomaincliques", "computedomaincliques/status"],
    }


def test_policy_takes_pod_node_and_uid_from_the_bound_token_and_fails_closed() -> None:
    spec = _policy()
    variables = _variables(spec)
    for name, claim in (
        ("userPodName", POD_CLAIM),
        ("userNodeName", NODE_CLAIM),
        ("userPodUID", POD_UID_CLAIM),
    ):
        assert variables[name] == f"request.userInfo.?extra[?'{claim}'][0].orValue('')"
    rules = [v["expression"] for v in spec["validations"]]  # type: ignore[attr-defined]
    # Without the claims nothing limits the request to one pod / node: refused first.
    assert rules[:3] == [
        'variables.userPodName != ""',
        'variables.userNodeName != ""',
        'request.operation != "DELETE"',
    ]
    assert all(v["reason"] == "Forbidden" for v in spec["validations"])  # type: ignore[attr-defined]


def test_domain_of_pod_and_clique_follow_the_object_names() -> None:
    """The pod's domain is read from the DaemonSet's name prefix, the clique's from the part of
    its name before the first '.', exactly as the controller and daemon name them."""
    variables = _variables(_policy())
    prefix = c.daemon_object_name("")
    assert variables["daemonPrefix"] == f"'{prefix}'"
    assert (
        "substring(size(variables.daemonPrefix), variables.userPodName.lastIndexOf('-'))"
        in (variables["podDomain"])
    )
    uid = str(uuid.uuid4())
    # A clique ID itself contains a '.' (<clusterUUID>.<cliqueId>): the domain is the first part.
    clique_id = f"{uuid.uuid4()}.32766"
    name = c.clique_object_name(uid, clique_id)
    assert name.split(".", 1) == [uid, clique_id]
    assert (
        "variables.cliqueName.substring(0, variables.cliqueName.indexOf('.'))"
        in (variables["cliqueDomain"])
    )
    assert (
        "variables.cliqueName.substring(variables.cliqueName.indexOf('.') + 1)"
        in (variables["cliqueIDOfName"])
    )


def test_daemon_pod_names_keep_the_domain_intact() -> None:
    """The DaemonSet controller names pods generateName '<DaemonSet>-' + 5 characters, and
    the API server cuts a generateName longer than 58 characters: the DaemonSet name plus '-'
    must fit, or the pod name would no longer end in '-<suffix>' after the whole domain UID."""
    uid = str(uuid.uuid4())
    generate_name = c.daemon_object_name(uid) + "-"
    assert len(generate_name) <= 63 - 5
    pod = generate_name + "x7k2q"
    prefix = c.daemon_object_name("")
    assert pod[len(prefix) : pod.rindex("-")] == uid


def test_entries_of_other_nodes_must_be_unchanged_both_ways() -> None:
    spec = _policy()
    variables = _variables(spec)
    key = NODE_NAME
    assert variables["newEntries"] == (
        f'request.operation == "DELETE" ? [] : object.?{DAEMONS}.orValue([])'
    )
    assert variables["oldEntries"] == (
        f'request.operation == "UPDATE" ? oldObject.?{DAEMONS}.orValue([]) : []'
    )
    for side in ("new", "old"):
        assert variables[f"{side}Others"] == (
            f"variables.{side}Entries.filter(e, e.?{key}.orValue('') != variables.userNodeName)"
        )
    rules = {" ".join(v["expression"].split()) for v in spec["validations"]}  # type: ignore[attr-defined]
    assert (
        "variables.newOthers.all(n, variables.oldOthers.exists(o, o == n)) && "
        "variables.oldOthers.all(o, variables.newOthers.exists(n, n == o))"
    ) in rules
    assert 'variables.podDomain != "" && variables.cliqueDomain == variables.podDomain' in rules


def test_create_pins_the_labels_the_daemon_writes() -> None:
    rules = " ".join(
        " ".join(v["expression"].split())
        for v in _policy()["validations"]  # type: ignore[attr-defined]
    )
    assert f"labels[?'{c.COMPUTE_DOMAIN_LABEL}'].orValue('') == variables.cliqueDomain" in rules
    assert f"labels[?'{c.CLIQUE_ID_LABEL}'].orValue('') == variables.cliqueIDOfName" in rules
    # ownerReferences only grow, by the daemon's own pod.
    assert 'r.kind == "Pod" && r.name == variables.userPodName' in rules
    assert "variables.oldRefs.all(o, variables.newRefs.exists(r, r == o))" in rules


def test_host_managed_mode_and_the_chart_leave_it_out_with_the_daemons() -> None:
    """No daemons in host-managed IMEX mode: the component deletes the policy like the others,
    and the chart wraps it in the hostManaged condition (hack/gen-chart.py DAEMON_ONLY)."""
    text = (REPO / "config/components/host-managed-imex/omit-daemon-objects.yaml").read_text()
    assert text.count(f"name: {POLICY}\n") == 2
    template = (
        REPO / "deployments/helm/compute-domain-driver/templates/validatingadmissionpolicy.yaml"
    ).read_text()
    head, _, rest = template.partition(f"  name: {POLICY}\n")
    assert rest, "the chart has no template of the policy"
    assert head.rstrip().endswith(
        '{{- if not (include "cdd.hostManagedIMEX" .) }}\n---\napiVersion: '
        "admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata:"
    )


def test_cliques_off_pins_daemon_status_writes_like_clique_writes() -> None:
    """With ComputeDomainCliques=false the daemons update computedomains/status cluster-wide
    (the component's ClusterRole); the component's policy holds them to their own domain (the
    UID in the pod name is the domain's metadata.uid) and their own node's status.nodes entry,
    failing closed without the token's claims, and follows any driver namespace."""
    objs = render("components/cliques-off")
    policy = find(objs, "ValidatingAdmissionPolicy", "compute-domain-daemon-status")["spec"]
    binding = find(objs, "ValidatingAdmissionPolicyBinding", "compute-domain-daemon-status")
    assert binding["spec"] == {
        "policyName": "compute-domain-daemon-status",
        "validationActions": ["Deny"],
    }
    assert policy["failurePolicy"] == "Fail"
    [rule] = policy["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["computedomains/status"] and rule["operations"] == ["UPDATE"]
    [cond] = policy["matchConditions"]
    pattern = re.search(r"matches\('([^']+)'\)", cond["expression"])
    assert pattern is not None
    for user, matched in (
        ("system:serviceaccount:nvidia-dra-driver:compute-domain-daemon", True),
        ("system:serviceaccount:other-ns:compute-domain-daemon", True),
        ("system:serviceaccount:nvidia-dra-driver:compute-domain-controller", False),
        ("system:serviceaccount:x:compute-domain-daemon-2", False),
    ):
        assert (re.search(pattern.group(1).replace("$", r"\Z"), user) is not None) == matched
    first, second = (v["expression"] for v in policy["validations"][:2])
    assert first == 'variables.userPodName != ""' and second == 'variables.userNodeName != ""'
    expressions = " ".join(v["expression"] for v in policy["validations"])
    assert "object.metadata.uid == variables.podDomain" in expressions
    variables = {v["name"]: v["expression"] for v in policy["variables"]}
    assert f"'{c.daemon_object_name('')}'" == variables["daemonPrefix"]
    assert "e.?name.orValue('')" in variables["newOthers"]  # status.nodes key: name
    rbac = find(objs, "ClusterRole", "compute-domain-daemon-status")
    assert {r["resources"][0] for r in rbac["rules"]} == {"computedomains", "computedomains/status"}
