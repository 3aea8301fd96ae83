"""What informer caches hold, as plain JSON: the ``/debug/informers`` document.

Owns the rendering of a `SharedInformerFactory`'s caches for debugging and for checking them
against the API server (the chaos suite compares each with a fresh LIST of the same slice).
Per informer: the slice it watches (group, version, resource, kind, scope, namespace, label and
field selector, metadata-only), whether it has synced, the resourceVersion its reflector last
absorbed, and ``{key: resourceVersion}`` of every cached object (key ``namespace/name``, or
``name`` when cluster-scoped: the cache's own keys). Invariants: each informer's objects are read
in one consistent snapshot of its cache; only keys and resourceVersions leave the process, never
object contents (caches may hold transformed or metadata-only objects, but a resourceVersion
names one version of the whole object, so equal keys and resourceVersions mean an equal view).
"""

from __future__ import annotations

from pkg.base.types import JSON
from pkg.informers.factory import InformerKey, SharedInformerFactory
from pkg.informers.informer import SharedInformer

__all__ = ["factory_snapshot", "informer_snapshot"]


def informer_snapshot(key: InformerKey, informer: SharedInformer) -> JSON:
    """One informer's entry of the document (see the module docstring)."""
    resource, namespace, label_selector, field_selector, metadata_only = key
    objects = {
        k: str((obj.get("metadata") or {}).get("resourceVersion", ""))
        for k, obj in informer.indexer.items()
    }
    return {
        "group": resource.group,
        "version": resource.version,
        "resource": resource.plural,
        "kind": resource.kind,
        "namespaced": resource.namespaced,
        "namespace": namespace,
        "labelSelector": label_selector,
        "fieldSelector": field_selector,
        "metadataOnly": metadata_only,
        "synced": informer.has_synced(),
        "lastSyncResourceVersion": informer.last_sync_resource_version,
        "objects": dict(sorted(objects.items())),
    }


def factory_snapshot(factory: SharedInformerFactory) -> list[JSON]:
    """Every informer of ``factory``, in creation order."""
    return [informer_snapshot(key, inf) for key, inf in factory.informers()]
