"""The start and stop sequence every controller manager shares.

Owns the order: start the informers, wait for their caches (giving up on a timeout or a stop),
then, under the lifecycle lock, the caller's on-synced step, the controllers' workers and the
orphan sweep's thread; stop sets the stop event first, so a start racing a stop never starts
workers after it. Used by `pkg.reconcilers.manager.ControllerManager` (driver-managed IMEX) and
`pkg.reconcilers.hostmanaged.HostManagedManager`, which differ only in what they build.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from pkg.informers.factory import SharedInformerFactory
from pkg.reconcilers.cleanup import OrphanCleaner
from pkg.reconcilers.controller import Controller

__all__ = ["ManagerLifecycle"]

log = logging.getLogger(__name__)


class ManagerLifecycle:
    """Start/stop of one manager's informers, controllers and orphan sweep (idempotent stop)."""

    def __init__(self, factory: SharedInformerFactory, cleaner: OrphanCleaner) -> None:
        self._factory = factory
        self._cleaner = cleaner
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._cleanup_thread: threading.Thread | None = None

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stop.is_set()

    def start(
        self,
        controllers: Sequence[Controller],
        *,
        sync_timeout: float,
        on_synced: Callable[[], None],
    ) -> bool:
        """Start the informers, wait for their caches, then run ``on_synced`` and start
        ``controllers`` and the sweep. False if the caches did not sync within
        ``sync_timeout`` seconds or :meth:`stop` was called meanwhile."""
        with self._lock:
            if self._stop.is_set():
                return False
            self._factory.start()
        deadline = time.monotonic() + sync_timeout
        while not self._factory.wait_for_cache_sync(0.2):
            if self._stop.is_set():
                return False
            if time.monotonic() > deadline:
                log.error("caches did not sync within %.0f s", sync_timeout)
                return False
        with self._lock:
            if self._stop.is_set():
                return False
            on_synced()
            for ctl in controllers:
                ctl.start()
            self._cleanup_thread = threading.Thread(
                target=self._cleaner.run, args=(self._stop,), name="orphan-cleanup", daemon=True
            )
            self._cleanup_thread.start()
        return True

    def stop(self, controllers: Sequence[Controller]) -> None:
        """Stop ``controllers``, the sweep and the informers (idempotent)."""
        with self._lock:
            self._stop.set()
        for ctl in controllers:
            ctl.stop()
        self._cleaner.poke()
        if self._cleanup_thread is not None:
            self._cleanup_thread.join(timeout=10)
        self._factory.shutdown()
