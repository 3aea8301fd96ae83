"""Crafted membership entries against the real apiserver: the CRD schema refuses them.

A compromised daemon (or anyone who may write ComputeDomainCliques) writes clique entries that
every daemon of the clique reads. The CRDs of ``pkg/api/crds.py``, as ``config/`` installs
them, refuse with 422, naming the field:

* an ``ipAddress`` that is not a canonical IP literal without a zone, above all an IPv6 scope ID
  carrying text (``'fe80::1%a\\n10.0.0.9\\tx'``, which Python's ``ipaddress`` accepts and which
  would add a line to every peer's hosts file), by the CEL rule ``isIP && ip.isCanonical``;
* an over-long ``nodeName`` (``maxLength``), a node name that is no DNS subdomain, a cliqueID
  that is no label value;
* more entries than one clique can hold (``maxItems``), and an over-long peer list;

and the same entry in a ComputeDomain's ``status.nodes``. Entries as upstream's daemons write
them (``<clusterUUID>.<cliqueId>``, IPv4 and IPv6 pod IPs, index -1..) still validate, and the
CRDs' CEL cost estimate passed the apiserver (they were applied by the ``driver`` fixture).
Needs no nodes.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from testsupport.e2e_support import Driver, compute_domain, teardown_namespace, wait_for

from pkg.api import constants as c
from pkg.api import daemonentry as de
from pkg.kube.client import KubeClient
from pkg.kube.errors import ApiError, InvalidError, NotFoundError
from pkg.kube.resources import COMPUTE_DOMAIN_CLIQUES, COMPUTE_DOMAINS, NAMESPACES

pytestmark = pytest.mark.e2e

UPSTREAM_CLIQUE_ID = "9f410827-1c4b-4f38-9e0a-51266ca08eb7.32766"
SCOPE_ID_INJECTION = "fe80::1%a\n10.0.0.9\tx"


def entry(node: str = "gpu-node-1", ip: str = "10.0.0.1", **extra: Any) -> dict[str, Any]:
    return {
        "nodeName": node,
        "ipAddress": ip,
        "cliqueID": UPSTREAM_CLIQUE_ID,
        "index": 0,
        "status": "NotReady",
        **extra,
    }


def clique(daemons: list[dict[str, Any]]) -> dict[str, Any]:
    uid = "4f1c0c7e-0000-4000-8000-" + secrets.token_hex(6)
    return {
        "apiVersion": f"{c.GROUP}/{c.VERSION}",
        "kind": c.COMPUTE_DOMAIN_CLIQUE_KIND,
        "metadata": {
            "name": f"{uid}.{UPSTREAM_CLIQUE_ID.split('.')[1]}",
            "labels": {c.COMPUTE_DOMAIN_LABEL: uid, c.CLIQUE_ID_LABEL: UPSTREAM_CLIQUE_ID},
        },
        de.DAEMONS: daemons,
    }


def causes(err: ApiError) -> list[str]:
    """Fields a 422 names (without the "<nil>" notice that CEL rules were skipped)."""
    details = (err.body or {}).get("details") or {}
    fields = [str(cause.get("field") or "") for cause in details.get("causes") or []]
    return [f for f in dict.fromkeys(fields) if f and f != "<nil>"]


def refused(admin: KubeClient, ns: str, daemons: list[dict[str, Any]]) -> tuple[list[str], str]:
    with pytest.raises(InvalidError) as exc:
        created = admin.create(COMPUTE_DOMAIN_CLIQUES, clique(daemons), namespace=ns)
        admin.delete(COMPUTE_DOMAIN_CLIQUES, created["metadata"]["name"], namespace=ns)
    return causes(exc.value), exc.value.message


def test_upstream_shaped_entries_validate(admin: KubeClient, driver: Driver) -> None:
    daemons = [
        entry("gpu-node-1", "10.0.0.1"),
        entry("gpu-node-2.example.com", "fd00::a:1", index=1, status="Ready"),
        entry(
            "gpu-node-3",
            "192.168.255.254",
            index=17,
            connectedPeers=2,
            unreachablePeers=["gpu-node-1"],
        ),
        {"nodeName": "cpu-node", "ipAddress": "10.0.0.4", "cliqueID": "", "index": -1},
    ]
    created = admin.create(COMPUTE_DOMAIN_CLIQUES, clique(daemons), namespace=driver.namespace)
    try:
        assert [d["nodeName"] for d in created[de.DAEMONS]] == [d["nodeName"] for d in daemons]
    finally:
        admin.delete(
            COMPUTE_DOMAIN_CLIQUES, created["metadata"]["name"], namespace=driver.namespace
        )


@pytest.mark.parametrize(
    "ip",
    [
        SCOPE_ID_INJECTION,
        "fe80::1%a\n10.0.0.9\tcompute-domain-daemon-x-0000",  # also too long
        "fe80::1%eth0",
        "FD00::1",  # not canonical: upper case
        "fd00:0:0:0:0:0:0:1",  # not canonical: uncompressed
        "010.0.0.1",
        "::ffff:10.0.0.1",  # IPv4-mapped
        "10.0.0.1 ",
        "gpu-node-1",
    ],
)
def test_bad_ip_address_is_refused(admin: KubeClient, driver: Driver, ip: str) -> None:
    fields, message = refused(admin, driver.namespace, [entry("gpu-node-2"), entry(ip=ip)])
    assert fields == ["daemons[1].ipAddress"], (fields, message)


@pytest.mark.parametrize(
    ("daemons", "field"),
    [
        ([entry("n" * (de.MAX_NODE_NAME_LENGTH + 1))], "daemons[0].nodeName"),
        ([entry("gpu-node-1\n10.0.0.9")], "daemons[0].nodeName"),
        ([entry("GPU_NODE")], "daemons[0].nodeName"),
        ([entry(cliqueID="x" * (de.MAX_CLIQUE_ID_LENGTH + 1))], "daemons[0].cliqueID"),
        ([entry(cliqueID="a/b")], "daemons[0].cliqueID"),
        ([entry(index=de.MAX_CLIQUE_DAEMONS)], "daemons[0].index"),
        ([entry(index=-2)], "daemons[0].index"),
        ([entry(status="Ready\n")], "daemons[0].status"),
        ([entry(unreachablePeers=["x" * 254])], "daemons[0].unreachablePeers[0]"),
        (
            [entry(unreachablePeers=[f"n{i}" for i in range(de.MAX_CLIQUE_DAEMONS + 1)])],
            "daemons[0].unreachablePeers",
        ),
        (
            [
                entry(f"n{i}", f"10.0.{i // 256}.{i % 256}", index=i % de.MAX_CLIQUE_DAEMONS)
                for i in range(de.MAX_CLIQUE_DAEMONS + 1)
            ],
            "daemons",
        ),
    ],
    ids=[
        "long-node-name",
        "node-name-newline",
        "node-name-not-dns",
        "long-clique-id",
        "clique-id-slash",
        "index-too-large",
        "index-below-minus-one",
        "status-enum",
        "long-peer-name",
        "too-many-peers",
        "too-many-daemons",
    ],
)
def test_bad_entry_is_refused(
    admin: KubeClient, driver: Driver, daemons: list[dict[str, Any]], field: str
) -> None:
    fields, message = refused(admin, driver.namespace, daemons)
    assert fields == [field], (fields, message)
    assert f"{field}: " in message


def test_an_update_cannot_plant_a_bad_entry(admin: KubeClient, driver: Driver) -> None:
    created = admin.create(COMPUTE_DOMAIN_CLIQUES, clique([entry()]), namespace=driver.namespace)
    name = created["metadata"]["name"]
    try:
        with pytest.raises(InvalidError) as exc:
            admin.patch(
                COMPUTE_DOMAIN_CLIQUES,
                name,
                [
                    {
                        "op": "add",
                        "path": "/daemons/-",
                        "value": entry("gpu-node-9", SCOPE_ID_INJECTION),
                    }
                ],
                namespace=driver.namespace,
                patch_type="json",
            )
        assert causes(exc.value) == ["daemons[1].ipAddress"]
        after = admin.get(COMPUTE_DOMAIN_CLIQUES, name, namespace=driver.namespace)
        assert after[de.DAEMONS] == created[de.DAEMONS]
    finally:
        admin.delete(COMPUTE_DOMAIN_CLIQUES, name, namespace=driver.namespace)


@pytest.fixture
def own_ns(admin: KubeClient, driver: Driver) -> Iterator[str]:
    name = f"adversarial-entries-{secrets.token_hex(2)}"
    admin.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    teardown_namespace(admin, name)
    admin.delete(NAMESPACES, name)


def test_status_nodes_refuse_the_same_entries(admin: KubeClient, own_ns: str) -> None:
    admin.create(COMPUTE_DOMAINS, compute_domain("cd", own_ns, rct="cd-rct"), namespace=own_ns)
    # The controller writes the first status; then a crafted entry goes to /status.
    cd = wait_for("status of cd", lambda: _with_status(admin, own_ns, "cd"), timeout=30)
    bad = {"name": "gpu-node-1", "ipAddress": SCOPE_ID_INJECTION, "cliqueID": "", "index": -1}
    long_name = {"name": "n" * 254, "ipAddress": "10.0.0.1", "cliqueID": "", "index": -1}
    for item, field in ((bad, "status.nodes[0].ipAddress"), (long_name, "status.nodes[0].name")):
        body = {**cd, "status": {**cd["status"], "nodes": [item]}}
        with pytest.raises(InvalidError) as exc:
            admin.update(COMPUTE_DOMAINS, body, subresource="status")
        assert causes(exc.value) == [field], exc.value.message


def _with_status(admin: KubeClient, ns: str, name: str) -> dict[str, Any] | None:
    try:
        cd = admin.get(COMPUTE_DOMAINS, name, namespace=ns)
    except NotFoundError:
        return None
    return cd if cd.get("status") else None
