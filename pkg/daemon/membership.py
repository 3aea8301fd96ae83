"""Membership of one IMEX daemon in its ComputeDomain: the shared list of daemon entries.

Owns every write this daemon makes to the membership list, which lives either in the
``ComputeDomainClique`` ``<cdUID>.<cliqueID>`` (``daemons[]``, gate ``ComputeDomainCliques``) or,
with that gate off, in ``ComputeDomain.status.nodes`` (via the status subresource). Both are
behind :class:`EntryStore`, so the join/update/leave logic exists once.

Invariants:
- no daemon ever overwrites another's entry (upstream #1050): a write is either a
  read-modify-write of the *whole* list guarded by the object's resourceVersion, or (clique
  only) a JSON patch guarded by `test` operations instead - a join appends our entry only if
  the list still ends with the entry our view ended with and ours lands right after it (the
  API server's list-map key validation refuses a second entry of our node); a status or
  connectivity change replaces fields of our own entry only if it is still at its position
  with our node, IP, clique and index. Other daemons' in-place status patches break neither
  guard, so daemons turning Ready together do not fail each other. A 422 from an append is
  handled like a 409 (a few times, then the guarded write); from a status patch, the guarded
  write decides at once. No write acts on a cached view older than our own last write
  (:func:`not_older_than`). With a :class:`CacheView` (the
  daemon's informer on the object) the read is the cached object, not a GET: a stale cache only
  costs a 409, never an entry. After a 409 (or our own write) the RV we wrote against is known
  stale; after a 409 the loop first waits for the cache to move past it (a GET only if it does
  not within ``cache_wait``), then sleeps a full-jitter exponential backoff in units of that
  write-to-cache delay, so the losers, who all see the winning write at once, spread out
  (upstream #816: 18 daemons joining and turning Ready at once take ~4.5 requests each against
  the fake API server, not ~13). Until the cache shows our own write, the written object
  stands in for it (mutation cache);
- a write whose result equals the current list is skipped; the clique is created with our
  entry already in it;
- a daemon owns at most one entry, keyed by node name; it joins at the lowest index not used by
  another entry of the same clique and below ``max_nodes``; its index never changes while the
  entry exists, so a restarted daemon (same node, new IP) keeps its slot;
- leaving removes only our node's entry *and only if it still carries our IP*, so a shutting-down
  pod never deletes the entry its replacement on the same node already re-registered;
- peer connectivity (``connectedPeers``, ``unreachablePeers``: what our IMEX's
  ``nvidia-imex-ctl -N -j`` says about the other members of our clique) is written only into
  clique entries, as additive fields upstream's readers ignore; absent means "not reported",
  and a new IP (restarted daemon) clears it;
- the clique is created on demand with upstream's labels; each daemon pod that writes it adds
  itself as an owner, so the garbage collector removes it after the last daemon pod is gone.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from pkg.api import constants as c
from pkg.api.daemonentry import (
    DAEMONS,
    STATUS_NODES,
    DaemonEntry,
    clique_daemons,
    encode_daemons,
    encode_status_nodes,
    guarded_append_ops,
    item_position,
    own_entry_patch_ops,
    status_nodes,
)
from pkg.base.types import JSON
from pkg.kube import resources as res
from pkg.kube.client import KubeClient
from pkg.kube.errors import (
    TRANSIENT_ERRORS,
    AlreadyExistsError,
    ApiError,
    ConflictError,
    InvalidError,
    NotFoundError,
)
from pkg.kube.versions import not_older_than, resource_version

log = logging.getLogger(__name__)


class MembershipError(Exception):
    """The membership list cannot take our entry (no free index, domain gone, API failure)."""


class CliqueFullError(MembershipError):
    """Every index of the clique is taken by another daemon (``MAX_NODES_PER_IMEX_DOMAIN``)."""

    def __init__(self, clique_id: str, max_nodes: int) -> None:
        super().__init__(
            f"no free index: all {max_nodes} slots of clique {clique_id!r} are taken "
            f"(MAX_NODES_PER_IMEX_DOMAIN={max_nodes})"
        )
        self.clique_id = clique_id
        self.max_nodes = max_nodes


@dataclass(frozen=True)
class Identity:
    """Who this daemon is: fixed for the process lifetime."""

    domain_uid: str
    domain_name: str
    domain_namespace: str
    clique_id: str
    node_name: str
    pod_ip: str
    pod_name: str
    pod_uid: str
    pod_namespace: str


@dataclass(frozen=True)
class Snapshot:
    """A membership object as read, with its decoded entries (all cliques)."""

    obj: JSON
    entries: tuple[DaemonEntry, ...]


class EntryStore(Protocol):
    """Where the entries live. ``write`` must carry ``snap``'s resourceVersion precondition."""

    name: str  # the membership object (watched by the daemon loop)
    namespace: str

    def read(self) -> Snapshot | None:
        """The current object, or None if it does not exist."""

    def check(self, obj: JSON) -> Snapshot:
        """Decode an object read elsewhere (cache); MembershipError if it is not our domain's."""

    def create(self, entries: list[DaemonEntry]) -> JSON:
        """Create the object holding ``entries``; AlreadyExistsError if it exists."""

    def write(self, snap: Snapshot, entries: list[DaemonEntry]) -> JSON:
        """Replace the entries and return the written object; ConflictError if the object
        changed since ``snap``."""

    def decode(self, obj: JSON) -> Snapshot:
        """Decode an object received elsewhere (a watch event)."""

    def patch_entry(self, snap: Snapshot, old: DaemonEntry, new: DaemonEntry) -> JSON | None:
        """Write only the status/connectivity change ``old`` -> ``new`` of our own entry,
        guarded by that entry's identity instead of the object's resourceVersion (so writes of
        other entries in between do not conflict); the written object, or None when this store
        cannot (the caller then uses :meth:`write`). InvalidError (422) if the entry is no
        longer where and what ``snap`` says."""

    def append_entry(self, snap: Snapshot, entry: DaemonEntry) -> JSON | None:
        """Append ``entry`` (a join) without the object's resourceVersion, guarded by the list's
        shape instead: the last entry of ``snap`` is still last and ours lands right after
        it. None when this store cannot; InvalidError (422) when the list changed shape."""


