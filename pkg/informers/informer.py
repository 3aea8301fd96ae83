"""`SharedInformer`: one reflector feeding one cache and any number of event handlers.

Owns the step from "the reflector saw something" to "the cache changed and every handler was
told". Invariants:
* The cache is updated *before* notifications are queued, under one lock that also orders the
  queues, so a lister read inside a handler already sees the new state and every handler sees
  the same sequence.
* A relist replaces the cache atomically: new keys -> add, surviving keys -> update, vanished
  keys -> delete carrying `DeletedFinalStateUnknown(key, last known object)`.
* Handlers added after start first receive a synthetic add for every cached object.
* Resync never calls the API: it replays the cache as update(old=new) per handler period.
* `has_synced()` is true once the first LIST is in the cache; `has_stopped()` once `stop()` was
  called and no thread of the informer can change the cache any more.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

from pkg.base.clock import Clock
from pkg.base.types import JSON
from pkg.informers.listener import HandlerRegistration, Notification, OnAdd, OnDelete, OnUpdate
from pkg.informers.listwatch import ListerWatcher
from pkg.informers.reflector import DEFAULT_BACKOFF, BackoffPolicy, Reflector
from pkg.informers.store import DeletedFinalStateUnknown, Indexer, IndexFunc, ObjectCodec

__all__ = ["SharedInformer"]

log = logging.getLogger(__name__)

MIN_RESYNC = 1.0


class SharedInformer:
    """One LIST+WATCH feeding one cache (`indexer`) and any number of event handlers.

    Thread-safe. The cache is read-only for everyone but the informer: objects from it and
    from notifications are shared, so callers deep-copy before mutating. Create through
    `SharedInformerFactory.informer_for` so the process keeps one watch per slice.
    """

    def __init__(
        self,
        lw: ListerWatcher,
        *,
        clock: Clock,
        resync_period: float = 0.0,
        indexers: dict[str, IndexFunc] | None = None,
        page_size: int = 500,
        min_watch_timeout: float = 300.0,
        backoff: BackoffPolicy = DEFAULT_BACKOFF,
        rng: random.Random | None = None,
        transform: Callable[[JSON], JSON] | None = None,
        codec: ObjectCodec | None = None,
    ) -> None:
        """``transform`` applies to every object before it is cached; ``codec`` is how the
        cache holds objects (`Indexer`; e.g. `serialized.SerializedCodec` for large caches)."""
        self.resource = lw.resource
        # Applied to every object before it is cached (e.g. `compact.compact` to save memory).
        self._transform = transform
        self._clock = clock
        self._resync_period = resync_period
        self.indexer = Indexer(indexers, codec=codec)
        self._lock = threading.RLock()
        self._handlers: list[HandlerRegistration] = []
        self._synced = threading.Event()
        self._started = False
        self._stopped = False
        self._resync_cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self.reflector = Reflector(
            lw,
            self,
            clock=clock,
            page_size=page_size,
            min_watch_timeout=min_watch_timeout,
            backoff=backoff,
            rng=rng,
        )

    # -- handlers ----------------------------------------------------------------------------

    def add_event_handler(
        self,
        on_add: OnAdd | None = None,
        on_update: OnUpdate | None = None,
        on_delete: OnDelete | None = None,
        *,
        resync_period: float | None = None,
    ) -> HandlerRegistration:
        """Register callbacks for this informer's notifications; returns the registration
        (its `has_synced` tells when the handler has seen the initial state).

        Guarantees: each handler runs on its own thread, receives notifications in cache order,
        first a synthetic add for every object already cached, and never misses an event between
        that snapshot and live ones. A handler that raises is logged and keeps receiving. Callbacks
        must not block for long (they delay only their own handler). ``resync_period`` (seconds;
        ``None``: the informer's, ``0``: never) replays the cache as updates with ``old is new``.
        Raises RuntimeError after `stop`. Safe from any thread, before or after `start`.
        """
        period = self._resync_period if resync_period is None else resync_period
        if 0 < period < MIN_RESYNC:
            period = MIN_RESYNC
        reg = HandlerRegistration(
            on_add=on_add,
            on_update=on_update,
            on_delete=on_delete,
            resync_period=period,
            name=self.resource.plural,
        )
        with self._lock:
            if self._stopped:
                raise RuntimeError("informer is stopped")
            reg.next_resync = self._clock.monotonic() + period
            # Under the lock, so no live event can slip between the snapshot and the handler.
            for _, obj in sorted(self.indexer.items()):
                reg.push(Notification("add", obj))
            if self._synced.is_set():
                reg.mark_sync_point()
            self._handlers.append(reg)
            if self._started:
                reg.start()
        with self._resync_cond:
            self._resync_cond.notify_all()
        return reg

    def remove_event_handler(self, reg: HandlerRegistration) -> None:
        """Unregister ``reg`` and stop its delivery thread; notifications still buffered for it are
        dropped. Idempotent; must not be called from that handler's own callback.
        """
        with self._lock:
            if reg in self._handlers:
                self._handlers.remove(reg)
        reg.stop()

    def add_indexers(self, indexers: dict[str, IndexFunc]) -> None:
        """Add secondary indexes to the cache (existing objects are indexed at once). Raises
        ValueError for a name already in use. Safe at any time.
        """
        self.indexer.add_indexers(indexers)

    def _distribute(self, n: Notification) -> None:
        for reg in self._handlers:
            reg.push(n)

    # -- ReflectorSink (called on the reflector thread) --------------------------------------

    def replace(self, items: list[JSON], resource_version: str) -> None:
        """Reflector sink: install a full LIST as the cache (see the module docstring). Called
        only by this informer's reflector thread.
        """
        if self._transform is not None:
            items = [self._transform(o) for o in items]
        with self._lock:
            old = dict(self.indexer.items())
            gone = self.indexer.replace(items)
            for obj in items:
                prev = old.get(self.indexer.key(obj))
                if prev is None:
                    self._distribute(Notification("add", obj))
                else:
                    self._distribute(Notification("update", obj, prev))
            for key, last in sorted(gone.items()):
                self._distribute(Notification("delete", DeletedFinalStateUnknown(key, last)))
            first_sync = not self._synced.is_set()
            if first_sync:
                self._synced.set()
                for reg in self._handlers:
                    reg.mark_sync_point()
        if first_sync:  # a resync that fell due before the first LIST may run now
            with self._resync_cond:
                self._resync_cond.notify_all()

    def add(self, obj: JSON) -> None:
        """Reflector sink: an ADDED or MODIFIED object (an update if the key is cached).
        Called only by this informer's reflector thread.
        """
        if self._transform is not None:
            obj = self._transform(obj)
        with self._lock:
            prev = self.indexer.add(obj)
            self._distribute(
                Notification("update", obj, prev) if prev else Notification("add", obj)
            )

    update = add  # a MODIFIED for an unknown key is an add, as in client-go

    def delete(self, obj: JSON) -> None:
        """Reflector sink: a DELETED object. Called only by this informer's reflector thread."""
        if self._transform is not None:
            obj = self._transform(obj)
        with self._lock:
            self.indexer.delete(obj)
            self._distribute(Notification("delete", obj))

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the reflector and resync threads and every registered handler; returns at once.
        Idempotent. Use `wait_for_sync` (or the factory's `wait_for_cache_sync`) before relying
        on the cache.
        """
        with self._lock:
            if self._started:
                return
            self._started = True
            for reg in self._handlers:
                reg.start()
        name = self.resource.plural
        for target, kind in ((self.reflector.run, "reflector"), (self._resync_loop, "resync")):
            t = threading.Thread(target=target, name=f"{kind}-{name}", daemon=True)
            self._threads.append(t)
            t.start()

    def stop(self, *, join_timeout: float = 5.0) -> None:
        """Stop the reflector (interrupting a blocked watch), the resync loop and every handler,
        joining each thread for at most ``join_timeout`` real seconds. Idempotent; the cache keeps
        its last content.
        """
        with self._lock:
            self._stopped = True
            handlers = list(self._handlers)
        self.reflector.stop()
        with self._resync_cond:
            self._resync_cond.notify_all()
        for t in self._threads:
            t.join(join_timeout)
        for reg in handlers:
            reg.stop(join_timeout=join_timeout)

    def has_synced(self) -> bool:
        """True once the first LIST is in the cache (never false again). Non-blocking."""
        return self._synced.is_set()

    def has_stopped(self) -> bool:
        """True once `stop` was called and the reflector and resync threads have exited, so the
        cache no longer changes (`stop` joins them only for a bounded time). Non-blocking."""
        with self._lock:
            if not self._stopped:
                return False
        return not any(t.is_alive() for t in self._threads)

    def wait_for_sync(self, timeout: float | None = None) -> bool:
        """Block until the first LIST is in the cache or ``timeout`` seconds of the injected
        clock pass (``None``: no limit); returns whether it has synced. Safe from any thread."""
        return self._clock.wait(self._synced, timeout)

    @property
    def last_sync_resource_version(self) -> str:
        """The resourceVersion the cache reflects (empty before the first LIST)."""
        return self.reflector.last_sync_resource_version

    # -- resync ------------------------------------------------------------------------------

    def _resync_loop(self) -> None:
        with self._resync_cond:
            while True:
                with self._lock:
                    if self._stopped:
                        return
                    now = self._clock.monotonic()
                    due = [r for r in self._handlers if r.resync_period > 0]
                    if self._synced.is_set():
                        for reg in due:
                            if now >= reg.next_resync:
                                for _, obj in sorted(self.indexer.items()):
                                    reg.push(Notification("update", obj, obj))
                                reg.next_resync = now + reg.resync_period
                    nxt = min((r.next_resync for r in due), default=None)
                    if nxt is not None and not self._synced.is_set() and nxt <= now:
                        nxt = None  # overdue but unsynced: wait for the sync's notify
                wait = None if nxt is None else max(nxt - now, 0.001)
                self._clock.wait_condition(self._resync_cond, wait)
