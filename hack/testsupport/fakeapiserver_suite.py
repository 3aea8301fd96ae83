"""The fake API server's suite: the same tests against `FakeApiServer` and a real kube-apiserver.

Every test reaches its server through an `ApiTarget`: the real `RestClient`, two fresh
namespaces, and the few hooks that are not API calls (`compact`, `eventually`, `unique`). The
tests live here, not in a test module, because two modules collect them, each with its own
``server`` fixture: ``test/unit/testing/test_fakeapiserver.py`` against the fake (`FakeTarget`,
the unit tier) and ``test/e2e/test_fakeapiserver_conformance.py`` against a real
kube-apiserver, etcd and controller-manager started from ``hack/localcluster`` with the CRDs of
``config/`` installed, as controller-runtime's envtest does. So every behaviour unit tests rely
on is checked against the real thing.

Where the two differ, a marker says so (see docs/contracts.md, "Where the fake differs"):

* ``fake_only(reason)``: the test exercises a hook only the fake has (error injection, dropped
  watches, the request log); skipped against the real server.
* ``fake_gap(reason)``: real behaviour the fake does not model; a strict xfail against the fake
  (fixing the fake turns it into a failure that asks for the marker to go), run for real.

Objects are valid for the real server: pods name a scheduler that does not exist, so nothing
but the test writes them; the compaction tests use leases, whose watch cache the real server
is started without, so a compacted resourceVersion answers 410 there as it does on the fake.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any, Literal, Protocol, TypeVar

import pytest

from pkg.base.types import JSON
from pkg.kube import resources as r
from pkg.kube.client import RestClient
from pkg.kube.errors import (
    AlreadyExistsError,
    ApiError,
    BadRequestError,
    ConflictError,
    ConnectionFailedError,
    GoneError,
    InvalidError,
    NotFoundError,
    ServerError,
    TooManyRequestsError,
)
from pkg.kube.resources import Resource
from pkg.testing.fakeapiserver import FakeApiServer

T = TypeVar("T")

NO_SCHEDULER = "no-such-scheduler"  # keeps the real kube-scheduler's hands off test pods
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


class ApiTarget(Protocol):
    """The server a test runs against (fake or real) and what a test may do beyond the API."""

    kind: Literal["fake", "real"]
    ns: str  # an existing namespace of this test only
    ns2: str  # a second one
    fake: FakeApiServer | None  # the fake itself, for fake_only tests

    def client(self) -> RestClient:
        """A client with full rights on the server."""
        ...

    def compact(self) -> None:
        """Forget history: every resourceVersion older than the newest answers 410 on a
        watch or a continue token afterwards (for LEASES on the real server)."""
        ...

    def eventually(self, predicate: Callable[[], T], what: str) -> T:
        """``predicate()`` once it is truthy: the fake is synchronous (checked once); the real
        server's controllers (garbage collector) act asynchronously (polled)."""
        ...

    def unique(self, resource: Resource, name: str) -> str:
        """A name for a cluster-scoped object that no other test uses; deleted after the test."""
        ...


class FakeTarget:
    """`ApiTarget` over a `FakeApiServer` (with garbage collection, as a real cluster has)."""

    kind: Literal["fake", "real"] = "fake"

    def __init__(self, api: FakeApiServer) -> None:
        self.fake: FakeApiServer | None = api
        self._api = api
        self.ns, self.ns2 = "ns-a", "ns-b"

    def client(self) -> RestClient:
        return self._api.client()

    def compact(self) -> None:
        self._api.compact()

    def eventually(self, predicate: Callable[[], T], what: str) -> T:
        value = predicate()
        assert value, f"{what}: not true (the fake acts synchronously; last: {value!r})"
        return value

    def unique(self, resource: Resource, name: str) -> str:
        return name


