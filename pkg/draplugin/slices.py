"""Publishes a driver's ResourceSlice for one node and puts it back when something deletes it.

Owns the single slice of pool ``<node name>``: the devices the driver hands in (``spec.devices``
entries, published verbatim - which devices and attributes is the driver's business); owner
reference to the Node (so the slice dies with it); ``spec.driver``; ``spec.nodeName``;
``pool.generation`` and ``resourceSliceCount = 1``.

Invariants: the publisher watches the slices of its node through a `pkg.informers`
SharedInformer (``spec.nodeName`` field selector) whose event handler only marks it dirty, reads
them through the informer's `Lister`, and re-syncs on every event, so a slice wiped by the
kubelet (at its start and 30 s after we disconnect) is re-created within one watch round-trip;
slices of our driver on this node with another name are deleted; the pool generation only grows
(bumped whenever the content changes); the devices match when they equal the desired ones or
the API server's stored form of our last write of them (a field its feature gates drop, a
default it adds, never causes a rewrite loop). The publisher never gives up: an API error, a dropped
connection or a timeout (the API server restarting) is retried with capped exponential backoff
(``retry_delay`` doubling up to ``max_retry_delay``, reset by a successful pass), and the Node
read that supplies the owner reference happens inside that retry loop, not at start-up.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
from collections.abc import Sequence
from typing import Any, Final

from pkg.base.types import JSON
from pkg.informers import (
    DeletedFinalStateUnknown,
    HandlerRegistration,
    Lister,
    SharedInformerFactory,
)
from pkg.kube.client import KubeClient
from pkg.kube.errors import (
    TRANSIENT_ERRORS,
    AlreadyExistsError,
    ApiError,
    ConflictError,
    NotFoundError,
)
from pkg.kube.resources import NODES, RESOURCE_SLICES

log = logging.getLogger(__name__)

_MAX_NAME: Final = 253
_FAILURES: Final[tuple[type[Exception], ...]] = (ApiError, *TRANSIENT_ERRORS)


def slice_name(node_name: str, driver_name: str) -> str:
    """The name of the node's slice: ``<node>-<driver>``, cut to the 253-character limit."""
    suffix = f"-{driver_name}"
    return node_name[: _MAX_NAME - len(suffix)] + suffix


