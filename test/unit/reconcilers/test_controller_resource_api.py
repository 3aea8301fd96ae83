"""The controller process on a cluster serving resource.k8s.io v1beta1 (Kubernetes 1.32) or
v1beta2 (1.33) only: it discovers the version at start, creates valid templates in it and reads
claims and slices written in it; a cluster serving none it supports stops it at once."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator

import pytest
from cdctl_fakes import (  # type: ignore[import-not-found, unused-ignore]
    DRIVER_NS,
    channel_claim,
    compute_domain,
    node,
    resource_slice,
)

from pkg.api import constants as c
from pkg.kube import resources as res
from pkg.kube.resourceconvert import to_served
from pkg.reconcilers.app import run
from pkg.reconcilers.flags import parse_options
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer

OPTS = ["--image-name=img", f"--namespace={DRIVER_NS}"]


@pytest.fixture(params=["v1beta1", "v1beta2"])
def older(request: pytest.FixtureRequest) -> Iterator[FakeApiServer]:
    with FakeApiServer(resource_api_versions=(request.param,)) as server:
        yield server


def test_templates_are_created_and_claims_read_in_the_served_version(
    older: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO")
    version = next(r.version for r in older.store.resources() if r.group == "resource.k8s.io")

    def wire(r: res.Resource) -> res.Resource:
        return dataclasses.replace(r, version=version)

    uid = older.seed(res.COMPUTE_DOMAINS, compute_domain())["metadata"]["uid"]
    older.seed(res.NODES, node("a"))
    slice_ = to_served("ResourceSlice", resource_slice("a", clique_id="uuid.3"), version)
    older.seed(wire(res.RESOURCE_SLICES), slice_)
    stop = threading.Event()
    rc: list[int] = []
    opts = parse_options(OPTS, {})
    thread = threading.Thread(
        target=lambda: rc.append(
            run(opts, stop=stop, env={}, client_factory=lambda _o: older.client())
        ),
    )
    thread.start()
    try:
        # The workload template (POSTed through the fake's shape check for that version).
        eventually(lambda: len(older.objects(wire(res.RESOURCE_CLAIM_TEMPLATES))) == 1)
        (rct,) = older.objects(wire(res.RESOURCE_CLAIM_TEMPLATES))
        assert rct["apiVersion"] == f"resource.k8s.io/{version}"
        (request,) = rct["spec"]["spec"]["devices"]["requests"]
        if version == "v1beta1":
            assert "exactly" not in request
            assert request["deviceClassName"] == "compute-domain-default-channel.nvidia.com"
        else:
            assert request["exactly"]["deviceClassName"] == (
                "compute-domain-default-channel.nvidia.com"
            )
        # The slice's clique label reached the node (slices read in that version).
        eventually(
            lambda: (
                older.objects(res.NODES)[0]["metadata"]
                .get("labels", {})
                .get(c.GPU_CLIQUE_NODE_LABEL)
                == "uuid.3"
            )
        )
        # A claim the scheduler allocated on node a: node labelled, daemon template created.
        claim = channel_claim("w0", ns="team", uid=uid, node_name="a")
        claim["spec"]["devices"]["requests"][0]["exactly"] = {"deviceClassName": "x"}
        older.seed(wire(res.RESOURCE_CLAIMS), to_served("ResourceClaim", claim, version))
        eventually(
            lambda: (
                older.objects(res.NODES)[0]["metadata"]
                .get("labels", {})
                .get(c.COMPUTE_DOMAIN_LABEL)
                == uid
            )
        )
        eventually(lambda: len(older.objects(wire(res.RESOURCE_CLAIM_TEMPLATES))) == 2)
        assert all(
            p.startswith(f"/apis/resource.k8s.io/{version}")
            for _m, p in older.request_log
            if p.startswith("/apis/resource.k8s.io/")
        )
        assert caplog.text.count(f"using resource.k8s.io/{version}") == 1
    finally:
        stop.set()
        thread.join(10)
    assert rc == [0]


def test_a_cluster_without_a_supported_version_stops_the_controller(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with FakeApiServer(resource_api_versions=("v1alpha3",)) as server:  # Kubernetes 1.31
        rc = run(
            parse_options(OPTS, {}),
            stop=threading.Event(),
            env={},
            client_factory=lambda _o: server.client(),
        )
    assert rc == 1
    assert "found: resource.k8s.io/v1alpha3" in caplog.text
