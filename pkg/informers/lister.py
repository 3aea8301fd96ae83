"""`Lister`: read-only, typed-by-convention access to an informer's cache.

Owns the lookups controllers do on every reconcile (by name, by namespace, by index, by label
predicate) without touching the API server. Invariant: results are the cached dicts themselves
(shared, never copies) - deep-copy before mutating.
"""

from __future__ import annotations

from collections.abc import Callable

from pkg.base.types import JSON
from pkg.informers.store import Indexer
from pkg.kube.resources import Resource

__all__ = ["Lister"]

_Objects = list[JSON]


class Lister:
    """Read-only, typed-by-resource view of one informer's cache.

    Reads are consistent snapshots and never call the API; returned objects are shared with
    the cache (deep-copy before mutating). Thread-safe.
    """

    def __init__(self, indexer: Indexer, resource: Resource) -> None:
        self._indexer = indexer
        self.resource = resource

    def get(self, name: str, namespace: str | None = None) -> JSON | None:
        """The cached object ``name`` in ``namespace`` (required for namespaced resources:
        ValueError otherwise), or None.
        """
        if self.resource.namespaced and not namespace:
            raise ValueError(f"{self.resource.plural} are namespaced; pass a namespace")
        return self._indexer.get_by_key(f"{namespace}/{name}" if namespace else name)

    def get_by_key(self, key: str) -> JSON | None:
        """The cached object with cache key ``key`` (``namespace/name`` or ``name``), or None."""
        return self._indexer.get_by_key(key)

    def list(
        self,
        namespace: str | None = None,
        *,
        labels: dict[str, str] | None = None,
        predicate: Callable[[JSON], bool] | None = None,
    ) -> _Objects:
        """Objects in `namespace` (all if None) whose labels include `labels`, sorted by key."""
        out: _Objects = []
        for _, obj in sorted(self._indexer.items()):
            meta = obj["metadata"]
            if namespace is not None and meta.get("namespace") != namespace:
                continue
            if labels:
                have = meta.get("labels") or {}
                if any(have.get(k) != v for k, v in labels.items()):
                    continue
            if predicate is not None and not predicate(obj):
                continue
            out.append(obj)
        return out

    def by_index(self, index_name: str, value: str) -> _Objects:
        """Cached objects whose index ``index_name`` contains ``value``, sorted by key. KeyError
        for an unknown index.
        """
        return self._indexer.by_index(index_name, value)
