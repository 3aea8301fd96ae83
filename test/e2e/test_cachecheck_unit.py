"""The cache checker against the in-process fake API server and a real ``/debug/informers``.

No control plane needed (not marked e2e): an informer factory over ``pkg.testing.fakeapiserver``
is served by an `ObservabilityServer` as the controller and the plugin serve theirs; the checker
must find it equal to a fresh LIST, and must report precisely (missing, stale, resourceVersion,
not synced, unreachable) when it is not.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cachecheck import check_process, check_processes, diff, slice_name
from prometheus_client import CollectorRegistry

from pkg.base.clock import RealClock
from pkg.informers.factory import SharedInformerFactory
from pkg.informers.snapshot import factory_snapshot
from pkg.kube import resources as r
from pkg.runtime.httpserver import HealthChecks, ObservabilityServer
from pkg.testing.fakeapiserver import FakeApiServer

Doctor = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]


def pod(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "labels": labels}, "spec": {}}


class Process:
    """A factory's caches served at ``endpoint``; ``doctor`` may falsify the document."""

    def __init__(self, api: FakeApiServer) -> None:
        self.factory = SharedInformerFactory(api.client(), clock=RealClock())
        self.doctor: Doctor = lambda infs: infs
        self.server = ObservabilityServer(
            "127.0.0.1:0",
            registry=CollectorRegistry(),
            liveness=HealthChecks(),
            readiness=HealthChecks(),
            debug={
                "/debug/informers": lambda: {
                    "informers": self.doctor(copy.deepcopy(factory_snapshot(self.factory)))
                }
            },
        )

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.server.port}"


@pytest.fixture
def world() -> Iterator[tuple[FakeApiServer, Process]]:
    with FakeApiServer() as api:
        for name in ("a", "b"):
            api.seed(r.PODS, pod(name, app="x"))
        api.seed(r.PODS, pod("other"))
        api.seed(r.NODES, {"metadata": {"name": "n1"}})
        proc = Process(api)
        proc.factory.informer_for(r.PODS, "ns", label_selector="app")
        proc.factory.informer_for(r.NODES, metadata_only=True)
        proc.server.start()
        proc.factory.start()
        assert proc.factory.wait_for_cache_sync(5)
        yield api, proc
        proc.server.stop()
        proc.factory.shutdown()


def test_equal_caches_pass_and_follow_writes(world: tuple[FakeApiServer, Process]) -> None:
    api, proc = world
    client = api.client()
    assert check_process(client, proc.endpoint, timeout=5) == []
    client.patch(r.PODS, "a", {"metadata": {"labels": {"v": "2"}}}, namespace="ns")
    client.delete(r.PODS, "b", namespace="ns")
    client.create(r.NODES, {"metadata": {"name": "n2"}})
    # Right after the writes the cache may trail; the retry absorbs it.
    assert check_processes(client, {"p": proc.endpoint, "q": proc.endpoint}, timeout=5) == {}


def test_differences_are_reported_precisely(world: tuple[FakeApiServer, Process]) -> None:
    api, proc = world
    client = api.client()
    rv_a = str(api.objects(r.PODS)[0]["metadata"]["resourceVersion"])

    def falsify(infs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        pods = infs[0]["objects"]
        del pods["ns/b"]
        pods["ns/gone"] = "1"
        pods["ns/a"] = "999"
        return infs

    proc.doctor = falsify
    problems = check_process(client, proc.endpoint, timeout=0.3, every=0.1)
    rv_b = str(
        next(o for o in api.objects(r.PODS) if o["metadata"]["name"] == "b")["metadata"][
            "resourceVersion"
        ]
    )
    inf_rv = proc.factory.informers()[0][1].last_sync_resource_version
    at = f" (informer at RV {inf_rv}, LIST at {client.list(r.PODS)['metadata']['resourceVersion']})"
    assert problems == [
        f"pods[ns=ns,labels=app]: missing from the cache: ns/b@{rv_b}{at}",
        f"pods[ns=ns,labels=app]: stale in the cache (not listed): ns/gone@1{at}",
        f"pods[ns=ns,labels=app]: resourceVersion differs (cache != list): ns/a 999 != {rv_a}{at}",
    ]
    assert check_processes(client, {"x": proc.endpoint}, timeout=0.2) == {"x": problems}

    def unsynced(infs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        infs[1]["synced"] = False
        return infs

    proc.doctor = unsynced
    assert check_process(client, proc.endpoint, ready_timeout=0.2) == [
        "nodes[metadata-only]: not synced"
    ]
    proc.doctor = lambda infs: []
    assert check_process(client, proc.endpoint, ready_timeout=0.2) == ["no informers (leading: -)"]
    proc.server.stop()
    (unreachable,) = check_process(client, "127.0.0.1:1", ready_timeout=0.1)
    assert unreachable.startswith("/debug/informers at 127.0.0.1:1 unreachable")


def test_a_process_gets_time_to_become_ready(world: tuple[FakeApiServer, Process]) -> None:
    api, proc = world
    calls = {"n": 0}

    def not_leading_at_first(infs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        calls["n"] += 1
        return [] if calls["n"] <= 3 else infs

    proc.doctor = not_leading_at_first
    # A 0 s difference budget: only the readiness wait lets the check pass.
    assert check_process(api.client(), proc.endpoint, timeout=0, every=0.05) == []
    assert calls["n"] > 3


def test_diff_and_names() -> None:
    assert diff({"a": "1"}, {"a": "1"}) == []
    many = {f"k{i:02d}": "1" for i in range(12)}
    (line,) = diff({}, many)
    assert line.endswith("k09@1 (+2 more)") and "k10" not in line
    inf = {
        "group": "resource.k8s.io",
        "resource": "resourceslices",
        "namespace": None,
        "labelSelector": None,
        "fieldSelector": "spec.nodeName=n1",
        "metadataOnly": False,
    }
    assert slice_name(inf) == "resourceslices.resource.k8s.io[fields=spec.nodeName=n1]"
    assert slice_name({**inf, "fieldSelector": None}) == "resourceslices.resource.k8s.io"


def test_a_process_that_moved_is_followed(world: tuple[FakeApiServer, Process]) -> None:
    """A pod whose node rebooted comes back on a new IP; the endpoint taken from its status
    before the kubelet reported the new one is unreachable. With ``resolve`` the check asks
    again and compares the process where it now serves; without it the old address stays."""
    api, proc = world
    gone = "127.0.0.1:1"  # nothing listens there
    asked: list[str] = []

    def resolve() -> dict[str, str]:
        asked.append("again")
        return {"plugin/n1": proc.endpoint}

    found = check_processes(
        api.client(), {"plugin/n1": gone}, timeout=5, ready_timeout=5, resolve=resolve
    )
    assert found == {} and asked
    (stuck,) = check_process(api.client(), gone, ready_timeout=0.1)
    assert stuck.startswith(f"/debug/informers at {gone} unreachable")
