"""Memory-compacting transforms for cached objects (client-go's informer `SetTransform`).

Owns `intern_strings`: rebuilds a decoded JSON object so every dict key and every short string
value is an interned, process-wide shared string. JSON decoding shares keys only within one
document, so thousands of watch events otherwise each carry private copies of "metadata",
"name", "Running", ... Invariant: the result is equal (==) to the input; only identity of
strings changes. `drop_managed_fields` removes `metadata.managedFields`, which no controller
in this project reads and which is often the largest part of a real object.
"""

from __future__ import annotations

import sys
from typing import Any

from pkg.base.types import JSON

__all__ = ["compact", "drop_managed_fields", "intern_strings"]

_MAX_INTERNED_VALUE = 64  # long values (hashes, certs) are rarely repeated across objects
_intern = sys.intern


def _walk(value: Any) -> Any:
    if isinstance(value, dict):
        return {_intern(k): _walk(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v) for v in value]
    if isinstance(value, str) and len(value) <= _MAX_INTERNED_VALUE:
        return _intern(value)
    return value


def intern_strings(obj: JSON) -> JSON:
    """Return ``obj`` with every string deduplicated through :func:`sys.intern` (a new
    structure; ``obj`` is not changed). Pure; safe from any thread.
    """
    out: JSON = _walk(obj)
    return out


def drop_managed_fields(obj: JSON) -> JSON:
    """Return ``obj`` without ``metadata.managedFields`` (a shallow copy when present;
    ``obj`` is not changed). Pure; safe from any thread.
    """
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        obj = dict(obj)
        obj["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return obj


def compact(obj: JSON) -> JSON:
    """Both transforms: the default for informers that cache many objects."""
    return intern_strings(drop_managed_fields(obj))
