"""A tenant with ``edit`` in its own namespace attacks the driver.

On the session's real control plane (kube-apiserver with RBAC and the driver's admission
policies, scheduler, controller-manager), the deployed driver (local controller) and the
simulated nodes (``kubeletsim``: the kubelet stand-in drives the real kubelet plugin over DRA
gRPC, writes CDI specs and a checkpoint into the node's directories). Setup, per module:

* namespace ``victim-*``: a ComputeDomain created by the admin with one workload pod on
  ``VICTIM_NODE``, Running with its channel, the domain Ready;
* namespace ``mallory-*``: the ServiceAccount ``mallory``, bound by a RoleBinding to the
  built-in ClusterRole ``edit``, which covers ResourceClaims, ResourceClaimTemplates and pods
  and, through the driver's ``compute-domain-edit`` (aggregated, config/rbac/user-roles.yaml),
  ComputeDomains (checked with SubjectAccessReviews; a kind it lacked would get a Role of its
  own, and the first test would fail).

Every attack is a request the admin credentials send impersonating
``system:serviceaccount:<mallory-ns>:mallory`` with the groups ``system:serviceaccounts``,
``system:serviceaccounts:<mallory-ns>`` and ``system:authenticated`` -- exactly the identity a
token of that ServiceAccount authenticates as. Each must end in a refusal where she looks, with
its exact status and message, and change nothing elsewhere:

1. ResourceClaims and ResourceClaimTemplates asking for the daemon DeviceClass (``exactly``,
   a ``firstAvailable`` subrequest) or carrying a ``ComputeDomainDaemonConfig``: 403 from the
   ValidatingAdmissionPolicy ``compute-domain-daemon-device-claims`` (her plain channel claim
   passes, so it is the policy and not RBAC that refuses; older served versions of
   ``resource.k8s.io`` are tried too -- Kubernetes 1.37 serves only v1);
2. writes into the driver namespace (ComputeDomainClique create/patch/delete, DaemonSet, pod and
   claim create, Secret, pod and template reads) and onto shared objects (node label, every
   ResourceSlice, the victim's domain, her own domain's status): 403 from RBAC; the victim's
   clique and domain status are unchanged;
3. a channel claim naming the victim's domain UID (with the toleration of that domain's
   channel taint, so the scheduler puts it on the victim's node beside the victim's pod): her pod
   never starts; its ``FailedPrepareDynamicResources`` Event (read as mallory) carries the
   permanent Prepare error ``the ResourceClaim's namespace is different than the ComputeDomain's
   namespace`` naming neither the victim's namespace nor its domain; no CDI spec, checkpoint entry
   or node label for her claim; the node's CDI specs, the victim's checkpoint entries, the
   plugin directory, the victim's clique, domain status and pod are what they were. The same
   claim on a free node of the victim's clique (``LURE_NODE``) is refused the same way and does
   not label that node, so the victim's DaemonSet does not grow onto it. The controller's Warning
   on her claims names nothing of the victim, its Warning on the victim's domain nothing of hers;
4. channel claims whose ``domainID`` is a path (``/var/run/cdi``, ``../x``): admitted (no policy
   reads channel configs), then a permanent Prepare error naming the field ``domainID``; nothing
   is created on the node (no CDI spec, checkpoint entry, label, directory; ``/var/run/cdi``
   unchanged);
5. her own ComputeDomain with an absurd ``numNodes``: 422 from the CRD schema.

The module's teardown deletes both namespaces' domains and pods and requires
``e2e_support.leak_report`` to come back empty (no CDI claim spec, checkpoint entry, node label,
daemon object left anywhere).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import secrets
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubeletsim import NodeFleet
from kubeletsim.node import SimulatedNode
from localcluster import Cluster
from testsupport.e2e_support import (
    Driver,
    channels_seen,
    compute_domain,
    impersonated_request,
    leak_report,
    pod_phase,
    pod_ready,
    teardown_namespace,
    wait_for,
    workload_pod,
)
from testsupport.workloads import (
    Workload,
    create_cd,
    start_pods,
    wait_bound,
    wait_cd_ready,
    wait_running,
)

from pkg.api import constants as c
from pkg.api.channelshare import channel_toleration
from pkg.api.computedomain import MAX_NUM_NODES
from pkg.kube.client import KubeClient
from pkg.kube.errors import NotFoundError
from pkg.kube.resources import (
    COMPUTE_DOMAIN_CLIQUES,
    COMPUTE_DOMAINS,
    DAEMONSETS,
    EVENTS,
    NAMESPACES,
    NODES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    SECRETS,
    Resource,
)

pytestmark = pytest.mark.e2e

VICTIM_NODE = "gpu-node-3"  # the victim's pod and mallory's cross-tenant claim
SPARE_NODE = "gpu-node-4"  # mallory's path-domainID claims (no domain there)
LURE_NODE = "gpu-node-2"  # a free node of the victim's clique she tries to pull it onto
ATTACKER = "mallory"
DAEMON_POLICY = "compute-domain-daemon-device-claims"
DAEMON_RULE = "ComputeDomain daemon claims are only allowed in the driver namespace"
CROSS_NS = "the ResourceClaim's namespace is different than the ComputeDomain's namespace"
SAR = Resource(
    "authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", namespaced=False
)
ROLES = Resource("rbac.authorization.k8s.io", "v1", "roles", "Role", namespaced=True)
ROLE_BINDINGS = Resource(
    "rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", namespaced=True
)
SERVICE_ACCOUNTS = Resource("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True)
# What a tenant needs to run ComputeDomain workloads in its namespace: (group, resource).
TENANT_KINDS = (
    ("resource.k8s.io", "resourceclaims"),
    ("resource.k8s.io", "resourceclaimtemplates"),
    ("", "pods"),
    ("resource.nvidia.com", "computedomains"),
)
TENANT_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete")


class Tenant:
    """Raw API requests as the admin impersonating a ServiceAccount of the tenant namespace
    (user and all three groups, as its token authenticates)."""

    def __init__(self, cluster: Cluster, namespace: str, name: str = ATTACKER) -> None:
        self.namespace = namespace
        self.user = f"system:serviceaccount:{namespace}:{name}"
        self.groups = (
            "system:serviceaccounts",
            f"system:serviceaccounts:{namespace}",
            "system:authenticated",
        )
        self._cluster = cluster

    def request(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
    ) -> tuple[int, str]:
        return impersonated_request(
            self._cluster,
            method,
            path,
            body,
            user=self.user,
            groups=self.groups,
            content_type=content_type,
        )

    def create(
        self,
        res: Resource,
        doc: dict[str, Any],
        *,
        dry_run: bool = False,
        namespace: str | None = None,
    ) -> tuple[int, str]:
        ns = namespace if namespace is not None else doc["metadata"].get("namespace")
        path = res.path(namespace=ns) + ("?dryRun=All" if dry_run else "")
        return self.request("POST", path, doc)

    def created(self, res: Resource, doc: dict[str, Any]) -> dict[str, Any]:
        status, text = self.create(res, doc)
        assert status == 201, (status, text)
        obj: dict[str, Any] = json.loads(text)
        return obj

    def events(self, name: str) -> list[dict[str, Any]]:
        """Events of her object ``name``, read as she would (``kubectl describe``)."""
        query = urllib.parse.urlencode({"fieldSelector": f"involvedObject.name={name}"})
        status, text = self.request("GET", f"{EVENTS.path(namespace=self.namespace)}?{query}")
        assert status == 200, (status, text)
        return list(json.loads(text).get("items", []))


@dataclass
class Scene:
    victim: Workload
    mallory: Tenant
    driver_ns: str
    granted: tuple[str, ...]  # kinds the extra Role grants (missing from `edit`)

    @property
    def victim_ns(self) -> str:
        return self.victim.namespace

    @property
    def ns(self) -> str:
        return self.mallory.namespace


def _allowed(
    admin: KubeClient, t: Tenant, verb: str, group: str, resource: str, namespace: str | None = None
) -> bool:
    """The real authorizer's answer for her (``namespace``: default her own)."""
    resource, _, sub = resource.partition("/")
    attributes = {
        "namespace": t.namespace if namespace is None else namespace,
        "verb": verb,
        "group": group,
        "resource": resource,
        "subresource": sub,
    }
    review = admin.create(
        SAR,
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": t.user, "groups": list(t.groups), "resourceAttributes": attributes},
        },
    )
    return bool(review.get("status", {}).get("allowed"))


