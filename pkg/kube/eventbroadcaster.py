"""Asynchronous core/v1 Event recording with client-go's correlation semantics.

Owns the Events a long-running controller writes, off its critical path. Modelled on client-go's
``tools/record`` (``EventBroadcaster`` + ``EventCorrelator``), written from its documented
behaviour:

* :meth:`AsyncEventRecorder.event` never blocks and never raises: it stamps the event and puts
  it on a bounded in-memory queue (``queue_size``, client-go's 1000); when the queue is full the
  event is dropped and counted (``dropped``), as client-go's broadcaster does
  (``DropIfChannelFull``). A reconcile therefore never waits for the API server on an Event.
* One background sender drains the queue through its *own* client (give it its own rate
  limiter, so Events never spend the reconcile client's QPS) and, for each event, asks the
  :class:`EventCorrelator`:

  - aggregation (``EventAggregator``): events with the same source, involved object, type and
    reason but different messages, more than ``max_events`` (10) of them within
    ``max_interval`` (10 min), are folded into one Event whose message is prefixed
    ``(combined from similar events): ``;
  - dedup (``eventLogger``): an event identical to one already written bumps that Event's
    ``count``/``lastTimestamp`` with a PATCH instead of creating a new object;
  - spam filter (``EventSourceObjectSpamFilter``): a token bucket per source + involved object
    (burst ``spam_burst`` 25, refill ``spam_qps`` one per 5 minutes); an event finding it empty
    is skipped (counted in ``filtered``).

* A write failing with a transient error (:data:`pkg.kube.errors.TRANSIENT_ERRORS`) is retried
  after each of ``retry_delays`` (the sender's thread sleeps, nobody else waits), then dropped;
  other errors drop the event at once. A PATCH of an Event that expired (404) creates it anew.

The correlator is pure (state + injected clock), so its rules are tested without threads or
real time.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cachetools import LRUCache

from pkg.base.clock import Clock
from pkg.base.types import JSON
from pkg.kube.client import KubeClient
from pkg.kube.errors import TRANSIENT_ERRORS, NotFoundError
from pkg.kube.resources import EVENTS

__all__ = [
    "AGGREGATED_PREFIX",
    "AsyncEventRecorder",
    "Correlation",
    "EventCorrelator",
]

log = logging.getLogger(__name__)

AGGREGATED_PREFIX = "(combined from similar events): "
_MAX_TRIES_DEFAULT = (1.0, 2.0, 4.0, 8.0)


def _timestamp(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _object_key(event: JSON) -> tuple[str, ...]:
    ref = event.get("involvedObject") or {}
    src = event.get("source") or {}
    return (
        str(src.get("component", "")),
        str(src.get("host", "")),
        str(ref.get("kind", "")),
        str(ref.get("namespace", "")),
        str(ref.get("name", "")),
        str(ref.get("uid", "")),
        str(ref.get("apiVersion", "")),
    )


@dataclass
class _Aggregate:
    messages: set[str] = field(default_factory=set)
    last: float = 0.0


@dataclass
class _Bucket:
    tokens: float
    last: float


@dataclass(frozen=True)
class Correlation:
    """What to write for one event: ``body`` is created, or, when ``existing`` names an Event
    (namespace, name), that Event is patched with ``body``'s count/lastTimestamp/message."""

    body: JSON
    key: tuple[str, ...]
    existing: tuple[str, str] | None


class EventCorrelator:
    """client-go's EventCorrelator: aggregation, dedup and a per-object spam filter."""

    def __init__(
        self,
        clock: Clock,
        *,
        max_events: int = 10,
        max_interval: float = 600.0,
        spam_burst: int = 25,
        spam_qps: float = 1.0 / 300.0,
        cache_size: int = 4096,
    ) -> None:
        """Defaults are client-go's (``maxLruCacheEntries`` aside, which is smaller here)."""
        self._clock = clock
        self._max_events = max_events
        self._max_interval = max_interval
        self._spam_burst = float(spam_burst)
        self._spam_qps = spam_qps
        self._aggregates: LRUCache[tuple[str, ...], _Aggregate] = LRUCache(cache_size)
        # correlation key -> (namespace, name, count, firstTimestamp) of the written Event
        self._written: LRUCache[tuple[str, ...], tuple[str, str, int, str]] = LRUCache(cache_size)
        self._buckets: LRUCache[tuple[str, ...], _Bucket] = LRUCache(cache_size)

    def _aggregate(self, event: JSON) -> tuple[JSON, tuple[str, ...]]:
        now = self._clock.now()
        base = (*_object_key(event), str(event.get("type", "")), str(event.get("reason", "")))
        message = str(event.get("message", ""))
        record = self._aggregates.get(base)
        if record is None or now - record.last > self._max_interval:
            record = _Aggregate()
        record.messages.add(message)
        record.last = now
        self._aggregates[base] = record
        if len(record.messages) < self._max_events:
            return event, (*base, message)
        folded = dict(event)
        folded["message"] = AGGREGATED_PREFIX + message
        return folded, base

    def _allow(self, event: JSON) -> bool:
        now = self._clock.now()
        key = _object_key(event)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = _Bucket(tokens=self._spam_burst, last=now)
        bucket.tokens = min(self._spam_burst, bucket.tokens + (now - bucket.last) * self._spam_qps)
        bucket.last = now
        self._buckets[key] = bucket
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True

    def correlate(self, event: JSON) -> Correlation | None:
        """Aggregate, dedup and filter ``event``; None means "skip it" (spam)."""
        body, key = self._aggregate(event)
        seen = self._written.get(key)
        if seen is not None:
            ns, name, count, first = seen
            body = dict(body)
            body["count"] = count + 1
            body["firstTimestamp"] = first
            body["metadata"] = {"name": name, "namespace": ns}
            # Remember the new count now, as client-go does, so occurrences the spam filter
            # drops still show in the next written count.
            self._written[key] = (ns, name, count + 1, first)
            existing: tuple[str, str] | None = (ns, name)
        else:
            existing = None
        if not self._allow(body):
            return None
        return Correlation(body=body, key=key, existing=existing)

    def written(self, correlation: Correlation, namespace: str, name: str) -> None:
        """Record that ``correlation`` now lives in Event ``namespace/name``."""
        body = correlation.body
        self._written[correlation.key] = (
            namespace,
            name,
            int(body.get("count", 1)),
            str(body.get("firstTimestamp", "")),
        )

    def forget(self, correlation: Correlation) -> None:
        """The Event behind ``correlation`` is gone (expired); the next one is created."""
        self._written.pop(correlation.key, None)