class CliqueStore:
    """Entries in ``ComputeDomainClique`` ``<cdUID>.<cliqueID>`` in the daemon pod's namespace."""

    def __init__(self, client: KubeClient, me: Identity) -> None:
        self._client = client
        self._me = me
        self.name = c.clique_object_name(me.domain_uid, me.clique_id)
        self.namespace = me.pod_namespace

    def decode(self, obj: JSON) -> Snapshot:
        return Snapshot(obj, tuple(clique_daemons(obj)))

    def read(self) -> Snapshot | None:
        try:
            obj = self._client.get(res.COMPUTE_DOMAIN_CLIQUES, self.name, namespace=self.namespace)
        except NotFoundError:
            return None
        return self.check(obj)

    def check(self, obj: JSON) -> Snapshot:
        labels = obj.get("metadata", {}).get("labels") or {}
        if labels.get(c.COMPUTE_DOMAIN_LABEL, self._me.domain_uid) != self._me.domain_uid:
            raise MembershipError(
                f"clique {self.namespace}/{self.name} belongs to domain "
                f"{labels.get(c.COMPUTE_DOMAIN_LABEL)}, not {self._me.domain_uid}"
            )
        return self.decode(obj)

    def _owner_refs(self, existing: list[JSON]) -> list[JSON]:
        if not self._me.pod_uid or any(r.get("uid") == self._me.pod_uid for r in existing):
            return existing
        me = {"apiVersion": "v1", "kind": "Pod", "name": self._me.pod_name, "uid": self._me.pod_uid}
        return [*existing, me]

    def create(self, entries: list[DaemonEntry]) -> JSON:
        obj: JSON = {
            "apiVersion": c.API_VERSION,
            "kind": c.COMPUTE_DOMAIN_CLIQUE_KIND,
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "labels": {
                    c.COMPUTE_DOMAIN_LABEL: self._me.domain_uid,
                    c.CLIQUE_ID_LABEL: self._me.clique_id,
                },
                "ownerReferences": self._owner_refs([]),
            },
            DAEMONS: encode_daemons(entries),
        }
        return self._client.create(res.COMPUTE_DOMAIN_CLIQUES, obj, namespace=self.namespace)

    def write(self, snap: Snapshot, entries: list[DaemonEntry]) -> JSON:
        obj = dict(snap.obj)
        meta = dict(obj.get("metadata") or {})
        meta["ownerReferences"] = self._owner_refs(list(meta.get("ownerReferences") or []))
        obj["metadata"] = meta
        obj[DAEMONS] = encode_daemons(entries)
        return self._client.update(res.COMPUTE_DOMAIN_CLIQUES, obj)

    def patch_entry(self, snap: Snapshot, old: DaemonEntry, new: DaemonEntry) -> JSON | None:
        """A JSON patch whose ``test`` operations pin our entry (its position, node name, IP,
        clique and index) and whose ``add`` operations set its status and connectivity: the
        API server applies it to the current object (retrying its own storage conflicts), so
        18 daemons turning Ready at once do not fail each other with 409s. Only when our pod
        already owns the clique (the guarded write adds the owner reference) and no
        connectivity field is being removed."""
        meta = snap.obj.get("metadata") or {}
        if self._me.pod_uid and not any(
            r.get("uid") == self._me.pod_uid for r in meta.get("ownerReferences") or []
        ):
            return None
        if (new.connected_peers is None and old.connected_peers is not None) or (
            new.unreachable_peers is None and old.unreachable_peers is not None
        ):
            return None
        raw = snap.obj.get(DAEMONS) or []
        pos = item_position(raw, old.node_name)
        if pos is None:
            return None
        ops = own_entry_patch_ops(pos, old, new)
        return self._client.patch(
            res.COMPUTE_DOMAIN_CLIQUES,
            self.name,
            ops,
            namespace=self.namespace,
            patch_type="json",
        )

    def append_entry(self, snap: Snapshot, entry: DaemonEntry) -> JSON | None:
        """A JSON patch that appends our entry only if the list still ends with the entry
        ``snap`` ended with (`test` of its node, IP, clique and index at that position) and
        ours lands right after it: entries are only ever appended, changed in place or
        removed, so that holds only if no entry was added or removed since ``snap``, and the
        index ``snap`` showed free is still free. Status patches of other entries (in place)
        do not break it. Not for an empty list, nor before our pod owns the clique unless
        its ownerReferences can take us."""
        raw = snap.obj.get(DAEMONS)
        if not isinstance(raw, list) or not raw or not isinstance(raw[-1], dict):
            return None
        ops = guarded_append_ops(raw, [entry])
        owners = (snap.obj.get("metadata") or {}).get("ownerReferences")
        refs = owners if isinstance(owners, list) else []
        missing = self._owner_refs(refs)[len(refs) :]
        if missing and not refs:
            return None  # no list to append to: the guarded write sets it
        ops += [{"op": "add", "path": "/metadata/ownerReferences/-", "value": r} for r in missing]
        return self._client.patch(
            res.COMPUTE_DOMAIN_CLIQUES,
            self.name,
            ops,
            namespace=self.namespace,
            patch_type="json",
        )


