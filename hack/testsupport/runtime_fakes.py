"""Fakes for pkg.runtime tests: an in-memory Lease store with resourceVersion conflicts."""

from __future__ import annotations

import copy

from pkg.base.types import JSON
from pkg.kube.errors import AlreadyExistsError, ConflictError, NotFoundError, ServerError
from pkg.kube.resources import Resource


class LeaseStore:
    """Just enough of an API server for Leases: get/create/update with resourceVersion checks."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], JSON] = {}
        self.rv = 0
        self.fail_next = 0
        self.writes: list[JSON] = []
        self.calls: list[str] = []  # "get" / "create" / "update", in order
        self.stale_get: JSON | None = None  # answer GETs with this (a reader that lags)

    def _check(self) -> None:
        if self.fail_next:
            self.fail_next -= 1
            raise ServerError(500, "InternalError", "injected")

    def get(
        self,
        resource: Resource,
        name: str,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> JSON:
        self.calls.append("get")
        self._check()
        if self.stale_get is not None:
            return copy.deepcopy(self.stale_get)
        obj = self.objects.get((namespace or "", name))
        if obj is None:
            raise NotFoundError(404, "NotFound", name)
        return copy.deepcopy(obj)

    def create(self, resource: Resource, obj: JSON, *, namespace: str | None = None) -> JSON:
        self.calls.append("create")
        self._check()
        key = (namespace or obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if key in self.objects:
            raise AlreadyExistsError(409, "AlreadyExists", key[1])
        return self._store(key, obj)

    def update(self, resource: Resource, obj: JSON, *, subresource: str | None = None) -> JSON:
        self.calls.append("update")
        self._check()
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        cur = self.objects.get(key)
        if cur is None:
            raise NotFoundError(404, "NotFound", key[1])
        if obj["metadata"].get("resourceVersion") != cur["metadata"]["resourceVersion"]:
            raise ConflictError(409, "Conflict", "the object has been modified")
        return self._store(key, obj)

    def write_spec(self, namespace: str, name: str, **fields: object) -> JSON:
        """Another writer changes the Lease's spec (a new resourceVersion, as on a real server)."""
        obj = copy.deepcopy(self.objects[(namespace, name)])
        obj["spec"].update(fields)
        return self._store((namespace, name), obj)

    def _store(self, key: tuple[str, str], obj: JSON) -> JSON:
        self.rv += 1
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(self.rv)
        stored["metadata"]["namespace"] = key[0]
        self.objects[key] = stored
        self.writes.append(copy.deepcopy(stored))
        return copy.deepcopy(stored)
