"""Checkpoint cleanup: unprepare stale PrepareStarted claims, expire PrepareAborted tombstones.

A claim can stay ``PrepareStarted`` forever when its Prepare failed and the kubelet never sent
Unprepare (the pod and the claim were force-deleted, the plugin was down). `CheckpointCleanup`
finds those entries and undoes them, as upstream's ``CheckpointCleanupManager`` does:

* one pass at `CheckpointCleanup.start`, then one every `CLEANUP_INTERVAL` of the injected clock
  (each pass runs to its end; a pass never overlaps another);
* only ``PrepareStarted`` entries that carry a claim name are looked up (older Go drivers wrote
  none); the claim is fetched by name; when it is gone or its UID changed, the entry is
  unprepared through `CheckpointedClaims.unprepare`, the very call the kubelet's Unprepare
  makes (node lock, label and domain-dir removal), which leaves a ``PrepareAborted`` tombstone;
* an API error other than NotFound skips the entry until the next pass;
* the pass ends by deleting tombstones older than `PREPARE_ABORTED_TTL`.

``PrepareCompleted`` entries are never collected here: the kubelet owns their lifetime. Log
lines and their klog levels are upstream's, so its runbooks and e2e greps match.
"""

from __future__ import annotations

import logging
import threading
from typing import Final, Protocol

from pkg.base.clock import Clock
from pkg.draplugin.claims import ClaimRef
from pkg.kube.client import KubeClient
from pkg.kube.errors import ApiError, NotFoundError
from pkg.kube.resources import RESOURCE_CLAIMS
from pkg.kubeletplugin.checkpointformat import ClaimEntry, ClaimState
from pkg.runtime.logsetup import V

__all__ = [
    "CLAIM_LOOKUP_TIMEOUT",
    "CLEANUP_INTERVAL",
    "PREPARE_ABORTED_TTL",
    "CheckpointCleanup",
    "CheckpointedClaims",
]

log = logging.getLogger(__name__)

# Upstream's ResourceClaimCleanupInterval.
CLEANUP_INTERVAL: Final = 600.0
# Upstream's PrepareAbortedClaimEntryTTL: twice the 45 s Prepare retry window, so a retry of the
# aborted Prepare still in flight meets the tombstone.
PREPARE_ABORTED_TTL: Final = 90.0
# Budget of one claim's lookup and unprepare (upstream's per-GET timeout).
CLAIM_LOOKUP_TIMEOUT: Final = 20.0

_PREFIX: Final = "Checkpointed RC cleanup"


class CheckpointedClaims(Protocol):
    """What the cleanup needs from `state.DeviceState`."""

    def entries(self) -> dict[str, ClaimEntry]:
        """A snapshot of the checkpoint entries by claim UID."""
        ...

    def unprepare(self, ref: ClaimRef, *, deadline: float) -> None:
        """The kubelet's Unprepare of one claim; raises on failure."""
        ...

    def expire_aborted(self, *, ttl: float) -> int:
        """Delete PrepareAborted entries at least ``ttl`` seconds old; returns how many."""
        ...


class CheckpointCleanup:
    """Runs the cleanup passes of the module docstring on a background thread.

    `start` and `stop` are called once each from one thread; `run_once` may be called directly
    (tests) but not concurrently with the background thread's pass.
    """

    def __init__(
        self,
        *,
        claims: CheckpointedClaims,
        client: KubeClient,
        clock: Clock,
        interval: float = CLEANUP_INTERVAL,
        aborted_ttl: float = PREPARE_ABORTED_TTL,
    ) -> None:
        self._claims = claims
        self._client = client
        self._clock = clock
        self._interval = interval
        self._aborted_ttl = aborted_ttl
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Run the start-up pass now (the caller waits for it), then one pass per interval on a
        daemon thread until `stop`."""
        log.log(V(6), "CheckpointCleanupManager started")
        self.run_once()
        self._thread = threading.Thread(target=self._loop, name="checkpoint-cleanup", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the periodic passes; a pass in progress finishes first. Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while not self._clock.wait(self._stop, self._interval):
            log.log(V(6), "%s: task submitted", _PREFIX)
            try:
                self.run_once()
            except Exception:  # a bug in one pass must not end the periodic cleanup
                log.exception("%s: pass failed", _PREFIX)

    def run_once(self) -> None:
        """One pass: unprepare stale PrepareStarted claims, then expire old tombstones.

        Never raises for API or checkpoint failures; they are logged and retried next pass.
        """
        try:
            entries = self._claims.entries()
        except Exception as err:  # the node lock timed out, the file went unreadable
            log.error("%s: unable to get checkpoint: %s", _PREFIX, err)
            return
        started = [e for e in entries.values() if e.state == ClaimState.PREPARE_STARTED]
        log.log(
            V(4),
            "%s: claims in PrepareStarted state: %d (of %d)",
            _PREFIX,
            len(started),
            len(entries),
        )
        for entry in started:
            self._collect(entry)
        try:
            expired = self._claims.expire_aborted(ttl=self._aborted_ttl)
        except Exception as err:
            log.warning(
                "%s: unable to delete expired PrepareAborted claim entries: %s", _PREFIX, err
            )
            return
        if expired > 0:
            log.log(V(4), "%s: deleted expired PrepareAborted claim entries: %d", _PREFIX, expired)

    def _collect(self, entry: ClaimEntry) -> None:
        """Unprepare ``entry`` if its claim is gone from the API server or was replaced."""
        if not entry.name:
            log.log(
                V(4),
                "%s: skip checkpointed claim '%s': RC name not in checkpoint",
                _PREFIX,
                entry.uid,
            )
            return
        ref = ClaimRef(namespace=entry.namespace, uid=entry.uid, name=entry.name)
        text = str(ref)  # <ns>/<name>:<uid>
        deadline = self._clock.monotonic() + CLAIM_LOOKUP_TIMEOUT
        try:
            claim = self._client.get(RESOURCE_CLAIMS, entry.name, namespace=entry.namespace)
        except NotFoundError:
            log.log(
                V(4),
                "%s: partially prepared claim '%s' is stale: not found in API server",
                _PREFIX,
                text,
            )
        except ApiError as err:
            log.info(
                "%s: skip for checkpointed claim %s: getClaimByName failed (retry later): %s",
                _PREFIX,
                entry.uid,
                err,
            )
            return
        else:
            api_uid = str((claim.get("metadata") or {}).get("uid", ""))
            if api_uid == entry.uid:
                log.log(V(4), "%s: partially prepared claim not stale: %s", _PREFIX, text)
                return
            log.log(
                V(4),
                "%s: partially prepared claim '%s/%s' is stale: UID changed "
                "(checkpoint: %s, API server: %s)",
                _PREFIX,
                entry.namespace,
                entry.name,
                entry.uid,
                api_uid,
            )
        try:
            self._claims.unprepare(ref, deadline=deadline)
        except Exception as err:  # ClaimError, or a filesystem/API failure while undoing
            log.warning("%s: error during unprepare for %s (retried later): %s", _PREFIX, text, err)
            return
        log.info("%s: unprepared stale claim: %s", _PREFIX, text)