def _set_up_attacker(admin: KubeClient, t: Tenant) -> tuple[str, ...]:
    """ServiceAccount + RoleBinding to ``edit``; a Role for what ``edit`` lacks. Returns the
    resources the extra Role grants."""
    ns = t.namespace
    admin.create(
        SERVICE_ACCOUNTS,
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": ATTACKER, "namespace": ns},
        },
        namespace=ns,
    )
    subject = [{"kind": "ServiceAccount", "name": ATTACKER, "namespace": ns}]

    def bind(name: str, kind: str, role: str) -> None:
        admin.create(
            ROLE_BINDINGS,
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": name, "namespace": ns},
                "subjects": subject,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
            },
            namespace=ns,
        )

    bind(f"{ATTACKER}-edit", "ClusterRole", "edit")
    wait_for("edit bound", lambda: _allowed(admin, t, "create", "", "pods"), timeout=30)
    missing = [(g, r) for g, r in TENANT_KINDS if not _allowed(admin, t, "create", g, r)]
    if missing:
        rules = [
            {"apiGroups": [g], "resources": [r], "verbs": list(TENANT_VERBS)} for g, r in missing
        ]
        admin.create(
            ROLES,
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "computedomains-edit", "namespace": ns},
                "rules": rules,
            },
            namespace=ns,
        )
        bind(f"{ATTACKER}-computedomains", "Role", "computedomains-edit")
    wait_for(
        "the tenant may create all it needs",
        lambda: all(_allowed(admin, t, "create", g, r) for g, r in TENANT_KINDS),
        timeout=30,
    )
    return tuple(r for _, r in missing)


