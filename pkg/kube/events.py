"""Best-effort core/v1 Event recording for reconcilers and plugins.

Owns the Event objects this process writes. Invariants: `event()` never raises (failures are
logged; an event is diagnostics, never control flow); an identical event (same involved object,
type, reason, message) repeated within the dedup cache bumps `count`/`lastTimestamp` on the
existing Event instead of creating a new one, as client-go's correlator does. A write that
fails because the API server is unreachable, too slow or overloaded
(:data:`pkg.kube.errors.TRANSIENT_ERRORS`) is retried after each of ``retry_delays`` (a short,
bounded backoff on the caller's thread, like client-go's event sink retries) before the event
is dropped with a warning.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final

from cachetools import LRUCache

from pkg.base.clock import Clock
from pkg.base.types import JSON, EventType
from pkg.kube.client import KubeClient
from pkg.kube.errors import TRANSIENT_ERRORS, NotFoundError
from pkg.kube.resources import EVENTS

__all__ = ["EventRecorder"]

log = logging.getLogger(__name__)

NORMAL: Final[EventType] = "Normal"
WARNING: Final[EventType] = "Warning"


def _timestamp(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


class EventRecorder:
    """Writes Events about objects on behalf of one component (thread-safe)."""

    def __init__(
        self,
        client: KubeClient,
        component: str,
        clock: Clock,
        *,
        cache_size: int = 4096,
        retry_delays: tuple[float, ...] = (0.1, 0.4),
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        """``retry_delays``: pauses before each retry of a transiently failed write;
        ``sleep``: how to pause (default: ``clock.sleep``)."""
        self._retry_delays = retry_delays
        self._sleep = sleep or clock.sleep
        self._client = client
        self._component = component
        self._clock = clock
        self._lock = threading.Lock()
        # dedup key -> (event namespace, event name, count)
        self._seen: LRUCache[tuple[str, ...], tuple[str, str, int]] = LRUCache(cache_size)

    def event(self, obj: JSON, type_: str, reason: str, message: str) -> None:
        """Record an event about `obj`; never raises."""
        try:
            for delay in (*self._retry_delays, None):
                try:
                    self._record(obj, type_, reason, message)
                    return
                except TRANSIENT_ERRORS as err:
                    if delay is None:
                        raise
                    log.info("event write failed (%s); retrying in %.1fs", err, delay)
                    self._sleep(delay)
        except Exception:
            log.warning(
                "event not recorded reason=%s object=%s",
                reason,
                obj.get("metadata", {}),
                exc_info=True,
            )

    def _record(self, obj: JSON, type_: str, reason: str, message: str) -> None:
        meta = obj.get("metadata", {})
        namespace = meta.get("namespace") or "default"
        key = (str(meta.get("uid", "")), namespace, str(meta.get("name")), type_, reason, message)
        now = _timestamp(self._clock.now())
        with self._lock:
            seen = self._seen.get(key)
        if seen is not None:
            ev_ns, ev_name, count = seen
            try:
                self._client.patch(
                    EVENTS, ev_name, {"count": count + 1, "lastTimestamp": now}, namespace=ev_ns
                )
            except NotFoundError:
                pass  # the Event expired (TTL); fall through and create a fresh one
            else:
                with self._lock:
                    self._seen[key] = (ev_ns, ev_name, count + 1)
                return
        name = f"{meta.get('name', 'unknown')}.{int(self._clock.now() * 1e9):x}"
        body: JSON = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {
                k: v
                for k, v in (
                    ("apiVersion", obj.get("apiVersion")),
                    ("kind", obj.get("kind")),
                    ("name", meta.get("name")),
                    ("namespace", meta.get("namespace")),
                    ("uid", meta.get("uid")),
                    ("resourceVersion", meta.get("resourceVersion")),
                )
                if v
            },
            "type": type_,
            "reason": reason,
            "message": message,
            "source": {"component": self._component},
            "reportingComponent": self._component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self._client.create(EVENTS, body, namespace=namespace)
        with self._lock:
            self._seen[key] = (namespace, name, 1)