def apply_server_markers(request: pytest.FixtureRequest, kind: str) -> None:
    """Turn ``fake_only``/``fake_gap`` markers into a skip or a strict xfail for ``kind``."""
    only = request.node.get_closest_marker("fake_only")
    if kind == "real" and only is not None:
        pytest.skip(f"fake-only: {only.args[0]}")
    gap = request.node.get_closest_marker("fake_gap")
    if kind == "fake" and gap is not None:
        request.applymarker(pytest.mark.xfail(reason=f"fake gap: {gap.args[0]}", strict=True))


# -- valid objects -----------------------------------------------------------------------------


def pod(name: str, ns: str, *, node: str | None = None, **labels: str) -> JSON:
    spec: JSON = {
        "schedulerName": NO_SCHEDULER,
        "containers": [{"name": "c", "image": "registry.invalid/c:1"}],
    }
    if node:
        spec["nodeName"] = node
    meta = {"name": name, "namespace": ns, "labels": labels}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def lease(name: str, ns: str) -> JSON:
    meta = {"name": name, "namespace": ns}
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": meta,
        "spec": {"holderIdentity": "t"},
    }


def compute_domain(name: str, ns: str, **metadata: Any) -> JSON:
    return {
        "apiVersion": r.COMPUTE_DOMAINS.api_version,
        "kind": "ComputeDomain",
        "metadata": {"name": name, "namespace": ns, **metadata},
        "spec": {"channel": {"resourceClaimTemplate": {"name": f"{name}-channel"}}},
    }


def daemonset(name: str, ns: str, owner: JSON) -> JSON:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": ns, "ownerReferences": [owner]},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"no-such-node": "true"},
                    "containers": [{"name": "c", "image": "registry.invalid/c:1"}],
                },
            },
        },
    }


def device_class(name: str, driver: str) -> JSON:
    return {
        "apiVersion": r.DEVICE_CLASSES.api_version,
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
    }


def names(items: list[JSON]) -> list[str]:
    return [i["metadata"]["name"] for i in items]


def _collect(c: RestClient, resource: Resource = r.PODS, **kw: Any) -> list[tuple[str, str]]:
    w = c.watch(resource, **kw)
    return [(e.type, e.object["metadata"].get("name", "")) for e in w]


# -- objects -----------------------------------------------------------------------------------


def test_create_assigns_metadata_and_rejects_duplicates(server: ApiTarget) -> None:
    c, ns = server.client(), server.ns
    obj = c.create(r.PODS, pod("a", ns))
    meta = obj["metadata"]
    assert meta["uid"] and meta["creationTimestamp"] and meta["generation"] == 1
    assert obj["kind"] == "Pod" and obj["apiVersion"] == "v1"
    with pytest.raises(AlreadyExistsError) as exc:
        c.create(r.PODS, pod("a", ns))
    assert exc.value.status == 409 and isinstance(exc.value, ConflictError)
    body = pod("", ns)
    body["metadata"] = {"generateName": "p-", "namespace": ns}
    gen = c.create(r.PODS, body)
    assert gen["metadata"]["name"].startswith("p-") and len(gen["metadata"]["name"]) == 7


def test_update_conflicts_on_stale_rv_and_bumps_generation_on_spec(server: ApiTarget) -> None:
    c = server.client()
    name = server.unique(r.DEVICE_CLASSES, "dc")
    obj = c.create(r.DEVICE_CLASSES, device_class(name, "a"))
    stale = copy.deepcopy(obj)
    obj["metadata"]["labels"] = {"a": "b"}
    upd = c.update(r.DEVICE_CLASSES, obj)
    assert upd["metadata"]["generation"] == 1
    upd["spec"] = device_class(name, "b")["spec"]
    upd2 = c.update(r.DEVICE_CLASSES, upd)
    assert upd2["metadata"]["generation"] == 2
    assert int(upd2["metadata"]["resourceVersion"]) > int(upd["metadata"]["resourceVersion"])
    with pytest.raises(ConflictError):
        c.update(r.DEVICE_CLASSES, stale)


