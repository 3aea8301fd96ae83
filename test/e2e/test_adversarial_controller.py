"""A compromised controller against the real API server.

The controller's RBAC lets it create DaemonSets in the driver namespace, patch every node and
create ResourceClaimTemplates everywhere. The policies of config/admission/controller-*.yaml
pin what it may put there; these tests send, as the controller's ServiceAccount (admin
credentials with ``Impersonate-User``, every write a server-side dry run so nothing changes),
what a compromised controller would and what the real one does:

* its real daemon DaemonSet (``pkg.reconcilers.objects.render_daemonset`` with the options the
  controller parses from its Deployment's env) is accepted; the same DaemonSet with a hostPath,
  a PVC, privileged, privilege escalation, an added capability, hostNetwork, a hostPort, another
  image (also in an init container), another ServiceAccount, another name or a foreign claim is
  refused with the rule's message;
* node patches of its two labels (and its clique annotation) are accepted; another label,
  another annotation, a taint, ``unschedulable`` or a computeDomain value that is no UID are
  refused;
* its workload and daemon ResourceClaimTemplates are accepted; another DeviceClass,
  ``firstAvailable``, ``adminAccess`` or another driver's opaque config are refused;
* the per-namespace quota example (``config/samples/quota``) is accepted by the API server and
  bounds a namespace's ComputeDomains.

That the controller still forms domains under these policies is shown by every formation test
of the suite (the session controller runs as this ServiceAccount), e.g.
``test_happy_path.py::test_cd_forms_runs_and_tears_down``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import secrets
import uuid
from typing import Any

import pytest
from kubeletsim import NodeFleet
from localcluster import Cluster
from testsupport.e2e_support import (
    REPO,
    Driver,
    compute_domain,
    impersonated_request,
    render_config,
    wait_for,
)

from pkg.api import constants as c
from pkg.api.computedomain import parse_compute_domain
from pkg.kube.client import KubeClient
from pkg.kube.errors import ConflictError, ForbiddenError
from pkg.kube.resources import (
    COMPUTE_DOMAINS,
    DAEMONSETS,
    NAMESPACES,
    NODES,
    RESOURCE_CLAIM_TEMPLATES,
    Resource,
)
from pkg.reconcilers.flags import parse_options
from pkg.reconcilers.objects import render_daemon_rct, render_daemonset, render_workload_rct

pytestmark = pytest.mark.e2e

CONTROLLER = "compute-domain-controller"
FORBIDDEN = 403

Obj = dict[str, Any]


def _as_controller(
    cluster: Cluster, method: str, path: str, body: Obj, content_type: str = "application/json"
) -> tuple[int, str]:
    """A dry-run request as the controller's ServiceAccount (admin impersonating it); on an
    error the Status message (JSON escapes such as \\u003c undone) instead of the body."""
    user = cluster.service_account_identity(CONTROLLER).user
    status, text = impersonated_request(
        cluster, method, f"{path}?dryRun=All", body, user=user, content_type=content_type
    )
    if status < 300:
        return status, text
    try:
        return status, str(json.loads(text)["message"])
    except (ValueError, KeyError):
        return status, text


def _create(cluster: Cluster, resource: Any, obj: Obj) -> tuple[int, str]:
    path = resource.path(namespace=obj["metadata"].get("namespace"))
    return _as_controller(cluster, "POST", path, obj)


def _options(driver: Driver) -> Any:
    """What the controller parses from its Deployment (the env the session controller runs with)."""
    env = driver.controller_env(kubeconfig=driver.kubeconfig, http_port=1)
    args = [
        a.replace("$(LOG_VERBOSITY)", env.get("LOG_VERBOSITY", "1"))
        for a in driver.controller_args()
    ]
    return parse_options(args, env)


def _domain(ns: str) -> Any:
    return parse_compute_domain(
        {
            "apiVersion": c.API_VERSION,
            "kind": c.COMPUTE_DOMAIN_KIND,
            "metadata": {"name": "victim", "namespace": ns, "uid": str(uuid.uuid4())},
            "spec": {
                "numNodes": 0,
                "channel": {"resourceClaimTemplate": {"name": "victim-channel"}},
            },
        }
    )


def _pod(ds: Obj) -> Obj:
    spec: Obj = ds["spec"]["template"]["spec"]
    return spec


def _tamper(ds: Obj, change: Any) -> Obj:
    out = copy.deepcopy(ds)
    change(out)
    return out


def test_controller_may_create_only_its_daemon_daemonsets(cluster: Cluster, driver: Driver) -> None:
    config = _options(driver).controller
    assert config.namespace == driver.namespace
    real = render_daemonset(_domain("team"), config)
    wait_for(
        "the controller DaemonSet policy to deny a hostPath",
        lambda: (
            _create(
                cluster,
                DAEMONSETS,
                _tamper(
                    real,
                    lambda d: (
                        _pod(d)
                        .setdefault("volumes", [])
                        .append({"name": "root", "hostPath": {"path": "/"}})
                    ),
                ),
            )[0]
            == FORBIDDEN
        ),
        timeout=30,
    )
    status, text = _create(cluster, DAEMONSETS, real)
    assert status == 201, text

    def ctr(d: Obj) -> Obj:
        first: Obj = _pod(d)["containers"][0]
        return first

    def security(d: Obj, **fields: Any) -> None:
        ctr(d).setdefault("securityContext", {}).update(fields)

    volumes = "may use only emptyDir, configMap and downwardAPI volumes"
    privilege = "must drop ALL capabilities and add none, set allowPrivilegeEscalation false"
    host = "may not use hostNetwork, hostPID, hostIPC or a hostPort"
    cases: dict[str, tuple[Any, str]] = {
        "hostPath": (
            lambda d: (
                _pod(d)
                .setdefault("volumes", [])
                .append({"name": "root", "hostPath": {"path": "/"}})
            ),
            volumes,
        ),
        "persistentVolumeClaim": (
            lambda d: (
                _pod(d)
                .setdefault("volumes", [])
                .append({"name": "pv", "persistentVolumeClaim": {"claimName": "host"}})
            ),
            volumes,
        ),
        "secret": (
            lambda d: (
                _pod(d)
                .setdefault("volumes", [])
                .append({"name": "s", "secret": {"secretName": "anything"}})
            ),
            volumes,
        ),
        "privileged": (
            lambda d: security(d, privileged=True, allowPrivilegeEscalation=True),
            privilege,
        ),
        "allowPrivilegeEscalation": (
            lambda d: security(d, allowPrivilegeEscalation=True),
            privilege,
        ),
        "capabilities.add": (
            lambda d: security(d, capabilities={"drop": ["ALL"], "add": ["SYS_ADMIN"]}),
            privilege,
        ),
        "capabilities not dropped": (lambda d: security(d, capabilities={}), privilege),
        "no securityContext": (lambda d: ctr(d).pop("securityContext"), privilege),
        "seccomp Unconfined": (
            lambda d: security(d, seccompProfile={"type": "Unconfined"}),
            privilege,
        ),
        # The API server refuses the pod's reserved-ports sysctl with hostNetwork: drop it.
        "hostNetwork": (
            lambda d: (_pod(d).update(hostNetwork=True), _pod(d).pop("securityContext")),
            host,
        ),
        "another sysctl": (
            lambda d: _pod(d)["securityContext"]["sysctls"].append(
                {"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}
            ),
            "may set only the sysctl net.ipv4.ip_local_reserved_ports",
        ),
        "hostPID": (lambda d: _pod(d).update(hostPID=True), host),
        "hostPort": (
            lambda d: ctr(d).update(ports=[{"containerPort": 50000, "hostPort": 50000}]),
            host,
        ),
        "other image": (
            lambda d: ctr(d).update(image="registry.example/miner:1"),
            f"may run only the image {config.image_name}",
        ),
        "other image in an init container": (
            lambda d: _pod(d).update(
                initContainers=[
                    {
                        "name": "init",
                        "image": "registry.example/miner:1",
                        "securityContext": copy.deepcopy(ctr(d)["securityContext"]),
                    }
                ]
            ),
            f"may run only the image {config.image_name}",
        ),
        "other ServiceAccount": (
            lambda d: _pod(d).update(serviceAccountName=CONTROLLER),
            f"must run as ServiceAccount {config.daemon_service_account}",
        ),
        "other name": (
            lambda d: d["metadata"].update(name="miner"),
            "may create only DaemonSets named computedomain-daemon-<ComputeDomain UID>",
        ),
        "another domain's claim": (
            lambda d: _pod(d)["resourceClaims"][0].update(
                resourceClaimTemplateName=c.daemon_object_name(str(uuid.uuid4()))
            ),
            "may claim devices only through their own daemon ResourceClaimTemplate",
        ),
    }
    for case, (change, rule) in cases.items():
        status, text = _create(cluster, DAEMONSETS, _tamper(real, change))
        assert status == FORBIDDEN and rule in text, (case, status, text)
    # RBAC alone keeps it out of every other namespace.
    elsewhere = _tamper(real, lambda d: d["metadata"].update(namespace="default"))
    status, text = _create(cluster, DAEMONSETS, elsewhere)
    assert status == FORBIDDEN and "cannot create resource" in text, text


def test_controller_may_patch_only_its_node_labels(cluster: Cluster, fleet: NodeFleet) -> None:
    node = sorted(n.name for n in fleet)[0]
    path = NODES.path(name=node)

    def patch(metadata: Obj, spec: Obj | None = None) -> tuple[int, str]:
        body: Obj = {"metadata": metadata, **({"spec": spec} if spec is not None else {})}
        return _as_controller(cluster, "PATCH", path, body, "application/merge-patch+json")

    only = "may change only the resource.nvidia.com/computeDomain and nvidia.com/gpu.clique"
    wait_for(
        "the controller node policy to deny another label",
        lambda: patch({"labels": {"nvidia.com/gpu.product": "x"}})[0] == FORBIDDEN,
        timeout=30,
    )
    accepted: dict[str, Obj] = {
        "computeDomain": {"labels": {c.COMPUTE_DOMAIN_LABEL: str(uuid.uuid4())}},
        "computeDomain removed": {"labels": {c.COMPUTE_DOMAIN_LABEL: None}},
        "clique label with its annotation": {
            "labels": {c.GPU_CLIQUE_NODE_LABEL: "clique-x"},
            "annotations": {c.GPU_CLIQUE_MANAGED_ANNOTATION: "true"},
        },
    }
    for case, metadata in accepted.items():
        status, text = patch(metadata)
        assert status == 200, (case, text)
    refused: dict[str, tuple[Obj, Obj | None, str]] = {
        "other label": ({"labels": {"node-role.kubernetes.io/control-plane": ""}}, None, only),
        "label removed": ({"labels": {"kubernetes.io/hostname": None}}, None, only),
        "computeDomain not a UID": (
            {"labels": {c.COMPUTE_DOMAIN_LABEL: "other-domain"}},
            None,
            "only to a ComputeDomain UID",
        ),
        "other annotation": (
            {"annotations": {"example.com/x": "y"}},
            None,
            "may not change node annotations",
        ),
        "clique annotation taken for the plugin": (
            {"annotations": {c.GPU_CLIQUE_MANAGED_ANNOTATION: "kubelet-plugin"}},
            None,
            "may not change node annotations",
        ),
        "taint": (
            {},
            {"taints": [{"key": "evil", "effect": "NoExecute"}]},
            "finalizers, owner references or spec",
        ),
        "unschedulable": ({}, {"unschedulable": True}, "finalizers, owner references or spec"),
    }
    for case, (metadata, spec, rule) in refused.items():
        status, text = patch(metadata, spec)
        assert status == FORBIDDEN and rule in text, (case, status, text)


def test_controller_claim_templates_only_for_its_device_classes(
    cluster: Cluster, admin: KubeClient, driver: Driver
) -> None:
    ns = f"tenant-{secrets.token_hex(3)}"
    admin.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    try:
        cd = _domain(ns)
        workload = render_workload_rct(cd)
        rule = "may request only the DeviceClasses"

        def other_class(t: Obj) -> None:
            t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = (
                "gpu.nvidia.com"
            )

        wait_for(
            "the controller template policy to deny another class",
            lambda: (
                _create(cluster, RESOURCE_CLAIM_TEMPLATES, _tamper(workload, other_class))[0]
                == FORBIDDEN
            ),
            timeout=30,
        )
        status, text = _create(cluster, RESOURCE_CLAIM_TEMPLATES, workload)
        assert status == 201, text
        daemon = render_daemon_rct(cd, _options(driver).controller)
        status, text = _create(cluster, RESOURCE_CLAIM_TEMPLATES, daemon)
        assert status == 201, text

        def first_available(t: Obj) -> None:
            [request] = t["spec"]["spec"]["devices"]["requests"]
            request["firstAvailable"] = [{"name": "any", "deviceClassName": "gpu.nvidia.com"}]
            del request["exactly"]

        def admin_access(t: Obj) -> None:
            t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] = True

        def foreign_config(t: Obj) -> None:
            t["spec"]["spec"]["devices"]["config"][0]["opaque"]["driver"] = "gpu.nvidia.com"

        cases = {
            "other DeviceClass": (other_class, rule),
            "firstAvailable": (first_available, rule),
            "adminAccess": (admin_access, rule),
            "another driver's config": (foreign_config, "only opaque configs of"),
        }
        for case, (change, why) in cases.items():
            status, text = _create(cluster, RESOURCE_CLAIM_TEMPLATES, _tamper(workload, change))
            # adminAccess may be refused earlier by the API server itself (namespace not
            # labelled for admin access); any refusal will do there.
            ok = status in (FORBIDDEN, 422) if case == "adminAccess" else status == FORBIDDEN
            assert ok and (case == "adminAccess" or why in text), (case, status, text)
    finally:
        admin.delete(NAMESPACES, ns)


RESOURCE_QUOTAS = Resource("", "v1", "resourcequotas", "ResourceQuota", namespaced=True)


def test_quota_sample_bounds_a_namespaces_domains(admin: KubeClient, driver: Driver) -> None:
    """The sample quota as shipped passes the API server, and its ComputeDomain count bites
    (lowered to 1 here); the domain it admits still gets its template under the template quota."""
    ns = f"quota-{secrets.token_hex(3)}"
    admin.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    try:
        [quota] = render_config(REPO / "config" / "samples" / "quota")
        quota["metadata"]["namespace"] = ns
        cds = "count/computedomains.resource.nvidia.com"
        quota["spec"]["hard"][cds] = "1"
        admin.create(RESOURCE_QUOTAS, quota, namespace=ns)

        claims = "count/resourceclaims.resource.k8s.io"
        nudges = iter(range(1, 1000))

        def synced() -> bool:
            status = admin.get(RESOURCE_QUOTAS, quota["metadata"]["name"], namespace=ns)
            keys = set(quota["spec"]["hard"])
            if all(set(status.get("status", {}).get(f, {})) == keys for f in ("hard", "used")):
                return True
            # The quota controller counts a CRD's objects once its discovery has found the CRD
            # (it re-reads discovery every 30 s) and then only at the next sync of this quota:
            # a changed spec.hard asks for one at once.
            status["spec"]["hard"][claims] = str(64 + next(nudges) % 2)
            with contextlib.suppress(ConflictError):
                admin.update(RESOURCE_QUOTAS, status)
            return False

        try:
            wait_for("the quota's status", synced, timeout=120, every=5)
        except AssertionError:
            raise AssertionError(
                admin.get(RESOURCE_QUOTAS, quota["metadata"]["name"], namespace=ns).get("status")
            ) from None
        admin.create(
            COMPUTE_DOMAINS, compute_domain("first", ns, rct="first-channel"), namespace=ns
        )
        wait_for(
            "the first domain's template",
            lambda: any(
                t["metadata"]["name"] == "first-channel"
                for t in admin.list(RESOURCE_CLAIM_TEMPLATES, namespace=ns).get("items", [])
            ),
            timeout=60,
        )

        def second_refused() -> bool:
            name = f"second-{secrets.token_hex(2)}"
            try:
                admin.create(
                    COMPUTE_DOMAINS, compute_domain(name, ns, rct=f"{name}-channel"), namespace=ns
                )
            except ForbiddenError as err:
                assert "exceeded quota" in str(err), err
                return True
            admin.delete(COMPUTE_DOMAINS, name, namespace=ns)  # usage not yet counted
            return False

        wait_for("the second domain to exceed the quota", second_refused, timeout=60)
    finally:
        for cd in admin.list(COMPUTE_DOMAINS, namespace=ns).get("items", []):
            admin.delete(COMPUTE_DOMAINS, cd["metadata"]["name"], namespace=ns)
        wait_for(
            "the domains gone",
            lambda: not admin.list(COMPUTE_DOMAINS, namespace=ns).get("items"),
            timeout=60,
        )
        admin.delete(NAMESPACES, ns)
