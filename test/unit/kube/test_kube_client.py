"""RestClient and EventRecorder against the fake API server; resources and error mapping."""

from __future__ import annotations

import pytest

from pkg.base.verbosity import V
from pkg.kube import resources as r
from pkg.kube.client import RestClient
from pkg.kube.errors import (
    AlreadyExistsError,
    ApiError,
    BadRequestError,
    ConflictError,
    ConnectionFailedError,
    ForbiddenError,
    GoneError,
    InvalidError,
    NotFoundError,
    ServerError,
    TooManyRequestsError,
    UnauthorizedError,
    error_from_status,
)
from pkg.kube.events import EventRecorder
from pkg.testing.clock import FakeClock
from pkg.testing.fakeapiserver import FakeApiServer


@pytest.mark.parametrize(
    ("resource", "kw", "path"),
    [
        (
            r.PODS,
            {"namespace": "ns", "name": "p", "subresource": "status"},
            "/api/v1/namespaces/ns/pods/p/status",
        ),
        (r.RESOURCE_SLICES, {}, "/apis/resource.k8s.io/v1/resourceslices"),
        (
            r.COMPUTE_DOMAINS,
            {"namespace": "x"},
            "/apis/resource.nvidia.com/v1beta1/namespaces/x/computedomains",
        ),
        (r.NODES, {"name": "n"}, "/api/v1/nodes/n"),
    ],
)
def test_resource_paths(resource: r.Resource, kw: dict[str, str], path: str) -> None:
    assert resource.path(**kw) == path


def test_resource_api_version_and_validation() -> None:
    assert r.PODS.api_version == "v1"
    assert r.LEASES.api_version == "coordination.k8s.io/v1"
    with pytest.raises(ValueError, match="cluster-scoped"):
        r.NODES.path("ns")
    with pytest.raises(ValueError, match="subresource"):
        r.PODS.path("ns", subresource="status")


@pytest.mark.parametrize(
    ("status", "reason", "cls"),
    [
        (400, "", BadRequestError),
        (401, "", UnauthorizedError),
        (403, "", ForbiddenError),
        (404, "", NotFoundError),
        (409, "Conflict", ConflictError),
        (409, "AlreadyExists", AlreadyExistsError),
        (410, "", GoneError),
        (422, "", InvalidError),
        (429, "", TooManyRequestsError),
        (500, "", ServerError),
        (503, "", ServerError),
        (418, "", ApiError),
    ],
)
def test_error_from_status(status: int, reason: str, cls: type[ApiError]) -> None:
    err = error_from_status(status, {"reason": reason, "message": "m"})
    assert type(err) is cls and err.status == status and err.reason == reason
    assert err.message == "m"


def test_connection_refused_is_connection_failed() -> None:
    with FakeApiServer() as api:
        c = api.client()
    # Server is stopped: nothing listens any more.
    with pytest.raises(ConnectionFailedError):
        c.get(r.NODES, "n")


def test_verbs_round_trip_and_rest_paths() -> None:
    with FakeApiServer() as api:
        c = api.client()
        c.create(r.NODES, {"metadata": {"name": "n"}})
        node = c.get(r.NODES, "n")
        node["metadata"]["labels"] = {"a": "b"}
        c.update(r.NODES, node)
        # kube-apiserver answers a Status for a deleted Node (only some kinds answer the object)
        assert c.delete(r.NODES, "n", propagation_policy="Background") is None
        with pytest.raises(NotFoundError) as exc:
            c.get(r.NODES, "n")
        assert exc.value.body is not None and exc.value.body["kind"] == "Status"
        assert api.request_log == [
            ("POST", "/api/v1/nodes"),
            ("GET", "/api/v1/nodes/n"),
            ("PUT", "/api/v1/nodes/n"),
            ("DELETE", "/api/v1/nodes/n"),
            ("GET", "/api/v1/nodes/n"),
        ]