def test_noop_write_keeps_rv_and_list_rv_covers_own_writes(server: ApiTarget) -> None:
    c, ns = server.client(), server.ns
    created = c.create(r.PODS, pod("a", ns, app="x"))
    same = c.patch(r.PODS, "a", {"metadata": {"labels": {"app": "x"}}}, namespace=ns)
    assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    listed = c.list(r.PODS, namespace=ns)["metadata"]["resourceVersion"]
    assert int(listed) >= int(created["metadata"]["resourceVersion"])


def test_status_subresource_rules(server: ApiTarget) -> None:
    c, ns = server.client(), server.ns
    created = c.create(
        r.COMPUTE_DOMAINS, {**compute_domain("cd", ns), "status": {"status": "Ready"}}
    )
    assert "status" not in created
    created["status"] = {"status": "Ready"}
    assert "status" not in c.update(r.COMPUTE_DOMAINS, created)
    st = c.patch(
        r.COMPUTE_DOMAINS,
        "cd",
        {"status": {"status": "Ready"}, "spec": {"numNodes": 9}},
        namespace=ns,
        subresource="status",
    )
    assert st["status"] == {"status": "Ready"} and st["spec"] == created["spec"]
    got = c.get(r.COMPUTE_DOMAINS, "cd", namespace=ns)
    got["status"] = {"status": "NotReady"}
    out = c.update(r.COMPUTE_DOMAINS, got, subresource="status")
    assert out["status"] == {"status": "NotReady"}
    assert out["metadata"]["generation"] == 1  # status writes never bump the generation


def test_strategic_merge_is_refused_for_custom_resources(server: ApiTarget) -> None:
    c, ns = server.client(), server.ns
    c.create(r.COMPUTE_DOMAINS, compute_domain("cd", ns))
    with pytest.raises(ApiError) as exc:
        c.patch(
            r.COMPUTE_DOMAINS,
            "cd",
            {"metadata": {"labels": {"a": "b"}}},
            namespace=ns,
            patch_type="strategic",
        )
    assert exc.value.status == 415


@pytest.mark.parametrize(
    ("patch_type", "body", "labels"),
    [
        ("merge", {"metadata": {"labels": {"b": "2", "a": None}}}, {"b": "2"}),
        ("strategic", {"metadata": {"labels": {"b": "2"}}}, {"a": "1", "b": "2"}),
        ("json", [{"op": "replace", "path": "/metadata/labels/a", "value": "9"}], {"a": "9"}),
        (
            "apply",
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"labels": {"c": "3"}}},
            {"a": "1", "c": "3"},
        ),
    ],
    ids=["merge", "strategic", "json", "apply"],
)
def test_patch_types(server: ApiTarget, patch_type: str, body: Any, labels: JSON) -> None:
    c, ns = server.client(), server.ns
    c.create(r.PODS, pod("a", ns, a="1"))
    out = c.patch(
        r.PODS,
        "a",
        body,
        namespace=ns,
        patch_type=patch_type,  # type: ignore[arg-type]
        field_manager="t",
        force=patch_type == "apply",
    )
    assert out["metadata"]["labels"] == labels


@pytest.mark.fake_only("the request log is a hook of the fake")
def test_requests_are_logged_with_their_query(server: ApiTarget) -> None:
    assert server.fake is not None
    c, ns = server.client(), server.ns
    c.create(r.PODS, pod("a", ns))
    c.patch(r.PODS, "a", {"metadata": {"labels": {"b": "2"}}}, namespace=ns, field_manager="t")
    last = server.fake.requests[-1]
    assert (last.method, last.query.get("fieldManager")) == ("PATCH", "t")
    assert server.fake.request_log[-1] == ("PATCH", f"/api/v1/namespaces/{ns}/pods/a")


def test_apply_creates_and_json_patch_test_fails(server: ApiTarget) -> None:
    c, ns = server.client(), server.ns
    body = pod("n", ns)
    assert c.patch(r.PODS, "n", body, namespace=ns, patch_type="apply", field_manager="m")
    with pytest.raises(InvalidError):
        c.patch(
            r.PODS,
            "n",
            [{"op": "test", "path": "/metadata/name", "value": "x"}],
            namespace=ns,
            patch_type="json",
        )
    with pytest.raises(NotFoundError):
        c.patch(r.PODS, "missing", {"metadata": {"labels": {"a": "1"}}}, namespace=ns)


