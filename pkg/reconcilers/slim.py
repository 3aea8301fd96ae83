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
    ``status.conditions`` without their ``lastHeartbeatTime``. The kubelet rewrites every
    condition's heartbeat on each status report (every 5 minutes per node, more often on a
    change); nothing here reads it, so a report that changed nothing else leaves the cached
    object as it was and wakes no reconciler."""
    out = drop_managed_fields(node)
    status = out.get("status")
    if not isinstance(status, dict):
        return out
    conditions = status.get("conditions")
    if isinstance(conditions, list):
        conditions = [
            {k: v for k, v in cond.items() if k != "lastHeartbeatTime"}
            if isinstance(cond, dict)
            else cond
            for cond in conditions
        ]
    if set(status) - {"conditions"} or conditions != status.get("conditions"):
        out = dict(out)
        out["status"] = {"conditions": conditions} if "conditions" in status else {}
    return out
