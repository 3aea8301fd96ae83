"""ComputeDomain facts the plugin needs during Prepare/Unprepare, driven by watch events.

Owns three things:

* lookups of ComputeDomains by UID: a cluster-wide `pkg.informers` SharedInformer of
  ComputeDomains with a UID index, read through its `Lister`;
* readiness of this node's IMEX daemon for a domain: the ComputeDomainClique
  ``<cdUID>.<cliqueID>`` in the driver namespace (a second informer, scoped to that namespace;
  ``cliqueID`` is the node's current one, read through the injected accessor at each lookup)
  has ``daemons[nodeName == me].status == Ready``; on a node without a clique (or when no clique
  object says so) the fallback is ``cd.status.nodes[name == me].status == Ready``; or, sooner,
  the daemon's node-local readiness record (:mod:`pkg.api.localready`) names that entry's node
  and IP. Both
  informers' event handlers only notify one condition variable; a waiter re-checks its predicate
  against the listers under that condition, so a Ready transition releases it within one event -
  the only polling is of the local record, every ``local_poll`` while a Prepare waits on an
  entry that exists and is not Ready (before the join no record can count) - and
  the wait is bounded by the caller's deadline (on the injected
  `pkg.base.Clock`). No event is lost: an informer updates its cache before it
  queues the notification, and the handler must take the condition the waiter holds while
  checking. The record is the daemon's file: it is read before the condition is taken, never
  under it (a hostile daemon must not stall the event handlers), by `LocalRecordReader`, which
  refuses symlinks, FIFOs, devices and oversized files and warns once per file and problem.
  `daemon_readiness` answers the same question with a reason and a third answer
  ("cannot tell") for device health; listeners added with `add_listener` are called after
  every event (device health re-evaluates then);
* the node label ``resource.nvidia.com/computeDomain=<cdUID>``: added with a JSON patch whose
  first operation tests ``metadata.resourceVersion``, so two domains racing for one node can
  never both win (the loser re-reads and sees the other's label: a retryable error); removed only
  when its value is still ours. The node is read from a metadata-only watch of this one node
  (field selector ``metadata.name``) on a call's first attempt, when that cache has synced and
  is not older than the node as this tracker last wrote or read it (our own write of a moment
  ago is never undone by a lagging cache); the cache only saves requests: a label it shows as
  ours needs none, a missing one a single patch (its ``resourceVersion`` test refuses a stale
  read), and anything else - another domain's label, a refused patch, a label to remove that
  the cache does not show - is decided on a GET, as before. The controller labels the node
  when it sees the allocation, so on a forming domain the first case is the common one. A
  dropped connection, a timeout, a 5xx or a 429 while labelling
  is retried within the call with capped exponential backoff (on the injected clock) and, if the
  API server stays away, becomes a :class:`RetryableError` the kubelet retries; it never
  surfaces as a crash or a permanent error.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pkg.api import localready
from pkg.api.constants import (
    COMPUTE_DOMAIN_LABEL,
    STATUS_READY,
    TRACEPARENT_ANNOTATION,
    clique_object_name,
)
from pkg.api.daemonentry import DaemonEntry, clique_daemons, status_nodes
from pkg.api.localready import LocalReady
from pkg.base.clock import Clock
from pkg.base.files import UnsafeFileError
from pkg.base.types import JSON
from pkg.draplugin.errors import RetryableError
from pkg.informers import (
    BY_UID,
    DeletedFinalStateUnknown,
    HandlerRegistration,
    Lister,
    SharedInformer,
    SharedInformerFactory,
    index_by_uid,
)
from pkg.kube.client import KubeClient
from pkg.kube.errors import TRANSIENT_ERRORS, ConflictError, InvalidError, NotFoundError
from pkg.kube.resources import COMPUTE_DOMAIN_CLIQUES, COMPUTE_DOMAINS, NODES
from pkg.kube.versions import not_older_than

log = logging.getLogger(__name__)

_LABEL_PATH = "/metadata/labels/" + COMPUTE_DOMAIN_LABEL.replace("~", "~0").replace("/", "~1")
_LABEL_ATTEMPTS = 5
_TRANSIENT_BACKOFF = (0.1, 0.2, 0.4, 0.8)  # then give up this call: the kubelet retries


class LocalRecordReader:
    """``local_ready`` of a `DomainTracker`: a domain's node-local readiness record
    (:func:`pkg.api.localready.read`, which never follows, blocks on or over-reads the daemon's
    files) from the directory ``directory_of(cd_uid)`` gives (None for an id it refuses with
    ``ValueError``).

    A file that is there but refused or unreadable counts as no record and is logged as one
    warning naming its path and the reason, repeated for the same file and kind of problem at
    most once per ``interval`` seconds (of ``clock``): never once per poll.
    """

    _MAX_REMEMBERED = 1024

    def __init__(
        self, directory_of: Callable[[str], Path], *, clock: Clock, interval: float = 600.0
    ) -> None:
        self._directory_of = directory_of
        self._clock = clock
        self._interval = interval
        self._lock = threading.Lock()  # guards _warned only; held for no I/O
        self._warned: dict[tuple[str, str], float] = {}

    def __call__(self, cd_uid: str) -> LocalReady | None:
        try:
            directory = self._directory_of(cd_uid)
        except ValueError:
            return None
        return localready.read(directory, on_unsafe=self._unsafe)

    def _unsafe(self, path: Path, err: OSError) -> None:
        if isinstance(err, UnsafeFileError):
            kind = err.kind
        else:
            kind = errno.errorcode.get(err.errno or 0, type(err).__name__)
        key = (str(path), kind)
        now = self._clock.monotonic()
        with self._lock:
            last = self._warned.get(key)
            if last is not None and now - last < self._interval:
                return
            if len(self._warned) >= self._MAX_REMEMBERED:
                self._warned.clear()
            self._warned[key] = now
        log.warning(
            "ignoring the IMEX daemon's readiness record %s: %s; the daemon counts as not Ready "
            "until its membership entry says so",
            path,
            err,
        )


@dataclass(frozen=True)
class DaemonReadiness:
    """This node's IMEX daemon for one domain: ``ready`` is None when the plugin cannot tell."""

    ready: bool | None
    reason: str


