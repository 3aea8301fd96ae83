"""A compromised IMEX daemon against the real API server.

All daemons share the ServiceAccount ``compute-domain-daemon``, whose Role may create, update and
patch every ComputeDomainClique of the driver namespace. The ValidatingAdmissionPolicy
``compute-domain-daemon-cliques`` (config/admission/daemon-cliques.yaml, installed with
config/default by the session's ``driver`` fixture) narrows that, by the pod-name / node-name /
pod-uid claims of the daemon's pod-bound token, to its own domain's clique and its own node's
entry. Here the admin credentials impersonate the daemon ServiceAccount with such claims
(``Impersonate-User``/``-Group``/``-Extra-*``), exactly what the API server derives from a real
daemon's token, and:

* every write a real daemon makes passes, with the very operations pkg/daemon/membership.py
  sends (create with its entry and owner reference, a shape-guarded append, an identity-guarded
  status patch, a resourceVersion-guarded PUT that re-registers and one that leaves);
* every cross-domain and cross-node write is refused with 403 where the attacker looks: another
  domain's clique (patch, create, label), another node's entry (add, change, mark Ready,
  remove), delete, labels and owner references, credentials without the claims, a pod that is
  no daemon pod; afterwards the victim's clique is byte-for-byte what it was;
* the controller's ServiceAccount still writes any clique (the policy does not match it).

The daemons' own end-to-end formation with the policy in place is every other e2e test of this
lane (their daemons run with pod-bound tokens from ``kubeletsim.tokens``), e.g.
``test_happy_path.py``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from localcluster import Cluster
from testsupport.e2e_support import (
    NODE_CLAIM,
    POD_CLAIM,
    POD_UID_CLAIM,
    Api,
    Driver,
    wait_for,
)

from pkg.api import constants as c
from pkg.api.daemonentry import DaemonEntry, guarded_append_ops, own_entry_patch_ops
from pkg.kube.client import KubeClient
from pkg.kube.errors import NotFoundError
from pkg.kube.resources import COMPUTE_DOMAIN_CLIQUES, PODS

pytestmark = pytest.mark.e2e

POLICY = "compute-domain-daemon-cliques"
JSON_PATCH = "application/json-patch+json"
OTHER_NODE_RULE = "may add, change or remove only its own daemons[] entry"
OTHER_DOMAIN_RULE = "not its ComputeDomain's"


@dataclass(frozen=True)
class Daemon:
    """The identity the API server derives from one daemon pod's bound token."""

    domain: str
    node: str
    pod: str
    pod_uid: str
    ip: str

    @property
    def claims(self) -> dict[str, str]:
        return {POD_CLAIM: self.pod, NODE_CLAIM: self.node, POD_UID_CLAIM: self.pod_uid}

    def owner(self) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod", "name": self.pod, "uid": self.pod_uid}

    def entry(self, clique_id: str, index: int, status: str = c.STATUS_NOT_READY) -> DaemonEntry:
        return DaemonEntry(self.node, self.ip, clique_id, index, status)


def _path(ns: str, name: str | None = None) -> str:
    return COMPUTE_DOMAIN_CLIQUES.path(namespace=ns, name=name)


def _clique(
    ns: str, domain: str, clique_id: str, entries: list[DaemonEntry], owners: list[dict[str, Any]]
) -> dict[str, Any]:
    """The object CliqueStore.create writes (membership.py)."""
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.COMPUTE_DOMAIN_CLIQUE_KIND,
        "metadata": {
            "name": c.clique_object_name(domain, clique_id),
            "namespace": ns,
            "labels": {c.COMPUTE_DOMAIN_LABEL: domain, c.CLIQUE_ID_LABEL: clique_id},
            "ownerReferences": owners,
        },
        "daemons": [e.encode("clique") for e in entries],
    }


