"""Test helpers for the controller: live caches over the fake API server, recorders, builders.

`LiveCaches` answers every cache read from the fake server's current objects, so reconcile
tests see a perfectly synced cache; cache *lag* is simulated explicitly where a test needs it.
"""

from __future__ import annotations

import builtins
import threading
import time
from collections.abc import Callable
from typing import Any

from pkg.api import constants as c
from pkg.base.types import JSON
from pkg.informers.store import Indexer
from pkg.kube import resources as res
from pkg.kube.resources import Resource
from pkg.reconcilers.cache import INDEXES, Caches
from pkg.testing.fakeapiserver import FakeApiServer

DRIVER_NS = "nvidia-dra-driver"


class LiveCache:
    """An `ObjectCache` rebuilt from the fake server on every read (optionally filtered)."""

    def __init__(
        self,
        server: FakeApiServer,
        resource: Resource,
        indexes: dict[str, Callable[[JSON], list[str]]],
        *,
        keep: Callable[[JSON], bool] = lambda _o: True,
    ) -> None:
        self._server = server
        self._resource = resource
        self._indexes = indexes
        self._keep = keep
        self.hidden: set[str] = set()  # keys to pretend the cache has not seen yet

    def _indexer(self) -> Indexer:
        idx = Indexer(dict(self._indexes))
        for obj in self._server.objects(self._resource):
            if self._keep(obj) and idx.key(obj) not in self.hidden:
                idx.add(obj)
        return idx

    def get_by_key(self, key: str) -> JSON | None:
        return self._indexer().get_by_key(key)

    def list(self) -> list[JSON]:
        return self._indexer().list()

    def by_index(self, index: str, value: str) -> builtins.list[JSON]:
        return self._indexer().by_index(index, value)

    def index_values(self, index: str) -> builtins.list[str]:
        return self._indexer().index_values(index)


def _labelled_in(namespace: str | None) -> Callable[[JSON], bool]:
    def keep(obj: JSON) -> bool:
        meta = obj["metadata"]
        if namespace is not None and meta.get("namespace") != namespace:
            return False
        return c.COMPUTE_DOMAIN_LABEL in (meta.get("labels") or {})

    return keep


def live_caches(server: FakeApiServer, *, namespace: str = DRIVER_NS) -> Caches:
    def cache(name: str, resource: Resource, **kw: Any) -> LiveCache:
        return LiveCache(server, resource, INDEXES[name], **kw)

    return Caches(
        compute_domains=cache("compute_domains", res.COMPUTE_DOMAINS),
        daemonsets=cache("daemonsets", res.DAEMONSETS, keep=_labelled_in(namespace)),
        pods=cache("pods", res.PODS, keep=_labelled_in(namespace)),
        cliques=cache("cliques", res.COMPUTE_DOMAIN_CLIQUES, keep=_labelled_in(namespace)),
        rcts=cache("rcts", res.RESOURCE_CLAIM_TEMPLATES, keep=_labelled_in(None)),
        nodes=cache("nodes", res.NODES),
        claims=cache("claims", res.RESOURCE_CLAIMS),
        slices=cache("slices", res.RESOURCE_SLICES),
    )


class RecordedEvents:
    """`EventSink` that keeps (object name, type, reason, message) tuples."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str, str, str]] = []
        self._lock = threading.Lock()

    def event(self, obj: JSON, type_: str, reason: str, message: str) -> None:
        with self._lock:
            self.items.append((obj["metadata"].get("name", ""), type_, reason, message))

    def reasons(self) -> list[str]:
        return [i[2] for i in self.items]


# -- builders ---------------------------------------------------------------------------------


def compute_domain(name: str = "cd1", ns: str = "team", **spec: Any) -> JSON:
    body: JSON = {"channel": {"resourceClaimTemplate": {"name": f"{name}-channel"}}}
    body.update(spec)
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.COMPUTE_DOMAIN_KIND,
        "metadata": {"name": name, "namespace": ns},
        "spec": body,
    }


def rfc3339(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def node(
    name: str,
    *,
    ready: str = "True",
    labels: JSON | None = None,
    taints: Any = None,
    since: float | None = None,
) -> JSON:
    """A Node; ``since`` (epoch) is its Ready condition's ``lastTransitionTime``."""
    cond: JSON = {"type": "Ready", "status": ready}
    if since is not None:
        cond["lastTransitionTime"] = rfc3339(since)
    obj: JSON = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {"taints": taints} if taints else {},
        "status": {"conditions": [cond]},
    }
    return obj


