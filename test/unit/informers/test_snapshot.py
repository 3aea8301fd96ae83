"""`/debug/informers` documents: each cache's slice, sync state and {key: resourceVersion}."""

from __future__ import annotations

from pkg.base.types import JSON
from pkg.informers.factory import SharedInformerFactory
from pkg.informers.snapshot import factory_snapshot
from pkg.kube import resources as r
from pkg.testing.clock import FakeClock
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer


def pod(name: str, **labels: str) -> JSON:
    return {"metadata": {"name": name, "namespace": "ns", "labels": labels}, "spec": {}}


def node(name: str) -> JSON:
    return {"metadata": {"name": name, "labels": {}}, "status": {"phase": "x"}}


def rvs(api: FakeApiServer, res: r.Resource) -> dict[str, str]:
    out = {}
    for o in api.objects(res):
        meta = o["metadata"]
        key = f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]
        out[key] = meta["resourceVersion"]
    return out


def test_snapshot_names_each_slice_and_holds_keys_and_resource_versions() -> None:
    with FakeApiServer() as api:
        api.seed(r.PODS, pod("a", app="x"))
        api.seed(r.PODS, pod("b"))
        api.seed(r.NODES, node("n1"))
        client = api.client()
        factory = SharedInformerFactory(client, clock=FakeClock())
        factory.informer_for(r.PODS, "ns", label_selector="app")
        factory.informer_for(r.NODES, metadata_only=True)
        factory.informer_for(r.NODES, field_selector="metadata.name=n2")
        before = factory_snapshot(factory)
        assert [s["synced"] for s in before] == [False, False, False]
        assert all(s["objects"] == {} for s in before)
        factory.start()
        assert factory.wait_for_cache_sync(5)
        pods, meta_nodes, one_node = factory_snapshot(factory)
        assert {k: pods[k] for k in ("group", "version", "resource", "kind", "namespaced")} == {
            "group": "",
            "version": "v1",
            "resource": "pods",
            "kind": "Pod",
            "namespaced": True,
        }
        selectors = (pods["namespace"], pods["labelSelector"], pods["fieldSelector"])
        assert selectors == ("ns", "app", None)
        assert pods["synced"] and pods["metadataOnly"] is False
        assert pods["objects"] == {"ns/a": rvs(api, r.PODS)["ns/a"]}  # the selector applies
        assert meta_nodes["metadataOnly"] is True and meta_nodes["namespace"] is None
        assert meta_nodes["objects"] == rvs(api, r.NODES)  # cluster-scoped keys: the name
        assert one_node["fieldSelector"] == "metadata.name=n2" and one_node["objects"] == {}
        # Writes show up as new resourceVersions; deletes drop the key.
        client.patch(r.PODS, "a", {"metadata": {"labels": {"v": "2"}}}, namespace="ns")
        client.create(r.PODS, pod("c", app="y"))
        client.delete(r.NODES, "n1")
        want = {k: v for k, v in rvs(api, r.PODS).items() if k != "ns/b"}
        eventually(lambda: factory_snapshot(factory)[0]["objects"] == want)
        eventually(lambda: factory_snapshot(factory)[1]["objects"] == {})
        assert factory_snapshot(factory)[0]["lastSyncResourceVersion"] != ""
        factory.shutdown()