def test_json_patch_is_not_rewritten_to_strategic() -> None:
    with FakeApiServer() as api:
        c = api.client()
        c.create(r.COMPUTE_DOMAINS, {"metadata": {"name": "cd", "namespace": "ns"}, "spec": {}})
        ops = [{"op": "add", "path": "/spec/numNodes", "value": 3}]
        out = c.patch(r.COMPUTE_DOMAINS, "cd", ops, namespace="ns", patch_type="json")
        assert out["spec"] == {"numNodes": 3}
        with pytest.raises(ApiError) as exc:  # CRs refuse strategic merge, as on a real server
            c.patch(r.COMPUTE_DOMAINS, "cd", {"spec": {}}, namespace="ns", patch_type="strategic")
        assert exc.value.status == 415
        with pytest.raises(ValueError, match="field_manager"):
            c.patch(r.COMPUTE_DOMAINS, "cd", {}, namespace="ns", patch_type="apply")


def test_throttle_and_close() -> None:
    with FakeApiServer() as api:
        c = RestClient(api.client()._api, qps=1000.0, burst=2)
        for _ in range(5):
            c.list(r.NODES)
        c.close()


def test_event_recorder_dedups_and_never_raises() -> None:
    with FakeApiServer() as api:
        c = api.client()
        obj = c.create(r.COMPUTE_DOMAINS, {"metadata": {"name": "cd", "namespace": "ns"}})
        clock = FakeClock()
        rec = EventRecorder(c, "controller", clock)
        rec.event(obj, "Normal", "Created", "made it")
        clock.step(1)
        rec.event(obj, "Normal", "Created", "made it")
        clock.step(1)
        rec.event(obj, "Warning", "Failed", "oops")
        clock.step(1)
        events = api.objects(r.EVENTS)
        assert sorted((e["reason"], e["count"]) for e in events) == [("Created", 2), ("Failed", 1)]
        created = next(e for e in events if e["reason"] == "Created")
        assert created["involvedObject"]["uid"] == obj["metadata"]["uid"]
        assert created["source"] == {"component": "controller"}
        api.inject_error("POST", r.EVENTS, 403)
        rec.event(obj, "Normal", "Other", "swallowed")  # logged, not raised
        clock.step(1)
        for e in events:  # expired events are recreated
            c.delete(r.EVENTS, e["metadata"]["name"], namespace="ns")
        rec.event(obj, "Normal", "Created", "made it")
        assert [e["count"] for e in api.objects(r.EVENTS)] == [1]


def test_event_recorder_retries_an_outage_with_backoff_then_gives_up() -> None:
    with FakeApiServer() as api:
        c = api.client()
        obj = c.create(r.COMPUTE_DOMAINS, {"metadata": {"name": "cd", "namespace": "ns"}})
        pauses: list[float] = []
        clock = FakeClock()
        rec = EventRecorder(c, "controller", clock, retry_delays=(0.1, 0.4), sleep=pauses.append)
        api.inject_error("POST", r.EVENTS, 0, count=1)  # connection dropped
        api.inject_error("POST", r.EVENTS, 503, count=1)
        rec.event(obj, "Warning", "Lost", "delivered on the third try")
        clock.step(1)
        assert pauses == [0.1, 0.4]
        assert [e["reason"] for e in api.objects(r.EVENTS)] == ["Lost"]
        pauses.clear()
        api.set_available(False)
        rec.event(obj, "Warning", "Dropped", "never delivered")  # must not raise
        assert pauses == [0.1, 0.4]
        api.set_available(True)
        assert [e["reason"] for e in api.objects(r.EVENTS)] == ["Lost"]


def test_every_request_is_one_response_line_at_v6(caplog: pytest.LogCaptureFixture) -> None:
    with FakeApiServer() as api:
        c = api.client()
        with caplog.at_level(V(6), logger="pkg.kube.client"):
            c.create(r.NODES, {"metadata": {"name": "n"}})
            with pytest.raises(NotFoundError):
                c.get(r.NODES, "missing")
        records = list(caplog.records)
        with caplog.at_level(V(5), logger="pkg.kube.client"):
            caplog.clear()
            c.get(r.NODES, "n")
            assert caplog.records == []  # below V(6) nothing is logged per request
    first, second = records
    assert (first.levelno, first.getMessage(), first.verb) == (V(6), "Response", "POST")  # type: ignore[attr-defined]
    assert first.status == "201 Created" and first.url.endswith("/api/v1/nodes")  # type: ignore[attr-defined]
    assert (second.verb, second.status) == ("GET", "404 Not Found")  # type: ignore[attr-defined]
    assert isinstance(first.milliseconds, int)  # type: ignore[attr-defined]