def daemon_pod(
    uid: str,
    node_name: str,
    *,
    ip: str | None = None,
    clique: str | None = None,
    ready: bool = True,
    ns: str = DRIVER_NS,
    container: str | None = None,
) -> JSON:
    """A Running daemon pod. ``podIP`` is ``ip``, or 10.0.0.1 on a non-NVLink pod; a fabric
    pod without ``ip`` has none, so it never contradicts the IP of a clique entry.
    ``container`` (a state: running, terminated, waiting) adds a daemon container status."""
    labels = {c.COMPUTE_DOMAIN_LABEL: uid}
    if clique is not None:
        labels[c.CLIQUE_ID_LABEL] = clique
    status: JSON = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    if ip is None and clique == "":
        ip = "10.0.0.1"
    if ip is not None:
        status["podIP"] = ip
    if container is not None:
        status["containerStatuses"] = [
            {
                "name": c.DAEMON_CONTAINER_NAME,
                "ready": ready and container == "running",
                "restartCount": 0,
                "state": {container: {}},
            },
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"daemon-{node_name}", "namespace": ns, "labels": labels},
        "spec": {"nodeName": node_name, "containers": [{"name": "d", "image": "i"}]},
        "status": status,
    }


def clique(uid: str, clique_id: str, daemons: list[JSON], *, ns: str = DRIVER_NS) -> JSON:
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.COMPUTE_DOMAIN_CLIQUE_KIND,
        "metadata": {
            "name": c.clique_object_name(uid, clique_id),
            "namespace": ns,
            "labels": {c.COMPUTE_DOMAIN_LABEL: uid, c.CLIQUE_ID_LABEL: clique_id},
        },
        "daemons": daemons,
    }


def daemon_entry(
    node_name: str, *, index: int, status: str = "Ready", clique_id: str = "cl.1"
) -> JSON:
    return {
        "nodeName": node_name,
        "ipAddress": f"10.1.0.{index + 1}",
        "cliqueID": clique_id,
        "index": index,
        "status": status,
    }


def channel_claim(
    name: str, *, ns: str, uid: str, node_name: str | None, allocated: bool = True
) -> JSON:
    obj: JSON = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "channel"}]}},
        "status": {},
    }
    if allocated:
        obj["status"]["allocation"] = {
            "devices": {
                "results": [
                    {
                        "request": "channel",
                        "driver": c.DRIVER_NAME,
                        "pool": node_name,
                        "device": c.CHANNEL_DEVICE_NAME,
                    },
                ],
                "config": [
                    {
                        "source": "FromClaim",
                        "requests": ["channel"],
                        "opaque": {
                            "driver": c.DRIVER_NAME,
                            "parameters": {
                                "apiVersion": c.API_VERSION,
                                "kind": c.CHANNEL_CONFIG_KIND,
                                "domainID": uid,
                            },
                        },
                    }
                ],
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [node_name]}
                        ]
                    }
                ]
            },
        }
    return obj


def resource_slice(node_name: str, *, clique_id: str | None, qualified: bool = False) -> JSON:
    attrs: JSON = {"type": {"string": "channel"}, "id": {"int": 0}}
    if clique_id is not None:
        key = f"{c.DRIVER_NAME}/cliqueID" if qualified else "cliqueID"
        attrs[key] = {"string": clique_id}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node_name}-cd"},
        "spec": {
            "driver": c.DRIVER_NAME,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": c.CHANNEL_DEVICE_NAME, "attributes": attrs}],
        },
    }


class LaggingCache:
    """`ObjectCache` that, once :meth:`freeze` is called, answers from that snapshot: an
    informer that has not yet delivered the writes made since."""

    def __init__(self, live: LiveCache, name: str) -> None:
        self._live = live
        self._indexes = INDEXES[name]
        self._snapshot: builtins.list[JSON] | None = None

    def freeze(self) -> None:
        self._snapshot = self._live.list()

    def thaw(self) -> None:
        """The informer caught up."""
        self._snapshot = None

    def get_by_key(self, key: str) -> JSON | None:
        if self._snapshot is None:
            return self._live.get_by_key(key)
        for obj in self._snapshot:
            meta = obj["metadata"]
            if f"{meta.get('namespace')}/{meta['name']}" in (key, f"None/{key}"):
                return obj
        return None

    def list(self) -> builtins.list[JSON]:
        return self._live.list() if self._snapshot is None else list(self._snapshot)

    def by_index(self, index: str, value: str) -> builtins.list[JSON]:
        if self._snapshot is None:
            return self._live.by_index(index, value)
        return [o for o in self._snapshot if value in self._indexes[index](o)]

    def index_values(self, index: str) -> builtins.list[str]:
        if self._snapshot is None:
            return self._live.index_values(index)
        return sorted({v for o in self._snapshot for v in self._indexes[index](o)})
