"""The fake API server's suite, unchanged, against a real kube-apiserver (like envtest).

Every test of ``testsupport.fakeapiserver_suite`` is imported here and runs with the
`server` fixture overridden by `RealTarget`: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager from ``hack/localcluster``, started once for this module (not the
session cluster: the driver's controller must not act on these ComputeDomains), with
``config/`` deployed as the e2e tier does (CRDs, RBAC, DeviceClasses, admission policies).

The apiserver runs with the watch cache off for leases only
(``--watch-cache-sizes=leases.coordination.k8s.io#0``): their lists and watches are served by
etcd, so `RealTarget.compact` (an etcd compaction) makes older resourceVersions answer 410, as
``FakeApiServer.compact`` does. Cached resources keep answering from the watch cache after a
compaction; there a 410 only comes once an RV leaves the cache's window, which a test cannot
force quickly.

Each test gets two fresh namespaces; afterwards their pods are deleted without grace (pods
bound to a node would otherwise wait for a kubelet), finalizers of ComputeDomains are dropped,
the namespaces and the test's cluster-scoped objects are deleted.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import secrets
import shutil
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal, TypeVar

import pytest
from localcluster import Cluster, bin_dir
from testsupport import fakeapiserver_suite as suite
from testsupport.e2e_support import Driver, wait_for
from testsupport.fakeapiserver_suite import apply_server_markers

from pkg.kube import resources as res
from pkg.kube.client import RestClient
from pkg.kube.config import load_api_client
from pkg.kube.errors import NotFoundError
from pkg.kube.resources import Resource
from pkg.testing.fakeapiserver import FakeApiServer

pytestmark = pytest.mark.e2e
# Every test of the suite, unchanged; `server` below makes them talk to the real apiserver.
globals().update({k: v for k, v in vars(suite).items() if k.startswith("test_")})

REQUIRED = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")
UNCACHED = "leases.coordination.k8s.io"
V = TypeVar("V")


class RealTarget:
    """`ApiTarget` over a real control plane; `compact` compacts its etcd."""

    kind: Literal["fake", "real"] = "real"
    fake: FakeApiServer | None = None

    def __init__(self, client: RestClient, etcd_url: str, ns: str, ns2: str) -> None:
        self._client = client
        self._etcd = etcd_url
        self.ns, self.ns2 = ns, ns2
        self.created: list[tuple[Resource, str]] = []

    def client(self) -> RestClient:
        return self._client

    def _etcd_call(self, path: str, body: dict[str, object]) -> dict[str, object]:
        req = urllib.request.Request(
            self._etcd + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            out: dict[str, object] = json.loads(resp.read())
        return out

    def compact(self) -> None:
        # A write outside the apiserver's /registry prefix first, so that the newest
        # resourceVersion of the API is compacted too (etcd keeps the revision it compacts at).
        key = base64.b64encode(b"/fakeapi-conformance/compact").decode()
        header = self._etcd_call("/v3/kv/put", {"key": key, "value": key})["header"]
        assert isinstance(header, dict)
        self._etcd_call("/v3/kv/compaction", {"revision": header["revision"], "physical": True})

    def eventually(self, predicate: Callable[[], V], what: str) -> V:
        return wait_for(what, predicate, timeout=90.0, every=0.2)

    def unique(self, resource: Resource, name: str) -> str:
        unique = f"{self.ns}-{name}"
        self.created.append((resource, unique))
        return unique

    def cleanup(self) -> None:
        c = self._client
        for ns in (self.ns, self.ns2):
            for p in c.list(res.PODS, namespace=ns)["items"]:
                with contextlib.suppress(NotFoundError):
                    c.delete(res.PODS, p["metadata"]["name"], namespace=ns, grace_period_seconds=0)
            for cd in c.list(res.COMPUTE_DOMAINS, namespace=ns)["items"]:
                if cd["metadata"].get("finalizers"):
                    with contextlib.suppress(NotFoundError):
                        c.patch(
                            res.COMPUTE_DOMAINS,
                            cd["metadata"]["name"],
                            {"metadata": {"finalizers": None}},
                            namespace=ns,
                        )
            with contextlib.suppress(NotFoundError):
                c.delete(res.NAMESPACES, ns)
        for resource, name in self.created:
            with contextlib.suppress(NotFoundError):
                c.delete(resource, name)


@pytest.fixture(scope="module")
def real_control_plane() -> Iterator[tuple[RestClient, str]]:
    if os.environ.get("SKIP_E2E") == "1":
        pytest.skip("SKIP_E2E=1")
    bins = bin_dir()
    missing = [b for b in REQUIRED if not (bins / b).is_file()]
    if missing:
        pytest.fail(
            f"e2e: control-plane binaries missing in {bins}: {', '.join(missing)}. "
            "Build them with `hack/build-control-plane.sh`.",
            pytrace=False,
        )
    workdir = Path(tempfile.mkdtemp(prefix="cdfakeapi-", dir="/tmp"))
    cluster = Cluster.start(
        bins, workdir, node_names=[], apiserver_args=[f"--watch-cache-sizes={UNCACHED}#0"]
    )
    try:
        Driver.deploy(cluster.kubeconfig("admin"))
        client = RestClient(
            load_api_client(str(cluster.kubeconfig("admin"))), user_agent="fakeapi-conformance"
        )
        yield client, f"http://127.0.0.1:{cluster.ports.etcd_client}"
        client.close()
    finally:
        cluster.stop()
        if os.environ.get("E2E_KEEP") != "1":
            shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def server(
    request: pytest.FixtureRequest, real_control_plane: tuple[RestClient, str]
) -> Iterator[RealTarget]:
    apply_server_markers(request, "real")
    client, etcd_url = real_control_plane
    base = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    suffix = secrets.token_hex(2)
    target = RealTarget(client, etcd_url, f"{base}-{suffix}", f"{base}-{suffix}-b")
    for ns in (target.ns, target.ns2):
        client.create(
            res.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        )
    yield target
    target.cleanup()