@pytest.fixture(scope="module")
def scene(cluster: Cluster, admin: KubeClient, driver: Driver, fleet: NodeFleet) -> Iterator[Scene]:
    suffix = secrets.token_hex(2)
    victim_ns, attacker_ns = f"victim-{suffix}", f"mallory-{suffix}"
    for name in (victim_ns, attacker_ns):
        admin.create(
            NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        )
    try:
        mallory = Tenant(cluster, attacker_ns)
        granted = _set_up_attacker(admin, mallory)
        victim = create_cd(admin, victim_ns, "victim")
        start_pods(admin, victim, 1, [VICTIM_NODE])
        assert wait_bound(admin, victim) == {victim.pods[0]: VICTIM_NODE}
        wait_running(admin, fleet, victim)
        wait_cd_ready(admin, victim, 1)
        yield Scene(victim, mallory, driver.namespace, granted)
    finally:
        for name in (attacker_ns, victim_ns):
            teardown_namespace(admin, name)
        namespaces = [attacker_ns, victim_ns]

        def clean() -> bool:
            return not leak_report(admin, fleet, driver.namespace, namespaces)

        with contextlib.suppress(AssertionError):
            wait_for("no leaks", clean, timeout=90, every=0.5)
        leaks = leak_report(admin, fleet, driver.namespace, namespaces)
        for name in namespaces:
            with contextlib.suppress(NotFoundError):
                admin.delete(NAMESPACES, name)
        assert not leaks, f"leaked after the adversarial tenant tests: {leaks}"


# -- helpers: refusals and node state --------------------------------------------------------


def _message(text: str) -> str:
    """The ``message`` of a Status body (unescaped), else the body."""
    try:
        return str(json.loads(text).get("message", text))
    except (ValueError, AttributeError):
        return text


def _refused(done: tuple[int, str], code: int, *fragments: str) -> bool:
    status, text = done
    message = _message(text)
    return status == code and all(f in message for f in fragments)


def _claim(name: str, ns: str, devices: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": devices},
    }


def _template(name: str, ns: str, devices: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"spec": {"devices": devices}},
    }


def _channel_devices(domain_id: str, *, tolerate: str | None = None) -> dict[str, Any]:
    """A channel request with an opaque ComputeDomainChannelConfig naming ``domain_id``."""
    exactly: dict[str, Any] = {"deviceClassName": c.CHANNEL_DEVICE_CLASS}
    if tolerate:
        exactly["tolerations"] = [channel_toleration(tolerate)]
    return {
        "requests": [{"name": "channel", "exactly": exactly}],
        "config": [
            {
                "requests": ["channel"],
                "opaque": {
                    "driver": c.DRIVER_NAME,
                    "parameters": {
                        "apiVersion": c.API_VERSION,
                        "kind": c.CHANNEL_CONFIG_KIND,
                        "domainID": domain_id,
                        "allocationMode": c.ALLOCATION_MODE_SINGLE,
                    },
                },
            }
        ],
    }


def _pod(name: str, ns: str, claim: str, node: str) -> dict[str, Any]:
    return workload_pod(name, ns, claim=claim, node=node)


@dataclass(frozen=True)
class NodeState:
    """What a node holds for claims: CDI spec files (name -> sha256), checkpoint entries
    (uid -> entry), every path under the plugin's directory and the domain label."""

    cdi: dict[str, str]
    checkpoint: dict[str, Any]
    plugin_paths: frozenset[str]
    label: str | None


def _checkpoint_entries(node: SimulatedNode) -> dict[str, Any]:
    try:
        doc = json.loads(node.plugin_checkpoint().read_text())
    except (OSError, ValueError):
        return {}
    return dict((doc.get("v2") or {}).get("preparedClaims") or {})


