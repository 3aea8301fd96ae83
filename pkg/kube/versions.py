"""resourceVersion comparisons for mutation caches (a writer's own last write against its cache).

Owns the one rule both the daemon's membership writes and the controller's clique joins use
to decide whether a cached object already shows their last write. Invariant: resourceVersions
are compared as the integers the API server issues (etcd revisions); an opaque one trusts the
cache, as client-go's mutation cache does when it cannot compare.
"""

from __future__ import annotations

from pkg.base.types import JSON

__all__ = ["not_older_than", "resource_version"]


def resource_version(obj: JSON | None) -> str:
    """``metadata.resourceVersion`` of ``obj`` (``""`` for none or no object)."""
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")


def not_older_than(cached: JSON | None, written: JSON) -> bool:
    """The cached object is ``written`` (our last write) or newer."""
    a, b = resource_version(cached), resource_version(written)
    if a == b:
        return True
    try:
        return int(a) > int(b)
    except ValueError:
        return True