# -- deletion ----------------------------------------------------------------------------------


def test_finalizers_preconditions_and_gc(server: ApiTarget) -> None:
    c, ns = server.client(), server.ns
    owner = c.create(r.COMPUTE_DOMAINS, compute_domain("cd", ns, finalizers=["example.com/f"]))
    uid = owner["metadata"]["uid"]
    ref = {
        "apiVersion": r.COMPUTE_DOMAINS.api_version,
        "kind": "ComputeDomain",
        "name": "cd",
        "uid": uid,
    }
    c.create(r.DAEMONSETS, daemonset("ds", ns, ref))
    with pytest.raises(ConflictError):
        c.delete(r.COMPUTE_DOMAINS, "cd", namespace=ns, uid="wrong")
    with pytest.raises(ConflictError):
        c.delete(r.COMPUTE_DOMAINS, "cd", namespace=ns, resource_version="1")
    marked = c.delete(r.COMPUTE_DOMAINS, "cd", namespace=ns, uid=uid)
    assert marked is not None and marked["metadata"]["deletionTimestamp"]
    assert c.get(r.COMPUTE_DOMAINS, "cd", namespace=ns)["metadata"]["deletionTimestamp"]
    assert c.get(r.DAEMONSETS, "ds", namespace=ns)
    c.patch(r.COMPUTE_DOMAINS, "cd", {"metadata": {"finalizers": None}}, namespace=ns)
    server.eventually(
        lambda: not c.list(r.COMPUTE_DOMAINS, namespace=ns)["items"],
        "ComputeDomain removed with its last finalizer",
    )
    server.eventually(
        lambda: not c.list(r.DAEMONSETS, namespace=ns)["items"],
        "the dependent DaemonSet garbage-collected",
    )


def test_delete_answers_the_object_or_a_status_per_kind(server: ApiTarget) -> None:
    c, ns = server.client(), server.ns
    c.create(r.PODS, pod("a", ns))
    removed = c.delete(r.PODS, "a", namespace=ns)  # pods answer the deleted object
    assert removed is not None and removed["metadata"]["name"] == "a"
    c.create(r.COMPUTE_DOMAINS, compute_domain("cd", ns))
    assert c.delete(r.COMPUTE_DOMAINS, "cd", namespace=ns) is None  # a Status
    c.create(r.COMPUTE_DOMAINS, compute_domain("cd", ns, finalizers=["example.com/f"]))
    marked = c.delete(r.COMPUTE_DOMAINS, "cd", namespace=ns)  # still there: the object
    assert marked is not None and marked["metadata"]["deletionTimestamp"]
    with pytest.raises(NotFoundError):
        c.delete(r.COMPUTE_DOMAINS, "missing", namespace=ns)


def test_finalized_deletion_is_watched_as_modified_then_deleted(server: ApiTarget) -> None:
    c, ns = server.client(), server.ns
    rv = c.list(r.COMPUTE_DOMAINS, namespace=ns)["metadata"]["resourceVersion"]
    c.create(r.COMPUTE_DOMAINS, compute_domain("cd", ns, finalizers=["example.com/f"]))
    c.delete(r.COMPUTE_DOMAINS, "cd", namespace=ns)
    c.patch(r.COMPUTE_DOMAINS, "cd", {"metadata": {"finalizers": None}}, namespace=ns)
    w = c.watch(
        r.COMPUTE_DOMAINS,
        namespace=ns,
        resource_version=rv,
        timeout_seconds=1,
        allow_watch_bookmarks=False,
    )
    events = [(e.type, e.object) for e in w]
    assert [t for t, _ in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert events[1][1]["metadata"]["deletionTimestamp"]


# -- lists -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=a", ["p1", "p2"]),
        ("app!=a", ["p3", "p4"]),
        ("app in (a,b)", ["p1", "p2", "p3"]),
        ("app notin (a)", ["p3", "p4"]),
        ("tier", ["p2"]),
        ("!tier", ["p1", "p3", "p4"]),
        ("app=a,tier", ["p2"]),
    ],
)
def test_label_selectors(server: ApiTarget, selector: str, expected: list[str]) -> None:
    c, ns = server.client(), server.ns
    for obj in (
        pod("p1", ns, app="a"),
        pod("p2", ns, app="a", tier="x"),
        pod("p3", ns, app="b"),
        pod("p4", ns),
    ):
        c.create(r.PODS, obj)
    items = c.list(r.PODS, namespace=ns, label_selector=selector)["items"]
    assert names(items) == expected
    # Items of built-in kinds carry no apiVersion/kind in a LIST.
    assert not any("kind" in i or "apiVersion" in i for i in items)