def _node_state(admin: KubeClient, node: SimulatedNode) -> NodeState:
    cdi = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in node.dirs.cdi_files()}
    plugin_dir = node.plugin_checkpoint().parent
    paths = frozenset(
        str(p.relative_to(plugin_dir))
        for p in plugin_dir.rglob("*")
        if not p.name.endswith(".tmp") and not p.name.startswith(".")
    )
    labels = admin.get(NODES, node.name)["metadata"].get("labels") or {}
    return NodeState(cdi, _checkpoint_entries(node), paths, labels.get(c.COMPUTE_DOMAIN_LABEL))


def _traces_of(fleet: NodeFleet, uid: str, *, pod_gone: bool = False) -> dict[str, list[str]]:
    """Anything any node holds for claim ``uid``: CDI specs, checkpoint entries that are not
    an Aborted tombstone without devices, files named after it, and the kubelet's DRA cache
    entry -- which, like the real kubelet's, holds the claim of a pod on the node *unprepared*
    while Prepare fails (so that the pod's deletion unprepares it): a trace only once prepared,
    or at all once ``pod_gone``."""
    out: dict[str, list[str]] = {}
    for node in fleet:
        found = [p.name for p in node.dirs.cdi_files() if uid in p.name]
        entry = _checkpoint_entries(node).get(uid)
        if entry is not None and not (
            entry.get("checkpointState") == "PrepareAborted" and not entry.get("preparedDevices")
        ):
            found.append(f"checkpoint: {entry.get('checkpointState')}")
        cached = node.dra.prepared().get(uid)
        if cached is not None and (cached.prepared or cached.devices or pod_gone):
            found.append(f"kubelet DRA cache (prepared={cached.prepared})")
        found += [str(p) for p in node.dirs.root.rglob(f"*{uid}*")]
        if found:
            out[node.name] = found
    return out


def _clique(admin: KubeClient, driver_ns: str, domain: str) -> list[dict[str, Any]]:
    items = admin.list(
        COMPUTE_DOMAIN_CLIQUES,
        namespace=driver_ns,
        label_selector=f"{c.COMPUTE_DOMAIN_LABEL}={domain}",
    )["items"]
    return [{"name": i["metadata"]["name"], "daemons": i.get("daemons")} for i in items]


def _domain_view(admin: KubeClient, w: Workload) -> dict[str, Any]:
    st = admin.get(COMPUTE_DOMAINS, w.cd_name, namespace=w.namespace).get("status") or {}
    return {"status": st.get("status"), "nodes": st.get("nodes")}


def _assert_victim_intact(
    admin: KubeClient, fleet: NodeFleet, s: Scene, before: dict[str, Any]
) -> None:
    w = s.victim
    assert _domain_view(admin, w) == before["domain"]
    assert before["domain"]["status"] == c.STATUS_READY
    assert _clique(admin, s.driver_ns, w.cd_uid) == before["clique"]
    for p in w.pods:
        assert pod_ready(admin, w.namespace, p), p
        assert pod_phase(admin, w.namespace, p) == "Running", p
        assert channels_seen(fleet, w.namespace, p) == ["channel0"], p


def _victim_snapshot(admin: KubeClient, s: Scene) -> dict[str, Any]:
    return {
        "domain": _domain_view(admin, s.victim),
        "clique": _clique(admin, s.driver_ns, s.victim.cd_uid),
    }


def _prepare_failure(t: Tenant, pod: str, *fragments: str) -> str:
    """The kubelet's FailedPrepareDynamicResources message on her pod containing
    ``fragments``, as she reads it."""

    def found() -> str | None:
        for ev in t.events(pod):
            msg = str(ev.get("message", ""))
            if ev.get("reason") == "FailedPrepareDynamicResources" and all(
                f in msg for f in fragments
            ):
                return msg
        return None

    return wait_for(f"the Prepare error on {pod}", found, timeout=60, every=0.5)


# -- 1. the daemon device ---------------------------------------------------------------------


def test_tenant_may_create_what_a_workload_needs_and_nothing_more(
    admin: KubeClient, scene: Scene
) -> None:
    """The setup: ``edit`` alone covers claims, templates, pods and ComputeDomains (the last
    through the driver's aggregated role). Nothing outside her namespace is hers."""
    t = scene.mallory
    assert scene.granted == (), f"edit lacks {scene.granted}"
    for group, resource in TENANT_KINDS:
        assert _allowed(admin, t, "create", group, resource), resource
    assert not _allowed(admin, t, "update", "resource.nvidia.com", "computedomains/status")
    for verb, group, resource in (
        ("create", "resource.nvidia.com", "computedomaincliques"),
        ("list", "", "secrets"),
        ("create", "apps", "daemonsets"),
    ):
        assert not _allowed(admin, t, verb, group, resource, scene.driver_ns), (verb, resource)


