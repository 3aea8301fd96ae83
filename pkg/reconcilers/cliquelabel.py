"""CliqueLabelReconciler: mirror each node's NVLink clique ID onto ``nvidia.com/gpu.clique``.

Keyed by node name. The kubelet plugin publishes the clique as the device attribute
``cliqueID`` (plain or driver-qualified key) in its ResourceSlices; users need it as a node
label to write ``podAffinity`` with ``topologyKey: nvidia.com/gpu.clique``. Invariants:

* the label is ours only while the node also carries the annotation
  ``resource.nvidia.com/gpu.clique-managed=true``, written together with it;
* a node whose kubelet plugin keeps the label itself (``--gpu-clique-label-enabled``; it marks
  the node with that annotation set to ``kubelet-plugin``) is left alone entirely: no write, no
  Event. The plugin adopts a refreshed clique before its slices show it, and removes label and
  mark on graceful shutdown, after which this reconciler labels the node again from its slices;
* a label someone else set (GPU feature discovery uses the same key) is never changed or
  removed: an equal value is left alone, a different value yields one Warning Event on the node;
* when the node's slices stop publishing a clique, our label (and annotation) is removed;
* slices that disagree about the clique, or a value that is not a valid label value, change
  nothing and yield a Warning Event.
"""

from __future__ import annotations

import logging
import re

from pkg.api import constants as c
from pkg.base.types import JSON
from pkg.kube.client import KubeClient
from pkg.reconcilers.cache import BY_NODE, Caches, slice_clique_ids
from pkg.reconcilers.context import BACKGROUND, ReconcileContext
from pkg.reconcilers.controller import Result
from pkg.reconcilers.events import WARNING, OnceEvents
from pkg.reconcilers.nodecache import patch_node_metadata

__all__ = ["MANAGED_ANNOTATION", "CliqueLabelReconciler"]

log = logging.getLogger(__name__)


MANAGED_ANNOTATION = c.GPU_CLIQUE_MANAGED_ANNOTATION
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class CliqueLabelReconciler:
    """Reconciles the clique label of one node from its ResourceSlices."""

    def __init__(self, *, client: KubeClient, caches: Caches, events: OnceEvents) -> None:
        self._client = client
        self._caches = caches
        self._events = events

    def reconcile(self, key: str, ctx: ReconcileContext = BACKGROUND) -> Result:
        """Set node ``key``'s clique label from its ResourceSlices; stops before writing
        once ``ctx`` is cancelled."""
        ctx.check()
        node = self._caches.nodes.get_by_key(key)
        if node is None:
            return Result()
        owner = (node["metadata"].get("annotations") or {}).get(MANAGED_ANNOTATION)
        if owner == c.GPU_CLIQUE_MANAGED_BY_PLUGIN:
            return Result()  # the node's plugin keeps the label (--gpu-clique-label-enabled)
        ids: set[str] = set()
        for slice_ in self._caches.slices.by_index(BY_NODE, key):
            ids |= slice_clique_ids(slice_)
        if len(ids) > 1:
            self._events.event(
                node,
                WARNING,
                "CliqueIDConflict",
                f"ResourceSlices of node {key} publish several clique IDs: {sorted(ids)}",
            )
            return Result()
        desired = next(iter(ids), "")
        if desired and (len(desired) > 63 or not _LABEL_VALUE.fullmatch(desired)):
            self._events.event(
                node,
                WARNING,
                "InvalidCliqueID",
                f'clique ID "{desired}" is not a valid label value; not labelling node {key}',
            )
            return Result()
        meta = node["metadata"]
        current = (meta.get("labels") or {}).get(c.GPU_CLIQUE_NODE_LABEL)
        ours = (meta.get("annotations") or {}).get(MANAGED_ANNOTATION) == "true"
        if not desired:
            if ours:
                self._write(node, label=None)
            return Result()
        if current == desired:
            return Result()
        if current is not None and not ours:
            self._events.event(
                node,
                WARNING,
                "CliqueLabelConflict",
                f'node label {c.GPU_CLIQUE_NODE_LABEL}="{current}" was set by someone else; '
                f'the NVLink clique published by the driver is "{desired}"; not overwriting',
            )
            return Result()
        self._write(node, label=desired)
        return Result()

    def _write(self, node: JSON, *, label: str | None) -> None:
        meta = node["metadata"]
        patch_node_metadata(
            self._client,
            node,
            labels={c.GPU_CLIQUE_NODE_LABEL: label},
            annotations={MANAGED_ANNOTATION: None if label is None else "true"},
        )
        log.info(
            "clique label %s value=%s",
            "removed" if label is None else "set",
            label,
            extra={"key": meta["name"]},
        )
