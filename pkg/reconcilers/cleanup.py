"""Orphan cleanup: dependents and node labels of ComputeDomains that no longer exist.

Owns the sweep (at start, then whenever :meth:`OrphanCleaner.poke` reports a possible orphan —
a ComputeDomain deleted, a dependent or node label naming an unknown domain — and, only if
``cleanup_interval`` > 0, also every ``cleanup_interval`` as a backstop; a failed sweep is
retried after ``retry_delay``; an idle controller does no periodic work) that deletes daemon
DaemonSets, daemon and workload ResourceClaimTemplates, and removes ``computeDomain`` node
labels whose domain UID is unknown, e.g. because a domain was force-deleted or deleted while
the controller was down. Candidates come from the informer caches; before anything is deleted
the set of live domains is confirmed with one LIST against the API server, so a cache that
lags a just-created domain can never make us delete that domain's objects. Invariants: deletes
carry a UID precondition; a node label is removed only while it still names the orphan UID;
ComputeDomainCliques are left to the garbage collector (they are owned by daemon pods).
"""

from __future__ import annotations

import logging
import threading

from pkg.api import constants as c
from pkg.base.clock import Clock
from pkg.base.types import JSON
from pkg.informers.store import meta_namespace_key
from pkg.kube.client import KubeClient
from pkg.kube.errors import ApiError, ConflictError, NotFoundError
from pkg.kube.resources import COMPUTE_DOMAINS, DAEMONSETS, RESOURCE_CLAIM_TEMPLATES
from pkg.reconcilers.cache import Caches
from pkg.reconcilers.config import ControllerConfig
from pkg.reconcilers.dependents import Dependents, remove_domain_label
from pkg.reconcilers.events import EventSink

__all__ = ["OrphanCleaner"]

log = logging.getLogger(__name__)


def _owner(obj: JSON) -> str:
    return str((obj.get("metadata", {}).get("labels") or {}).get(c.COMPUTE_DOMAIN_LABEL) or "")


class OrphanCleaner:
    """Finds and removes what dead domains left behind."""

    def __init__(
        self,
        *,
        client: KubeClient,
        caches: Caches,
        config: ControllerConfig,
        events: EventSink,
        clock: Clock,
    ) -> None:
        self._client = client
        self._caches = caches
        self._config = config
        self._clock = clock
        self._deleter = Dependents(client=client, caches=caches, config=config, events=events)
        self._wake = threading.Event()
        self.retry_delay = 30.0

    def poke(self) -> None:
        """Ask for a sweep soon (cheap; call from event handlers and on stop)."""
        self._wake.set()

    def maybe_orphan(self, obj: JSON) -> bool:
        """True (and a sweep is requested) if ``obj`` names a domain UID the cache lacks."""
        owner = _owner(obj)
        if owner and not self._caches.compute_domains.by_index("uid", owner):
            self.poke()
            return True
        return False

    def _live_uids(self) -> set[str]:
        uids: set[str] = set()
        token: str | None = None
        while True:
            page = self._client.list(COMPUTE_DOMAINS, limit=500, continue_token=token)
            uids.update(str(i["metadata"]["uid"]) for i in page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return uids

    def sweep(self) -> int:
        """One pass; returns how many objects were deleted or unlabelled."""
        cached = {str(cd["metadata"].get("uid")) for cd in self._caches.compute_domains.list()}
        daemonsets = [o for o in self._caches.daemonsets.list() if _owner(o) not in cached]
        rcts = [o for o in self._caches.rcts.list() if _owner(o) not in cached]
        nodes = [n for n in self._caches.nodes.list() if _owner(n) and _owner(n) not in cached]
        if not (daemonsets or rcts or nodes):
            return 0
        live = self._live_uids()
        done = 0
        for resource, objs in ((DAEMONSETS, daemonsets), (RESOURCE_CLAIM_TEMPLATES, rcts)):
            for obj in objs:
                if _owner(obj) in live:
                    continue
                try:
                    self._deleter.delete(resource, obj)
                except ApiError as exc:
                    log.warning(
                        "orphan delete failed object=%s error=%s", obj["metadata"].get("name"), exc
                    )
                    continue
                done += 1
                log.info(
                    "deleted orphan %s uid=%s",
                    resource.kind,
                    _owner(obj),
                    extra={"key": meta_namespace_key(obj)},
                )
        for node in nodes:
            uid = _owner(node)
            if uid in live:
                continue
            try:
                if remove_domain_label(self._client, node, uid=uid):
                    done += 1
                    log.info(
                        "removed orphan node label uid=%s",
                        uid,
                        extra={"key": node["metadata"]["name"]},
                    )
            except (ConflictError, NotFoundError):
                continue  # changed under us; the next sweep looks again
        return done

    def run(self, stop: threading.Event) -> None:
        """Sweep now, then on each :meth:`poke` (and every ``cleanup_interval`` if > 0) until
        ``stop`` is set (poke after setting it); never raises."""
        pending = True
        while not stop.is_set():
            if pending:
                self._wake.clear()
                try:
                    self.sweep()
                    pending = False
                except Exception:
                    log.exception("orphan sweep failed")
            if stop.is_set():
                return
            interval = self._config.cleanup_interval
            timeout = self.retry_delay if pending else (interval if interval > 0 else None)
            if timeout is None:
                self._wake.wait()
            else:
                self._clock.wait(self._wake, timeout)
            pending = True