def test_tenant_cannot_claim_the_daemon_device(admin: KubeClient, scene: Scene) -> None:
    t, ns = scene.mallory, scene.ns
    domain = scene.victim.cd_uid  # any UID will do; her own domain's would as well
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
    daemon_config = {
        **_channel_devices(domain),
        "config": [
            {
                "requests": [],
                "opaque": {
                    "driver": c.DRIVER_NAME,
                    "parameters": {
                        "apiVersion": c.API_VERSION,
                        "kind": c.DAEMON_CONFIG_KIND,
                        "domainID": domain,
                    },
                },
            }
        ],
    }
    cases = {
        "claim exactly": (RESOURCE_CLAIMS, _claim("d1", ns, exactly)),
        "claim firstAvailable": (RESOURCE_CLAIMS, _claim("d2", ns, first)),
        "claim daemon config": (RESOURCE_CLAIMS, _claim("d3", ns, daemon_config)),
        "template exactly": (RESOURCE_CLAIM_TEMPLATES, _template("d4", ns, exactly)),
        "template firstAvailable": (RESOURCE_CLAIM_TEMPLATES, _template("d5", ns, first)),
        "template daemon config": (RESOURCE_CLAIM_TEMPLATES, _template("d6", ns, daemon_config)),
    }
    # The policy binding was applied with the session's driver: wait until it bites (a dry run,
    # so a probe let through before then leaves nothing behind).
    probe = cases["claim exactly"][1]
    wait_for(
        "the daemon-device policy to deny",
        lambda: _refused(t.create(RESOURCE_CLAIMS, probe, dry_run=True), 403, DAEMON_RULE),
        timeout=30,
    )
    # Her plain channel claim passes: the refusals below are the policy's, not RBAC's.
    status, text = t.create(
        RESOURCE_CLAIMS, _claim("plain", ns, _channel_devices(domain)), dry_run=True
    )
    assert status == 201, text
    results = {case: t.create(res, doc) for case, (res, doc) in cases.items()}
    failed = {
        case: done
        for case, done in results.items()
        if not _refused(done, 403, DAEMON_RULE, f"ValidatingAdmissionPolicy '{DAEMON_POLICY}'")
    }
    assert not failed, json.dumps(failed, indent=1)
    # The same through every older served version of resource.k8s.io (the policy lists v1,
    # v1beta2 and v1beta1 and reads both request shapes: test/unit/config/test_admission_cel.py).
    status, text = t.request("GET", "/apis/resource.k8s.io")
    assert status == 200, text
    served = [v["version"] for v in json.loads(text)["versions"] if v["version"] != "v1"]
    for version in served:
        doc = {**cases["claim exactly"][1], "apiVersion": f"resource.k8s.io/{version}"}
        request: dict[str, Any] = {"name": "d", "deviceClassName": c.DAEMON_DEVICE_CLASS}
        if version != "v1beta1":  # v1beta1 has no `exactly`
            request = {"name": "d", "exactly": {"deviceClassName": c.DAEMON_DEVICE_CLASS}}
        doc["spec"] = {"devices": {"requests": [request]}}
        done = t.request(
            "POST", f"/apis/resource.k8s.io/{version}/namespaces/{ns}/resourceclaims", doc
        )
        assert _refused(done, 403, DAEMON_RULE), (version, done)
    for res in (RESOURCE_CLAIMS, RESOURCE_CLAIM_TEMPLATES):
        names = [o["metadata"]["name"] for o in admin.list(res, namespace=ns)["items"]]
        assert not [n for n in names if n.startswith(("path-", "uid-ok"))], names
    assert not admin.list(RESOURCE_CLAIM_TEMPLATES, namespace=ns)["items"]


# -- 2. the driver namespace and shared objects ----------------------------------------------


