"""Thread-safe object cache with secondary indexes (client-go `Indexer`).

Owns the informer's local copy of the cluster: raw JSON dicts keyed `namespace/name` (or `name`
for cluster-scoped objects). Invariants: one lock guards items and indexes so every read is a
consistent snapshot; index entries are always exactly those computed from the stored objects;
objects are shared with handlers and listers - callers must deep-copy before mutating.
Also defines `DeletedFinalStateUnknown`, the tombstone delete handlers receive when an object
vanished while the watch was down, and stock index functions.

How an object is held is the `codec`'s (`pkg.informers.serialized`): by default the dict itself;
a serialized codec keeps each object as compact JSON bytes and decodes on read, so a cache of
many objects costs about their JSON size instead of ~6x. Index values are always computed from
the decoded object, at write time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from pkg.base.types import JSON

__all__ = [
    "BY_NODE_NAME",
    "BY_OWNER_UID",
    "BY_UID",
    "DeletedFinalStateUnknown",
    "IndexFunc",
    "Indexer",
    "ObjectCodec",
    "by_label",
    "index_by_node_name",
    "index_by_owner_uid",
    "index_by_uid",
    "meta_namespace_key",
]

IndexFunc = Callable[[JSON], list[str]]
# Aliases so annotations inside `Indexer` (which has a `list` method) stay unambiguous.
_Objects = list[JSON]
_Strings = list[str]
_Items = list[tuple[str, JSON]]

BY_UID = "uid"
BY_OWNER_UID = "owner-uid"
BY_NODE_NAME = "spec.nodeName"


@dataclass(frozen=True, slots=True)
class DeletedFinalStateUnknown:
    """A delete observed only by relisting: `obj` is the last state this cache knew."""

    key: str
    obj: JSON


def meta_namespace_key(obj: JSON | DeletedFinalStateUnknown) -> str:
    """The cache key of an object or tombstone: ``namespace/name``, or ``name`` when
    cluster-scoped (client-go's ``MetaNamespaceKeyFunc``).
    """
    if isinstance(obj, DeletedFinalStateUnknown):
        return obj.key
    meta = obj["metadata"]
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else str(meta["name"])


def index_by_uid(obj: JSON) -> list[str]:
    """Index function: the object's ``metadata.uid``."""
    uid = obj["metadata"].get("uid")
    return [uid] if uid else []


def index_by_owner_uid(obj: JSON) -> list[str]:
    """Index function: the UIDs of the object's ownerReferences."""
    return [r["uid"] for r in obj["metadata"].get("ownerReferences") or [] if r.get("uid")]


def index_by_node_name(obj: JSON) -> list[str]:
    """Index function: the pod's ``spec.nodeName`` (unscheduled pods are not indexed)."""
    node = (obj.get("spec") or {}).get("nodeName")
    return [node] if node else []


def by_label(label: str) -> IndexFunc:
    """Index objects by the value of one label (objects without it are not indexed)."""

    def index(obj: JSON) -> list[str]:
        value = (obj["metadata"].get("labels") or {}).get(label)
        return [value] if value is not None else []

    return index


class ObjectCodec(Protocol):
    """How an `Indexer` holds its objects (called under the indexer's lock).

    ``encode`` turns an object being stored under ``key`` into what is kept; ``decode`` gives
    the object back for a read (equal to what was stored; the same dict on repeated reads is
    allowed but not promised); ``forget`` is told that ``key`` left the cache.
    """

    def encode(self, key: str, obj: JSON) -> Any: ...
    def decode(self, key: str, stored: Any) -> JSON: ...
    def forget(self, key: str) -> None: ...


class _AsIs:
    """The default codec: the dict itself (reads return the very object stored)."""

    def encode(self, key: str, obj: JSON) -> Any:
        return obj

    def decode(self, key: str, stored: Any) -> JSON:
        out: JSON = stored
        return out

    def forget(self, key: str) -> None:
        return None


class Indexer:
    """The cache: `add`/`update`/`delete`/`replace` plus snapshot reads and index lookups."""

    def __init__(
        self,
        indexers: dict[str, IndexFunc] | None = None,
        *,
        key_func: Callable[[JSON], str] = meta_namespace_key,
        codec: ObjectCodec | None = None,
    ) -> None:
        self._lock = threading.RLock()
        self._codec: ObjectCodec = codec or _AsIs()
        self._items: dict[str, Any] = {}  # key -> what the codec keeps
        self._key = key_func
        self._funcs: dict[str, IndexFunc] = {}
        # index name -> indexed value -> keys
        self._indices: dict[str, dict[str, set[str]]] = {}
        self.add_indexers(indexers or {})

    def key(self, obj: JSON) -> str:
        """The cache key of ``obj`` under this indexer's key function."""
        return self._key(obj)

    def add_indexers(self, indexers: dict[str, IndexFunc]) -> None:
        """Add index functions (any time; existing objects are indexed immediately)."""
        with self._lock:
            for name, func in indexers.items():
                if name in self._funcs:
                    raise ValueError(f"indexer {name!r} already exists")
                self._funcs[name] = func
                self._indices[name] = {}
                for key, stored in self._items.items():
                    self._index_one(name, func, key, self._codec.decode(key, stored))

    def _index_one(self, name: str, func: IndexFunc, key: str, obj: JSON) -> None:
        index = self._indices[name]
        for value in func(obj):
            index.setdefault(value, set()).add(key)

    def _unindex(self, key: str, obj: JSON) -> None:
        for name, func in self._funcs.items():
            index = self._indices[name]
            for value in func(obj):
                keys = index.get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[value]

    def _get_locked(self, key: str) -> JSON | None:
        stored = self._items.get(key)
        return None if stored is None else self._codec.decode(key, stored)

    def _put_locked(self, key: str, obj: JSON) -> JSON | None:
        old = self._get_locked(key)
        if old is not None:
            self._unindex(key, old)
        self._items[key] = self._codec.encode(key, obj)
        for name, func in self._funcs.items():
            self._index_one(name, func, key, obj)
        return old

    def add(self, obj: JSON) -> JSON | None:
        """Insert or overwrite; returns the previous object for that key, if any."""
        with self._lock:
            return self._put_locked(self._key(obj), obj)

    update = add

    def delete(self, obj: JSON | DeletedFinalStateUnknown) -> JSON | None:
        """Remove the object (or tombstone's key); returns what was stored, if anything."""
        key = (
            meta_namespace_key(obj) if isinstance(obj, DeletedFinalStateUnknown) else self._key(obj)
        )
        return self.delete_key(key)

    def delete_key(self, key: str) -> JSON | None:
        """Remove the object stored under ``key``; returns it, if anything."""
        with self._lock:
            old = self._get_locked(key)
            if old is not None:
                del self._items[key]
                self._codec.forget(key)
                self._unindex(key, old)
            return old

    def replace(self, objs: Iterable[JSON]) -> dict[str, JSON]:
        """Swap the whole content atomically; returns the objects whose keys vanished."""
        with self._lock:
            new = {self._key(o): o for o in objs}
            gone = {k: self._codec.decode(k, v) for k, v in self._items.items() if k not in new}
            for key in gone:
                self._codec.forget(key)
            self._items = {}
            self._indices = {name: {} for name in self._funcs}
            for key, obj in new.items():
                self._put_locked(key, obj)
            return gone

    # -- reads -------------------------------------------------------------------------------

    def get(self, obj: JSON) -> JSON | None:
        """The stored object with the same key as ``obj``, or None."""
        return self.get_by_key(self._key(obj))

    def get_by_key(self, key: str) -> JSON | None:
        """The stored object under ``key``, or None."""
        with self._lock:
            return self._get_locked(key)

    def list(self) -> _Objects:
        """A snapshot list of every stored object (shared objects: do not mutate)."""
        with self._lock:
            return [self._codec.decode(k, v) for k, v in self._items.items()]

    def list_keys(self) -> _Strings:
        """A snapshot list of every key."""
        with self._lock:
            return list(self._items)

    def items(self) -> _Items:
        """A snapshot list of (key, object) pairs."""
        with self._lock:
            return [(k, self._codec.decode(k, v)) for k, v in self._items.items()]

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def index_keys(self, index_name: str, value: str) -> _Strings:
        """Sorted keys of the objects whose index ``index_name`` contains ``value``. KeyError for
        an unknown index.
        """
        with self._lock:
            if index_name not in self._indices:
                raise KeyError(f"no indexer named {index_name!r}")
            return sorted(self._indices[index_name].get(value, ()))

    def by_index(self, index_name: str, value: str) -> _Objects:
        """Objects whose index ``index_name`` contains ``value``, sorted by key. KeyError for an
        unknown index.
        """
        with self._lock:
            return [
                self._codec.decode(k, self._items[k]) for k in self.index_keys(index_name, value)
            ]

    def index_values(self, index_name: str) -> _Strings:
        """Sorted values of index ``index_name`` that some object has (client-go's
        ``ListIndexFuncValues``); reads no object. KeyError for an unknown index.
        """
        with self._lock:
            if index_name not in self._indices:
                raise KeyError(f"no indexer named {index_name!r}")
            return sorted(self._indices[index_name])

    def lock(self) -> threading.RLock:
        """For callers that need several reads (or read+notify) to be one atomic step."""
        return self._lock
