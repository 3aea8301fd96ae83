"""The deployment manifests against the real API server: schema, RBAC matrix, admission policies.

* Every object ``kubectl kustomize`` renders for ``config/default``, ``config/overlays/*`` and
  ``config/samples`` passes a server-side dry-run apply (OpenAPI schema, CEL, defaulting,
  admission) -- including the controller Deployment and plugin DaemonSet the suite otherwise
  runs as local processes.
* For each component ServiceAccount the real authorizer is asked (``SubjectAccessReview``) about
  every verb on every resource the driver touches plus sensitive ones, in the driver namespace,
  a user namespace, all namespaces and cluster scope; the allowed set must equal the reviewed
  table below exactly, so any extra power (or a missing one) fails.
* The ValidatingAdmissionPolicies really bite: requests impersonating the plugin / daemon with
  the node-name / pod-name claims of a pod-bound token are allowed only for their own node /
  pod and label, and denied without the claim; ResourceClaims and templates asking for the IMEX
  daemon device are denied outside the driver namespace (all as dry-run, so nothing changes).

Runs on the session cluster and deployed driver of ``conftest.py``.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubeletsim import NodeFleet
from localcluster import Cluster
from testsupport.e2e_support import (
    KUBECTL,
    REPO,
    Driver,
    impersonated_request,
    render_config,
    wait_for,
)

from pkg.api import constants as c
from pkg.kube.client import KubeClient
from pkg.kube.errors import NotFoundError
from pkg.kube.resources import NAMESPACES, PODS, Resource

pytestmark = pytest.mark.e2e

SAR = Resource(
    "authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", namespaced=False
)
OTHER_NS = "some-user-namespace"  # never created: authorization does not need it
ALL_NS = ""  # SAR namespace "" on a namespaced resource = across all namespaces
CLUSTER = None  # cluster-scoped resource
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
LEASE = "compute-domain-controller"

# (group, resource, namespaced).  Everything the driver touches, plus what it must never touch.
UNIVERSE: tuple[tuple[str, str, bool], ...] = (
    ("resource.nvidia.com", "computedomains", True),
    ("resource.nvidia.com", "computedomains/status", True),
    ("resource.nvidia.com", "computedomaincliques", True),
    ("resource.k8s.io", "resourceclaimtemplates", True),
    ("resource.k8s.io", "resourceclaims", True),
    ("resource.k8s.io", "resourceclaims/status", True),
    ("resource.k8s.io", "resourceslices", False),
    ("resource.k8s.io", "deviceclasses", False),
    ("apps", "daemonsets", True),
    ("apps", "deployments", True),
    ("coordination.k8s.io", "leases", True),
    ("", "pods", True),
    ("", "pods/status", True),
    ("", "pods/exec", True),
    ("", "pods/eviction", True),
    ("", "nodes", False),
    ("", "nodes/status", False),
    ("", "events", True),
    ("events.k8s.io", "events", True),
    ("", "secrets", True),
    ("", "configmaps", True),
    ("", "serviceaccounts", True),
    ("", "serviceaccounts/token", True),
    ("", "namespaces", False),
    ("rbac.authorization.k8s.io", "roles", True),
    ("rbac.authorization.k8s.io", "clusterroles", False),
    ("rbac.authorization.k8s.io", "rolebindings", True),
    ("admissionregistration.k8s.io", "validatingadmissionpolicies", False),
    ("admissionregistration.k8s.io", "validatingadmissionpolicybindings", False),
    ("apiextensions.k8s.io", "customresourcedefinitions", False),
)

# The reviewed powers: (group, resource, verbs, where).  where = "driver" (Role in the driver
# namespace), "everywhere" (ClusterRole on a namespaced resource: every namespace and across
# namespaces) or "cluster" (cluster-scoped resource).
Grant = tuple[str, str, str, str]
EXPECTED: dict[str, list[Grant]] = {
    "compute-domain-controller": [
        ("resource.nvidia.com", "computedomains", "get list watch update", "everywhere"),
        ("resource.nvidia.com", "computedomains/status", "update", "everywhere"),
        (
            "resource.k8s.io",
            "resourceclaimtemplates",
            "get list watch create update delete",
            "everywhere",
        ),
        ("resource.k8s.io", "resourceclaims", "list watch", "everywhere"),
        ("resource.k8s.io", "resourceslices", "list watch", "cluster"),
        ("", "nodes", "list watch patch", "cluster"),
        ("", "events", "create patch", "everywhere"),
        ("apps", "daemonsets", "get list watch create update delete", "driver"),
        ("", "pods", "list watch", "driver"),
        ("resource.nvidia.com", "computedomaincliques", "list watch create update patch", "driver"),
        ("coordination.k8s.io", "leases", "create", "driver"),
        ("coordination.k8s.io", f"leases@{LEASE}", "get update", "driver"),
    ],
    "compute-domain-kubelet-plugin": [
        ("resource.k8s.io", "resourceslices", "list watch create update delete", "cluster"),
        ("resource.k8s.io", "resourceclaims", "get", "everywhere"),
        ("resource.nvidia.com", "computedomains", "list watch", "everywhere"),
        ("", "nodes", "get list watch patch", "cluster"),
        ("resource.nvidia.com", "computedomaincliques", "list watch", "driver"),
    ],
    "compute-domain-daemon": [
        ("", "pods", "patch", "driver"),
        ("", "events", "create", "driver"),
        (
            "resource.nvidia.com",
            "computedomaincliques",
            "get list watch create update patch",
            "driver",
        ),
    ],
}

Query = tuple[str, str, str, str | None, str]  # group, resource, verb, namespace, name


def _queries(driver_ns: str) -> Iterator[Query]:
    for group, resource, namespaced in UNIVERSE:
        scopes: tuple[str | None, ...] = (driver_ns, OTHER_NS, ALL_NS) if namespaced else (CLUSTER,)
        names = ("", LEASE, "someone-elses-lease") if resource == "leases" else ("",)
        for verb in VERBS:
            for ns in scopes:
                for name in names:
                    if name and verb in ("list", "watch", "create", "deletecollection"):
                        continue
                    yield group, resource, verb, ns, name


def _expected(sa: str, driver_ns: str) -> set[Query]:
    allowed: set[Query] = set()
    for group, res, verbs, where in EXPECTED[sa]:
        resource, _, name = res.partition("@")
        scopes: tuple[str | None, ...] = {
            "driver": (driver_ns,),
            "everywhere": (driver_ns, OTHER_NS, ALL_NS),
            "cluster": (CLUSTER,),
        }[where]
        for verb in verbs.split():
            for ns in scopes:
                allowed.add((group, resource, verb, ns, name))
                if not name and resource == "leases" and verb not in ("create", "list", "watch"):
                    # An unnamed grant also covers every named request.
                    allowed.update(
                        (group, resource, verb, ns, n) for n in (LEASE, "someone-elses-lease")
                    )
    return allowed


def _allowed(admin: KubeClient, user: str, groups: list[str], q: Query) -> bool:
    group, resource, verb, ns, name = q
    res, _, sub = resource.partition("/")
    attrs: dict[str, Any] = {"group": group, "resource": res, "verb": verb}
    if sub:
        attrs["subresource"] = sub
    if ns is not None:
        attrs["namespace"] = ns
    if name:
        attrs["name"] = name
    review = admin.create(
        SAR,
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": groups, "resourceAttributes": attrs},
        },
    )
    return bool(review["status"].get("allowed"))


@pytest.mark.parametrize("sa", sorted(EXPECTED))
def test_rbac_matrix_has_no_extra_power(
    cluster: Cluster, admin: KubeClient, driver: Driver, sa: str
) -> None:
    ns = driver.namespace
    ident = cluster.service_account_identity(sa)
    groups = [*ident.groups, "system:authenticated"]
    allowed = {q for q in _queries(ns) if _allowed(admin, ident.user, groups, q)}
    expected = _expected(sa, ns)
    extra, missing = sorted(allowed - expected, key=str), sorted(expected - allowed, key=str)
    assert not extra, f"{sa} may do more than reviewed: {extra}"
    assert not missing, f"{sa} lacks reviewed permissions: {missing}"


# -- server-side dry-run ---------------------------------------------------------------------


def _dry_run_apply(
    cluster: Cluster, docs: list[dict[str, Any]], namespace: str | None = None
) -> str:
    args = [
        str(KUBECTL),
        f"--kubeconfig={cluster.kubeconfig('admin')}",
        "apply",
        "--server-side",
        "--dry-run=server",
        "--force-conflicts",
        "--field-manager=test-deploy-config",
        "-o",
        "name",
        "-f",
        "-",
    ]
    if namespace:
        args[2:2] = ["-n", namespace]
    done = subprocess.run(
        args,
        input=yaml.safe_dump_all(docs),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, f"server-side dry-run rejected:\n{done.stderr}"
    return done.stdout


@pytest.mark.parametrize("rel", ["default", "overlays/kind-fake-gpu"])
def test_every_rendered_object_passes_server_side_dry_run(
    cluster: Cluster, driver: Driver, rel: str
) -> None:
    docs = render_config(REPO / "config" / rel)
    out = _dry_run_apply(cluster, docs).split()
    assert len(out) == len(docs), out
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "DaemonSet", "ValidatingAdmissionPolicy", "DeviceClass"} <= kinds


def test_samples_pass_server_side_dry_run(
    cluster: Cluster, admin: KubeClient, driver: Driver
) -> None:
    ns = f"samples-{secrets.token_hex(3)}"
    admin.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    try:
        docs = render_config(REPO / "config" / "samples")
        for d in docs:
            d["metadata"]["namespace"] = ns
        assert len(_dry_run_apply(cluster, docs, ns).split()) == len(docs)
    finally:
        admin.delete(NAMESPACES, ns)


# -- admission policies ------------------------------------------------------------------------


def _as(
    cluster: Cluster, sa: str, extra: dict[str, str], args: list[str], stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    ident = cluster.service_account_identity(sa)
    cmd = [
        str(KUBECTL),
        f"--kubeconfig={cluster.kubeconfig('admin')}",
        f"--as={ident.user}",
        *(f"--as-group={g}" for g in ident.groups),
        *(f"--as-user-extra={k}={v}" for k, v in extra.items()),
        *args,
    ]
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=False, timeout=60)


NODE_CLAIM = "authentication.kubernetes.io/node-name"
POD_CLAIM = "authentication.kubernetes.io/pod-name"


def _slice(node: str, driver_name: str = c.DRIVER_NAME) -> str:
    return json.dumps(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"test-deploy-config-{secrets.token_hex(3)}"},
            "spec": {
                "driver": driver_name,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "channel-0"}],
            },
        }
    )


def _denied(done: subprocess.CompletedProcess[str], why: str) -> bool:
    return done.returncode != 0 and why in done.stderr


def test_plugin_may_write_only_its_own_nodes_slices(
    cluster: Cluster, driver: Driver, fleet: NodeFleet
) -> None:
    me, other = sorted(n.name for n in fleet)[:2]
    plugin, create = "compute-domain-kubelet-plugin", ["create", "--dry-run=server", "-f", "-"]
    own = _as(cluster, plugin, {NODE_CLAIM: me}, create, _slice(me))
    assert own.returncode == 0, own.stderr
    wait_for(
        "the slice policy to deny another node's slice",
        lambda: _denied(
            _as(cluster, plugin, {NODE_CLAIM: me}, create, _slice(other)),
            f"may not modify ResourceSlices of node '{other}'",
        ),
        timeout=30,
    )
    assert _denied(_as(cluster, plugin, {}, create, _slice(me)), "no node-name claim")
    assert _denied(
        _as(cluster, plugin, {NODE_CLAIM: me}, create, _slice(me, "gpu.nvidia.com")),
        "may not modify ResourceSlices of driver 'gpu.nvidia.com'",
    )


def test_plugin_may_label_only_its_own_node_with_its_two_labels(
    cluster: Cluster, driver: Driver, fleet: NodeFleet
) -> None:
    me, other = sorted(n.name for n in fleet)[:2]
    plugin = "compute-domain-kubelet-plugin"
    only = "may change only the resource.nvidia.com/computeDomain and nvidia.com/gpu.clique"

    def label(node: str, key: str, claim: dict[str, str]) -> subprocess.CompletedProcess[str]:
        body = json.dumps({"metadata": {"labels": {key: "x"}}})
        return _as(
            cluster,
            plugin,
            claim,
            ["patch", "node", node, "--type=merge", "-p", body, "--dry-run=server"],
        )

    for key in (c.COMPUTE_DOMAIN_LABEL, c.GPU_CLIQUE_NODE_LABEL):
        ok = label(me, key, {NODE_CLAIM: me})
        assert ok.returncode == 0, ok.stderr
        assert _denied(label(other, key, {NODE_CLAIM: me}), f"may not modify node '{other}'")
    assert _denied(label(me, "nvidia.com/gpu.product", {NODE_CLAIM: me}), only)
    assert _denied(label(me, c.GPU_CLIQUE_NODE_LABEL, {}), "no node-name claim")

    def annotate(node: str, value: str) -> subprocess.CompletedProcess[str]:
        """The merge patch --gpu-clique-label-enabled sends: label plus owner mark."""
        body = json.dumps(
            {
                "metadata": {
                    "labels": {c.GPU_CLIQUE_NODE_LABEL: "x"},
                    "annotations": {c.GPU_CLIQUE_MANAGED_ANNOTATION: value},
                }
            }
        )
        return _as(
            cluster,
            plugin,
            {NODE_CLAIM: me},
            ["patch", "node", node, "--type=merge", "-p", body, "--dry-run=server"],
        )

    marked = annotate(me, c.GPU_CLIQUE_MANAGED_BY_PLUGIN)
    assert marked.returncode == 0, marked.stderr
    assert _denied(annotate(me, "some-other-owner"), "may not change node annotations")
    assert _denied(
        annotate(other, c.GPU_CLIQUE_MANAGED_BY_PLUGIN), f"may not modify node '{other}'"
    )
    other_annotation = json.dumps({"metadata": {"annotations": {"example.com/x": "y"}}})
    assert _denied(
        _as(
            cluster,
            plugin,
            {NODE_CLAIM: me},
            ["patch", "node", me, "--type=merge", "-p", other_annotation, "--dry-run=server"],
        ),
        "may not change node annotations",
    )


def _claim_docs(namespace: str) -> dict[str, dict[str, Any]]:
    """ResourceClaims/-Templates the daemon-device policy must refuse outside the driver
    namespace (and one channel claim it must let through), by case name."""

    def claim(devices: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": f"daemon-device-{secrets.token_hex(3)}", "namespace": namespace},
            "spec": {"devices": devices},
        }

    def template(devices: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": f"daemon-device-{secrets.token_hex(3)}", "namespace": namespace},
            "spec": {"spec": {"devices": devices}},
        }

    exactly = {"requests": [{"name": "d", "exactly": {"deviceClassName": c.DAEMON_DEVICE_CLASS}}]}
    first = {
        "requests": [
            {
                "name": "d",
                "firstAvailable": [
                    {"name": "a", "deviceClassName": c.CHANNEL_DEVICE_CLASS},
                    {"name": "b", "deviceClassName": c.DAEMON_DEVICE_CLASS},
                ],
            }
        ]
    }
    channel = {"requests": [{"name": "c", "exactly": {"deviceClassName": c.CHANNEL_DEVICE_CLASS}}]}
    with_config = {
        **channel,
        "config": [
            {
                "requests": [],
                "opaque": {
                    "driver": c.DRIVER_NAME,
                    "parameters": {
                        "apiVersion": c.API_VERSION,
                        "kind": c.DAEMON_CONFIG_KIND,
                        "domainID": "00000000-0000-4000-8000-000000000000",
                    },
                },
            }
        ],
    }
    return {
        "claim exactly": claim(exactly),
        "claim firstAvailable": claim(first),
        "claim daemon config": claim(with_config),
        "template exactly": template(exactly),
        "template firstAvailable": template(first),
        "template daemon config": template(with_config),
        "channel claim": claim(channel),
    }


def _dry_run_create(cluster: Cluster, doc: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(KUBECTL),
            f"--kubeconfig={cluster.kubeconfig('admin')}",
            "create",
            "--dry-run=server",
            "-o",
            "name",
            "-f",
            "-",
        ],
        input=json.dumps(doc),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_daemon_device_claims_only_in_the_driver_namespace(
    cluster: Cluster, admin: KubeClient, driver: Driver
) -> None:
    """Even a cluster admin cannot ask for the IMEX daemon device, or carry a
    ComputeDomainDaemonConfig, outside the driver namespace; the controller's templates there
    (and channel claims everywhere) still pass."""
    ns = f"tenant-{secrets.token_hex(3)}"
    admin.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    try:
        docs = _claim_docs(ns)
        rule = "ComputeDomain daemon claims are only allowed in the driver namespace"
        wait_for(
            "the daemon-device policy to deny",
            lambda: _denied(_dry_run_create(cluster, docs["claim exactly"]), rule),
            timeout=30,
        )
        for case, doc in docs.items():
            done = _dry_run_create(cluster, doc)
            if case == "channel claim":
                assert done.returncode == 0, done.stderr
            else:
                assert _denied(done, rule), (case, done.returncode, done.stderr)
        for case, doc in _claim_docs(driver.namespace).items():
            done = _dry_run_create(cluster, doc)
            assert done.returncode == 0, (case, done.stderr)
    finally:
        admin.delete(NAMESPACES, ns)


def _patch_as(
    cluster: Cluster, sa: str, extra: dict[str, str], path: str, body: dict[str, Any]
) -> tuple[int, str]:
    """A dry-run merge PATCH as ``sa`` with ``extra`` claims (kubectl patch would GET first,
    which the daemon may not).  Groups are not impersonated: RBAC binds the user."""
    user = cluster.service_account_identity(sa).user
    merge = "application/merge-patch+json"
    return impersonated_request(
        cluster, "PATCH", f"{path}?dryRun=All", body, user=user, extra=extra, content_type=merge
    )


def test_daemon_may_label_only_its_own_pod(
    cluster: Cluster, admin: KubeClient, driver: Driver
) -> None:
    ns = driver.namespace
    names = [f"test-deploy-config-{i}-{secrets.token_hex(2)}" for i in range(2)]
    for name in names:  # held by a scheduling gate: never scheduled, never run
        admin.create(
            PODS,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": ns},
                "spec": {
                    "schedulingGates": [{"name": "test/hold"}],
                    "containers": [{"name": "c", "image": "busybox"}],
                },
            },
            namespace=ns,
        )
    try:
        me, other = names

        def label(pod: str, key: str, claim: dict[str, str], where: str = ns) -> tuple[int, str]:
            body = {"metadata": {"labels": {key: "x"}}}
            return _patch_as(
                cluster, "compute-domain-daemon", claim, PODS.path(namespace=where, name=pod), body
            )

        status, text = label(me, c.CLIQUE_ID_LABEL, {POD_CLAIM: me})
        assert status == 200, text
        status, text = label(other, c.CLIQUE_ID_LABEL, {POD_CLAIM: me})
        assert status == 403 and f"may not modify pod '{other}'" in text, text
        status, text = label(me, "app", {POD_CLAIM: me})
        assert status == 403 and "may change only the resource.nvidia.com/computeDomain" in text
        status, text = label(me, c.CLIQUE_ID_LABEL, {})
        assert status == 403 and "no pod-name claim" in text, text
        # RBAC alone already stops the daemon outside the driver namespace.
        status, text = label(me, c.CLIQUE_ID_LABEL, {POD_CLAIM: me}, where="default")
        assert status == 403 and "cannot patch resource" in text, text
    finally:
        for name in names:
            with contextlib.suppress(NotFoundError):
                admin.delete(PODS, name, namespace=ns, grace_period_seconds=0)
