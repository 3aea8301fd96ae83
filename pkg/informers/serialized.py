"""`SerializedCodec`: an informer cache that holds each object as compact JSON bytes.

Owns the memory/CPU trade of a large cache. A CPython dict-of-dicts costs ~6x its JSON size
(`docs/benchmarks.md`, informer ingest); kept as UTF-8 JSON bytes an object costs about its
JSON size. Reads decode, so a small LRU keeps the most recently written or read objects
decoded: a lister read of a hot object costs a dict lookup, a cold one a ``json.loads``.
Invariants: `decode` returns an object equal to the one encoded under that key; while the key's
entry is in the LRU, repeated reads return the same dict (shared, like the raw cache: callers
deep-copy before mutating); the LRU never holds a key the cache no longer holds (`forget`).
All calls come under the owning `Indexer`'s lock, so the codec keeps no lock of its own.
"""

from __future__ import annotations

import json
from typing import Any

from cachetools import LRUCache

from pkg.base.types import JSON

__all__ = ["DEFAULT_DECODED", "SerializedCodec"]

# Decoded objects kept per cache: enough for the objects one reconcile round touches.
DEFAULT_DECODED = 64

_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, check_circular=False)


class SerializedCodec:
    """`pkg.informers.store.ObjectCodec` that keeps compact JSON bytes plus an LRU of at most
    ``decoded`` decoded objects (0: none, every read decodes)."""

    def __init__(self, decoded: int = DEFAULT_DECODED) -> None:
        self._decoded: LRUCache[str, tuple[bytes, JSON]] | None = (
            LRUCache(maxsize=decoded) if decoded > 0 else None
        )

    def encode(self, key: str, obj: JSON) -> Any:
        """The bytes kept for ``obj``; ``obj`` itself becomes the key's decoded entry (so the
        notification's object and the next lister read are the same dict)."""
        data = _encoder.encode(obj).encode()
        if self._decoded is not None:
            self._decoded[key] = (data, obj)
        return data

    def decode(self, key: str, stored: Any) -> JSON:
        """The object ``stored`` (bytes from `encode` under ``key``) holds."""
        if self._decoded is not None:
            hit = self._decoded.get(key)
            if hit is not None and hit[0] is stored:
                return hit[1]
        obj: JSON = json.loads(stored)
        if self._decoded is not None:
            self._decoded[key] = (stored, obj)
        return obj

    def forget(self, key: str) -> None:
        """Drop ``key``'s decoded entry (it left the cache)."""
        if self._decoded is not None:
            self._decoded.pop(key, None)
