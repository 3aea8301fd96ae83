"""The kubelet plugin on a cluster serving resource.k8s.io v1beta1 (Kubernetes 1.32) or v1beta2
(1.33) only (and v1, as the control): slices are published and claims read in that version's
shape."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from testsupport.kp_harness import (  # type: ignore[import-not-found, unused-ignore]
    CLIQUE,
    NODE,
    Kubelet,
    channel_params,
    make_config,
    seed_domain,
    seed_world,
)

from pkg.api import constants as c
from pkg.base.types import JSON
from pkg.kube import resources as res
from pkg.kube.resourceapi import discover_resource_api
from pkg.kube.resourceconvert import to_served
from pkg.kubeletplugin.discovery import NodeDevices
from pkg.kubeletplugin.driver import KubeletPlugin
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer


@pytest.fixture(params=["v1", "v1beta1", "v1beta2"])
def api(request: pytest.FixtureRequest) -> Iterator[FakeApiServer]:
    with FakeApiServer(resource_api_versions=(request.param,)) as server:
        seed_world(server)
        yield server


def served_claim(api: FakeApiServer, version: str, cd_uid: str) -> JSON:
    """An allocated channel claim as the scheduler leaves it, stored in ``version``'s shape."""
    claim: JSON = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "w0", "namespace": "team"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "channel",
                        "exactly": {
                            "deviceClassName": "compute-domain-default-channel.nvidia.com",
                            "allocationMode": "ExactCount",
                            "count": 1,
                        },
                    },
                ]
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "channel",
                            "driver": c.DRIVER_NAME,
                            "pool": NODE,
                            "device": c.CHANNEL_DEVICE_NAME,
                        }
                    ],
                    "config": [
                        {
                            "source": "FromClaim",
                            "requests": [],
                            "opaque": {
                                "driver": c.DRIVER_NAME,
                                "parameters": channel_params(cd_uid),
                            },
                        }
                    ],
                }
            }
        },
    }
    wire = dataclasses.replace(res.RESOURCE_CLAIMS, version=version)
    return api.seed(wire, to_served("ResourceClaim", claim, version))


def test_slices_are_published_and_a_claim_prepared_in_the_served_version(
    api: FakeApiServer, root: Path
) -> None:
    version = next(r.version for r in api.store.resources() if r.group == "resource.k8s.io")
    client = api.client()
    client.use_resource_api(discover_resource_api(client))
    assert client.resource_api.version == version
    cd = seed_domain(api)
    claim = served_claim(api, version, cd)
    devices = NodeDevices(driver_version="580.65.06", gpus=(), clique_id=CLIQUE)
    config = make_config(root)
    plugin = KubeletPlugin(config=config, client=client, devices=devices)
    plugin.start()
    try:
        wire_slices = dataclasses.replace(res.RESOURCE_SLICES, version=version)
        eventually(lambda: len(api.objects(wire_slices)) == 1)
        (slice_,) = api.objects(wire_slices)
        assert slice_["apiVersion"] == f"resource.k8s.io/{version}"
        names = [d["name"] for d in slice_["spec"]["devices"]]
        assert c.CHANNEL_DEVICE_NAME in names
        for device in slice_["spec"]["devices"]:
            if version == "v1beta1":
                assert set(device) == {"name", "basic"}
                assert device["basic"]["attributes"]["type"]
            else:
                assert "basic" not in device and device["attributes"]["type"]
        kubelet = Kubelet(config)
        uid = claim["metadata"]["uid"]
        result = kubelet.prepare(claim).claims[uid]
        assert result.error == ""
        (device,) = result.devices
        assert (device.pool_name, device.device_name) == (NODE, c.CHANNEL_DEVICE_NAME)
        assert list(device.request_names) == ["channel"]
        assert kubelet.unprepare(claim).claims[uid].error == ""
        # Every resource.k8s.io request went to the served version.
        dra = [p for _m, p in api.request_log if p.startswith("/apis/resource.k8s.io/")]
        assert dra and all(p.startswith(f"/apis/resource.k8s.io/{version}/") for p in dra)
    finally:
        plugin.stop()
