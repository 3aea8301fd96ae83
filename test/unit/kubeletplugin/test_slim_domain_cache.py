"""Every node's plugin caches every ComputeDomain of the cluster, so what a tenant can put on one
(labels, annotations up to ~256 KiB, managedFields) is not kept: the cache holds what Prepare
reads. A running plugin on the fake API server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testsupport.kp_harness import channel_params, running_plugin, seed_claim, seed_domain

from pkg.api import constants as c
from pkg.kube import resources as res
from pkg.kubeletplugin.computedomains import slim_domain
from pkg.testing.fakeapiserver import FakeApiServer

BULK = "x" * 200_000


def test_the_cache_keeps_what_prepare_reads_and_drops_the_rest(
    api: FakeApiServer, root: Path
) -> None:
    uid = seed_domain(api)
    [cd] = api.objects(res.COMPUTE_DOMAINS)
    meta = cd["metadata"]
    meta["labels"] = {"team.example/bulk": "y"}
    meta["annotations"] = {"team.example/bulk": BULK, c.TRACEPARENT_ANNOTATION: "00-t-s-01"}
    meta["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:metadata": BULK}}]
    api.seed(res.COMPUTE_DOMAINS, cd)
    with running_plugin(api, root) as (plugin, kubelet):
        [cached] = plugin.domains._domains.indexer.list()
        assert BULK not in str(cached)
        assert cached["metadata"]["annotations"] == {c.TRACEPARENT_ANNOTATION: "00-t-s-01"}
        assert "labels" not in cached["metadata"] and "managedFields" not in cached["metadata"]
        assert cached["spec"] == cd["spec"] and cached["status"] == cd["status"]
        assert cached["metadata"]["uid"] == uid
        # Prepare still works from the slim copy.
        claim = seed_claim(api, params=channel_params(uid))
        assert kubelet.prepare(claim).claims[claim["metadata"]["uid"]].error == ""


def test_slim_domain_is_pure_and_keeps_the_identity() -> None:
    obj: dict[str, Any] = {
        "apiVersion": c.API_VERSION,
        "kind": c.COMPUTE_DOMAIN_KIND,
        "metadata": {
            "name": "cd",
            "namespace": "team",
            "uid": "u",
            "resourceVersion": "7",
            "deletionTimestamp": "2026-12-01T00:00:00Z",
            "finalizers": [c.FINALIZER],
            "annotations": {"a": "b"},
            "ownerReferences": [{"uid": "o"}],
        },
        "spec": {"numNodes": 2},
    }
    slim = slim_domain(obj)
    assert slim == {
        "apiVersion": c.API_VERSION,
        "kind": c.COMPUTE_DOMAIN_KIND,
        "metadata": {
            "name": "cd",
            "namespace": "team",
            "uid": "u",
            "resourceVersion": "7",
            "deletionTimestamp": "2026-12-01T00:00:00Z",
            "finalizers": [c.FINALIZER],
        },
        "spec": {"numNodes": 2},
    }
    assert obj["metadata"]["annotations"] == {"a": "b"}  # the input is untouched