class SlicePublisher:
    """Keeps this node's one ResourceSlice of a driver in place from a thread of its own.

    `start` and `stop` are called once each from one thread; `sync` is meant for the publishing
    thread (and tests). ``failures`` is read without a lock (observability only).
    """

    def __init__(
        self,
        *,
        client: KubeClient,
        informers: SharedInformerFactory,
        driver_name: str,
        node_name: str,
        devices: Sequence[JSON],
        retry_delay: float = 1.0,
        max_retry_delay: float = 30.0,
    ) -> None:
        """``devices`` are the slice's ``spec.devices`` entries, published as given (copied);
        ``informers`` must be the process's factory (the slice informer is added to it and it
        is started by `start`). Nothing is read or written before `start`."""
        self._client = client
        self._informers = informers
        self._driver = driver_name
        self._node = node_name
        self._devices = copy.deepcopy(list(devices))
        self._retry_delay = retry_delay
        self._max_retry_delay = max_retry_delay
        self.failures = 0  # consecutive failed passes (observability for tests)
        self._name = slice_name(node_name, driver_name)
        self._generation = 1
        self._node_uid = ""
        # (devices we sent, devices the API server stored) of our last write: a server drops
        # fields its feature gates turn off (``allowMultipleAllocations`` before 1.36) and
        # defaults others (a taint's ``timeAdded``); its stored form of what we want matches.
        self._written: tuple[list[JSON], Any] | None = None
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._informer = informers.informer_for(
            RESOURCE_SLICES, field_selector=f"spec.nodeName={node_name}"
        )
        self._lister = Lister(self._informer.indexer, RESOURCE_SLICES)
        self._registration: HandlerRegistration | None = None
        self._thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        """The slice's name."""
        return self._name

    def set_devices(self, devices: Sequence[JSON]) -> None:
        """Publish ``devices`` (copied) from now on: the publishing thread updates the slice
        with the next pool generation. Safe to call from any thread, before or after `start`."""
        self._devices = copy.deepcopy(list(devices))  # one reference swap: readers see old or new
        self._dirty.set()

    def start(self) -> None:
        """Start the informer and the publishing thread; never blocks on the API server."""
        self._registration = self._informer.add_event_handler(
            on_add=self._on_add, on_update=self._on_update, on_delete=self._on_delete
        )
        self._informers.start()
        self._dirty.set()
        self._thread = threading.Thread(target=self._run, name="slice-publisher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the publishing thread (the slice stays; the kubelet removes it)."""
        self._stop.set()
        self._dirty.set()
        if self._registration is not None:
            self._informer.remove_event_handler(self._registration)
            self._registration = None
        if self._thread is not None:
            self._thread.join(5)

    # Event handlers only mark the publisher dirty; `sync` reads the lister.
    def _on_add(self, _obj: JSON) -> None:
        self._dirty.set()

    def _on_update(self, _old: JSON, _new: JSON) -> None:
        self._dirty.set()

    def _on_delete(self, _obj: JSON | DeletedFinalStateUnknown) -> None:
        self._dirty.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._dirty.wait()
            if self._stop.is_set():
                return
            self._dirty.clear()
            if not self._informer.wait_for_sync(self._retry_delay):
                self._dirty.set()
                continue
            try:
                self.sync()
            except Exception as err:
                delay = min(self._retry_delay * 2**self.failures, self._max_retry_delay)
                self.failures += 1
                log.warning(
                    "publishing ResourceSlice %s failed: %s; retrying in %.1fs",
                    self._name,
                    err,
                    delay,
                    exc_info=not isinstance(err, _FAILURES),
                )
                self._stop.wait(delay)
                self._dirty.set()
            else:
                self.failures = 0

    def _desired(self) -> JSON:
        return {
            "apiVersion": RESOURCE_SLICES.api_version,
            "kind": RESOURCE_SLICES.kind,
            "metadata": {
                "name": self._name,
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": self._node,
                        "uid": self._node_uid,
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "driver": self._driver,
                "nodeName": self._node,
                "pool": {
                    "name": self._node,
                    "generation": self._generation,
                    "resourceSliceCount": 1,
                },
                "devices": copy.deepcopy(self._devices),
            },
        }

    def sync(self) -> None:
        """Make the API match the desired slice (one pass).

        Raises an API, connection or timeout error on failure; the loop retries.
        """
        if not self._node_uid:
            self._node_uid = str(self._client.get(NODES, self._node)["metadata"]["uid"])
        ours = self._lister.list(
            predicate=lambda s: (s.get("spec") or {}).get("driver") == self._driver
        )
        for stale in ours:
            if stale["metadata"]["name"] != self._name:
                with contextlib.suppress(NotFoundError):
                    self._client.delete(RESOURCE_SLICES, stale["metadata"]["name"])
        current = next((s for s in ours if s["metadata"]["name"] == self._name), None)
        seen = max([int((s["spec"].get("pool") or {}).get("generation") or 0) for s in ours] or [0])
        self._generation = max(self._generation, seen)
        if current is None:
            self._create()
            return
        if self._matches(current):
            return
        self._generation += 1
        body = self._desired()
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        try:
            self._remember(body, self._client.update(RESOURCE_SLICES, body))
        except (ConflictError, NotFoundError):
            self._dirty.set()  # raced with another writer or a wipe: next event re-syncs

    def _create(self) -> None:
        body = self._desired()
        try:
            self._remember(body, self._client.create(RESOURCE_SLICES, body))
            log.info("created ResourceSlice %s (generation %d)", self._name, self._generation)
        except AlreadyExistsError:
            self._dirty.set()  # our cache lags behind our own write

    def _remember(self, sent: JSON, stored: JSON | None) -> None:
        if isinstance(stored, dict):
            self._written = (sent["spec"]["devices"], (stored.get("spec") or {}).get("devices"))

    def _matches(self, current: JSON) -> bool:
        spec = current.get("spec") or {}
        desired = self._desired()
        devices = desired["spec"]["devices"]
        owners = (current.get("metadata") or {}).get("ownerReferences") or []
        return (
            (spec.get("devices") == devices or self._written == (devices, spec.get("devices")))
            and spec.get("nodeName") == self._node
            and (spec.get("pool") or {}).get("name") == self._node
            and (spec.get("pool") or {}).get("resourceSliceCount") == 1
            and any(o.get("uid") == self._node_uid for o in owners)
        )
