"""The fake API server's object store: versioned objects, write semantics and the event log.

Owns every stored object and the global resourceVersion counter. Invariants:
* One lock (`cond`) guards everything; every successful write bumps the global RV by exactly
  one, appends exactly one event to the log, and notifies `cond` (watchers wait on it).
* Stored dicts are never mutated after being stored (writes store fresh copies), so list
  snapshots and the event log can share them safely.
* The log is ordered by RV; `compact()` drops it and makes older RVs answer 410 Gone.
"""

from __future__ import annotations

import bisect
import copy
import random
import string
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from pkg.base.types import JSON
from pkg.kube.errors import (
    AlreadyExistsError,
    ConflictError,
    GoneError,
    InvalidError,
    NotFoundError,
)
from pkg.kube.resources import Resource

__all__ = ["Event", "ObjectStore"]

Key = tuple[str, str]  # (namespace or "", name)


@dataclass(frozen=True, slots=True)
class Event:
    rv: int
    resource: Resource
    type: str
    obj: JSON
    old: JSON | None  # the previous state, for selector transitions on MODIFIED


def _rfc3339(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


# Lists declared ``x-kubernetes-list-type: map`` in the CRDs under config/crd, by resource
# plural: (path to the list, its list-map keys). The real API server refuses a second item
# with the same keys (422 Duplicate value); the daemons' clique joins rely on it.
LIST_MAPS: dict[str, tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]] = {
    "computedomaincliques": ((("daemons",), ("nodeName",)),),
}


def _check_list_maps(resource: Resource, obj: JSON) -> None:
    for path, keys in LIST_MAPS.get(resource.plural, ()):
        items: object = obj
        for part in path:
            items = items.get(part) if isinstance(items, dict) else None
        if not isinstance(items, list):
            continue
        seen: set[tuple[object, ...]] = set()
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                continue
            key = tuple(repr(item.get(k)) for k in keys)
            if key in seen:
                dup = ", ".join(f"{k}={item.get(k)!r}" for k in keys)
                raise InvalidError(
                    422, "Invalid", f"{'.'.join(path)}[{i}]: Duplicate value: {{{dup}}}"
                )
            seen.add(key)


def _spec_part(obj: JSON) -> JSON:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "kind", "apiVersion")}