class AsyncEventRecorder:
    """Non-blocking Event recorder for one component; satisfies the reconcilers' EventSink."""

    def __init__(
        self,
        client: KubeClient,
        component: str,
        clock: Clock,
        *,
        queue_size: int = 1000,
        correlator: EventCorrelator | None = None,
        retry_delays: tuple[float, ...] = _MAX_TRIES_DEFAULT,
        sleep: Callable[[float], None] | None = None,
        host: str = "",
    ) -> None:
        """``client`` should be used for Events only (its own rate limit); ``sleep`` pauses
        the sender between retries (default: an interruptible wait on :meth:`stop`)."""
        self._client = client
        self._component = component
        self._host = host
        self._clock = clock
        self._queue: collections.deque[JSON] = collections.deque()
        self._queue_size = queue_size
        self._cond = threading.Condition()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._correlator = correlator or EventCorrelator(clock)
        self._retry_delays = retry_delays
        self._sleep = sleep or self._interruptible_sleep
        self._seq = 0
        self.dropped = 0  # queue full
        self.filtered = 0  # spam filter
        self.failed = 0  # write failed for good
        self.written = 0  # creates + patches that succeeded

    def _interruptible_sleep(self, seconds: float) -> None:
        self._clock.wait(self._stopped, seconds)

    # -- producer side (any thread, never blocks) -----------------------------------------------

    def event(self, obj: JSON, type_: str, reason: str, message: str) -> None:
        """Queue an event about ``obj``; returns at once, never raises."""
        try:
            meta = obj.get("metadata") or {}
            now = _timestamp(self._clock.now())
            ref = {
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
            }
            source = {"component": self._component}
            if self._host:
                source["host"] = self._host
            body: JSON = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"namespace": meta.get("namespace") or "default"},
                "involvedObject": ref,
                "type": type_,
                "reason": reason,
                "message": message,
                "source": source,
                "reportingComponent": self._component,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            }
            with self._cond:
                if len(self._queue) >= self._queue_size:
                    self.dropped += 1
                    return
                self._queue.append(body)
                self._cond.notify()
        except Exception:  # pragma: no cover - defensive: an Event is never control flow
            log.warning("event not queued reason=%s", reason, exc_info=True)

    def pending(self) -> int:
        """Events queued and not yet taken by the sender."""
        with self._cond:
            return len(self._queue)

    # -- sender side ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the background sender (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="event-sender", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the sender; queued events not yet sent within ``timeout`` are dropped."""
        self._stopped.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def process_pending(self) -> int:
        """Send every queued event on the caller's thread; returns how many were taken."""
        n = 0
        while True:
            with self._cond:
                if not self._queue:
                    return n
                body = self._queue.popleft()
            self._send(body)
            n += 1

    def _run(self) -> None:
        while not self._stopped.is_set():
            with self._cond:
                while not self._queue and not self._stopped.is_set():
                    self._cond.wait()
                if self._stopped.is_set():
                    return
                body = self._queue.popleft()
            self._send(body)

    def _send(self, body: JSON) -> None:
        correlation = self._correlator.correlate(body)
        if correlation is None:
            self.filtered += 1
            return
        for delay in (*self._retry_delays, None):
            try:
                self._write(correlation)
                self.written += 1
                return
            except TRANSIENT_ERRORS as err:
                if delay is None or self._stopped.is_set():
                    break
                log.info("event write failed (%s); retrying in %.1fs", err, delay)
                self._sleep(delay)
            except Exception as err:
                log.warning("event not recorded reason=%s error=%s", body.get("reason"), err)
                break
        self.failed += 1

    def _write(self, correlation: Correlation) -> None:
        body = correlation.body
        if correlation.existing is not None:
            ns, name = correlation.existing
            patch = {
                "count": body["count"],
                "lastTimestamp": body["lastTimestamp"],
                "message": body["message"],
            }
            try:
                self._client.patch(EVENTS, name, patch, namespace=ns)
                return
            except NotFoundError:
                self._correlator.forget(correlation)
                body = dict(body, count=1, firstTimestamp=body["lastTimestamp"])
                correlation = Correlation(body=body, key=correlation.key, existing=None)
        ns = str(body["metadata"]["namespace"])
        with self._cond:
            self._seq += 1
            seq = self._seq
        ref_name = str(body["involvedObject"].get("name", "unknown"))
        name = f"{ref_name}.{int(self._clock.now() * 1e9):x}{seq:x}"
        created = dict(body, metadata={"name": name, "namespace": ns})
        self._client.create(EVENTS, created, namespace=ns)
        self._correlator.written(correlation, ns, name)
