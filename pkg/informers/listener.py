"""Per-handler delivery: each event handler gets its own thread and unbounded buffer.

Owns the ordering and isolation guarantees of informer notifications. Invariants: a handler
sees notifications in exactly the order they were pushed; a slow or failing handler only
delays itself (the pusher never blocks, exceptions are logged and delivery continues);
`has_synced()` is true once every notification pushed up to the informer's sync point (or the
synthetic adds of a late registration) has been handled.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pkg.base.types import JSON, NotificationKind
from pkg.informers.store import DeletedFinalStateUnknown

__all__ = ["HandlerRegistration", "Notification", "OnAdd", "OnDelete", "OnUpdate"]

log = logging.getLogger(__name__)

OnAdd = Callable[[JSON], None]
OnUpdate = Callable[[JSON, JSON], None]
OnDelete = Callable[[JSON | DeletedFinalStateUnknown], None]


@dataclass(frozen=True, slots=True)
class Notification:
    """One change for a handler: ``kind`` with ``new`` (a tombstone for some deletes) and, for
    updates, ``old``. Immutable.
    """

    kind: NotificationKind
    new: Any
    old: JSON | None = None


class HandlerRegistration:
    """A registered handler; also its delivery thread. Returned by `add_event_handler`."""

    def __init__(
        self,
        *,
        on_add: OnAdd | None,
        on_update: OnUpdate | None,
        on_delete: OnDelete | None,
        resync_period: float,
        name: str,
    ) -> None:
        self._on_add, self._on_update, self._on_delete = on_add, on_update, on_delete
        self.resync_period = resync_period
        self.next_resync = 0.0
        self._buf: deque[Notification] = deque()
        self._cond = threading.Condition()
        self._stopped = False
        self._pushed = 0
        self._handled = 0
        self._sync_target: int | None = None
        self._thread = threading.Thread(target=self._run, name=f"handler-{name}", daemon=True)

    def start(self) -> None:
        """Start the delivery thread (the informer does this; call at most once)."""
        self._thread.start()

    def push(self, n: Notification) -> None:
        """Append a notification for delivery; never blocks. Called by the informer under its
        lock."""
        with self._cond:
            self._buf.append(n)
            self._pushed += 1
            self._cond.notify()

    def mark_sync_point(self) -> None:
        """Everything pushed so far belongs to the initial state."""
        with self._cond:
            self._sync_target = self._pushed
            self._cond.notify_all()

    def has_synced(self) -> bool:
        """True once every notification that made up the initial state has been handled (not just
        queued). Non-blocking; safe from any thread.
        """
        with self._cond:
            return self._sync_target is not None and self._handled >= self._sync_target

    def pending(self) -> int:
        """Notifications pushed but not handled yet (a snapshot; for metrics and tests)."""
        with self._cond:
            return self._pushed - self._handled

    def wait_idle(self, timeout: float) -> bool:
        """Real-time wait until every pushed notification was handled (for tests)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._handled >= self._pushed, timeout)

    def stop(self, *, join_timeout: float = 5.0) -> None:
        """Stop delivering (buffered notifications are dropped) and join the thread for at most
        ``join_timeout`` real seconds, unless called from that thread. Idempotent.
        """
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(join_timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._buf and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                n = self._buf.popleft()
            try:
                self._deliver(n)
            except Exception:
                log.exception("event handler failed kind=%s", n.kind)
            with self._cond:
                self._handled += 1
                self._cond.notify_all()

    def _deliver(self, n: Notification) -> None:
        if n.kind == "add":
            if self._on_add is not None:
                self._on_add(n.new)
        elif n.kind == "update":
            if self._on_update is not None:
                assert n.old is not None
                self._on_update(n.old, n.new)
        elif self._on_delete is not None:
            self._on_delete(n.new)