def test_field_selectors_and_namespaces(server: ApiTarget) -> None:
    c, ns = server.client(), server.ns
    for i, node in enumerate(["n1", "n2", "n1"]):
        c.create(r.PODS, pod(f"p{i}", [ns, server.ns2][i % 2], node=f"{ns}-{node}"))
    assert len(c.list(r.PODS, field_selector=f"spec.nodeName={ns}-n1")["items"]) == 2
    assert len(c.list(r.PODS, namespace=server.ns2)["items"]) == 1
    got = c.list(r.PODS, field_selector=f"metadata.namespace={ns},metadata.name!=p0")["items"]
    assert names(got) == ["p2"]


def test_metadata_only_list(server: ApiTarget) -> None:
    c, ns = server.client(), server.ns
    c.create(r.PODS, pod("a", ns, app="x"))
    out = c.list(r.PODS, namespace=ns, metadata_only=True)
    assert out["kind"] == "PartialObjectMetadataList" and out["metadata"]["resourceVersion"]
    assert names(out["items"]) == ["a"] and out["items"][0]["metadata"]["labels"] == {"app": "x"}
    assert "spec" not in out["items"][0]


@pytest.mark.parametrize("resource", [r.PODS, r.LEASES], ids=["pods", "leases"])
def test_pagination_is_a_consistent_snapshot(server: ApiTarget, resource: Resource) -> None:
    c, ns = server.client(), server.ns
    make = pod if resource == r.PODS else lease
    for i in range(7):
        c.create(resource, make(f"n{i}", ns))
    page = c.list(resource, namespace=ns, limit=3)
    got = names(page["items"])
    rv = page["metadata"]["resourceVersion"]
    assert page["metadata"]["remainingItemCount"] == 4
    c.create(resource, make("late", ns))
    while page["metadata"].get("continue"):
        page = c.list(resource, namespace=ns, limit=3, continue_token=page["metadata"]["continue"])
        assert page["metadata"]["resourceVersion"] == rv
        got += names(page["items"])
    assert got == [f"n{i}" for i in range(7)]


def test_continue_token_expires_with_compaction(server: ApiTarget) -> None:
    c, ns = server.client(), server.ns
    for i in range(3):
        c.create(r.LEASES, lease(f"l{i}", ns))
    token = c.list(r.LEASES, namespace=ns, limit=2)["metadata"]["continue"]
    c.create(r.LEASES, lease("late", ns))
    server.compact()
    with pytest.raises(GoneError):
        c.list(r.LEASES, namespace=ns, limit=2, continue_token=token)


# -- watches -----------------------------------------------------------------------------------


def test_watch_replays_from_rv_with_selector_transitions(server: ApiTarget) -> None:
    c, ns, cd = server.client(), server.ns, r.COMPUTE_DOMAINS
    rv = c.list(cd, namespace=ns)["metadata"]["resourceVersion"]
    c.create(cd, compute_domain("a", ns, labels={"app": "x"}))
    c.patch(cd, "a", {"metadata": {"labels": {"app": "y"}}}, namespace=ns)
    c.patch(cd, "a", {"metadata": {"labels": {"app": "x"}}}, namespace=ns)
    c.delete(cd, "a", namespace=ns)
    events = _collect(
        c,
        cd,
        namespace=ns,
        resource_version=rv,
        timeout_seconds=1,
        label_selector="app=x",
        allow_watch_bookmarks=False,
    )
    assert [t for t, _ in events] == ["ADDED", "DELETED", "ADDED", "DELETED"]
    assert (
        _collect(
            c,
            cd,
            namespace=ns,
            resource_version="0",
            timeout_seconds=1,
            allow_watch_bookmarks=False,
        )
        == []
    )


