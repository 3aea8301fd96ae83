"""A compromised IMEX daemon in ``ComputeDomainCliques=false`` mode.

In that mode every daemon updates ``computedomains/status`` cluster-wide
(``config/components/cliques-off/daemon-status-rbac.yaml``); the component's
ValidatingAdmissionPolicy ``compute-domain-daemon-status`` (``daemon-status-policy.yaml``) holds
each daemon, by the pod-name and node-name claims of its pod-bound token, to its own domain (the
UID in its pod's name is the domain's ``metadata.uid``) and its own node's ``status.nodes``
entry. Here the admin credentials impersonate the daemon ServiceAccount with such claims (as in
``test_adversarial_daemon.py``) and write status the way ``StatusStore.write`` does: its own
entry passes; another domain's status, another node's entry, the domain's own status field and
credentials without the claims are refused with 403 where the attacker looks. The daemons' own
formation under the policy is ``test_modes.py`` (it installs the same component files).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from localcluster import Cluster
from testsupport.e2e_support import NODE_CLAIM, POD_CLAIM, REPO, Api, Driver, kubectl, wait_for
from testsupport.workloads import create_cd

from pkg.api import constants as c
from pkg.api.daemonentry import DaemonEntry
from pkg.kube.client import KubeClient
from pkg.kube.resources import COMPUTE_DOMAINS

pytestmark = pytest.mark.e2e

COMPONENT = REPO / "config" / "components" / "cliques-off"
FILES = (COMPONENT / "daemon-status-rbac.yaml", COMPONENT / "daemon-status-policy.yaml")
SA = "compute-domain-daemon"
OTHER_DOMAIN_RULE = "not its ComputeDomain"
OTHER_NODE_RULE = "may add, change or remove only its own status.nodes entry"


def _component_docs(driver_ns: str) -> str:
    docs = [d for path in FILES for d in yaml.safe_load_all(Path(path).read_text()) if d]
    for doc in docs:
        for subject in doc.get("subjects") or []:
            subject["namespace"] = driver_ns
    return yaml.safe_dump_all(docs)


@pytest.fixture(scope="module")
def component(cluster: Cluster, driver: Driver) -> Iterator[None]:
    body = _component_docs(driver.namespace)
    kubectl(cluster.kubeconfig("admin"), "apply", "-f", "-", stdin=body)
    yield
    kubectl(cluster.kubeconfig("admin"), "delete", "--ignore-not-found", "-f", "-", stdin=body)


def _status_path(ns: str, name: str) -> str:
    return COMPUTE_DOMAINS.path(namespace=ns, name=name) + "/status"


def _settled(admin: KubeClient, ns: str, name: str) -> dict[str, Any]:
    """The domain once the controller has written its first status and stopped changing it."""

    def stable() -> dict[str, Any] | None:
        first = admin.get(COMPUTE_DOMAINS, name, namespace=ns)
        if "status" not in first.get("status", {}):
            return None
        time.sleep(0.5)  # polling the controller's progress, not waiting out a timer
        second = admin.get(COMPUTE_DOMAINS, name, namespace=ns)
        same = first["metadata"]["resourceVersion"] == second["metadata"]["resourceVersion"]
        return second if same else None

    return wait_for(f"{ns}/{name} settled", stable, timeout=60, every=0.2)


def _with_entries(obj: dict[str, Any], entries: list[DaemonEntry]) -> dict[str, Any]:
    """What StatusStore.write sends: the object read (its resourceVersion included: status
    updates are never unconditional) with status.nodes replaced."""
    body: dict[str, Any] = json.loads(json.dumps(obj))
    body.setdefault("status", {})["nodes"] = [e.encode("status") for e in entries]
    return body


def test_compromised_daemon_writes_only_its_own_domains_status_entry(
    cluster: Cluster, admin: KubeClient, driver: Driver, component: None, ns: str
) -> None:
    api = Api(cluster)
    mine_w = create_cd(admin, ns, "mine")
    theirs_w = create_cd(admin, ns, "theirs")
    pod = f"{c.daemon_object_name(mine_w.cd_uid)}-abcde"
    me = {POD_CLAIM: pod, NODE_CLAIM: "gpu-node-1"}
    clique = "00000000-0000-0000-0000-000000000000.0"
    own = DaemonEntry("gpu-node-1", "10.9.0.1", clique, 0, c.STATUS_NOT_READY)
    peer = DaemonEntry("gpu-node-2", "10.9.0.2", clique, 1, c.STATUS_NOT_READY)

    def put(
        name: str,
        make: Callable[[dict[str, Any]], dict[str, Any]],
        claims: dict[str, str] | None = None,
    ) -> tuple[int, str]:
        """PUT ``make(current object)`` to the status as the daemon; a 409 (the controller wrote
        the status in between: the resourceVersion check comes before admission) is retried
        with a fresh read."""
        for _ in range(20):
            body = make(admin.get(COMPUTE_DOMAINS, name, namespace=ns))
            done = api.request(
                "PUT", _status_path(ns, name), body, sa=SA, claims=me if claims is None else claims
            )
            if done[0] != 409:
                return done
        raise AssertionError(f"status of {ns}/{name} kept changing")

    def refused(done: tuple[int, str], why: str) -> bool:
        return done[0] == 403 and why in done[1]

    def entries(*items: DaemonEntry) -> Callable[[dict[str, Any]], dict[str, Any]]:
        return lambda obj: _with_entries(obj, list(items))

    # The policy may take a moment to become active after the fixture applied it.
    _settled(admin, ns, theirs_w.cd_name)
    name = theirs_w.cd_name
    wait_for(
        "the status policy to deny",
        lambda: refused(put(name, entries(own)), OTHER_DOMAIN_RULE),
        timeout=30,
    )
    before_theirs = admin.get(COMPUTE_DOMAINS, theirs_w.cd_name, namespace=ns)["status"]

    # Allowed: its own entry in its own domain.
    _settled(admin, ns, mine_w.cd_name)
    status, text = put(mine_w.cd_name, entries(own))
    assert status == 200, text

    # Refused: another node's entry, the domain's own status field, no claims, not a daemon pod.
    assert refused(put(mine_w.cd_name, entries(own, peer)), OTHER_NODE_RULE)
    status, text = put(mine_w.cd_name, entries())  # leaving (SIGTERM): its own removal
    assert status == 200, text

    def ready(obj: dict[str, Any]) -> dict[str, Any]:
        body = _with_entries(obj, [own])
        body["status"]["status"] = c.STATUS_READY
        return body

    assert refused(put(mine_w.cd_name, ready), "may change only its own status.nodes entry")
    assert refused(put(mine_w.cd_name, entries(own), claims={}), "no pod-name claim")
    assert refused(put(mine_w.cd_name, entries(own), claims={POD_CLAIM: pod}), "no node-name claim")
    intruder = {POD_CLAIM: "some-pod-abcde", NODE_CLAIM: "gpu-node-1"}
    assert refused(put(mine_w.cd_name, entries(own), claims=intruder), OTHER_DOMAIN_RULE)
    # Another domain's status, with its own entry in it.
    assert refused(put(theirs_w.cd_name, entries(own)), OTHER_DOMAIN_RULE)
    assert admin.get(COMPUTE_DOMAINS, theirs_w.cd_name, namespace=ns)["status"] == before_theirs
