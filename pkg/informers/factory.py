"""`SharedInformerFactory`: one informer (one LIST+WATCH) per slice of the API, per process.

Owns informer sharing: every consumer asking for the same (resource, namespace, label
selector, field selector) gets the same `SharedInformer`, so the API server sees one watch.
Invariants: `start()` starts every informer created so far (call again after creating more);
`shutdown()` stops them all and joins their threads; clock and client are injected.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from pkg.base.clock import Clock
from pkg.base.types import JSON
from pkg.informers.informer import SharedInformer
from pkg.informers.lister import Lister
from pkg.informers.listwatch import ListerWatcher, ResourceListerWatcher, RestListerWatcher
from pkg.informers.reflector import DEFAULT_BACKOFF, BackoffPolicy
from pkg.informers.serialized import SerializedCodec
from pkg.kube.client import KubeClient, RestClient
from pkg.kube.resources import Resource

__all__ = ["InformerKey", "SharedInformerFactory"]

InformerKey = tuple[Resource, str | None, str | None, str | None, bool]


class SharedInformerFactory:
    """Creates and shares informers: one per (resource, namespace, selectors, metadata-only).

    Call `informer_for`/`lister_for` before `start` (or `start` again after creating more),
    then `wait_for_cache_sync` before trusting the caches. Thread-safe.
    """

    def __init__(
        self,
        client: KubeClient,
        *,
        clock: Clock,
        resync_period: float = 0.0,
        page_size: int = 500,
        min_watch_timeout: float = 300.0,
        backoff: BackoffPolicy = DEFAULT_BACKOFF,
        transform: Callable[[JSON], JSON] | None = None,
        watch_list: bool = False,
    ) -> None:
        """``watch_list``: informers over a `RestClient` start with a streaming watch-list
        (``sendInitialEvents``) and fall back to LIST + WATCH where the server refuses it."""
        self._client = client
        self._watch_list = watch_list
        self._transform = transform
        self._clock = clock
        self._resync_period = resync_period
        self._page_size = page_size
        self._min_watch_timeout = min_watch_timeout
        self._backoff = backoff
        self._lock = threading.Lock()
        self._informers: dict[InformerKey, SharedInformer] = {}
        self._started: set[InformerKey] = set()

    def informer_for(
        self,
        resource: Resource,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        *,
        transform: Callable[[JSON], JSON] | None = None,
        metadata_only: bool = False,
        serialized: bool = False,
    ) -> SharedInformer:
        """The shared informer of this slice; ``transform`` (for this informer, overriding
        the factory's) and ``serialized`` (cache objects as JSON bytes,
        `serialized.SerializedCodec`: about 1x their JSON size instead of ~6x, reads decode)
        apply only when this call creates it; ``metadata_only`` (needs a `RestClient`) caches
        PartialObjectMetadata objects, a separate informer."""
        key: InformerKey = (
            resource,
            namespace,
            label_selector or None,
            field_selector or None,
            metadata_only,
        )
        with self._lock:
            inf = self._informers.get(key)
            if inf is None:
                lw: ListerWatcher
                if isinstance(self._client, RestClient) and (self._watch_list or metadata_only):
                    lw = RestListerWatcher(
                        self._client,
                        resource,
                        namespace,
                        label_selector,
                        field_selector,
                        metadata_only=metadata_only,
                        watch_list_enabled=self._watch_list,
                    )
                else:
                    lw = ResourceListerWatcher(
                        self._client, resource, namespace, label_selector, field_selector
                    )
                inf = SharedInformer(
                    lw,
                    clock=self._clock,
                    resync_period=self._resync_period,
                    page_size=self._page_size,
                    min_watch_timeout=self._min_watch_timeout,
                    backoff=self._backoff,
                    transform=transform or self._transform,
                    codec=SerializedCodec() if serialized else None,
                )
                self._informers[key] = inf
            return inf

    def lister_for(
        self,
        resource: Resource,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> Lister:
        """Lister over the shared informer of exactly this (resource, namespace, selectors)."""
        informer = self.informer_for(resource, namespace, label_selector, field_selector)
        return Lister(informer.indexer, resource)

    def informers(self) -> list[tuple[InformerKey, SharedInformer]]:
        """Every informer created so far with the slice it watches, in creation order."""
        with self._lock:
            return list(self._informers.items())

    def start(self) -> None:
        """Start every informer created so far that is not running yet; returns at once.
        Safe to call again (only new informers start).
        """
        with self._lock:
            todo = [(k, i) for k, i in self._informers.items() if k not in self._started]
            self._started.update(k for k, _ in todo)
        for _, inf in todo:
            inf.start()

    def wait_for_cache_sync(self, timeout: float) -> bool:
        """Block until every informer started so far has synced, or ``timeout`` seconds of the
        injected clock pass; returns whether all have synced (``timeout=0``: just check)."""
        deadline = self._clock.monotonic() + timeout
        with self._lock:
            infs = [self._informers[k] for k in self._started]
        return all(i.wait_for_sync(max(0.0, deadline - self._clock.monotonic())) for i in infs)

    def shutdown(self) -> None:
        """Stop every informer and join its threads (bounded); handlers get no further
        notifications afterwards. Idempotent.
        """
        with self._lock:
            infs = list(self._informers.values())
        for inf in infs:
            inf.stop()
