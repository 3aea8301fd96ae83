"""The controller's view of Nodes: metadata of every Node, health of the domain's Nodes.

Owns how two Node informers combine into the one ``Caches.nodes`` the reconcilers read:

* every Node, metadata only (PartialObjectMetadata, as client-go's metadata informers: labels
  and this driver's own annotations are all the label reconcilers read; other annotations are
  dropped, so a foreign annotation sweep - kube-controller-manager's TTL controller annotates
  every Node when the cluster grows - is an update that changes nothing we hold), re-typed
  ``v1``/``Node`` so Events about a Node name the right kind;
* Nodes labelled ``resource.nvidia.com/computeDomain`` (the nodes that host IMEX daemons),
  full objects slimmed to metadata, spec and ``status.conditions`` — node health (Ready
  condition, unreachable/not-ready taints) is read only for them, as upstream's controller
  watches only those nodes.

Invariants: :meth:`NodeView.get_by_key` prefers the full object when there is one; ``list``
and indexes come from the metadata cache, which holds every Node. Writes to Nodes must be
metadata patches (:func:`patch_node_metadata`), never a PUT of a cached object, which may be
metadata only.
"""

from __future__ import annotations

import builtins

from pkg.base.types import JSON
from pkg.informers.compact import drop_managed_fields
from pkg.kube.client import KubeClient
from pkg.kube.resources import NODES
from pkg.reconcilers.cache import ObjectCache

__all__ = ["NodeView", "as_node_metadata", "patch_node_metadata", "same_node_metadata"]


OWN_ANNOTATION_PREFIX = "resource.nvidia.com/"


def as_node_metadata(obj: JSON) -> JSON:
    """A PartialObjectMetadata Node without managedFields and without annotations other than
    ours (``resource.nvidia.com/``), typed ``v1``/``Node``."""
    out = dict(drop_managed_fields(obj))
    meta = out.get("metadata")
    if isinstance(meta, dict) and meta.get("annotations"):
        meta = dict(meta)
        ours = {k: v for k, v in meta["annotations"].items() if k.startswith(OWN_ANNOTATION_PREFIX)}
        if ours:
            meta["annotations"] = ours
        else:
            del meta["annotations"]
        out["metadata"] = meta
    out["apiVersion"], out["kind"] = "v1", "Node"
    return out


def same_node_metadata(old: JSON, new: JSON) -> bool:
    """Two cached metadata-only Nodes differ in nothing but their resourceVersion (an update
    no reconciler can act on)."""
    om, nm = dict(old.get("metadata") or {}), dict(new.get("metadata") or {})
    om.pop("resourceVersion", None)
    nm.pop("resourceVersion", None)
    return om == nm and {k: v for k, v in old.items() if k != "metadata"} == {
        k: v for k, v in new.items() if k != "metadata"
    }


def patch_node_metadata(
    client: KubeClient,
    node: JSON,
    *,
    labels: dict[str, str | None],
    annotations: dict[str, str | None] | None = None,
) -> JSON:
    """Set (value) or remove (None) labels/annotations of ``node`` with a merge patch that
    carries the cached resourceVersion (a 409 means "look again")."""
    meta = node["metadata"]
    body: JSON = {"metadata": {"labels": labels}}
    if annotations:
        body["metadata"]["annotations"] = annotations
    if meta.get("resourceVersion"):
        body["metadata"]["resourceVersion"] = meta["resourceVersion"]
    return client.patch(NODES, str(meta["name"]), body)


class NodeView:
    """``ObjectCache`` over the metadata cache of all Nodes and the health cache of some."""

    def __init__(self, metadata: ObjectCache, health: ObjectCache) -> None:
        self._metadata = metadata
        self._health = health

    def get_by_key(self, key: str) -> JSON | None:
        """The full (slimmed) Node if it is a domain node, else its metadata, else None."""
        return self._health.get_by_key(key) or self._metadata.get_by_key(key)

    def list(self) -> builtins.list[JSON]:
        """Every Node (metadata)."""
        return self._metadata.list()

    def by_index(self, index: str, value: str) -> builtins.list[JSON]:
        """Index lookups on the metadata cache (labels only)."""
        return self._metadata.by_index(index, value)

    def index_values(self, index: str) -> builtins.list[str]:
        """Index values of the metadata cache (labels only)."""
        return self._metadata.index_values(index)
