"""The serialized cache (`pkg.informers.serialized`): what it costs and what reads return."""

from __future__ import annotations

import copy
import json
import tracemalloc

from pkg.base.types import JSON
from pkg.informers.factory import SharedInformerFactory
from pkg.informers.serialized import SerializedCodec
from pkg.informers.store import BY_NODE_NAME, Indexer, index_by_node_name
from pkg.kube import resources as r
from pkg.testing.clock import FakeClock
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer


def claim(i: int) -> JSON:
    """A ResourceClaim as the API server returns it (~1.6 KB of JSON), distinct per ``i``."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": f"worker-{i}-channel-x7k2q",
            "namespace": f"team-{i % 7}",
            "uid": f"4b1c{i:08d}-2f3a-4c5d-9e8f-0a1b2c3d4e5f",
            "resourceVersion": str(100000 + i),
            "creationTimestamp": "2026-11-27T08:00:00Z",
            "labels": {"app": "nccl-test", "job-index": str(i)},
            "annotations": {"resource.kubernetes.io/pod-claim-name": "channel"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": f"worker-{i}",
                    "controller": True,
                    "blockOwnerDeletion": True,
                    "uid": f"9a8b{i:08d}-1c2d-3e4f-5a6b-7c8d9e0f1a2b",
                }
            ],
        },
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
                    }
                ],
                "config": [
                    {
                        "requests": ["channel"],
                        "opaque": {
                            "driver": "compute-domain.nvidia.com",
                            "parameters": {
                                "apiVersion": "resource.nvidia.com/v1beta1",
                                "kind": "ComputeDomainChannelConfig",
                                "domainID": f"0f0e{i:08d}-aaaa-bbbb-cccc-dddddddddddd",
                                "allocationMode": "Single",
                            },
                        },
                    }
                ],
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "channel",
                            "driver": "compute-domain.nvidia.com",
                            "pool": f"gpu-node-{i}",
                            "device": "channel-0",
                        }
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {
                                    "key": "metadata.name",
                                    "operator": "In",
                                    "values": [f"gpu-node-{i}"],
                                }
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [
                {
                    "resource": "pods",
                    "name": f"worker-{i}",
                    "uid": f"9a8b{i:08d}-1c2d-3e4f-5a6b-7c8d9e0f1a2b",
                }
            ],
        },
    }


def _cache_bytes(codec: SerializedCodec | None, objs: list[JSON]) -> int:
    """Bytes the cache allocates to hold ``objs`` (each a fresh decode, as off the wire)."""
    wire = [json.dumps(o).encode() for o in objs]
    tracemalloc.start()
    try:
        idx = Indexer({"ns": lambda o: [o["metadata"]["namespace"]]}, codec=codec)
        before = tracemalloc.get_traced_memory()[0]
        for data in wire:
            idx.add(json.loads(data))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(idx) == len(objs)
    return held


def test_a_serialized_cache_costs_at_most_twice_the_json() -> None:
    """<= 2x the JSON size per object for a cache holding many objects (the LRU of
    decoded objects included); the dict cache holds ~6x. Allocation counts, not time."""
    objs = [claim(i) for i in range(2000)]
    json_size = sum(len(json.dumps(o, separators=(",", ":"))) for o in objs)
    serialized = _cache_bytes(SerializedCodec(), objs) / json_size
    dicts = _cache_bytes(None, objs) / json_size
    assert serialized <= 2.0, (serialized, dicts)
    assert dicts >= 3 * serialized, (serialized, dicts)  # the measure can tell them apart


def test_reads_equal_what_was_stored_and_hot_reads_share_one_dict() -> None:
    codec = SerializedCodec(decoded=2)
    idx = Indexer({BY_NODE_NAME: index_by_node_name}, codec=codec)
    objs = [
        {"metadata": {"name": f"p{i}", "namespace": "ns"}, "spec": {"nodeName": "n1"}}
        for i in range(3)
    ]
    for o in objs:
        idx.add(copy.deepcopy(o))
    first = idx.get_by_key("ns/p2")
    assert first == objs[2] and idx.get_by_key("ns/p2") is first  # in the LRU: the same dict
    assert idx.get_by_key("ns/p0") == objs[0]
    assert idx.get_by_key("ns/p1") == objs[1]  # p2 left the 2-entry LRU
    again = idx.get_by_key("ns/p2")
    assert again == first and again is not first  # decoded afresh from the bytes
    assert [o["metadata"]["name"] for o in idx.by_index(BY_NODE_NAME, "n1")] == ["p0", "p1", "p2"]
    # A write replaces the decoded entry: no read sees the old content.
    changed = {"metadata": {"name": "p2", "namespace": "ns"}, "spec": {"nodeName": "n2"}}
    old = idx.update(changed)
    assert old == objs[2] and idx.get_by_key("ns/p2") is changed
    assert idx.index_keys(BY_NODE_NAME, "n2") == ["ns/p2"]
    # Deleted, then re-added with other content: the LRU never answers for a gone key.
    assert idx.delete_key("ns/p2") == changed and idx.get_by_key("ns/p2") is None
    idx.add({"metadata": {"name": "p2", "namespace": "ns"}, "spec": {"nodeName": "n3"}})
    assert idx.get_by_key("ns/p2") == {
        "metadata": {"name": "p2", "namespace": "ns"},
        "spec": {"nodeName": "n3"},
    }


def test_without_an_lru_every_read_decodes() -> None:
    idx = Indexer(codec=SerializedCodec(decoded=0))
    obj = {"metadata": {"name": "a"}, "data": {"k": "é"}}
    idx.add(obj)
    a, b = idx.get_by_key("a"), idx.get_by_key("a")
    assert a == b == obj and a is not b and a is not obj


def test_a_serialized_informer_notifies_and_lists_like_the_dict_one() -> None:
    """Through the factory (``serialized=True``): handlers see the add and the update (the old
    object decoded from the bytes), the lister the new content, and the cache keeps bytes."""
    with FakeApiServer() as api:
        c = api.client()
        factory = SharedInformerFactory(c, clock=FakeClock())
        inf = factory.informer_for(r.PODS, serialized=True)
        lister = factory.lister_for(r.PODS)
        seen: list[tuple[str, JSON | None, JSON]] = []
        inf.add_event_handler(
            on_add=lambda o: seen.append(("add", None, o)),
            on_update=lambda old, new: seen.append(("update", old, new)),
        )
        factory.start()
        assert factory.wait_for_cache_sync(5)
        c.create(r.PODS, {"metadata": {"name": "a", "namespace": "ns"}, "spec": {}})
        c.patch(r.PODS, "a", {"metadata": {"labels": {"x": "1"}}}, namespace="ns")

        def labelled() -> JSON | None:
            got = lister.get("a", "ns")
            return got if got and got["metadata"].get("labels") == {"x": "1"} else None

        eventually(labelled)
        eventually(lambda: any(k == "update" and n["metadata"].get("labels") for k, _, n in seen))
        assert seen[0][0] == "add" and seen[0][2]["metadata"].get("labels") is None
        # (A relist may add updates with old == new; the patch's update has the old content.)
        patch = [(o, n) for k, o, n in seen if k == "update" and n["metadata"].get("labels")]
        assert patch[0][0] is not None and patch[0][0]["metadata"].get("labels") is None
        assert lister.get("a", "ns") == patch[-1][1]
        assert isinstance(inf.indexer._items["ns/a"], bytes)
        factory.shutdown()