class StatusStore:
    """Entries in ``ComputeDomain.status.nodes`` (gate ``ComputeDomainCliques`` off)."""

    def __init__(self, client: KubeClient, me: Identity) -> None:
        self._client = client
        self._me = me
        self.name = me.domain_name
        self.namespace = me.domain_namespace

    def decode(self, obj: JSON) -> Snapshot:
        return Snapshot(obj, tuple(status_nodes(obj.get("status"))))

    def read(self) -> Snapshot | None:
        try:
            obj = self._client.get(res.COMPUTE_DOMAINS, self.name, namespace=self.namespace)
        except NotFoundError:
            return None
        return self.check(obj)

    def check(self, obj: JSON) -> Snapshot:
        if obj.get("metadata", {}).get("uid") != self._me.domain_uid:
            raise MembershipError(
                f"ComputeDomain {self.namespace}/{self.name} has a different UID "
                f"(recreated?); expected {self._me.domain_uid}"
            )
        return self.decode(obj)

    def create(self, entries: list[DaemonEntry]) -> JSON:
        raise MembershipError(f"ComputeDomain {self.namespace}/{self.name} does not exist")

    def write(self, snap: Snapshot, entries: list[DaemonEntry]) -> JSON:
        obj = dict(snap.obj)
        status = dict(obj.get("status") or {})
        status.setdefault("status", c.STATUS_NOT_READY)
        if entries:
            status[STATUS_NODES] = encode_status_nodes(entries)
        else:  # upstream omits an empty list (omitempty)
            status.pop(STATUS_NODES, None)
        obj["status"] = status
        return self._client.update(res.COMPUTE_DOMAINS, obj, subresource="status")

    def patch_entry(self, snap: Snapshot, old: DaemonEntry, new: DaemonEntry) -> JSON | None:
        """Not for ``status.nodes`` (upstream's layout, written whole): always None."""
        del snap, old, new
        return None

    def append_entry(self, snap: Snapshot, entry: DaemonEntry) -> JSON | None:
        """Not for ``status.nodes``: always None."""
        del snap, entry
        return None


