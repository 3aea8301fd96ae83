"""Follow one named object (our clique, or our ComputeDomain) through list + watch.

Owns the reconnect policy of the daemon's single watch. Every observed state is handed to
``on_change`` (``None`` when the object does not exist); the callback must be quick -- it only
records the object and wakes the daemon loop.

Invariants:
- the first callback happens after the initial list, so the loop always starts from a state the
  API server actually had;
- a 410 (expired resourceVersion) relists at once; other failures relist after a capped
  exponential backoff, and a server-closed watch (timeout) simply relists -- which doubles as
  the periodic resync (upstream resyncs the daemon informer every 4 min, issue #742);
- :meth:`stop` is prompt: it ends a blocked watch read from another thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from pkg.kube.client import JSON, KubeClient, WatchStream
from pkg.kube.errors import ApiError, ConnectionFailedError, GoneError
from pkg.kube.resources import Resource
from pkg.runtime.clock import Clock

log = logging.getLogger(__name__)


class ObjectWatcher:
    def __init__(
        self,
        client: KubeClient,
        resource: Resource,
        *,
        namespace: str,
        name: str,
        on_change: Callable[[JSON | None], None],
        clock: Clock,
        resync_seconds: int = 240,
        max_backoff: float = 10.0,
    ) -> None:
        self._client = client
        self._resource = resource
        self._namespace = namespace
        self._name = name
        self._on_change = on_change
        self._clock = clock
        self._resync = resync_seconds
        self._max_backoff = max_backoff
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._stream: WatchStream | None = None

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.stop()

    def run(self) -> None:
        failures = 0
        selector = f"metadata.name={self._name}"
        while not self._stop.is_set():
            try:
                listed = self._client.list(
                    self._resource, namespace=self._namespace, field_selector=selector
                )
                items = listed.get("items") or []
                self._on_change(items[0] if items else None)
                rv = str(listed.get("metadata", {}).get("resourceVersion", ""))
                stream = self._client.watch(
                    self._resource,
                    namespace=self._namespace,
                    field_selector=selector,
                    resource_version=rv,
                    timeout_seconds=self._resync,
                )
                with self._lock:
                    self._stream = stream
                if self._stop.is_set():
                    stream.stop()
                failures = 0
                for event in stream:
                    if event.type in ("ADDED", "MODIFIED"):
                        self._on_change(event.object)
                    elif event.type == "DELETED":
                        self._on_change(None)
            except GoneError:
                continue
            except (ApiError, ConnectionFailedError) as err:
                failures += 1
                delay = min(self._max_backoff, 0.2 * 2 ** min(failures, 10))
                log.warning(
                    "watch %s %s/%s failed: %s; retrying in %.1fs",
                    self._resource.plural,
                    self._namespace,
                    self._name,
                    err,
                    delay,
                )
                self._clock.wait(self._stop, delay)
            finally:
                with self._lock:
                    self._stream = None
