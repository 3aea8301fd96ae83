"""Which resource.k8s.io version is spoken (`pkg.kube.resourceapi`) and the shape conversions at
the client's edge (`pkg.kube.resourceconvert`), against the fake API server serving one version.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, cast

import pytest

from pkg.base.clock import Clock
from pkg.base.types import JSON
from pkg.kube import resources as res
from pkg.kube.client import RestClient
from pkg.kube.errors import ConnectionFailedError, ForbiddenError, InvalidError
from pkg.kube.resourceapi import (
    ResourceApi,
    UnsupportedResourceApiError,
    choose_version,
    discover_resource_api,
    wait_for_resource_api,
)
from pkg.kube.resourceconvert import from_served, to_served
from pkg.testing.fakeapiserver import FakeApiServer

RCT_V1: JSON = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaimTemplate",
    "metadata": {"name": "t", "namespace": "ns"},
    "spec": {
        "metadata": {"labels": {"a": "b"}},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "channel",
                        "exactly": {
                            "deviceClassName": "compute-domain-default-channel.nvidia.com",
                            "tolerations": [{"key": "k", "operator": "Exists"}],
                        },
                    },
                    {"name": "alt", "firstAvailable": [{"name": "a", "deviceClassName": "c"}]},
                ],
                "config": [{"requests": ["channel"], "opaque": {"driver": "d", "parameters": {}}}],
            }
        },
    },
}
SLICE_V1: JSON = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceSlice",
    "metadata": {"name": "n-cd"},
    "spec": {
        "driver": "compute-domain.nvidia.com",
        "nodeName": "n",
        "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
        "devices": [
            {"name": "channel-0", "attributes": {"type": {"string": "channel"}, "id": {"int": 0}}},
            {"name": "daemon-0", "attributes": {"type": {"string": "daemon"}}, "capacity": {}},
        ],
    },
}


def served(version: str) -> Iterator[tuple[FakeApiServer, RestClient]]:
    with FakeApiServer(resource_api_versions=(version,)) as server:
        client = server.client()
        client.use_resource_api(discover_resource_api(client))
        yield server, client


@pytest.fixture(params=["v1beta1", "v1beta2"])
def older(request: pytest.FixtureRequest) -> Iterator[tuple[FakeApiServer, RestClient]]:
    yield from served(request.param)


# -- version choice ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("listed", "chosen"),
    [
        (["v1", "v1beta2", "v1beta1"], "v1"),  # 1.34+
        (["v1beta1", "v1beta2"], "v1beta2"),  # 1.33, in any order
        (["v1beta1", "v1alpha3"], "v1beta1"),  # 1.32
    ],
)
def test_the_most_preferred_served_version_is_chosen(listed: list[str], chosen: str) -> None:
    assert choose_version(listed) == chosen


def test_a_cluster_without_a_supported_version_is_refused_naming_what_it_serves() -> None:
    with pytest.raises(UnsupportedResourceApiError) as err:
        choose_version(["v1alpha3"])  # Kubernetes 1.31 with DRA enabled
    assert "resource.k8s.io/v1alpha3" in str(err.value)
    assert "v1, v1beta2, v1beta1" in str(err.value)


@pytest.mark.parametrize("versions", [("v1",), ("v1beta2", "v1beta1"), ("v1beta1",)])
def test_discovery_reads_the_groups_document(versions: tuple[str, ...]) -> None:
    with FakeApiServer(resource_api_versions=versions) as server:
        assert discover_resource_api(server.client()).version == versions[0]
        assert server.request_log == [("GET", "/apis/resource.k8s.io")]


def test_a_cluster_without_the_group_is_refused() -> None:
    with (
        FakeApiServer(resource_api_versions=()) as server,
        pytest.raises(UnsupportedResourceApiError, match=r"does not serve the resource\.k8s\.io"),
    ):
        discover_resource_api(server.client())


class _Flaky:
    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)

    def api_group(self, group: str) -> JSON:
        if self.failures:
            raise self.failures.pop(0)
        return {"versions": [{"version": "v1beta2"}]}


class _Clock:
    def __init__(self) -> None:
        self.waits: list[float] = []

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        self.waits.append(timeout or 0.0)
        return event.is_set()


def test_discovery_retries_while_the_server_is_away_and_logs_the_choice_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO")
    clock = _Clock()
    flaky = _Flaky(ConnectionFailedError("refused"), ConnectionFailedError("refused"))
    api = wait_for_resource_api(flaky, clock=cast(Clock, clock), stop=threading.Event())
    assert api == ResourceApi("v1beta2")
    assert clock.waits == [1.0, 2.0]
    assert caplog.text.count("using resource.k8s.io/v1beta2") == 1


def test_discovery_gives_up_at_once_on_a_definite_answer_and_stops_on_stop() -> None:
    clock = _Clock()
    with pytest.raises(ForbiddenError):
        wait_for_resource_api(
            _Flaky(ForbiddenError(403, "Forbidden")),
            clock=cast(Clock, clock),
            stop=threading.Event(),
        )
    stop = threading.Event()
    stop.set()
    assert wait_for_resource_api(_Flaky(), clock=cast(Clock, clock), stop=stop) is None


# -- conversions ---------------------------------------------------------------------------


def test_v1beta1_flattens_requests_and_nests_devices_under_basic() -> None:
    rct = to_served("ResourceClaimTemplate", RCT_V1, "v1beta1")
    assert rct["apiVersion"] == "resource.k8s.io/v1beta1"
    channel, alt = rct["spec"]["spec"]["devices"]["requests"]
    assert channel == {
        "name": "channel",
        "deviceClassName": "compute-domain-default-channel.nvidia.com",
        "tolerations": [{"key": "k", "operator": "Exists"}],
    }
    assert alt == {"name": "alt", "firstAvailable": [{"name": "a", "deviceClassName": "c"}]}
    assert rct["spec"]["spec"]["devices"]["config"] == RCT_V1["spec"]["spec"]["devices"]["config"]
    dev = to_served("ResourceSlice", SLICE_V1, "v1beta1")["spec"]["devices"][0]
    assert dev == {
        "name": "channel-0",
        "basic": {"attributes": SLICE_V1["spec"]["devices"][0]["attributes"]},
    }


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
@pytest.mark.parametrize("obj", [RCT_V1, SLICE_V1], ids=["rct", "slice"])
def test_conversions_round_trip_and_leave_their_input_alone(obj: JSON, version: str) -> None:
    before = copy.deepcopy(obj)
    wire = to_served(obj["kind"], obj, version)
    assert obj == before
    assert wire["apiVersion"] == f"resource.k8s.io/{version}"
    assert from_served(obj["kind"], wire, version) == obj
    if version != "v1beta1":
        assert {**wire, "apiVersion": obj["apiVersion"]} == obj


def test_v1beta1_defaults_come_back_under_exactly() -> None:
    # What a 1.32 server answers for a claim: defaults filled in, deviceClassName "" on a
    # firstAvailable request.
    claim = {
        "kind": "ResourceClaim",
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "r",
                        "deviceClassName": "c",
                        "allocationMode": "ExactCount",
                        "count": 1,
                    },
                    {"name": "f", "deviceClassName": "", "firstAvailable": [{"name": "s"}]},
                ]
            }
        },
    }
    requests = from_served("ResourceClaim", claim, "v1beta1")["spec"]["devices"]["requests"]
    assert requests == [
        {
            "name": "r",
            "exactly": {"deviceClassName": "c", "allocationMode": "ExactCount", "count": 1},
        },
        {"name": "f", "firstAvailable": [{"name": "s"}]},
    ]


# -- the client's edge ---------------------------------------------------------------------


def test_with_v1_served_requests_are_unchanged() -> None:
    with FakeApiServer() as server:
        client = server.client()
        client.use_resource_api(discover_resource_api(client))
        server.clear_log()
        created = client.create(res.RESOURCE_CLAIM_TEMPLATES, RCT_V1)
        assert server.objects(res.RESOURCE_CLAIM_TEMPLATES)[0]["spec"] == RCT_V1["spec"]
        assert created["spec"] == RCT_V1["spec"]
        assert server.request_log == [
            ("POST", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaimtemplates")
        ]


def test_writes_go_out_in_the_served_shape_and_reads_come_back_in_v1(
    older: tuple[FakeApiServer, RestClient],
) -> None:
    server, client = older
    version = client.resource_api.version
    wire_rct = replace(res.RESOURCE_CLAIM_TEMPLATES, version=version)
    server.clear_log()
    created = client.create(res.RESOURCE_CLAIM_TEMPLATES, RCT_V1)
    assert server.request_log == [
        ("POST", f"/apis/resource.k8s.io/{version}/namespaces/ns/resourceclaimtemplates")
    ]
    (stored,) = server.objects(wire_rct)
    assert stored["apiVersion"] == f"resource.k8s.io/{version}"
    assert stored["spec"] == to_served("ResourceClaimTemplate", RCT_V1, version)["spec"]
    assert created["apiVersion"] == "resource.k8s.io/v1"
    assert created["spec"] == RCT_V1["spec"]
    assert client.get(res.RESOURCE_CLAIM_TEMPLATES, "t", namespace="ns")["spec"] == RCT_V1["spec"]
    listed = client.list(res.RESOURCE_CLAIM_TEMPLATES, namespace="ns")
    assert listed["apiVersion"] == "resource.k8s.io/v1"
    assert [o["spec"] for o in listed["items"]] == [RCT_V1["spec"]]
    created["metadata"]["labels"] = {"x": "y"}
    updated = client.update(res.RESOURCE_CLAIM_TEMPLATES, created)
    assert updated["spec"] == RCT_V1["spec"] and updated["metadata"]["labels"] == {"x": "y"}
    deleted: Any = client.delete(res.RESOURCE_CLAIM_TEMPLATES, "t", namespace="ns")
    assert deleted["spec"] == RCT_V1["spec"]


def test_watch_events_come_back_in_v1(older: tuple[FakeApiServer, RestClient]) -> None:
    _server, client = older
    rv = client.list(res.RESOURCE_SLICES)["metadata"]["resourceVersion"]
    stream = client.watch(res.RESOURCE_SLICES, resource_version=rv, timeout_seconds=5)
    client.create(res.RESOURCE_SLICES, SLICE_V1)
    for event in stream:
        if event.type == "ADDED":
            assert event.object["apiVersion"] == "resource.k8s.io/v1"
            assert event.object["spec"]["devices"] == SLICE_V1["spec"]["devices"]
            break
    stream.stop()


def test_the_fake_refuses_a_v1_shape_where_v1beta1_is_served() -> None:
    for _server, client in served("v1beta1"):
        client.use_resource_api(ResourceApi())  # pretend v1: the body goes out unconverted
        with pytest.raises(InvalidError, match="exactly"):
            client.create(replace(res.RESOURCE_CLAIM_TEMPLATES, version="v1beta1"), RCT_V1)
