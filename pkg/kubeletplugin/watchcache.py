"""A minimal list+watch cache of one resource, for event-driven waits inside the plugin.

Owns one background thread per cache that lists, then watches from the list's resourceVersion,
re-lists on 410 Gone and retries other failures after a delay. Invariants: the store only moves
forward (events are applied in order); every change notifies the shared `threading.Condition`
*after* the store is updated, so a waiter that re-checks its predicate under that condition never
misses an event; listeners run on the cache thread and must be quick.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from pkg.kube.client import JSON, KubeClient, WatchStream
from pkg.kube.errors import GoneError
from pkg.kube.resources import Resource

log = logging.getLogger(__name__)

Listener = Callable[[str, JSON], None]


def _key(obj: JSON) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


class WatchCache:
    def __init__(
        self,
        *,
        client: KubeClient,
        resource: Resource,
        cond: threading.Condition,
        namespace: str | None = None,
        field_selector: str | None = None,
        retry_delay: float = 1.0,
        watch_timeout: int = 300,
    ) -> None:
        self._client = client
        self._resource = resource
        self._namespace = namespace
        self._field_selector = field_selector
        self._retry_delay = retry_delay
        self._watch_timeout = watch_timeout
        self.cond = cond
        self._store: dict[tuple[str, str], JSON] = {}
        self._listeners: list[Listener] = []
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._stream: WatchStream | None = None
        self._thread: threading.Thread | None = None

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def start(self) -> None:
        name = f"watch-{self._resource.plural}"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.stop()
        if self._thread is not None:
            self._thread.join(5)

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(max(timeout, 0.0))

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def get(self, namespace: str, name: str) -> JSON | None:
        with self.cond:
            return self._store.get((namespace, name))

    def items(self) -> list[JSON]:
        with self.cond:
            return list(self._store.values())

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                rv = self._list()
                while not self._stop.is_set():
                    rv = self._watch(rv)
            except GoneError:
                continue  # our resourceVersion was compacted: re-list
            except Exception as err:
                if self._stop.is_set():
                    return
                log.warning("watch %s failed: %s; retrying", self._resource.plural, err)
                self._stop.wait(self._retry_delay)

    def _list(self) -> str:
        listed = self._client.list(
            self._resource, namespace=self._namespace, field_selector=self._field_selector
        )
        items = listed.get("items") or []
        with self.cond:
            old = self._store
            self._store = {_key(o): o for o in items}
            self._synced.set()
            self.cond.notify_all()
        for key, obj in old.items():
            if key not in self._store:
                self._notify("DELETED", obj)
        for obj in items:
            self._notify("ADDED", obj)
        return str((listed.get("metadata") or {}).get("resourceVersion") or "")

    def _watch(self, rv: str) -> str:
        stream = self._client.watch(
            self._resource, namespace=self._namespace, field_selector=self._field_selector,
            resource_version=rv, timeout_seconds=self._watch_timeout,
        )  # fmt: skip
        self._stream = stream
        if self._stop.is_set():
            stream.stop()  # stop() ran before the stream was published
        try:
            for event in stream:
                if self._stop.is_set():
                    break
                obj = event.object
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                if event.type == "BOOKMARK":
                    continue
                with self.cond:
                    if event.type == "DELETED":
                        self._store.pop(_key(obj), None)
                    else:
                        self._store[_key(obj)] = obj
                    self.cond.notify_all()
                self._notify(event.type, obj)
        finally:
            self._stream = None
        return rv

    def _notify(self, event_type: str, obj: JSON) -> None:
        for listener in self._listeners:
            try:
                listener(event_type, obj)
            except Exception:
                log.exception("watch listener failed for %s", self._resource.plural)