# What Prepare reads of a ComputeDomain (`parse_compute_domain`, the namespace check, the
# formation trace, status.nodes); everything else a tenant can put on the object -- labels,
# annotations (up to ~256 KiB each object), managedFields -- is not kept: every node's plugin
# caches every domain of the cluster, so one tenant's bulky objects would otherwise exhaust
# the memory of every plugin at once.
_KEPT_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "finalizers",
)
_KEPT_ANNOTATIONS = (TRACEPARENT_ANNOTATION,)


def slim_domain(obj: JSON) -> JSON:
    """The cache's copy of a ComputeDomain: kind, spec, status and the metadata Prepare reads
    (`_KEPT_METADATA`, and of its annotations only `_KEPT_ANNOTATIONS`). Pure."""
    meta = obj.get("metadata") or {}
    slim_meta: JSON = {k: meta[k] for k in _KEPT_METADATA if k in meta}
    annotations = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k in _KEPT_ANNOTATIONS
    }
    if annotations:
        slim_meta["annotations"] = annotations
    out: JSON = {k: obj[k] for k in ("apiVersion", "kind", "spec", "status") if k in obj}
    out["metadata"] = slim_meta
    return out


class DomainTracker:
    """Informer-backed ComputeDomain/Clique view plus node-label management for one node."""

    def __init__(
        self,
        *,
        client: KubeClient,
        informers: SharedInformerFactory,
        node_name: str,
        driver_namespace: str,
        clique_id: Callable[[], str],
        clock: Clock,
        domain_grace: float = 2.0,
        transient_backoff: tuple[float, ...] = _TRANSIENT_BACKOFF,
        local_ready: Callable[[str], LocalReady | None] | None = None,
        local_poll: float = 0.02,
    ) -> None:
        """``local_ready`` reads the node-local readiness record of a domain's daemon
        (:mod:`pkg.api.localready`), polled every ``local_poll`` seconds while a Prepare waits
        on this node's entry that exists and is not Ready; without it only the membership
        entry counts. ``clique_id`` returns the node's current clique ID
        (`pkg.kubeletplugin.clique.CliqueRefresher.clique_id`)."""
        self._client = client
        self._informers = informers
        self._node = node_name
        self._namespace = driver_namespace
        self._clique_id = clique_id
        self._clock = clock
        self._grace = domain_grace
        self._transient_backoff = transient_backoff
        self._local_ready = local_ready
        self._local_poll = local_poll
        self._cond = threading.Condition()
        self._domains: SharedInformer = informers.informer_for(
            COMPUTE_DOMAINS, transform=slim_domain
        )
        with contextlib.suppress(ValueError):  # another user of this informer added it already
            self._domains.add_indexers({BY_UID: index_by_uid})
        self._cliques: SharedInformer = informers.informer_for(
            COMPUTE_DOMAIN_CLIQUES, driver_namespace
        )
        self._nodes: SharedInformer = informers.informer_for(
            NODES, field_selector=f"metadata.name={node_name}", metadata_only=True
        )
        self._node_seen: JSON | None = None  # the node as we last wrote or read it (a GET)
        self._domain_lister = Lister(self._domains.indexer, COMPUTE_DOMAINS)
        self._clique_lister = Lister(self._cliques.indexer, COMPUTE_DOMAIN_CLIQUES)
        self._node_lister = Lister(self._nodes.indexer, NODES)
        self._registrations: list[tuple[SharedInformer, HandlerRegistration]] = []
        self._listeners: list[Callable[[], None]] = []

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (no arguments, must not block) after every domain or clique event."""
        self._listeners.append(listener)

    def start(self) -> None:
        """Register the notify-only handlers and start the informers (the node's has none)."""
        for informer in (self._domains, self._cliques):
            reg = informer.add_event_handler(
                on_add=self._on_add, on_update=self._on_update, on_delete=self._on_delete
            )
            self._registrations.append((informer, reg))
        self._informers.start()

    def stop(self) -> None:
        """Unregister the handlers (the factory's owner shuts the informers down)."""
        for informer, reg in self._registrations:
            informer.remove_event_handler(reg)
        self._registrations.clear()
        with self._cond:
            self._cond.notify_all()

    def synced(self) -> bool:
        return self._domains.has_synced() and self._cliques.has_synced()

    def wait_synced(self, timeout: float) -> bool:
        deadline = self._clock.monotonic() + timeout
        return self._domains.wait_for_sync(max(timeout, 0.0)) and self._cliques.wait_for_sync(
            max(deadline - self._clock.monotonic(), 0.0)
        )

    # -- event handlers: notify only -------------------------------------------------------------

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:
                log.exception("ComputeDomain event listener failed")

    def _on_add(self, _obj: JSON) -> None:
        self._notify()

    def _on_update(self, _old: JSON, _new: JSON) -> None:
        self._notify()

    def _on_delete(self, _obj: JSON | DeletedFinalStateUnknown) -> None:
        self._notify()

    # -- reads -----------------------------------------------------------------------------------

    def _wait(self, predicate: Callable[[], Any], deadline: float) -> Any:
        """``predicate`` (cache reads only: it runs under ``_cond``) re-checked after every
        event until it is truthy or ``deadline`` passes; its last result."""
        with self._cond:
            while True:
                result = predicate()
                remaining = deadline - self._clock.monotonic()
                if result or remaining <= 0:
                    return result
                self._clock.wait_condition(self._cond, remaining)

    def _domain(self, uid: str) -> JSON | None:
        found = self._domain_lister.by_index(BY_UID, uid)
        return found[0] if found else None

    def get_domain(self, uid: str, *, deadline: float) -> JSON | None:
        """The ComputeDomain with this UID, waiting briefly for a just-created one to arrive."""
        self._domains.wait_for_sync(max(deadline - self._clock.monotonic(), 0.0))
        found: JSON | None = self._wait(
            lambda: self._domain(uid), min(deadline, self._clock.monotonic() + self._grace)
        )
        return found

    def is_ready(self, cd_uid: str) -> bool:
        """This node's daemon for the domain is Ready."""
        return self._ready(cd_uid)

    def _entry(self, cd_uid: str) -> DaemonEntry | None:
        """This node's membership entry for the domain: its clique's, else the domain
        status's."""
        clique_id = self._clique_id()
        if clique_id:
            clique = self._clique_lister.get(clique_object_name(cd_uid, clique_id), self._namespace)
            for daemon in clique_daemons(clique):
                if daemon.node_name == self._node:
                    return daemon
        cd = self._domain(cd_uid) or {}
        for node in status_nodes(cd.get("status")):
            if node.node_name == self._node:
                return node
        return None

    def _ready(self, cd_uid: str) -> bool:
        entry = self._entry(cd_uid)
        return self._readiness_of(cd_uid, entry, self._record_for(cd_uid, entry))

    def _record_for(self, cd_uid: str, entry: DaemonEntry | None) -> LocalReady | None:
        """The daemon's node-local record, when it could decide: ``entry`` exists and is not
        Ready. Reads the daemon's file: call it without holding ``_cond`` (a slow or hostile
        file must never stall the informers' event handlers, which take it)."""
        if self._local_ready is None or entry is None or entry.status == STATUS_READY:
            return None
        return self._local_ready(cd_uid)

    def _readiness_of(
        self, cd_uid: str, entry: DaemonEntry | None, record: LocalReady | None
    ) -> bool:
        if entry is None:
            return False
        if entry.status == STATUS_READY:
            return True
        return record is not None and record.speaks_for(cd_uid, self._node, entry.ip_address)

    def daemon_readiness(self, cd_uid: str) -> DaemonReadiness:
        """Whether this node's IMEX daemon serves the domain, and why (for device health).

        Like Prepare's readiness check, but a clique object that exists and lacks this node
        means the node left the domain (no fallback to the possibly older domain status), and
        caches that have not synced or a domain that is not known give ``ready=None``.
        """
        me = self._node
        if not self.synced():
            return DaemonReadiness(None, "the plugin has not read ComputeDomains yet")
        clique_id = self._clique_id()
        if clique_id:
            clique = self._clique_lister.get(clique_object_name(cd_uid, clique_id), self._namespace)
            if clique is not None:
                for daemon in clique_daemons(clique):
                    if daemon.node_name == me:
                        return _readiness(me, cd_uid, daemon.status)
                return DaemonReadiness(
                    False,
                    f"node {me} is not a member of ComputeDomain {cd_uid} (its IMEX daemon "
                    f"left clique {clique_id} or has not joined it)",
                )
        cd = self._domain(cd_uid)
        if cd is None:
            return DaemonReadiness(None, f"ComputeDomain {cd_uid} not found")
        for node in status_nodes(cd.get("status")):
            if node.node_name == me:
                return _readiness(me, cd_uid, node.status)
        return DaemonReadiness(False, f"node {me} is not a member of ComputeDomain {cd_uid}")

    def wait_ready(self, cd_uid: str, *, deadline: float) -> bool:
        """Wait until this node's daemon for the domain is Ready (its membership entry says so,
        or its node-local record speaks for that entry), at most until ``deadline``
        (monotonic); whether it is."""

        while True:
            # The record is read first, outside the condition; the decision is then taken under
            # it against the listers' current entry, so an event that lands in between is not
            # lost (the entry is re-read) and the record is at most one poll old.
            record = self._record_for(cd_uid, self._entry(cd_uid))
            with self._cond:
                entry = self._entry(cd_uid)
                if self._readiness_of(cd_uid, entry, record):
                    return True
                remaining = deadline - self._clock.monotonic()
                if remaining <= 0:
                    return False
                # A record can only speak for an entry that exists: until the daemon has
                # joined, only an event can change the answer, so only then is there a poll.
                if entry is not None and self._local_ready is not None:
                    remaining = min(remaining, self._local_poll)
                self._clock.wait_condition(self._cond, remaining)

    def _with_retries(self, what: str, step: Callable[[bool], bool]) -> None:
        """Run ``step`` until it reports done (True); conflicts and outages retry.

        ``step`` gets True on its first run only (it may decide from the watch cache then) and
        returns False to be run again at once (the node changed under us); an API
        outage waits out :attr:`_transient_backoff` between tries. Raises
        :class:`RetryableError` when neither settles.
        """
        conflicts = 0
        outages = 0
        while True:
            try:
                if step(conflicts == 0 and outages == 0):
                    return
                conflicts += 1
                if conflicts >= _LABEL_ATTEMPTS:
                    raise RetryableError(
                        f"node {self._node} kept changing while {what}; will retry"
                    )
            except TRANSIENT_ERRORS as err:
                if outages >= len(self._transient_backoff):
                    raise RetryableError(
                        f"API server unavailable while {what} on node {self._node}: {err}; "
                        "will retry"
                    ) from err
                delay = self._transient_backoff[outages]
                outages += 1
                log.warning(
                    "%s on node %s failed: %s; retrying in %.1fs", what, self._node, err, delay
                )
                self._clock.sleep(delay)

    def _node_object(self, cached: bool) -> tuple[JSON, bool]:
        """This node and whether it came from the watch cache (``cached`` allows that: only
        when it has synced and is not older than the node as we last wrote or read it); else
        a GET (`NotFoundError` if the node does not exist)."""
        if cached and self._nodes.has_synced():
            node = self._node_lister.get(self._node)
            with self._cond:
                seen = self._node_seen
            if node is not None and (seen is None or not_older_than(node, seen)):
                return node, True
        node = self._client.get(NODES, self._node)
        self._saw_node(node)
        return node, False

    def _saw_node(self, node: JSON) -> None:
        with self._cond:
            seen = self._node_seen
            if seen is None or not_older_than(node, seen):
                self._node_seen = node

    def add_node_label(self, cd_uid: str) -> None:
        """Label this node for the domain; `RetryableError` if another domain holds it or the
        API server stays unreachable."""

        def step(first: bool) -> bool:
            node, cached = self._node_object(first)
            meta = node.get("metadata") or {}
            labels = meta.get("labels") or {}
            current = labels.get(COMPUTE_DOMAIN_LABEL)
            if current == cd_uid:
                return True
            if current and cached:
                return False  # another domain's, in the cache: decide on a GET
            if current:
                # The other domain is not named: it may be another tenant's (its UID is a
                # handle to it), and this message reaches the claim's pod Events.
                raise RetryableError(
                    f"node {self._node} is labeled for another ComputeDomain; "
                    "waiting until that domain's workload leaves the node"
                )
            ops: list[JSON] = [
                {
                    "op": "test",
                    "path": "/metadata/resourceVersion",
                    "value": meta["resourceVersion"],
                }
            ]
            if "labels" in meta:
                ops.append({"op": "add", "path": _LABEL_PATH, "value": cd_uid})
            else:
                ops.append(
                    {
                        "op": "add",
                        "path": "/metadata/labels",
                        "value": {COMPUTE_DOMAIN_LABEL: cd_uid},
                    }
                )
            try:
                written = self._client.patch(NODES, self._node, ops, patch_type="json")
            except (ConflictError, InvalidError):
                return False  # node changed since our read: re-read and decide again
            self._saw_node(written)
            log.info("labeled node %s %s=%s", self._node, COMPUTE_DOMAIN_LABEL, cd_uid)
            return True

        self._with_retries("labeling", step)

    def remove_node_label(self, cd_uid: str) -> None:
        """Remove the label if (and only if) it still names this domain; `RetryableError` if
        that cannot be settled now."""

        def step(first: bool) -> bool:
            try:
                node, cached = self._node_object(first)
            except NotFoundError:
                return True
            labels = (node.get("metadata") or {}).get("labels") or {}
            if labels.get(COMPUTE_DOMAIN_LABEL) != cd_uid:
                return not cached  # the cache may lag our label: settle it on a GET
            ops: list[JSON] = [
                {"op": "test", "path": _LABEL_PATH, "value": cd_uid},
                {"op": "remove", "path": _LABEL_PATH},
            ]
            try:
                written = self._client.patch(NODES, self._node, ops, patch_type="json")
            except NotFoundError:
                return True
            except (ConflictError, InvalidError):
                return False
            self._saw_node(written)
            log.info("removed node label %s=%s from %s", COMPUTE_DOMAIN_LABEL, cd_uid, self._node)
            return True

        self._with_retries("removing the ComputeDomain label", step)


def _readiness(node: str, cd_uid: str, status: str) -> DaemonReadiness:
    if status == STATUS_READY:
        return DaemonReadiness(True, f"IMEX daemon on node {node} is Ready")
    return DaemonReadiness(
        False,
        f"IMEX daemon on node {node} is {status or 'not Ready'} in ComputeDomain {cd_uid}",
    )
