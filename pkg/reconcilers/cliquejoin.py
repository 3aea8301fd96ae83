"""CliqueJoinReconciler: write the ``daemons[]`` entries of a forming clique in batches.

Keyed by ComputeDomainClique (``namespace/<cdUID>.<cliqueID>``, the object need not exist yet).
Upstream lets every daemon append its own entry; 18 daemons starting together then take turns
on one object (each append has to see the previous one), so the last daemon of a clique waited
seconds for its index. Here the controller, one writer, appends the entries of every daemon pod
it sees without one in a single write, and each daemon whose DaemonSet says so
(``CLIQUE_JOIN_BY_CONTROLLER=true``) waits for its entry (a bounded while, then joins by itself,
as upstream's daemons always do). Invariants:

* an entry is added only for a daemon pod of the clique's domain (label ``computeDomain``) that
  is bound (``spec.nodeName``), has a ``podIP``, is not terminating, whose daemon did not exit
  with ``DriverRootIncomplete``, whose node is healthy (a lost node's entry is the prune
  reconciler's to remove), and whose clique is this one: the pod's ``computeDomain.cliqueID``
  label, or, until the daemon set it, the ``cliqueID`` our plugin publishes in the node's
  ResourceSlices (one value, else nothing is decided);
* a node that already has an entry is left to its daemon (a restarted daemon updates its IP in
  place and keeps its index); entries are appended with the lowest indices no entry of the
  clique holds, below ``max_nodes_per_imex_domain``; a full clique gets no entry (the daemon
  reports it);
* the write never overwrites a daemon's: a new clique is created (with upstream's labels) and
  an AlreadyExists waits for the cache; an append is a JSON patch whose ``test`` operations pin
  the list's last entry and put each entry at the position computed, so a concurrent append or
  removal refuses it (422) and the key is tried again on the next change; an empty list is
  replaced by a PUT carrying the resourceVersion read;
* a pass never acts on a cached clique older than this reconciler's own last write of it (the
  written object stands in until the cache shows it, client-go's mutation cache), so a batch
  right after another is not refused by our own append;
* every pod given an entry becomes an owner of the clique (as a daemon's own write makes it),
  so the garbage collector still deletes the clique after its last daemon pod.

Driven by events only: daemon pod changes (podIP, clique label, deletion), clique changes and the
node's ResourceSlices (the clique of a pod whose daemon has not labelled it yet).
"""

from __future__ import annotations

import copy
import logging
import threading

from pkg.api import constants as c
from pkg.api.daemonentry import (
    DAEMONS,
    DaemonEntry,
    daemon_items,
    encode_daemons,
    guarded_append_ops,
    item_identity,
)
from pkg.base.clock import Clock
from pkg.base.types import JSON
from pkg.kube.client import KubeClient
from pkg.kube.errors import AlreadyExistsError, ConflictError, InvalidError, NotFoundError
from pkg.kube.resources import COMPUTE_DOMAIN_CLIQUES
from pkg.kube.versions import not_older_than
from pkg.reconcilers.cache import BY_DOMAIN, BY_NODE, Caches, slice_clique_ids
from pkg.reconcilers.config import ControllerConfig
from pkg.reconcilers.context import BACKGROUND, ReconcileContext
from pkg.reconcilers.controller import Result
from pkg.reconcilers.daemonpods import driver_root_incomplete
from pkg.reconcilers.status import node_loss_in

__all__ = ["CliqueJoinReconciler"]

log = logging.getLogger(__name__)

_RETRY = 2.0  # seconds: safety net after a refused write; the write that refused it is a
# clique event, which enqueues the key again at once (retrying sooner, on a cache that has not
# seen that write yet, is refused again: under load that was most of our requests)


def _owner_ref(pod: JSON) -> JSON:
    meta = pod["metadata"]
    return {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}


