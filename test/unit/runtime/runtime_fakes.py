"""Fakes for pkg.runtime tests: a manual clock and an in-memory Lease store with RV conflicts."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

from pkg.kube.errors import AlreadyExistsError, ConflictError, NotFoundError, ServerError
from pkg.kube.resources import Resource

JSON = dict[str, Any]


class ManualClock:
    """`pkg.runtime.clock.Clock` whose waits advance time instantly instead of sleeping."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.wall = start
        self.mono = 0.0
        self.waits: list[float] = []
        self.on_wait: Callable[[threading.Event], None] = lambda _stop: None

    def now(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds

    def wait(self, event: threading.Event, timeout: float) -> bool:
        self.on_wait(event)
        if event.is_set():
            return True
        self.waits.append(timeout)
        self.advance(timeout)
        return event.is_set()


class LeaseStore:
    """Just enough of an API server for Leases: get/create/update with resourceVersion checks."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], JSON] = {}
        self.rv = 0
        self.fail_next = 0
        self.writes: list[JSON] = []
        self.stale_get: JSON | None = None  # answer GETs with this (a reader that lags)

    def _check(self) -> None:
        if self.fail_next:
            self.fail_next -= 1
            raise ServerError(500, "InternalError", "injected")

    def get(
        self, resource: Resource, name: str, *, namespace: str | None = None,
        subresource: str | None = None,
    ) -> JSON:  # fmt: skip
        self._check()
        if self.stale_get is not None:
            return copy.deepcopy(self.stale_get)
        obj = self.objects.get((namespace or "", name))
        if obj is None:
            raise NotFoundError(404, "NotFound", name)
        return copy.deepcopy(obj)

    def create(self, resource: Resource, obj: JSON, *, namespace: str | None = None) -> JSON:
        self._check()
        key = (namespace or obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if key in self.objects:
            raise AlreadyExistsError(409, "AlreadyExists", key[1])
        return self._store(key, obj)

    def update(self, resource: Resource, obj: JSON, *, subresource: str | None = None) -> JSON:
        self._check()
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        cur = self.objects.get(key)
        if cur is None:
            raise NotFoundError(404, "NotFound", key[1])
        if obj["metadata"].get("resourceVersion") != cur["metadata"]["resourceVersion"]:
            raise ConflictError(409, "Conflict", "the object has been modified")
        return self._store(key, obj)

    def _store(self, key: tuple[str, str], obj: JSON) -> JSON:
        self.rv += 1
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(self.rv)
        stored["metadata"]["namespace"] = key[0]
        self.objects[key] = stored
        self.writes.append(copy.deepcopy(stored))
        return copy.deepcopy(stored)