# -- pure list edits (None = nothing to change) --------------------------------------------------


def lowest_free_index(entries: list[DaemonEntry], *, clique_id: str, max_nodes: int) -> int:
    """The lowest index below ``max_nodes`` no entry of the clique uses; else
    :class:`CliqueFullError`."""
    used = {e.index for e in entries if e.clique_id == clique_id}
    for index in range(max_nodes):
        if index not in used:
            return index
    raise CliqueFullError(clique_id, max_nodes)


def upsert(entries: list[DaemonEntry], me: Identity, *, max_nodes: int) -> list[DaemonEntry] | None:
    """Ensure our entry exists with our IP (new entries: lowest free index, NotReady)."""
    for i, e in enumerate(entries):
        if e.node_name != me.node_name:
            continue
        if e.ip_address == me.pod_ip and e.clique_id == me.clique_id and 0 <= e.index < max_nodes:
            return None
        if e.clique_id == me.clique_id and 0 <= e.index < max_nodes:
            # Same node, new pod IP: keep the slot, readiness must be re-earned.
            out = list(entries)
            out[i] = replace(
                e,
                ip_address=me.pod_ip,
                status=c.STATUS_NOT_READY,
                connected_peers=None,
                unreachable_peers=None,
            )
            return out
        others = [x for j, x in enumerate(entries) if j != i]
        return _append(others, me, max_nodes=max_nodes)
    return _append(list(entries), me, max_nodes=max_nodes)


def _append(entries: list[DaemonEntry], me: Identity, *, max_nodes: int) -> list[DaemonEntry]:
    index = lowest_free_index(entries, clique_id=me.clique_id, max_nodes=max_nodes)
    return [*entries, DaemonEntry(me.node_name, me.pod_ip, me.clique_id, index)]


def with_status(
    entries: list[DaemonEntry], me: Identity, status: str, *, max_nodes: int
) -> list[DaemonEntry] | None:
    base = upsert(entries, me, max_nodes=max_nodes)
    current = base if base is not None else list(entries)
    for i, e in enumerate(current):
        if e.node_name == me.node_name:
            if e.status == status:
                return base
            out = list(current)
            out[i] = replace(e, status=status)
            return out
    raise AssertionError("upsert always leaves our entry")


def with_connectivity(
    entries: list[DaemonEntry],
    me: Identity,
    connected: int,
    unreachable: tuple[str, ...],
    *,
    max_nodes: int,
) -> list[DaemonEntry] | None:
    """Our entry with the given peer connectivity (joining first if needed)."""
    base = upsert(entries, me, max_nodes=max_nodes)
    current = base if base is not None else list(entries)
    for i, e in enumerate(current):
        if e.node_name == me.node_name:
            if e.connected_peers == connected and e.unreachable_peers == unreachable:
                return base
            out = list(current)
            out[i] = replace(e, connected_peers=connected, unreachable_peers=unreachable)
            return out
    raise AssertionError("upsert always leaves our entry")


def without_me(entries: list[DaemonEntry], me: Identity) -> list[DaemonEntry] | None:
    kept = [e for e in entries if not (e.node_name == me.node_name and e.ip_address == me.pod_ip)]
    return kept if len(kept) != len(entries) else None


# -- the read-modify-write loop ------------------------------------------------------------------

# Outages (dropped connections, timeouts, 5xx, 429) back off and retry like a 409.
_RETRYABLE: tuple[type[Exception], ...] = (ConflictError, NotFoundError, *TRANSIENT_ERRORS)

_ABSENT = ""  # the "resourceVersion" of a missing object


_APPEND_PATCHES = 32  # shape-guarded join patches refused (422) before the guarded update


def _appends_me(entries: list[DaemonEntry], new: list[DaemonEntry], me: Identity) -> bool:
    """``new`` is ``entries`` plus our entry at the end (a join that changes nothing else)."""
    return (
        len(new) == len(entries) + 1 and new[:-1] == entries and new[-1].node_name == me.node_name
    )


def _rv(obj: JSON | None) -> str:
    return resource_version(obj) or _ABSENT