def test_watch_bookmark_arrives_before_the_timeout(server: ApiTarget) -> None:
    # A real server sends one 2 s before the deadline (and every minute); the fake more often.
    c, ns = server.client(), server.ns
    rv = c.list(r.PODS, namespace=ns)["metadata"]["resourceVersion"]
    created = c.create(r.PODS, pod("a", ns))
    w = c.watch(r.PODS, namespace=ns, resource_version=rv, timeout_seconds=3)
    events = []
    for e in w:
        events.append(e)
        if e.type == "BOOKMARK":
            w.stop()
    assert [e.type for e in events] == ["ADDED", "BOOKMARK"]
    bookmark_rv = int(events[-1].object["metadata"]["resourceVersion"])
    assert bookmark_rv >= int(created["metadata"]["resourceVersion"])
    assert not events[-1].object["metadata"].get("name")  # a bookmark names no object


def test_watch_from_zero_starts_with_the_current_state(server: ApiTarget) -> None:
    c, ns = server.client(), server.ns
    created = [c.create(r.PODS, pod(name, ns)) for name in ("b", "a")]
    # "0" is whatever the watch cache holds: a LIST at the last create's resourceVersion (not
    # older than) waits until it holds both, or a loaded real server may send "a" as a change.
    c.list(r.PODS, namespace=ns, resource_version=created[-1]["metadata"]["resourceVersion"])
    events = _collect(
        c, namespace=ns, resource_version="0", timeout_seconds=1, allow_watch_bookmarks=False
    )
    assert events == [("ADDED", "a"), ("ADDED", "b")]


def test_streaming_watch_list_ends_initial_events_with_a_bookmark(server: ApiTarget) -> None:
    c, ns = server.client(), server.ns
    for name in ("a", "b"):
        c.create(r.PODS, pod(name, ns))
    w = c.watch(
        r.PODS, namespace=ns, resource_version="", timeout_seconds=1, send_initial_events=True
    )
    events = []
    for e in w:
        events.append(e)
        if e.type == "BOOKMARK" and INITIAL_EVENTS_END in (
            e.object["metadata"].get("annotations") or {}
        ):
            w.stop()
            break
    assert [(e.type, e.object["metadata"].get("name")) for e in events[:2]] == [
        ("ADDED", "a"),
        ("ADDED", "b"),
    ]
    end = events[-1].object["metadata"]
    assert events[-1].type == "BOOKMARK" and end["annotations"][INITIAL_EVENTS_END] == "true"
    assert int(end["resourceVersion"]) >= max(
        int(e.object["metadata"]["resourceVersion"]) for e in events[:2]
    )


def test_watch_from_compacted_rv_is_gone(server: ApiTarget) -> None:
    c, ns = server.client(), server.ns
    rv = c.list(r.LEASES, namespace=ns)["metadata"]["resourceVersion"]
    c.create(r.LEASES, lease("a", ns))
    server.compact()
    with pytest.raises(GoneError):
        _collect(c, r.LEASES, namespace=ns, resource_version=rv, timeout_seconds=1)


@pytest.mark.fake_only("error injection is a hook of the fake")
def test_injected_errors(server: ApiTarget) -> None:
    api = server.fake
    assert api is not None
    c, ns = server.client(), server.ns
    api.inject_error("WATCH", r.PODS, 429)
    with pytest.raises(TooManyRequestsError):
        _collect(c, resource_version="0", timeout_seconds=1)
    api.inject_error("WATCH", r.PODS, 0, count=4)  # urllib3 retries a dropped GET 3 times
    with pytest.raises(ConnectionFailedError):
        _collect(c, resource_version="0", timeout_seconds=1)
    api.inject_error("POST", r.PODS, 503, count=2)
    for _ in range(2):
        with pytest.raises(ServerError):
            c.create(r.PODS, pod("b", ns))
    assert c.create(r.PODS, pod("b", ns))


