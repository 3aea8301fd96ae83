"""FakeApiServer semantics over the real RestClient (one server per test, torn down cleanly)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from pkg.base.types import JSON
from pkg.kube import resources as r
from pkg.kube.client import RestClient
from pkg.kube.errors import (
    AlreadyExistsError,
    ConflictError,
    ConnectionFailedError,
    GoneError,
    InvalidError,
    NotFoundError,
    ServerError,
    TooManyRequestsError,
)
from pkg.testing.fakeapiserver import FakeApiServer


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer(bookmark_interval=0.05) as server:
        yield server


def pod(name: str, ns: str = "ns", **labels: str) -> JSON:
    return {"metadata": {"name": name, "namespace": ns, "labels": labels}, "spec": {"x": 1}}


def test_create_assigns_metadata_and_rejects_duplicates(api: FakeApiServer) -> None:
    c = api.client()
    obj = c.create(r.PODS, pod("a"))
    meta = obj["metadata"]
    assert meta["uid"] and meta["creationTimestamp"] and meta["generation"] == 1
    assert obj["kind"] == "Pod" and obj["apiVersion"] == "v1"
    with pytest.raises(AlreadyExistsError) as exc:
        c.create(r.PODS, pod("a"))
    assert exc.value.status == 409 and isinstance(exc.value, ConflictError)
    gen = c.create(r.PODS, {"metadata": {"generateName": "p-", "namespace": "ns"}})
    assert gen["metadata"]["name"].startswith("p-") and len(gen["metadata"]["name"]) == 7


def test_update_conflicts_on_stale_rv_and_bumps_generation_on_spec(api: FakeApiServer) -> None:
    c = api.client()
    obj = c.create(r.COMPUTE_DOMAINS, {"metadata": {"name": "cd", "namespace": "ns"}, "spec": {}})
    stale = dict(obj)
    obj["metadata"]["labels"] = {"a": "b"}
    upd = c.update(r.COMPUTE_DOMAINS, obj)
    assert upd["metadata"]["generation"] == 1
    upd["spec"] = {"numNodes": 2}
    upd2 = c.update(r.COMPUTE_DOMAINS, upd)
    assert upd2["metadata"]["generation"] == 2
    with pytest.raises(ConflictError):
        c.update(r.COMPUTE_DOMAINS, stale)


def test_status_subresource_rules(api: FakeApiServer) -> None:
    c = api.client()
    obj = c.create(r.COMPUTE_DOMAINS, {"metadata": {"name": "cd", "namespace": "ns"},
                                       "spec": {"n": 1}, "status": {"s": "dropped"}})  # fmt: skip
    assert "status" not in obj
    obj["status"] = {"s": "ignored"}
    assert "status" not in c.update(r.COMPUTE_DOMAINS, obj)
    st = c.patch(r.COMPUTE_DOMAINS, "cd", {"status": {"s": "ok"}, "spec": {"n": 9}},
                 namespace="ns", subresource="status")  # fmt: skip
    assert st["status"] == {"s": "ok"} and st["spec"] == {"n": 1}
    got = c.get(r.COMPUTE_DOMAINS, "cd", namespace="ns")
    got["status"] = {"s": "put"}
    assert c.update(r.COMPUTE_DOMAINS, got, subresource="status")["status"] == {"s": "put"}


@pytest.mark.parametrize(
    ("patch_type", "body", "labels"),
    [
        ("merge", {"metadata": {"labels": {"b": "2", "a": None}}}, {"b": "2"}),
        ("strategic", {"metadata": {"labels": {"b": "2"}}}, {"a": "1", "b": "2"}),
        ("json", [{"op": "replace", "path": "/metadata/labels/a", "value": "9"}], {"a": "9"}),
        ("apply", {"apiVersion": "v1", "kind": "Pod", "metadata": {"labels": {"c": "3"}}},
         {"a": "1", "c": "3"}),
    ],
    ids=["merge", "strategic", "json", "apply"],
)  # fmt: skip
def test_patch_types(api: FakeApiServer, patch_type: str, body: JSON, labels: JSON) -> None:
    c = api.client()
    c.create(r.PODS, pod("a", a="1"))
    out = c.patch(r.PODS, "a", body, namespace="ns", patch_type=patch_type,  # type: ignore[arg-type]
                  field_manager="t", force=patch_type == "apply")  # fmt: skip
    assert out["metadata"]["labels"] == labels
    assert api.requests[-1].query.get("fieldManager") == "t"


def test_apply_creates_and_json_patch_test_fails(api: FakeApiServer) -> None:
    c = api.client()
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "n", "namespace": "ns"}}
    assert c.patch(r.PODS, "n", body, namespace="ns", patch_type="apply", field_manager="m")
    with pytest.raises(InvalidError):
        c.patch(r.PODS, "n", [{"op": "test", "path": "/metadata/name", "value": "x"}],
                namespace="ns", patch_type="json")  # fmt: skip
    with pytest.raises(NotFoundError):
        c.patch(r.PODS, "missing", {"a": 1}, namespace="ns")


def test_finalizers_preconditions_and_gc() -> None:
    with FakeApiServer(gc=True) as api:
        c = api.client()
        owner = c.create(r.COMPUTE_DOMAINS, {"metadata": {"name": "cd", "namespace": "ns",
                                                          "finalizers": ["f"]}})  # fmt: skip
        ref = {"uid": owner["metadata"]["uid"], "name": "cd", "kind": "ComputeDomain"}
        c.create(r.DAEMONSETS, {"metadata": {"name": "ds", "namespace": "ns",
                                             "ownerReferences": [ref]}})  # fmt: skip
        with pytest.raises(ConflictError):
            c.delete(r.COMPUTE_DOMAINS, "cd", namespace="ns", uid="wrong")
        marked = c.delete(r.COMPUTE_DOMAINS, "cd", namespace="ns", uid=owner["metadata"]["uid"])
        assert marked is not None and marked["metadata"]["deletionTimestamp"]
        assert api.objects(r.DAEMONSETS)
        c.patch(r.COMPUTE_DOMAINS, "cd", {"metadata": {"finalizers": None}}, namespace="ns")
        assert api.objects(r.COMPUTE_DOMAINS) == []
        assert api.objects(r.DAEMONSETS) == []


@pytest.mark.parametrize(
    ("selector", "names"),
    [
        ("app=a", ["p1", "p2"]), ("app!=a", ["p3", "p4"]), ("app in (a,b)", ["p1", "p2", "p3"]),
        ("app notin (a)", ["p3", "p4"]), ("tier", ["p2"]), ("!tier", ["p1", "p3", "p4"]),
        ("app=a,tier", ["p2"]),
    ],
)  # fmt: skip
def test_label_selectors(api: FakeApiServer, selector: str, names: list[str]) -> None:
    for obj in (pod("p1", app="a"), pod("p2", app="a", tier="x"), pod("p3", app="b"), pod("p4")):
        api.seed(r.PODS, obj)
    items = api.client().list(r.PODS, label_selector=selector)["items"]
    assert [i["metadata"]["name"] for i in items] == names


def test_field_selectors_and_namespaces(api: FakeApiServer) -> None:
    for i, node in enumerate(["n1", "n2", "n1"]):
        api.seed(r.PODS, {"metadata": {"name": f"p{i}", "namespace": f"ns{i % 2}"},
                          "spec": {"nodeName": node}})  # fmt: skip
    c = api.client()
    assert len(c.list(r.PODS, field_selector="spec.nodeName=n1")["items"]) == 2
    assert len(c.list(r.PODS, namespace="ns1")["items"]) == 1
    got = c.list(r.PODS, field_selector="metadata.namespace=ns0,metadata.name!=p0")["items"]
    assert [p["metadata"]["name"] for p in got] == ["p2"]


def test_pagination_is_a_consistent_snapshot(api: FakeApiServer) -> None:
    for i in range(7):
        api.seed(r.NODES, {"metadata": {"name": f"n{i}"}})
    c = api.client()
    page = c.list(r.NODES, limit=3)
    names = [n["metadata"]["name"] for n in page["items"]]
    rv = page["metadata"]["resourceVersion"]
    api.seed(r.NODES, {"metadata": {"name": "late"}})
    while page["metadata"].get("continue"):
        page = c.list(r.NODES, limit=3, continue_token=page["metadata"]["continue"])
        assert page["metadata"]["resourceVersion"] == rv
        names += [n["metadata"]["name"] for n in page["items"]]
    assert names == [f"n{i}" for i in range(7)]
    tok = c.list(r.NODES, limit=2)["metadata"]["continue"]
    api.compact()
    with pytest.raises(GoneError):
        c.list(r.NODES, limit=2, continue_token=tok)


def _collect(c: RestClient, **kw: object) -> list[tuple[str, str]]:
    w = c.watch(r.PODS, **kw)  # type: ignore[arg-type]
    return [(e.type, e.object["metadata"].get("name", "")) for e in w]


def test_watch_replays_from_rv_with_selector_transitions(api: FakeApiServer) -> None:
    c = api.client()
    rv = c.list(r.PODS)["metadata"]["resourceVersion"]
    c.create(r.PODS, pod("a", app="x"))
    c.patch(r.PODS, "a", {"metadata": {"labels": {"app": "y"}}}, namespace="ns")
    c.patch(r.PODS, "a", {"metadata": {"labels": {"app": "x"}}}, namespace="ns")
    c.delete(r.PODS, "a", namespace="ns")
    events = _collect(c, resource_version=rv, timeout_seconds=1, label_selector="app=x")
    assert [t for t, _ in events if t != "BOOKMARK"] == ["ADDED", "DELETED", "ADDED", "DELETED"]
    assert events[-1][0] == "BOOKMARK"
    assert _collect(c, resource_version="0", timeout_seconds=1, allow_watch_bookmarks=False) == []


def test_watch_errors(api: FakeApiServer) -> None:
    c = api.client()
    rv = c.list(r.PODS)["metadata"]["resourceVersion"]
    c.create(r.PODS, pod("a"))
    api.compact()
    with pytest.raises(GoneError):
        _collect(c, resource_version=rv, timeout_seconds=1)
    api.inject_error("WATCH", r.PODS, 429)
    with pytest.raises(TooManyRequestsError):
        _collect(c, resource_version="0", timeout_seconds=1)
    api.inject_error("WATCH", r.PODS, 0, count=4)  # urllib3 retries a dropped GET 3 times
    with pytest.raises(ConnectionFailedError):
        _collect(c, resource_version="0", timeout_seconds=1)
    api.inject_error("POST", r.PODS, 503, count=2)
    for _ in range(2):
        with pytest.raises(ServerError):
            c.create(r.PODS, pod("b"))
    assert c.create(r.PODS, pod("b"))


def test_close_watches_drops_and_stop_unblocks(api: FakeApiServer) -> None:
    c = api.client()
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
    c.create(r.PODS, pod("x"))  # ensures the watch is established before dropping
    while not any(req.query.get("watch") for req in api.requests):
        pass
    api.close_watches()
    t.join(5)
    assert not t.is_alive() and len(errors) == 1
    w2 = c.watch(r.PODS, resource_version="0", timeout_seconds=30, allow_watch_bookmarks=False)
    t2 = threading.Thread(target=lambda: list(w2))
    t2.start()
    next_ok = threading.Timer(0.2, w2.stop)
    next_ok.start()
    t2.join(5)
    next_ok.join()
    assert not t2.is_alive()


def test_many_concurrent_watchers_see_every_event(api: FakeApiServer) -> None:
    c = api.client()
    rv = c.list(r.PODS)["metadata"]["resourceVersion"]
    results: list[list[tuple[str, str]]] = []
    lock = threading.Lock()

    def watch() -> None:
        got = _collect(c, resource_version=rv, timeout_seconds=2, allow_watch_bookmarks=False)
        with lock:
            results.append(got)

    threads = [threading.Thread(target=watch) for _ in range(12)]
    for t in threads:
        t.start()
    writers = [threading.Thread(target=lambda i=i: c.create(r.PODS, pod(f"p{i}")))
               for i in range(20)]  # fmt: skip
    for t in writers:
        t.start()
    for t in writers + threads:
        t.join(10)
    assert len(results) == 12
    for got in results:
        assert sorted(n for _, n in got) == sorted(f"p{i}" for i in range(20))