class ObjectStore:
    """All objects of all registered resources, plus the watch event log."""

    def __init__(self, *, now: Callable[[], float], gc: bool) -> None:
        self.cond = threading.Condition(threading.RLock())
        self._now = now
        self._gc = gc
        self._rv = 1000
        self._objects: dict[Resource, dict[Key, JSON]] = {}
        self._status: set[Resource] = set()
        self._log: list[Event] = []
        self._log_rvs: list[int] = []
        self._compacted_rv = 0
        self._rand = random.Random()

    # -- registry ----------------------------------------------------------------------------

    def register(self, resource: Resource, *, status_subresource: bool) -> None:
        with self.cond:
            self._objects.setdefault(resource, {})
            if status_subresource:
                self._status.add(resource)

    def resources(self) -> list[Resource]:
        with self.cond:
            return list(self._objects)

    # -- reads -------------------------------------------------------------------------------

    @property
    def rv(self) -> int:
        return self._rv

    def get(self, resource: Resource, namespace: str | None, name: str) -> JSON:
        with self.cond:
            obj = self._objects[resource].get((namespace or "", name))
            if obj is None:
                raise NotFoundError(
                    404,
                    "NotFound",
                    f'{resource.plural} "{name}" not found',
                    {"details": {"name": name, "kind": resource.plural}},
                )
            return obj

    def select(
        self, resource: Resource, namespace: str | None, match: Callable[[JSON], bool]
    ) -> tuple[int, list[JSON]]:
        """(current RV, matching objects sorted by key) — a consistent snapshot."""
        with self.cond:
            objs = self._objects[resource]
            items = [objs[k] for k in sorted(objs) if (not namespace or k[0] == namespace)]
            return self._rv, [o for o in items if match(o)]

    def all_objects(self, resource: Resource) -> list[JSON]:
        with self.cond:
            return [copy.deepcopy(o) for _, o in sorted(self._objects[resource].items())]

    # -- event log ---------------------------------------------------------------------------

    def check_rv(self, rv: int) -> None:
        if rv < self._compacted_rv:
            raise GoneError(
                410, "Expired", f"too old resource version: {rv} ({self._compacted_rv})"
            )

    def log_position(self, rv: int) -> int:
        """Absolute index of the first logged event newer than `rv` (caller holds `cond`)."""
        self.check_rv(rv)
        return self._log_base + bisect.bisect_right(self._log_rvs, rv)

    @property
    def log_end(self) -> int:
        return self._log_base + len(self._log)

    _log_base = 0

    def events_from(self, pos: int) -> list[Event]:
        """Events from absolute index `pos` on (caller holds `cond`); Gone if compacted away."""
        if pos < self._log_base:
            raise GoneError(410, "Expired", "too old resource version")
        return self._log[pos - self._log_base :]

    def compact(self) -> None:
        with self.cond:
            self._compacted_rv = self._rv
            self._log_base += len(self._log)
            self._log = []
            self._log_rvs = []
            self.cond.notify_all()

    @property
    def compacted_rv(self) -> int:
        return self._compacted_rv

    # -- writes ------------------------------------------------------------------------------

    def _emit(self, resource: Resource, type_: str, obj: JSON, old: JSON | None) -> None:
        self._log.append(Event(self._rv, resource, type_, obj, old))
        self._log_rvs.append(self._rv)
        self.cond.notify_all()

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _store(self, resource: Resource, obj: JSON, old: JSON | None) -> JSON:
        _check_list_maps(resource, obj)
        meta = obj["metadata"]
        meta["resourceVersion"] = self._next_rv()
        self._objects[resource][(meta.get("namespace", ""), meta["name"])] = obj
        self._emit(resource, "MODIFIED" if old is not None else "ADDED", obj, old)
        return obj

    def create(
        self, resource: Resource, namespace: str | None, obj: JSON, *, keep_status: bool = False
    ) -> JSON:
        with self.cond:
            new = copy.deepcopy(obj)
            meta = new.setdefault("metadata", {})
            if not meta.get("name"):
                prefix = meta.get("generateName")
                if not prefix:
                    raise InvalidError(422, "Invalid", "metadata.name or generateName required")
                alphabet = string.ascii_lowercase + string.digits
                meta["name"] = prefix + "".join(self._rand.choice(alphabet) for _ in range(5))
            if resource.namespaced:
                ns = namespace or meta.get("namespace") or "default"
                if meta.get("namespace") not in (None, "", ns):
                    raise InvalidError(422, "Invalid", "namespace does not match the request")
                meta["namespace"] = ns
            else:
                meta.pop("namespace", None)
            key = (meta.get("namespace", ""), meta["name"])
            if key in self._objects[resource]:
                raise AlreadyExistsError(
                    409, "AlreadyExists", f'{resource.plural} "{meta["name"]}" already exists'
                )
            new["apiVersion"], new["kind"] = resource.api_version, resource.kind
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _rfc3339(self._now())
            meta["generation"] = 1
            for drop in ("deletionTimestamp", "deletionGracePeriodSeconds"):
                meta.pop(drop, None)
            if resource in self._status and not keep_status:
                new.pop("status", None)
            return self._store(resource, new, None)

    def replace(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        obj: JSON,
        *,
        subresource: str | None = None,
        check_rv: bool = True,
    ) -> JSON:
        """PUT semantics (also the last step of every PATCH)."""
        with self.cond:
            old = self.get(resource, namespace, name)
            meta_in = obj.get("metadata") or {}
            want_rv = meta_in.get("resourceVersion")
            if check_rv and want_rv and want_rv != old["metadata"]["resourceVersion"]:
                raise ConflictError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {resource.plural} "{name}": the object '
                    "has been modified; please apply your changes to the latest version and "
                    "try again",
                )
            if subresource == "status":
                new = copy.deepcopy(old)
                if "status" in obj:
                    new["status"] = copy.deepcopy(obj["status"])
                else:
                    new.pop("status", None)
            elif subresource is not None:
                raise NotFoundError(404, "NotFound", f"no subresource {subresource!r}")
            else:
                new = copy.deepcopy(obj)
                new["apiVersion"], new["kind"] = resource.api_version, resource.kind
                if resource in self._status:
                    # The main resource ignores status when a status subresource exists.
                    if "status" in old:
                        new["status"] = copy.deepcopy(old["status"])
                    else:
                        new.pop("status", None)
                meta = new.setdefault("metadata", {})
                for immutable in ("uid", "creationTimestamp", "namespace", "name", "generation"):
                    if immutable in old["metadata"]:
                        meta[immutable] = old["metadata"][immutable]
                if "deletionTimestamp" in old["metadata"]:
                    meta["deletionTimestamp"] = old["metadata"]["deletionTimestamp"]
                else:
                    meta.pop("deletionTimestamp", None)
                if _spec_part(new) != _spec_part(old):
                    meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
            meta = new["metadata"]
            meta["resourceVersion"] = old["metadata"]["resourceVersion"]
            if new == old:
                return old  # a no-op write does not bump the RV, as on a real server
            if meta.get("deletionTimestamp") and not meta.get("finalizers"):
                return self._remove(resource, new)
            return self._store(resource, new, old)

    def seed(self, resource: Resource, obj: JSON) -> JSON:
        """Create or overwrite regardless of resourceVersion, keeping status (a test hook)."""
        with self.cond:
            meta = obj.get("metadata") or {}
            key = (
                (meta.get("namespace") or "default") if resource.namespaced else "",
                meta["name"],
            )
            if key in self._objects[resource]:
                return copy.deepcopy(
                    self.replace(resource, key[0] or None, key[1], obj, check_rv=False)
                )
            return copy.deepcopy(self.create(resource, key[0] or None, obj, keep_status=True))

    def delete(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> JSON:
        """DELETE: a failed uid/resourceVersion precondition is a 409; an object with
        finalizers is marked (deletionTimestamp) and stays until its last finalizer goes;
        anything else is removed in one write (pods too: no graceful deletion, see
        docs/contracts.md). Returns the last state of the object."""
        with self.cond:
            old = self.get(resource, namespace, name)
            meta = old["metadata"]
            if (uid and uid != meta["uid"]) or (
                resource_version and resource_version != meta["resourceVersion"]
            ):
                raise ConflictError(
                    409, "Conflict", f"Precondition failed: UID or resourceVersion for {name}"
                )
            if meta.get("finalizers"):
                if meta.get("deletionTimestamp"):
                    return old
                new = copy.deepcopy(old)
                new["metadata"]["deletionTimestamp"] = _rfc3339(self._now())
                new["metadata"]["deletionGracePeriodSeconds"] = 0
                return self._store(resource, new, old)
            return self._remove(resource, copy.deepcopy(old))

    def _remove(self, resource: Resource, obj: JSON) -> JSON:
        meta = obj["metadata"]
        old = self._objects[resource].pop((meta.get("namespace", ""), meta["name"]))
        meta["resourceVersion"] = self._next_rv()
        self._emit(resource, "DELETED", obj, old)
        if self._gc:
            self._collect_garbage()
        return obj

    def _collect_garbage(self) -> None:
        """Background propagation: delete dependents whose owners are all gone."""
        live = {o["metadata"]["uid"] for objs in self._objects.values() for o in objs.values()}
        for resource, objs in self._objects.items():
            for obj in list(objs.values()):
                owners = obj["metadata"].get("ownerReferences") or []
                if owners and not any(ref.get("uid") in live for ref in owners):
                    meta = obj["metadata"]
                    key = (meta.get("namespace", ""), meta["name"])
                    if key in objs and not meta.get("deletionTimestamp"):
                        self.delete(resource, meta.get("namespace"), meta["name"])
