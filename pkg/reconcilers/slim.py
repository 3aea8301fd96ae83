"""Transforms that shrink objects before they enter the controller's informer caches.

Owns what the controller keeps of each watched object (client-go's informer ``SetTransform``).
Invariants: ``managedFields`` are never kept (nothing reads them; a PUT without them keeps the
server's); a Node keeps its metadata and spec and, of its status, only the conditions (node
health is read from the ``Ready`` condition and the taints) — the status is never written
from the cache (the main-resource PUT of a Node ignores status), so dropping ``images``,
``nodeInfo``, ``capacity`` etc. cannot lose data. Transforms copy; the input is not mutated.
"""

from __future__ import annotations

from pkg.base.types import JSON
from pkg.informers.compact import drop_managed_fields

__all__ = ["slim_node", "slim_object"]


def slim_object(obj: JSON) -> JSON:
    """``obj`` without ``metadata.managedFields``."""
    return drop_managed_fields(obj)


def slim_node(node: JSON) -> JSON:
    """A Node with only what the controller reads: metadata (no managedFields), spec, and
    ``status.conditions``."""
    out = drop_managed_fields(node)
    status = out.get("status")
    if isinstance(status, dict) and set(status) - {"conditions"}:
        out = dict(out)
        out["status"] = {"conditions": status["conditions"]} if "conditions" in status else {}
    return out
