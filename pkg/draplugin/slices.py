"""Publishes this node's ResourceSlice and puts it back when something deletes it.

Owns the single slice of pool ``<node name>``: devices ``channel-0`` and ``daemon-0`` with the
upstream attributes ``type`` (string) and ``id`` (int) plus ``cliqueID`` (string, ``""`` on
non-NVLink nodes) so placement can select on it; owner reference to the Node (so the slice dies
with it); ``spec.nodeName``; ``pool.generation`` and ``resourceSliceCount = 1``.

Invariants: the publisher watches the slices of its node through a `pkg.informers`
SharedInformer (``spec.nodeName`` field selector) whose event handler only marks it dirty, reads
them through the informer's `Lister`, and re-syncs on every event, so a slice wiped by the
kubelet (at its start and 30 s after we disconnect) is re-created within one watch round-trip;
slices of our driver on this node with another name are deleted; the pool generation only grows
(bumped whenever the content changes). The publisher never gives up: an API error, a dropped
connection or a timeout (the API server restarting) is retried with capped exponential backoff
(``retry_delay`` doubling up to ``max_retry_delay``, reset by a successful pass), and the Node
read that supplies the owner reference happens inside that retry loop, not at start-up.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Final

from pkg.api.constants import CHANNEL_DEVICE_NAME, DAEMON_DEVICE_NAME, DRIVER_NAME
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


def slice_name(node_name: str) -> str:
    """The name of the node's slice: ``<node>-<driver>``, cut to the 253-character limit."""
    suffix = f"-{DRIVER_NAME}"
    return node_name[: _MAX_NAME - len(suffix)] + suffix


def desired_devices(clique_id: str) -> list[JSON]:
    """``channel-0`` and ``daemon-0`` with upstream's attributes plus ``cliqueID``."""

    def device(name: str, kind: str) -> JSON:
        return {
            "name": name,
            "attributes": {
                "type": {"string": kind},
                "id": {"int": 0},
                "cliqueID": {"string": clique_id},
            },
        }

    return [device(CHANNEL_DEVICE_NAME, "channel"), device(DAEMON_DEVICE_NAME, "daemon")]


class SlicePublisher:
    """Keeps this node's one ResourceSlice in place from a thread of its own."""

    def __init__(
        self,
        *,
        client: KubeClient,
        informers: SharedInformerFactory,
        node_name: str,
        clique_id: str,
        retry_delay: float = 1.0,
        max_retry_delay: float = 30.0,
    ) -> None:
        self._client = client
        self._informers = informers
        self._node = node_name
        self._clique_id = clique_id
        self._retry_delay = retry_delay
        self._max_retry_delay = max_retry_delay
        self.failures = 0  # consecutive failed passes (observability for tests)
        self._name = slice_name(node_name)
        self._generation = 1
        self._node_uid = ""
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._informer = informers.informer_for(
            RESOURCE_SLICES, field_selector=f"spec.nodeName={node_name}"
        )
        self._lister = Lister(self._informer.indexer, RESOURCE_SLICES)
        self._registration: HandlerRegistration | None = None
        self._thread: threading.Thread | None = None
        self.syncs = 0

    @property
    def name(self) -> str:
        """The slice's name."""
        return self._name

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
                log.warning("publishing ResourceSlice %s failed: %s; retrying in %.1fs",
                            self._name, err, delay,
                            exc_info=not isinstance(err, _FAILURES))  # fmt: skip
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
                "driver": DRIVER_NAME,
                "nodeName": self._node,
                "pool": {
                    "name": self._node,
                    "generation": self._generation,
                    "resourceSliceCount": 1,
                },
                "devices": desired_devices(self._clique_id),
            },
        }

    def sync(self) -> None:
        """Make the API match the desired slice (one pass).

        Raises an API, connection or timeout error on failure; the loop retries.
        """
        self.syncs += 1
        if not self._node_uid:
            self._node_uid = str(self._client.get(NODES, self._node)["metadata"]["uid"])
        ours = self._lister.list(
            predicate=lambda s: (s.get("spec") or {}).get("driver") == DRIVER_NAME
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
            self._client.update(RESOURCE_SLICES, body)
        except (ConflictError, NotFoundError):
            self._dirty.set()  # raced with another writer or a wipe: next event re-syncs

    def _create(self) -> None:
        try:
            self._client.create(RESOURCE_SLICES, self._desired())
            log.info("created ResourceSlice %s (generation %d)", self._name, self._generation)
        except AlreadyExistsError:
            self._dirty.set()  # our cache lags behind our own write

    def _matches(self, current: JSON) -> bool:
        spec = current.get("spec") or {}
        desired = self._desired()
        owners = (current.get("metadata") or {}).get("ownerReferences") or []
        return (
            spec.get("devices") == desired["spec"]["devices"]
            and spec.get("nodeName") == self._node
            and (spec.get("pool") or {}).get("name") == self._node
            and (spec.get("pool") or {}).get("resourceSliceCount") == 1
            and any(o.get("uid") == self._node_uid for o in owners)
        )