@pytest.mark.fake_only("dropping every open watch is a hook of the fake")
def test_close_watches_drops_open_watches(server: ApiTarget) -> None:
    api = server.fake
    assert api is not None
    c, ns = server.client(), server.ns
    w = c.watch(r.PODS, resource_version="0", timeout_seconds=30, allow_watch_bookmarks=False)
    errors: list[BaseException] = []
    started = threading.Event()

    def consume() -> None:
        try:
            started.set()
            list(w)
        except ConnectionFailedError as exc:
            errors.append(exc)

    t = threading.Thread(target=consume)
    t.start()
    started.wait()
    c.create(r.PODS, pod("x", ns))  # ensures the watch is established before dropping
    while not any(req.query.get("watch") for req in api.requests):
        pass
    api.close_watches()
    t.join(5)
    assert not t.is_alive() and len(errors) == 1


def test_stop_unblocks_a_watch_waiting_for_events(server: ApiTarget) -> None:
    c, ns = server.client(), server.ns
    w = c.watch(
        r.PODS, namespace=ns, resource_version="0", timeout_seconds=30, allow_watch_bookmarks=False
    )
    t = threading.Thread(target=lambda: list(w))
    t.start()
    stopper = threading.Timer(0.2, w.stop)
    stopper.start()
    t.join(5)
    stopper.join()
    assert not t.is_alive()


def test_many_concurrent_watchers_see_every_event(server: ApiTarget) -> None:
    c, ns = server.client(), server.ns
    rv = c.list(r.PODS, namespace=ns)["metadata"]["resourceVersion"]
    results: list[list[tuple[str, str]]] = []
    lock = threading.Lock()

    def watch() -> None:
        got = _collect(
            c, namespace=ns, resource_version=rv, timeout_seconds=2, allow_watch_bookmarks=False
        )
        with lock:
            results.append(got)

    threads = [threading.Thread(target=watch) for _ in range(12)]
    for t in threads:
        t.start()
    writers = [
        threading.Thread(target=lambda i=i: c.create(r.PODS, pod(f"p{i}", ns))) for i in range(20)
    ]
    for t in writers:
        t.start()
    for t in writers + threads:
        t.join(10)
    assert len(results) == 12
    for got in results:
        assert sorted(n for _, n in got) == sorted(f"p{i}" for i in range(20))


# -- where the fake differs (strict xfail against the fake) ------------------------------------


@pytest.mark.fake_gap("namespaces are not checked: unit tests write to namespaces never created")
def test_create_in_a_missing_namespace_is_not_found(server: ApiTarget) -> None:
    with pytest.raises(NotFoundError):
        server.client().create(r.PODS, pod("a", f"{server.ns}-missing"))


def test_a_second_clique_entry_of_one_node_is_refused(server: ApiTarget) -> None:
    """The daemons' join patch (pkg.daemon.membership) relies on this: the
    clique's ``daemons`` list is ``x-kubernetes-list-type: map`` keyed by ``nodeName``, so a
    JSON patch appending a second entry of a node is a 422, whatever its index."""
    c, ns = server.client(), server.ns
    entry = {"nodeName": "n1", "ipAddress": "10.0.0.1", "cliqueID": "u.1", "index": 0}
    c.create(
        r.COMPUTE_DOMAIN_CLIQUES,
        {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "ComputeDomainClique",
            "metadata": {"name": "uid.u.1", "namespace": ns},
            "daemons": [entry],
        },
        namespace=ns,
    )
    with pytest.raises(InvalidError):
        c.patch(
            r.COMPUTE_DOMAIN_CLIQUES,
            "uid.u.1",
            [{"op": "add", "path": "/daemons/-", "value": {**entry, "index": 1}}],
            namespace=ns,
            patch_type="json",
        )