def test_tenant_cannot_write_the_driver_namespace(admin: KubeClient, scene: Scene) -> None:
    t, dns, w = scene.mallory, scene.driver_ns, scene.victim
    before = _victim_snapshot(admin, scene)
    clique_name = before["clique"][0]["name"]
    daemon_pod = next(
        p["metadata"]["name"]
        for p in admin.list(
            PODS, namespace=dns, label_selector=f"{c.COMPUTE_DOMAIN_LABEL}={w.cd_uid}"
        )["items"]
    )
    merge = "application/merge-patch+json"
    forged_entry = {
        "nodeName": "gpu-node-1",
        "ipAddress": "10.9.9.9",
        "cliqueID": "x.0",
        "index": 0,
        "status": c.STATUS_READY,
    }
    clique = {
        "apiVersion": c.API_VERSION,
        "kind": c.COMPUTE_DOMAIN_CLIQUE_KIND,
        "metadata": {
            "name": f"{w.cd_uid}.forged",
            "namespace": dns,
            "labels": {c.COMPUTE_DOMAIN_LABEL: w.cd_uid},
        },
        "daemons": [forged_entry],
    }
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "mallory", "namespace": dns},
        "spec": {
            "selector": {"matchLabels": {"app": "m"}},
            "template": {
                "metadata": {"labels": {"app": "m"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            },
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "mallory", "namespace": dns},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    daemon_claim = _claim(
        "mallory",
        dns,
        {"requests": [{"name": "d", "exactly": {"deviceClassName": c.DAEMON_DEVICE_CLASS}}]},
    )
    attacks: dict[str, tuple[tuple[int, str], str]] = {
        "create a ComputeDomainClique": (
            t.create(COMPUTE_DOMAIN_CLIQUES, clique),
            'cannot create resource "computedomaincliques"',
        ),
        "patch the victim's clique": (
            t.request(
                "PATCH",
                COMPUTE_DOMAIN_CLIQUES.path(namespace=dns, name=clique_name),
                {"daemons": [forged_entry]},
                content_type=merge,
            ),
            'cannot patch resource "computedomaincliques"',
        ),
        "delete the victim's clique": (
            t.request("DELETE", COMPUTE_DOMAIN_CLIQUES.path(namespace=dns, name=clique_name)),
            'cannot delete resource "computedomaincliques"',
        ),
        "create a DaemonSet": (
            t.create(DAEMONSETS, daemonset),
            'cannot create resource "daemonsets"',
        ),
        "create a pod": (t.create(PODS, pod), 'cannot create resource "pods"'),
        "create a daemon claim there": (
            t.create(RESOURCE_CLAIMS, daemon_claim),
            'cannot create resource "resourceclaims"',
        ),
        "list Secrets": (
            t.request("GET", SECRETS.path(namespace=dns)),
            'cannot list resource "secrets"',
        ),
        "list pods": (t.request("GET", PODS.path(namespace=dns)), 'cannot list resource "pods"'),
        "read a daemon pod": (
            t.request("GET", PODS.path(namespace=dns, name=daemon_pod)),
            'cannot get resource "pods"',
        ),
        "read the daemon's templates": (
            t.request("GET", RESOURCE_CLAIM_TEMPLATES.path(namespace=dns)),
            'cannot list resource "resourceclaimtemplates"',
        ),
        # shared and other tenants' objects
        "label a node for the victim's domain": (
            t.request(
                "PATCH",
                NODES.path(name="gpu-node-1"),
                {"metadata": {"labels": {c.COMPUTE_DOMAIN_LABEL: w.cd_uid}}},
                content_type=merge,
            ),
            'cannot patch resource "nodes"',
        ),
        "delete every ResourceSlice": (
            t.request("DELETE", RESOURCE_SLICES.path()),
            'cannot deletecollection resource "resourceslices"',
        ),
        "patch the victim's ComputeDomain": (
            t.request(
                "PATCH",
                COMPUTE_DOMAINS.path(namespace=w.namespace, name=w.cd_name),
                {"spec": {"numNodes": 4}},
                content_type=merge,
            ),
            'cannot patch resource "computedomains"',
        ),
        "read the victim's ComputeDomain": (
            t.request("GET", COMPUTE_DOMAINS.path(namespace=w.namespace, name=w.cd_name)),
            'cannot get resource "computedomains"',
        ),
        "list every namespace's ComputeDomains": (
            t.request("GET", COMPUTE_DOMAINS.path()),
            'cannot list resource "computedomains"',
        ),
        "patch her own domain's status": (
            t.request(
                "PATCH",
                COMPUTE_DOMAINS.path(namespace=scene.ns, name="mine", subresource="status"),
                {"status": {"status": c.STATUS_READY}},
                content_type=merge,
            ),
            'cannot patch resource "computedomains/status"',
        ),
    }
    failed = {
        name: done
        for name, (done, why) in attacks.items()
        if not _refused(done, 403, "forbidden", why)
    }
    assert not failed, json.dumps(failed, indent=1)
    assert _victim_snapshot(admin, scene) == before
    labels = admin.get(NODES, "gpu-node-1")["metadata"].get("labels") or {}
    assert labels.get(c.COMPUTE_DOMAIN_LABEL) != w.cd_uid


# -- 3. another tenant's domain -------------------------------------------------------------


def test_channel_claim_on_another_tenants_domain_is_refused_on_the_node(
    admin: KubeClient, fleet: NodeFleet, scene: Scene
) -> None:
    t, ns, w = scene.mallory, scene.ns, scene.victim
    node = fleet[VICTIM_NODE]
    before = _victim_snapshot(admin, scene)
    node_before = _node_state(admin, node)
    victim_claims = [
        u
        for u, e in node_before.checkpoint.items()
        if e.get("checkpointState") == "PrepareCompleted"
    ]
    # The victim's channel claim and its daemon's claim (driver namespace).
    assert len(victim_claims) == 2, node_before.checkpoint
    assert node_before.label == w.cd_uid

    # Her claim tolerates the victim's channel taint, so the scheduler shares the victim's
    # channel-0 with her: the refusal must come from the node, beside the victim's claim.
    claim = t.created(
        RESOURCE_CLAIMS, _claim("steal", ns, _channel_devices(w.cd_uid, tolerate=w.cd_uid))
    )
    uid = claim["metadata"]["uid"]
    t.created(PODS, _pod("thief", ns, "steal", VICTIM_NODE))
    msg = _prepare_failure(t, "thief", CROSS_NS)
    assert "permanent error" in msg, msg
    assert f"(claim namespace {ns})" in msg, msg
    assert f"{ns}/steal" in msg, msg
    for secret in (w.namespace, w.cd_name):
        assert secret not in msg, msg
    allocated = admin.get(RESOURCE_CLAIMS, "steal", namespace=ns)["status"]["allocation"]
    assert allocated["devices"]["results"][0]["device"] == "channel-0"
    # The same claim on a free node of the victim's clique would, if anything labelled that
    # node for the victim's domain, pull the victim's IMEX daemon onto it.
    lure = _node_state(admin, fleet[LURE_NODE])
    assert lure.label is None, lure
    lure_uid = t.created(RESOURCE_CLAIMS, _claim("lure", ns, _channel_devices(w.cd_uid)))[
        "metadata"
    ]["uid"]
    t.created(PODS, _pod("lure", ns, "lure", LURE_NODE))
    lure_msg = _prepare_failure(t, "lure", CROSS_NS)
    assert "permanent error" in lure_msg and w.namespace not in lure_msg, lure_msg

    # The controller's Warning on her claim names nothing of the victim; the victim's domain
    # gets one rate-limited Warning naming nothing of hers.
    def mismatch(claim: str) -> str | None:
        for ev in t.events(claim):
            if ev.get("reason") == "ComputeDomainNamespaceMismatch":
                return str(ev.get("message", ""))
        return None

    for claim_name in ("steal", "lure"):  # also: the controller has seen both claims
        warning = wait_for(
            f"the controller's Warning on {claim_name}",
            functools.partial(mismatch, claim_name),
            timeout=30,
        )
        for secret in (w.namespace, w.cd_name, w.cd_uid):
            assert secret not in warning, warning

    def victim_warning() -> list[dict[str, Any]]:
        items = admin.list(EVENTS, namespace=w.namespace)["items"]
        hit = any(e.get("reason") == "ComputeDomainNamespaceMismatch" for e in items)
        return list(items) if hit else []

    for ev in wait_for("the Warning on the victim's domain", victim_warning, timeout=30):
        text = str(ev.get("message", ""))
        assert ns not in text and "steal" not in text and "thief" not in text, ev

    # The pod never starts; nothing of hers on any node; the victim's state is as it was.
    assert pod_phase(admin, ns, "thief") == "Pending"
    assert fleet.container_record(ns, "thief", "ctr") is None
    # The kubelet keeps retrying her Prepare while the pod is pending, and each retry holds a
    # PrepareStarted entry for the instant before its refusal: a moment with no trace at all is
    # what proves nothing of hers stays (one read after another could meet the next retry).
    wait_for("no trace of her claim", lambda: not _traces_of(fleet, uid), timeout=30, every=0.05)
    node_after = _node_state(admin, node)
    assert node_after.cdi == node_before.cdi
    assert {u: node_after.checkpoint.get(u) for u in victim_claims} == {
        u: node_before.checkpoint[u] for u in victim_claims
    }
    assert set(node_after.checkpoint) <= set(node_before.checkpoint) | {uid}
    assert node_after.plugin_paths == node_before.plugin_paths
    assert node_after.label == w.cd_uid
    wait_for(
        "no trace of the lure", lambda: not _traces_of(fleet, lure_uid), timeout=30, every=0.05
    )
    wait_for(
        "the lure node as it was",
        lambda: _node_state(admin, fleet[LURE_NODE]) == lure,
        timeout=30,
        every=0.05,
    )
    ds = admin.get(DAEMONSETS, c.daemon_object_name(w.cd_uid), namespace=scene.driver_ns)
    assert ds["status"].get("desiredNumberScheduled") == 1, ds["status"]
    selector = f"{c.COMPUTE_DOMAIN_LABEL}={w.cd_uid}"
    daemons = admin.list(PODS, namespace=scene.driver_ns, label_selector=selector)["items"]
    assert [p["spec"].get("nodeName") for p in daemons] == [VICTIM_NODE], daemons
    _assert_victim_intact(admin, fleet, scene, before)

    # Her pods go: still nothing of hers left, the victim untouched.
    for pod in ("thief", "lure"):
        status, text = t.request("DELETE", PODS.path(namespace=ns, name=pod))
        assert status == 200, text
    wait_for(
        "her pods gone",
        lambda: all(pod_phase(admin, ns, p) == "<gone>" for p in ("thief", "lure")),
        timeout=60,
    )
    for claim_uid in (uid, lure_uid):
        assert not _traces_of(fleet, claim_uid, pod_gone=True), claim_uid
    assert _node_state(admin, fleet[LURE_NODE]) == lure
    assert _node_state(admin, node).cdi == node_before.cdi
    assert _node_state(admin, node).label == w.cd_uid
    _assert_victim_intact(admin, fleet, scene, before)


# -- 4. a domainID that is a path -------------------------------------------------------------


def test_path_domain_id_is_refused_and_creates_nothing(
    admin: KubeClient, fleet: NodeFleet, scene: Scene
) -> None:
    """A ``domainID`` that is a path is refused when the claim or template is created (policy
    ``compute-domain-opaque-configs``, 422 naming the field); the plugin's own refusal at
    Prepare (``field "domainID": ... is not a ComputeDomain UID``) stays behind it for claims
    that exist anyway (unit tests: test_opaque.py, test_components.py). Nothing reaches a node."""
    t, ns = scene.mallory, scene.ns
    node = fleet[SPARE_NODE]
    plugin_dir = node.plugin_checkpoint().parent
    host_cdi = Path("/var/run/cdi")

    def host_listing() -> list[str] | None:
        return sorted(p.name for p in host_cdi.iterdir()) if host_cdi.is_dir() else None

    host_before = host_listing()
    before = _node_state(admin, node)
    victim_before = _victim_snapshot(admin, scene)
    rule = "devices.config[].opaque.parameters.domainID must be the UID of a ComputeDomain"
    for i, domain_id in enumerate(("/var/run/cdi", "../x", scene.victim.cd_uid.upper())):
        devices = _channel_devices(domain_id)
        claim, template = _claim(f"path-{i}", ns, devices), _template(f"path-{i}", ns, devices)
        for res, doc in ((RESOURCE_CLAIMS, claim), (RESOURCE_CLAIM_TEMPLATES, template)):
            done = t.create(res, doc)
            assert _refused(done, 422, rule, domain_id), (domain_id, done)
    # Her own, well-formed config still passes (dry run): the policy refuses only the form.
    ok = t.create(
        RESOURCE_CLAIMS, _claim("uid-ok", ns, _channel_devices(scene.victim.cd_uid)), dry_run=True
    )
    assert ok[0] == 201, ok
    for res in (RESOURCE_CLAIMS, RESOURCE_CLAIM_TEMPLATES):
        names = [o["metadata"]["name"] for o in admin.list(res, namespace=ns)["items"]]
        assert not [n for n in names if n.startswith(("path-", "uid-ok"))], names
    assert _node_state(admin, node) == before
    assert host_listing() == host_before
    assert not (plugin_dir / "x").exists() and not (plugin_dir.parent / "x").exists()
    assert not (node.dirs.root / "x").exists()
    assert _victim_snapshot(admin, scene) == victim_before


# -- 5. her own domain ----------------------------------------------------------------------


def test_absurd_num_nodes_is_refused(scene: Scene) -> None:
    t = scene.mallory
    cd = compute_domain("huge", scene.ns, rct="huge-channel", num_nodes=10**9)
    done = t.create(COMPUTE_DOMAINS, cd)
    assert _refused(done, 422, "spec.numNodes", str(MAX_NUM_NODES)), done
    ok = compute_domain("huge", scene.ns, rct="huge-channel", num_nodes=MAX_NUM_NODES)
    status, text = t.create(COMPUTE_DOMAINS, ok, dry_run=True)
    assert status == 201, text