class CliqueJoinReconciler:
    """Appends the entries of daemon pods that have none to their clique, by clique key."""

    def __init__(
        self, *, client: KubeClient, caches: Caches, config: ControllerConfig, clock: Clock
    ) -> None:
        self._client = client
        self._caches = caches
        self._namespace = config.namespace
        self._max_nodes = config.max_nodes_per_imex_domain
        self._node_loss_grace = config.node_loss_grace_period
        self._clock = clock
        # clique key -> the object as our last write returned it, until the cache catches up.
        self._written: dict[str, JSON] = {}
        self._lock = threading.Lock()

    # -- event handlers → keys --------------------------------------------------------------

    def clique_of(self, pod: JSON) -> str | None:
        """The clique ID of a daemon pod: its label, else its node's slices (None: unknown or
        not an NVLink node)."""
        labels = pod.get("metadata", {}).get("labels") or {}
        if c.CLIQUE_ID_LABEL in labels:
            return str(labels[c.CLIQUE_ID_LABEL]) or None
        node_name = (pod.get("spec") or {}).get("nodeName")
        if not node_name:
            return None
        ids: set[str] = set()
        for slice_ in self._caches.slices.by_index(BY_NODE, str(node_name)):
            ids |= slice_clique_ids(slice_)
        return next(iter(ids)) if len(ids) == 1 else None

    def keys_for_pod(self, pod: JSON) -> list[str]:
        """The clique key of a daemon pod (for the pod event handler)."""
        meta = pod.get("metadata", {})
        uid = (meta.get("labels") or {}).get(c.COMPUTE_DOMAIN_LABEL)
        clique_id = self.clique_of(pod) if uid else None
        if not uid or not clique_id:
            return []
        return [
            f"{meta.get('namespace') or self._namespace}/"
            f"{c.clique_object_name(str(uid), clique_id)}"
        ]

    def keys_for_node(self, node_name: str) -> list[str]:
        """Clique keys of the daemon pods on ``node_name`` (node health, its slices)."""
        pods = self._caches.pods.by_index(BY_NODE, node_name)
        return sorted({k for pod in pods for k in self.keys_for_pod(pod)})

    def keys_for_slice(self, slice_: JSON) -> list[str]:
        """Clique keys of the daemon pods on the slice's node (for the slice event handler)."""
        node_name = (slice_.get("spec") or {}).get("nodeName")
        return self.keys_for_node(str(node_name)) if node_name else []

    # -- reconcile ---------------------------------------------------------------------------

    def reconcile(self, key: str, ctx: ReconcileContext = BACKGROUND) -> Result:
        """Append entries for the clique ``namespace/<cdUID>.<cliqueID>``'s daemon pods that
        have none, in one write (see the module docstring); stops before writing once ``ctx``
        is cancelled. Idempotent: a pass with nothing to add writes nothing."""
        ctx.check()
        uid, _, clique_id = key.partition("/")[2].partition(".")
        if not uid or not clique_id:
            return Result()
        clique: JSON | None = self._newest(key, self._caches.cliques.get_by_key(key))
        labels = ((clique or {}).get("metadata") or {}).get("labels") or {}
        if clique is not None and labels.get(c.COMPUTE_DOMAIN_LABEL) != uid:
            return Result()  # not a clique of that domain: not ours to write
        entries = daemon_items(clique)
        held = [item_identity(d) for d in entries]
        pods = self._joining(uid, clique_id, {node for node, _, _ in held})
        if not pods:
            return Result()
        used = {index for _, _, index in held}
        free = [i for i in range(self._max_nodes) if i not in used]
        pods = pods[: len(free)]
        if not pods:
            return Result()  # full: each daemon joins (and reports it) by itself
        new = [
            DaemonEntry(str(p["spec"]["nodeName"]), str(p["status"]["podIP"]), clique_id, index)
            for p, index in zip(pods, free, strict=False)
        ]
        ctx.check()
        try:
            if clique is None:
                written = self._create(key, pods, new)
            elif not entries:
                written = self._replace(clique, pods, new)
            else:
                written = self._append(clique, entries, pods, new)
        except (AlreadyExistsError, ConflictError, InvalidError, NotFoundError) as err:
            # A daemon wrote first (or the clique went): look again, from the cache.
            with self._lock:
                self._written.pop(key, None)
            log.debug("clique join write refused (%s); retrying", err, extra={"key": key})
            return Result(requeue_after=_RETRY)
        with self._lock:
            self._written[key] = written
        log.info(
            "added clique entries: %s",
            ", ".join(f"{e.node_name} ({e.ip_address}, index {e.index})" for e in new),
            extra={"key": key},
        )
        return Result()

    def _newest(self, key: str, cached: JSON | None) -> JSON | None:
        """``cached``, or our last write of the clique while the cache has not caught up."""
        with self._lock:
            written = self._written.get(key)
            if written is None:
                return cached
            if cached is not None and not_older_than(cached, written):
                del self._written[key]
                return cached
            return written

    def _joining(self, uid: str, clique_id: str, have: set[str]) -> list[JSON]:
        """The domain's daemon pods of ``clique_id`` that should have an entry and have none,
        one per node (oldest pod first), in node-name order."""
        wall = self._clock.now()
        by_node: dict[str, JSON] = {}
        for pod in self._caches.pods.by_index(BY_DOMAIN, uid):
            meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
            node_name = spec.get("nodeName")
            if (
                not node_name
                or node_name in have
                or not status.get("podIP")
                or meta.get("deletionTimestamp")
                or not meta.get("uid")
                or status.get("phase") in ("Succeeded", "Failed")
                or driver_root_incomplete(pod)
                or self.clique_of(pod) != clique_id
            ):
                continue
            node = self._caches.nodes.get_by_key(str(node_name))
            if node_loss_in(node, now=wall, grace=self._node_loss_grace) is not None:
                continue  # not healthy: its daemon joins by itself if it runs
            known = by_node.get(str(node_name))
            if known is None or str(meta.get("creationTimestamp") or "") < str(
                known["metadata"].get("creationTimestamp") or ""
            ):
                by_node[str(node_name)] = pod
        return [by_node[n] for n in sorted(by_node)]

    # -- writes ----------------------------------------------------------------------------

    def _create(self, key: str, pods: list[JSON], new: list[DaemonEntry]) -> JSON:
        namespace, _, name = key.partition("/")
        uid, _, clique_id = name.partition(".")
        obj: JSON = {
            "apiVersion": c.API_VERSION,
            "kind": c.COMPUTE_DOMAIN_CLIQUE_KIND,
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {c.COMPUTE_DOMAIN_LABEL: uid, c.CLIQUE_ID_LABEL: clique_id},
                "ownerReferences": [_owner_ref(p) for p in pods],
            },
            DAEMONS: encode_daemons(new),
        }
        return self._client.create(COMPUTE_DOMAIN_CLIQUES, obj, namespace=namespace)

    def _replace(self, clique: JSON, pods: list[JSON], new: list[DaemonEntry]) -> JSON:
        body = copy.deepcopy(clique)
        meta = body["metadata"]
        refs = [r for r in meta.get("ownerReferences") or [] if isinstance(r, dict)]
        meta["ownerReferences"] = refs + self._missing_owners(refs, pods)
        body[DAEMONS] = encode_daemons(new)
        return self._client.update(COMPUTE_DOMAIN_CLIQUES, body)

    def _append(
        self, clique: JSON, entries: list[JSON], pods: list[JSON], new: list[DaemonEntry]
    ) -> JSON:
        ops = guarded_append_ops(entries, new)
        refs = [r for r in (clique["metadata"].get("ownerReferences") or []) if isinstance(r, dict)]
        missing = self._missing_owners(refs, pods)
        if missing and not clique["metadata"].get("ownerReferences"):
            ops.append({"op": "add", "path": "/metadata/ownerReferences", "value": missing})
        else:
            ops += [
                {"op": "add", "path": "/metadata/ownerReferences/-", "value": r} for r in missing
            ]
        meta = clique["metadata"]
        return self._client.patch(
            COMPUTE_DOMAIN_CLIQUES,
            meta["name"],
            ops,
            namespace=meta["namespace"],
            patch_type="json",
        )

    @staticmethod
    def _missing_owners(refs: list[JSON], pods: list[JSON]) -> list[JSON]:
        have = {r.get("uid") for r in refs}
        return [_owner_ref(p) for p in pods if p["metadata"]["uid"] not in have]