@pytest.mark.fake_gap("no graceful deletion: deleting a pod is one write (unit tests count it)")
def test_deleting_a_pod_marks_it_first(server: ApiTarget) -> None:
    c, ns = server.client(), server.ns
    rv = c.list(r.PODS, namespace=ns)["metadata"]["resourceVersion"]
    c.create(r.PODS, pod("a", ns))
    c.delete(r.PODS, "a", namespace=ns)
    w = c.watch(
        r.PODS, namespace=ns, resource_version=rv, timeout_seconds=1, allow_watch_bookmarks=False
    )
    events = [(e.type, e.object["metadata"]) for e in w]
    assert [t for t, _ in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert events[1][1]["deletionGracePeriodSeconds"] == 0 and events[1][1]["generation"] == 2


@pytest.mark.fake_gap("no graceful deletion: a pod bound to a node is removed at once")
def test_deleting_a_bound_pod_waits_for_its_grace_period(server: ApiTarget) -> None:
    c, ns = server.client(), server.ns
    c.create(r.PODS, pod("a", ns, node=f"{ns}-node"))
    c.delete(r.PODS, "a", namespace=ns)
    meta = c.get(r.PODS, "a", namespace=ns)["metadata"]
    assert meta["deletionTimestamp"] and meta["deletionGracePeriodSeconds"] == 30


@pytest.mark.fake_gap("server-side apply is a merge patch: no field managers, no conflicts")
def test_server_side_apply_tracks_field_managers(server: ApiTarget) -> None:
    c, ns = server.client(), server.ns

    def apply(manager: str, labels: JSON) -> JSON:
        body = pod("a", ns, **labels)
        return c.patch(r.PODS, "a", body, namespace=ns, patch_type="apply", field_manager=manager)

    apply("m1", {"x": "1", "y": "2"})
    assert apply("m1", {"y": "2"})["metadata"]["labels"] == {"y": "2"}  # m1 gave up x
    with pytest.raises(ConflictError):
        apply("m2", {"y": "3"})  # y belongs to m1


@pytest.mark.fake_gap("strategic merge is a JSON merge patch: lists are replaced, not merged")
def test_strategic_merge_merges_lists_by_key(server: ApiTarget) -> None:
    c, ns = server.client(), server.ns
    body = pod("a", ns)
    body["spec"]["containers"].append({"name": "d", "image": "registry.invalid/d:1"})
    c.create(r.PODS, body)
    patch = {"spec": {"containers": [{"name": "d", "image": "registry.invalid/d:2"}]}}
    out = c.patch(r.PODS, "a", patch, namespace=ns, patch_type="strategic")
    images = {x["name"]: x["image"] for x in out["spec"]["containers"]}
    assert images == {"c": "registry.invalid/c:1", "d": "registry.invalid/d:2"}


@pytest.mark.fake_gap("no OpenAPI schemas: custom resources are neither pruned nor defaulted")
def test_custom_resources_are_pruned_and_defaulted(server: ApiTarget) -> None:
    body = compute_domain("cd", server.ns)
    body["spec"]["unknownField"] = 1
    spec = server.client().create(r.COMPUTE_DOMAINS, body)["spec"]
    assert "unknownField" not in spec and spec["numNodes"] == 0


@pytest.mark.fake_gap("no CEL validation: ComputeDomain.spec is immutable only for real")
def test_custom_resource_validation_rules_apply(server: ApiTarget) -> None:
    c, ns = server.client(), server.ns
    c.create(r.COMPUTE_DOMAINS, compute_domain("cd", ns))
    with pytest.raises(InvalidError):
        c.patch(r.COMPUTE_DOMAINS, "cd", {"spec": {"numNodes": 3}}, namespace=ns)


@pytest.mark.fake_gap("any field path is selectable: the real server allows a few per kind")
def test_field_selector_on_an_unsupported_field_is_refused(server: ApiTarget) -> None:
    with pytest.raises(BadRequestError):
        server.client().list(r.PODS, namespace=server.ns, field_selector="spec.priority=1")