# A write of another daemon between the RV our write replaced and our write's RV is not stale
# by RV, yet it lacks our write: a view the resourceVersion-free patches must not act on (it
# could re-append our entry); :func:`not_older_than` tells.


class CacheView:
    """The membership object as an informer caches it.

    ``get`` returns the cached object (None if absent), ``wait_synced(timeout)`` whether the
    cache has listed at least once (waiting up to ``timeout`` s, as ``SharedInformer.
    wait_for_sync``); the informer's event handler must call :meth:`notify` after each change.
    :meth:`close` (informer stopped) turns every wait into an immediate "no change".
    """

    def __init__(
        self, get: Callable[[], JSON | None], wait_synced: Callable[[float], bool]
    ) -> None:
        self._get = get
        self._wait_synced = wait_synced
        self._cond = threading.Condition()
        self._closed = False

    def get(self) -> JSON | None:
        return self._get()

    def usable(self, timeout: float) -> bool:
        """Listed at least once (waits up to ``timeout`` s for the first list, so a daemon's
        first join needs no GET). A closed cache is still read, but never waited on."""
        return self._wait_synced(0 if self._closed else timeout)

    def notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def wait_past(self, stale: set[str], timeout: float) -> JSON | None:
        """The cached object once its resourceVersion is not in ``stale``; raises
        ``TimeoutError`` if that does not happen within ``timeout`` seconds."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._closed or _rv(self._get()) not in stale, timeout=timeout
            )
            obj = self._get()
            if _rv(obj) in stale:
                raise TimeoutError
            return obj


class Membership:
    """Our entry in the shared list; every method is a bounded read-modify-write loop."""

    def __init__(
        self,
        store: EntryStore,
        me: Identity,
        *,
        max_nodes: int,
        cache: CacheView | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        base_delay: float = 0.05,
        max_delay: float = 1.0,
        max_attempts: int = 200,
        cache_wait: float = 1.0,
        on_conflict: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.me = me
        self.max_nodes = max_nodes
        self.cache = cache
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._base = base_delay
        self._max = max_delay
        self._attempts = max_attempts
        self._cache_wait = cache_wait
        self._on_conflict = on_conflict or (lambda: None)
        # resourceVersions known to be outdated (we got a 409 against them, or our own write
        # replaced them); never reused by the apiserver, so a small bounded set suffices.
        self._stale: dict[str, None] = {}
        # Our last successful write: stands in for the cache until the cache shows it.
        self._written: JSON | None = None
        # The membership object as last read or written (IP mode needs its spec.numNodes).
        self.last_object: JSON | None = None

    def join(self) -> list[DaemonEntry]:
        """Ensure our entry (index, IP); returns the list as written or read."""
        return self._mutate(lambda es: upsert(es, self.me, max_nodes=self.max_nodes), "join")

    def set_status(self, status: str) -> list[DaemonEntry]:
        edit = lambda es: with_status(es, self.me, status, max_nodes=self.max_nodes)  # noqa: E731
        return self._mutate(edit, f"set status {status}")

    def set_connectivity(self, connected: int, unreachable: tuple[str, ...]) -> list[DaemonEntry]:
        """Publish what our IMEX sees of its peers in our entry (no write if unchanged)."""
        edit = lambda es: with_connectivity(  # noqa: E731
            es, self.me, connected, unreachable, max_nodes=self.max_nodes
        )
        return self._mutate(edit, "set connectivity")

    def leave(self) -> list[DaemonEntry]:
        return self._mutate(lambda es: without_me(es, self.me), "leave", create=False)

    def own_entry(self, entries: list[DaemonEntry]) -> DaemonEntry | None:
        return next((e for e in entries if e.node_name == self.me.node_name), None)

    def _backoff(self, attempt: int, unit: float = 0.0) -> None:
        """Full jitter: uniform in [0, min(max, max(base, unit) * 2**attempt)]."""
        step = max(self._base, unit)
        self._sleep(self._rng.uniform(0, min(self._max, step * 2 ** min(attempt, 16))))

    def _mark_stale(self, rv: str) -> None:
        self._stale[rv] = None
        while len(self._stale) > 16:
            del self._stale[next(iter(self._stale))]

    def _catch_up(self) -> None:
        cache = self.cache
        if cache is not None and cache.usable(0):
            with contextlib.suppress(TimeoutError):
                cache.wait_past(set(self._stale), self._cache_wait)

    def _read(self) -> Snapshot | None:
        """The freshest object we know without a GET if possible (see module docstring)."""
        cache = self.cache
        if cache is None or not cache.usable(self._cache_wait):
            return self.store.read()
        stale = set(self._stale)
        obj = cache.get()
        written = self._written
        if _rv(obj) not in stale and (written is None or not_older_than(obj, written)):
            self._written = None  # the cache caught up with (or went past) our write
        elif written is not None and _rv(written) not in stale:
            obj = written
        else:
            try:
                obj = cache.wait_past(stale, self._cache_wait)
            except TimeoutError:
                log.debug("membership cache did not catch up; reading the object")
                snap = self.store.read()
                if snap is None:
                    self._stale.pop(_ABSENT, None)  # deleted since: the cache is right
                return snap
        return None if obj is None else self.store.check(obj)

    def _mutate(
        self,
        edit: Callable[[list[DaemonEntry]], list[DaemonEntry] | None],
        what: str,
        *,
        create: bool = True,
    ) -> list[DaemonEntry]:
        last: Exception | None = None
        patch_ok = True  # our own entry's status/connectivity by an identity-guarded patch
        appends_left = _APPEND_PATCHES  # joins by a shape-guarded patch (422 = list changed)
        appending = False
        for attempt in range(self._attempts):
            rv = _ABSENT
            started = time.monotonic()
            try:
                snap = self._read()
                if snap is None:
                    if not create:
                        return []
                    initial = edit([]) or []
                    try:
                        written = self.store.create(initial)
                    except AlreadyExistsError:
                        self._mark_stale(_ABSENT)  # lost the create race: as for a 409
                        self._catch_up()
                        self._backoff(attempt, time.monotonic() - started)
                        continue
                    self._wrote(_ABSENT, written)
                    return initial
                rv = _rv(snap.obj)
                entries = list(snap.entries)
                self.last_object = snap.obj
                new = edit(entries)
                if new is None or new == entries:
                    return entries
                appending = appends_left > 0 and _appends_me(entries, new, self.me)
                if appending:
                    patched = self.store.append_entry(snap, new[-1])
                else:
                    patched = self._patch_own(snap, entries, new) if patch_ok else None
                self._wrote(rv, patched if patched is not None else self.store.write(snap, new))
                log.debug("membership %s done after %d attempt(s)", what, attempt + 1)
                return new
            except _RETRYABLE as err:
                last = err
                if isinstance(err, ConflictError | NotFoundError):
                    self._mark_stale(rv)
                    self._written = None
                    # Back off only once the cache shows the winning write: all losers see it
                    # at about the same moment, and the jitter must spread them from there,
                    # in units of how long a write takes to show up in the cache.
                    self._catch_up()
                if isinstance(err, ConflictError):
                    self._on_conflict()
                self._backoff(attempt, time.monotonic() - started)
            except InvalidError as err:
                if rv == _ABSENT or not (appending or patch_ok):
                    raise MembershipError(f"membership {what}: {err}") from err
                last = err
                self._mark_stale(rv)
                self._written = None
                if appending:
                    # Another daemon appended (or one left) first: as a 409, wait for the
                    # cache to show it and back off; after a few, the guarded write decides.
                    appends_left -= 1
                    self._on_conflict()
                    self._catch_up()
                    self._backoff(attempt, time.monotonic() - started)
                else:
                    patch_ok = False  # our entry moved or changed: the guarded write decides
            except ApiError as err:
                raise MembershipError(f"membership {what}: {err}") from err
        raise MembershipError(f"membership {what}: gave up after {self._attempts} attempts: {last}")

    def _patch_own(
        self, snap: Snapshot, entries: list[DaemonEntry], new: list[DaemonEntry]
    ) -> JSON | None:
        """The store's identity-guarded patch when ``new`` differs from ``entries`` only in
        our own entry's status/connectivity (same position, node, IP, clique, index)."""
        if len(new) != len(entries):
            return None
        changed = [(a, b) for a, b in zip(entries, new, strict=True) if a != b]
        if len(changed) != 1:
            return None
        old_e, new_e = changed[0]
        same = ("node_name", "ip_address", "clique_id", "index")
        if old_e.node_name != self.me.node_name or any(
            getattr(old_e, f) != getattr(new_e, f) for f in same
        ):
            return None
        return self.store.patch_entry(snap, old_e, new_e)

    def _wrote(self, replaced_rv: str, obj: JSON) -> None:
        self._mark_stale(replaced_rv)
        self._written = obj
        self.last_object = obj
