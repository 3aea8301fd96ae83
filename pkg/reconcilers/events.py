"""The Event-recording interface the reconcilers depend on, plus a once-per-cause filter.

Owns nothing on the API server itself: :class:`pkg.kube.events.EventRecorder` writes the
Events and satisfies :class:`EventSink`. :class:`OnceEvents` guards warnings that a level-
triggered reconciler would otherwise re-emit on every pass (for example "claim references a
ComputeDomain in another namespace"): each (object UID, reason, message) is recorded once per
process, within a bounded memory. :class:`RateLimitedEvents` guards warnings whose cause another
tenant controls (a claim in another namespace naming a ComputeDomain it does not own): at most
one per (object UID, reason) per interval on the injected clock, however many causes there are.
"""

from __future__ import annotations

import threading
from typing import Protocol

from cachetools import LRUCache

from pkg.base.clock import Clock
from pkg.base.types import JSON

__all__ = ["NORMAL", "WARNING", "EventSink", "OnceEvents", "RateLimitedEvents"]


NORMAL = "Normal"
WARNING = "Warning"


class EventSink(Protocol):
    """Records a core/v1 Event about ``obj``; must never raise."""

    def event(self, obj: JSON, type_: str, reason: str, message: str) -> None: ...


class OnceEvents:
    """Forwards each distinct (uid, reason, message) to ``sink`` only the first time."""

    def __init__(self, sink: EventSink, *, size: int = 8192) -> None:
        self._sink = sink
        self._seen: LRUCache[tuple[str, str, str], bool] = LRUCache(size)
        self._lock = threading.Lock()

    @property
    def sink(self) -> EventSink:
        """Where events go (unfiltered)."""
        return self._sink

    def event(self, obj: JSON, type_: str, reason: str, message: str) -> None:
        key = (str(obj.get("metadata", {}).get("uid", "")), reason, message)
        with self._lock:
            if key in self._seen:
                return
            self._seen[key] = True
        self._sink.event(obj, type_, reason, message)


class RateLimitedEvents:
    """Forwards at most one event per (object UID, reason) per ``interval`` seconds to ``sink``.

    Time is ``clock.monotonic()``; the memory of recent events is an LRU of ``size`` keys, so an
    evicted key (``size`` other objects warned about since) may be warned about again early.
    """

    def __init__(self, sink: EventSink, clock: Clock, *, interval: float, size: int = 8192) -> None:
        self._sink = sink
        self._clock = clock
        self._interval = interval
        self._last: LRUCache[tuple[str, str], float] = LRUCache(size)
        self._lock = threading.Lock()

    def event(self, obj: JSON, type_: str, reason: str, message: str) -> None:
        key = (str(obj.get("metadata", {}).get("uid", "")), reason)
        now = self._clock.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._interval:
                return
            self._last[key] = now
        self._sink.event(obj, type_, reason, message)