@pytest.fixture
def daemon_pods(admin: KubeClient, driver: Driver) -> Iterator[dict[str, tuple[str, str, str]]]:
    """Pods named as the per-domain DaemonSets name theirs (held by a scheduling gate, never
    run), so the owner references the daemons write point at live pods and the garbage
    collector leaves the cliques alone: key -> (domain UID, pod name, pod UID); a1 and a2 of
    one domain, b1 of another."""
    ns = driver.namespace
    pods: dict[str, tuple[str, str, str]] = {}
    domains = {"a": str(uuid.uuid4()), "b": str(uuid.uuid4())}
    try:
        for key in ("a1", "a2", "b1"):
            domain = domains[key[0]]
            name = f"{c.daemon_object_name(domain)}-{secrets.token_hex(3)[:5]}"
            pod = admin.create(
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
            pods[key] = (domain, name, pod["metadata"]["uid"])
        yield pods
    finally:
        for _, name, _ in pods.values():
            with contextlib.suppress(NotFoundError):
                admin.delete(PODS, name, namespace=ns, grace_period_seconds=0)


def _forbidden(done: tuple[int, str], why: str) -> bool:
    status, text = done
    return status in (403, 422) and why in text


def test_policy_type_checks_against_the_clique_schema(cluster: Cluster, driver: Driver) -> None:
    """The API server type-checks the policy's CEL against the CRD's schema: no warnings (a
    misspelt field or a type error would show here, not as a refusal)."""
    api = Api(cluster)
    path = f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{POLICY}"

    def checked() -> dict[str, Any] | None:
        status, text = api.request("GET", path)
        assert status == 200, text
        policy: dict[str, Any] = json.loads(text)
        return policy if "typeChecking" in policy.get("status", {}) else None

    policy = wait_for("the policy's type check", checked, timeout=30)
    assert policy["status"]["typeChecking"].get("expressionWarnings", []) == []


def test_compromised_daemon_writes_only_its_own_clique_and_entry(
    cluster: Cluster,
    admin: KubeClient,
    driver: Driver,
    daemon_pods: dict[str, tuple[str, str, str]],
) -> None:
    ns, api, sa = driver.namespace, Api(cluster), "compute-domain-daemon"
    clique_id = f"{uuid.uuid4()}.7"

    def daemon(key: str, node: str, ip: str) -> Daemon:
        domain, pod, pod_uid = daemon_pods[key]
        return Daemon(domain, node, pod, pod_uid, ip)

    me = daemon("a1", "gpu-node-1", "10.9.0.1")  # the compromised daemon
    peer = daemon("a2", "gpu-node-2", "10.9.0.2")  # same domain, another node
    victim = daemon("b1", "gpu-node-3", "10.9.0.3")  # another domain
    mine = c.clique_object_name(me.domain, clique_id)
    theirs = c.clique_object_name(victim.domain, clique_id)

    def as_(
        d: Daemon,
        method: str,
        name: str | None,
        body: Any = None,
        content_type: str = "application/json",
        claims: dict[str, str] | None = None,
        dry_run: bool = False,
    ) -> tuple[int, str]:
        path = _path(ns, name) + ("?dryRun=All" if dry_run else "")
        return api.request(
            method,
            path,
            body,
            sa=sa,
            claims=d.claims if claims is None else claims,
            content_type=content_type,
        )

    def read(name: str) -> dict[str, Any]:
        status, text = api.request("GET", _path(ns, name))
        assert status == 200, text
        obj: dict[str, Any] = json.loads(text)
        return obj

    try:
        # The victim domain's clique, as its own daemon made it (written by the admin).
        victim_obj = _clique(
            ns, victim.domain, clique_id, [victim.entry(clique_id, 0)], [victim.owner()]
        )
        status, text = api.request("POST", _path(ns), victim_obj)
        assert status == 201, text

        # -- what a real daemon writes: allowed ---------------------------------------------
        # The first daemon of a clique creates it with its entry and itself as owner. The
        # policy may take a moment to become active after the session applied it: probe with a
        # dry run, so a probe let through before then leaves nothing behind.
        own = _clique(ns, me.domain, clique_id, [me.entry(clique_id, 0)], [me.owner()])
        wrong_label = copy.deepcopy(own)
        wrong_label["metadata"]["labels"][c.COMPUTE_DOMAIN_LABEL] = victim.domain
        label_rule = "must create a ComputeDomainClique with the labels"
        wait_for(
            "the clique policy to deny",
            lambda: _forbidden(as_(me, "POST", None, wrong_label, dry_run=True), label_rule),
            timeout=30,
        )
        status, text = as_(me, "POST", None, own)
        assert status == 201, text
        # A second daemon of the domain joins by the shape-guarded append (and owns it too).
        obj = read(mine)
        ops = guarded_append_ops(obj["daemons"], [peer.entry(clique_id, 1)])
        ops.append({"op": "add", "path": "/metadata/ownerReferences/-", "value": peer.owner()})
        status, text = as_(peer, "PATCH", mine, ops, JSON_PATCH)
        assert status == 200, text
        # Each turns its own entry Ready by the identity-guarded patch.
        for d, pos in ((me, 0), (peer, 1)):
            old = d.entry(clique_id, pos)
            ready = DaemonEntry(d.node, d.ip, clique_id, pos, c.STATUS_READY, 1, ())
            status, text = as_(d, "PATCH", mine, own_entry_patch_ops(pos, old, ready), JSON_PATCH)
            assert status == 200, text
        # A restarted daemon (new IP) re-registers by the resourceVersion-guarded PUT.
        obj = read(mine)
        obj["daemons"][0] = {
            **obj["daemons"][0],
            "ipAddress": "10.9.0.11",
            "status": c.STATUS_NOT_READY,
        }
        obj["daemons"][0].pop("connectedPeers", None)
        obj["daemons"][0].pop("unreachablePeers", None)
        status, text = as_(me, "PUT", mine, obj)
        assert status == 200, text
        victim_before = read(theirs)

        # -- what a compromised daemon tries: refused ----------------------------------------
        peer_pos = 1
        peer_ready = own_entry_patch_ops(
            peer_pos,
            DaemonEntry(peer.node, peer.ip, clique_id, 1, c.STATUS_READY, 1, ()),
            DaemonEntry(peer.node, peer.ip, clique_id, 1, c.STATUS_NOT_READY),
        )
        # Its own entry Ready: allowed with its claims, the write of the credential cases.
        own_ready = [{"op": "replace", "path": "/daemons/0/status", "value": c.STATUS_READY}]
        attacks: dict[str, tuple[tuple[int, str], str]] = {
            # other nodes of its own domain
            "mark another node NotReady/Ready": (
                as_(me, "PATCH", mine, peer_ready, JSON_PATCH),
                OTHER_NODE_RULE,
            ),
            "redirect another node's IMEX": (
                as_(
                    me,
                    "PATCH",
                    mine,
                    [{"op": "replace", "path": "/daemons/1/ipAddress", "value": me.ip}],
                    JSON_PATCH,
                ),
                OTHER_NODE_RULE,
            ),
            "remove another node's entry": (
                as_(me, "PATCH", mine, [{"op": "remove", "path": "/daemons/1"}], JSON_PATCH),
                OTHER_NODE_RULE,
            ),
            "add an entry for another node": (
                as_(
                    me,
                    "PATCH",
                    mine,
                    [
                        {
                            "op": "add",
                            "path": "/daemons/-",
                            "value": victim.entry(clique_id, 2, c.STATUS_READY).encode(),
                        }
                    ],
                    JSON_PATCH,
                ),
                OTHER_NODE_RULE,
            ),
            "rename its own entry to another node": (
                as_(
                    me,
                    "PATCH",
                    mine,
                    [{"op": "replace", "path": "/daemons/0/nodeName", "value": "gpu-node-4"}],
                    JSON_PATCH,
                ),
                OTHER_NODE_RULE,
            ),
            # another domain
            "mark the other domain's node Ready": (
                as_(
                    me,
                    "PATCH",
                    theirs,
                    [{"op": "replace", "path": "/daemons/0/status", "value": c.STATUS_READY}],
                    JSON_PATCH,
                ),
                OTHER_DOMAIN_RULE,
            ),
            "join the other domain's clique": (
                as_(
                    me,
                    "PATCH",
                    theirs,
                    guarded_append_ops(victim_before["daemons"], [me.entry(clique_id, 1)]),
                    JSON_PATCH,
                ),
                OTHER_DOMAIN_RULE,
            ),
            "remove the other domain's entry": (
                as_(me, "PATCH", theirs, [{"op": "remove", "path": "/daemons/0"}], JSON_PATCH),
                OTHER_DOMAIN_RULE,
            ),
            "create a clique of the other domain": (
                as_(
                    me,
                    "POST",
                    None,
                    _clique(ns, victim.domain, "other.1", [me.entry("other.1", 0)], [me.owner()]),
                ),
                OTHER_DOMAIN_RULE,
            ),
            # deletion (RBAC has no delete verb for the daemon; the policy refuses it as well)
            "delete the other domain's clique": (as_(me, "DELETE", theirs), "forbidden"),
            "delete its own clique": (as_(me, "DELETE", mine), "forbidden"),
            # metadata
            "relabel its clique to the other domain": (
                as_(
                    me,
                    "PATCH",
                    mine,
                    [
                        {
                            "op": "replace",
                            "path": "/metadata/labels/resource.nvidia.com~1computeDomain",
                            "value": victim.domain,
                        }
                    ],
                    JSON_PATCH,
                ),
                "may not change a ComputeDomainClique's labels",
            ),
            "drop another daemon's owner reference": (
                as_(
                    me,
                    "PATCH",
                    mine,
                    [{"op": "remove", "path": "/metadata/ownerReferences/1"}],
                    JSON_PATCH,
                ),
                "may only add its own pod",
            ),
            "add a foreign owner reference": (
                as_(
                    me,
                    "PATCH",
                    mine,
                    [{"op": "add", "path": "/metadata/ownerReferences/-", "value": victim.owner()}],
                    JSON_PATCH,
                ),
                "may only add its own pod",
            ),
            # credentials
            "no node-name claim": (
                as_(me, "PATCH", mine, own_ready, JSON_PATCH, claims={POD_CLAIM: me.pod}),
                "no node-name claim",
            ),
            "no pod-name claim": (
                as_(me, "PATCH", mine, own_ready, JSON_PATCH, claims={NODE_CLAIM: me.node}),
                "no pod-name claim",
            ),
            "a pod that is no daemon pod": (
                as_(
                    me,
                    "PATCH",
                    mine,
                    own_ready,
                    JSON_PATCH,
                    claims={POD_CLAIM: "some-pod", NODE_CLAIM: me.node},
                ),
                OTHER_DOMAIN_RULE,
            ),
            "another domain's daemon pod": (
                as_(
                    me,
                    "PATCH",
                    mine,
                    own_ready,
                    JSON_PATCH,
                    claims={**me.claims, POD_CLAIM: victim.pod},
                ),
                OTHER_DOMAIN_RULE,
            ),
        }
        failed = {name: done for name, (done, why) in attacks.items() if not _forbidden(done, why)}
        assert not failed, json.dumps(failed, indent=1)
        for name, (done, _why) in attacks.items():
            if "delete" not in name:
                assert f"ValidatingAdmissionPolicy '{POLICY}'" in done[1], (name, done)
        # Nothing changed in the other domain.
        assert read(theirs) == victim_before

        # -- the controller's own writes do not match the policy -----------------------------
        obj = read(theirs)
        obj["daemons"][0]["status"] = c.STATUS_READY
        status, text = api.request(
            "PUT", f"{_path(ns, theirs)}?dryRun=All", obj, sa="compute-domain-controller"
        )
        assert status == 200, text

        # -- the daemon leaves on SIGTERM: removes its own entry (allowed) -------------------
        obj = read(mine)
        obj["daemons"] = [d for d in obj["daemons"] if d["nodeName"] != me.node]
        status, text = as_(me, "PUT", mine, obj)
        assert status == 200, text
        left = read(mine)
        assert [d["nodeName"] for d in left["daemons"]] == [peer.node]
        assert left["daemons"][0]["status"] == c.STATUS_READY
    finally:
        for name in (mine, theirs):
            with contextlib.suppress(NotFoundError):
                admin.delete(COMPUTE_DOMAIN_CLIQUES, name, namespace=ns)
