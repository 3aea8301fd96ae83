"""`Reflector`: keeps a sink in sync with the API server by LIST then WATCH, forever.

Owns the list/watch loop and its failure policy (client-go `tools/cache/reflector.go`):
* paginated LIST (first with RV "0", later relists with "" = a consistent read), then
  `sink.replace(items, rv)`; or, when the lister-watcher offers `watch_list`, a streaming
  watch-list instead (one WATCH with `sendInitialEvents=true`: the initial ADDED events up to
  the `k8s.io/initial-events-end` bookmark replace the sink, the same stream goes on as the
  watch), falling back to LIST + WATCH for good when the server refuses it (4xx);
* WATCH from the last RV with bookmarks and a randomized server timeout in
  [min_watch_timeout, 2 * min_watch_timeout); a clean end re-watches from the last RV;
* 410 Gone (HTTP or in-stream) -> relist; the sink turns vanished keys into tombstones;
* any other failure -> jittered, capped exponential backoff, then resume from the last RV
  (a failed LIST is retried as a LIST); the backoff resets after `backoff_reset` healthy seconds;
  while the server is unreachable (no answer at all) no wait exceeds `unreachable_cap` (2 s), so
  a restarted API server is seen again within seconds of its return, and such failures do not
  count toward the answered exponential: the first answered failure after an outage (a
  restarting server answers 403 until its authorizer has synced) waits `initial` again.
Invariants: events reach the sink in stream order on the reflector's own thread (never
dropped); the RV only advances to values the sink has already absorbed; `stop()` returns
promptly, interrupting a blocked watch read and any backoff wait.
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass
from typing import Protocol

from pkg.base.clock import Clock
from pkg.base.types import JSON
from pkg.base.verbosity import V
from pkg.informers.listwatch import ListerWatcher
from pkg.kube.client import INITIAL_EVENTS_END, WatchStream
from pkg.kube.errors import ApiError, ConnectionFailedError, GoneError

__all__ = ["DEFAULT_BACKOFF", "BackoffPolicy", "Reflector", "ReflectorSink"]

log = logging.getLogger(__name__)


class ReflectorSink(Protocol):
    """Where a reflector delivers what it sees (the informer). Called only from the
    reflector's thread, in stream order.
    """

    def replace(self, items: list[JSON], resource_version: str) -> None:
        """A complete LIST (or watch-list) at ``resource_version``: the new full content."""
        ...

    def add(self, obj: JSON) -> None:
        """An ADDED object."""
        ...

    def update(self, obj: JSON) -> None:
        """A MODIFIED object."""
        ...

    def delete(self, obj: JSON) -> None:
        """A DELETED object (its last state)."""
        ...


@dataclass(frozen=True)
class BackoffPolicy:
    """Waits between failed LIST/WATCH attempts (seconds; see the module docstring). Immutable."""

    initial: float = 0.8
    cap: float = 30.0
    factor: float = 2.0
    jitter: float = 1.0
    reset_after: float = 120.0
    # While nobody answers (connection refused/reset: the API server is down or restarting),
    # retries are cheap for the server and the client should be back within a few seconds of
    # its return, so the wait never exceeds this (answered failures grow to ``cap``, starting
    # over from ``initial`` after an outage).
    unreachable_cap: float = 2.0


DEFAULT_BACKOFF = BackoffPolicy()


class Reflector:
    """Keeps one sink in line with one `ListerWatcher`: LIST, then WATCH from the listed
    resourceVersion, relisting when the watch cannot resume.

    Run `run` on a dedicated thread; `stop` from any thread. Waits use the injected clock.
    """

    def __init__(
        self,
        lw: ListerWatcher,
        sink: ReflectorSink,
        *,
        clock: Clock,
        page_size: int = 500,
        min_watch_timeout: float = 300.0,
        backoff: BackoffPolicy = DEFAULT_BACKOFF,
        rng: random.Random | None = None,
    ) -> None:
        self._lw = lw
        self._sink = sink
        self._clock = clock
        self._page_size = page_size
        self._min_watch_timeout = min_watch_timeout
        self._policy = backoff
        self._rng = rng or random.Random()
        self._cond = threading.Condition()
        self._stopped = False
        self._stream: WatchStream | None = None
        self._last_rv = ""
        self._delay = 0.0
        self._outage_delay = 0.0  # the exponential of failures nobody answered
        self._last_failure = float("-inf")
        self.lists = 0  # LIST rounds completed (observability for tests and metrics)
        self.watch_lists = 0  # of which streaming watch-lists
        self._watch_list_refused = False
        self._initial_done = False

    @property
    def last_sync_resource_version(self) -> str:
        """The resourceVersion of the last event (or LIST) the sink has absorbed."""
        with self._cond:
            return self._last_rv

    def stop(self) -> None:
        """Make `run` return promptly: interrupts a blocked watch read and any backoff wait.
        Idempotent; safe from any thread.
        """
        with self._cond:
            self._stopped = True
            stream = self._stream
            self._cond.notify_all()
        if stream is not None:
            stream.stop()

    def _is_stopped(self) -> bool:
        with self._cond:
            return self._stopped

    def run(self) -> None:
        """Blocks until `stop()`; call on a dedicated thread."""
        need_list = True
        consistent = False  # after the first list, relists must not be served stale
        kind = {"type": self._lw.resource.kind}
        while not self._is_stopped():
            try:
                if need_list:
                    log.log(V(3), "Listing and watching", extra=kind)
                if need_list and self._use_watch_list():
                    self._initial_done = False
                    try:
                        self._watch_list()  # refused (4xx): LIST + WATCH from now on
                    finally:
                        # Only a completed initial state counts as listed; a stream that
                        # broke before its end bookmark is started over.
                        need_list = not self._initial_done
                    if not need_list:
                        log.log(V(2), "Caches populated", extra=kind)
                        continue  # the stream ended after the initial state: watch on
                if need_list:
                    self._list(consistent=consistent)
                    need_list, consistent = False, True
                    log.log(V(2), "Caches populated", extra=kind)
                self._watch()
            except GoneError as exc:
                log.info("relisting resource=%s reason=%s", self._lw.resource.plural, exc)
                need_list = True
            except (ApiError, ConnectionFailedError) as exc:
                if self._is_stopped():
                    return
                delay = self._next_backoff(unreachable=isinstance(exc, ConnectionFailedError))
                log.warning(
                    "list/watch failed resource=%s retry_in=%.2fs error=%s",
                    self._lw.resource.plural,
                    delay,
                    exc,
                )
                self._sleep(delay)

    def _next_backoff(self, *, unreachable: bool = False) -> float:
        """The next wait: capped exponential with jitter; at most ``unreachable_cap`` when
        the failure got no answer at all, which also makes the next answered failure start
        over from ``initial`` (see :class:`BackoffPolicy`)."""
        p = self._policy
        now = self._clock.monotonic()
        if unreachable:
            # Nothing is known about the server's load while nobody answers: this exponential
            # is separate, and an escalated answered backoff would leave a restarted server
            # (answering 403 while its authorizer syncs) unwatched for many seconds.
            fresh = now - self._last_failure > p.reset_after or self._outage_delay == 0.0
            grown = min(self._outage_delay * p.factor, p.unreachable_cap)
            self._outage_delay = p.initial if fresh else grown
            self._delay = 0.0
            self._last_failure = now
            jittered = self._outage_delay * (1.0 + p.jitter * self._rng.random())
            return min(jittered, p.unreachable_cap)
        self._outage_delay = 0.0
        if now - self._last_failure > p.reset_after or self._delay == 0.0:
            self._delay = p.initial
        else:
            self._delay = min(self._delay * p.factor, p.cap)
        self._last_failure = now
        return min(self._delay * (1.0 + p.jitter * self._rng.random()), p.cap * (1 + p.jitter))

    def _sleep(self, seconds: float) -> None:
        with self._cond:
            deadline = self._clock.monotonic() + seconds
            while not self._stopped and self._clock.monotonic() < deadline:
                self._clock.wait_condition(self._cond, deadline - self._clock.monotonic())

    def _list(self, *, consistent: bool) -> None:
        items: list[JSON] = []
        token: str | None = None
        rv_param: str | None = "" if consistent else "0"
        while True:
            page = self._lw.list(
                limit=self._page_size, continue_token=token, resource_version=rv_param
            )
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            token = meta.get("continue") or None
            if token is None:
                break
            rv_param = None  # continuation pages carry their RV inside the token
        rv = str(meta.get("resourceVersion", ""))
        self._sink.replace(items, rv)
        with self._cond:
            self._last_rv = rv
        self.lists += 1

    def _use_watch_list(self) -> bool:
        return not self._watch_list_refused and callable(getattr(self._lw, "watch_list", None))

    def _watch_list(self) -> bool:
        """Streaming watch-list: collect the initial ADDED events until the bookmark annotated
        ``k8s.io/initial-events-end``, replace the sink with them at that RV, then keep
        consuming the same stream as a watch. False (and never again) if the server refuses
        it with a 4xx other than 410; other errors propagate (backoff, then retry)."""
        timeout = int(self._min_watch_timeout * (1.0 + self._rng.random()))
        try:
            stream: WatchStream = self._lw.watch_list(timeout_seconds=timeout)  # type: ignore[attr-defined]
            with self._cond:
                if self._stopped:
                    stream.stop()
                    return True
                self._stream = stream
            items: dict[tuple[str, str], JSON] = {}
            for event in stream:
                obj = event.object
                meta = obj.get("metadata") or {}
                if event.type == "BOOKMARK":
                    if (meta.get("annotations") or {}).get(INITIAL_EVENTS_END) == "true":
                        rv = str(meta.get("resourceVersion", ""))
                        self._sink.replace(list(items.values()), rv)
                        with self._cond:
                            self._last_rv = rv
                        self.lists += 1
                        self.watch_lists += 1
                        self._initial_done = True
                        self._consume(stream)
                        return True
                    continue
                key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
                if event.type == "DELETED":
                    items.pop(key, None)
                else:
                    items[key] = obj
            raise ConnectionFailedError("watch-list ended before its initial events did")
        except GoneError:
            raise
        except ApiError as exc:
            if 400 <= exc.status < 500:
                log.info(
                    "watch-list refused resource=%s status=%d; using LIST+WATCH",
                    self._lw.resource.plural,
                    exc.status,
                )
                self._watch_list_refused = True
                return False
            raise
        finally:
            with self._cond:
                stream_ref = self._stream
                self._stream = None
            if stream_ref is not None:
                stream_ref.stop()

    def _watch(self) -> None:
        timeout = int(self._min_watch_timeout * (1.0 + self._rng.random()))
        stream = self._lw.watch(resource_version=self._last_rv, timeout_seconds=timeout)
        with self._cond:
            if self._stopped:
                return
            self._stream = stream
        try:
            self._consume(stream)
        finally:
            with self._cond:
                self._stream = None
            stream.stop()

    def _consume(self, stream: WatchStream) -> None:
        """Feed watch events to the sink until the stream ends."""
        for event in stream:
            obj = event.object
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if event.type == "ADDED":
                self._sink.add(obj)
            elif event.type == "MODIFIED":
                self._sink.update(obj)
            elif event.type == "DELETED":
                self._sink.delete(obj)
            elif event.type != "BOOKMARK":
                log.warning("unknown watch event type=%s", event.type)
                continue
            if rv:
                with self._cond:
                    self._last_rv = str(rv)
