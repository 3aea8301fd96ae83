"""Checkpoint cleanup: unprepare stale PrepareStarted claims, expire PrepareAborted tombstones.

A claim can stay ``PrepareStarted`` forever when its Prepare failed and the kubelet never sent
Unprepare (the pod and the claim were force-deleted, the plugin was down). `CheckpointCleanup`
finds those entries and undoes them, as upstream's ``CheckpointCleanupManager`` does:

* one pass at `CheckpointCleanup.start`, then one every `CLEANUP_INTERVAL` of the injected clock
  while the checkpoint holds an entry a pass can act on (``PrepareStarted`` or
  ``PrepareAborted``); each pass runs to its end and never overlaps another;
* with no such entry the thread sleeps with no timer (no idle wakeups) until the
  plugin writes one: `CheckpointCleanup.checkpoint_changed` (wired to every checkpoint write)
  arms it, and the next pass runs one interval later. The checkpoint is re-read (under the node
  lock) at the end of each pass and on every write, so entries another plugin instance wrote
  are seen then too; an entry another instance writes while this one neither prepares nor
  unprepares anything waits for this instance's next write or restart (instances overlap only
  when the DaemonSet's ``maxSurge`` is raised above the chart's 0);
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
from collections.abc import Iterable
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
# The states a pass acts on: stale Started claims are unprepared, old tombstones deleted.
_PENDING_STATES: Final = frozenset({ClaimState.PREPARE_STARTED, ClaimState.PREPARE_ABORTED})


def _pending(entries: Iterable[ClaimEntry]) -> bool:
    return any(e.state in _PENDING_STATES for e in entries)


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
    (tests) but not concurrently with the background thread's pass; `checkpoint_changed` may be
    called from any thread and never blocks.
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
        self._cond = threading.Condition()
        self._stopping = False
        self._pending = True  # until a pass found the checkpoint without such entries
        self._writes = 0  # checkpoint_changed calls that armed the cleanup
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Run the start-up pass now (the caller waits for it), then one pass per interval on a
        daemon thread until `stop`, while entries a pass acts on exist (module docstring)."""
        log.log(V(6), "CheckpointCleanupManager started")
        writes = self._armed_writes()
        self.run_once()
        self._settle(writes)
        self._thread = threading.Thread(target=self._loop, name="checkpoint-cleanup", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the periodic passes; a pass in progress finishes first. Idempotent."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def checkpoint_changed(self, entries: Iterable[ClaimEntry]) -> None:
        """The checkpoint now holds ``entries``: if one is PrepareStarted or PrepareAborted, a
        sleeping cleanup resumes its passes (the next one interval from now). Never blocks on a
        pass; call it after every checkpoint write."""
        if not _pending(entries):
            return
        with self._cond:
            self._writes += 1
            if not self._pending:
                self._pending = True
                self._cond.notify_all()

    def pending(self) -> bool:
        """Whether passes are scheduled: the checkpoint held entries a pass acts on when last
        looked at (after a pass or a write)."""
        with self._cond:
            return self._pending

    def _loop(self) -> None:
        while self._wait_for_next_pass():
            log.log(V(6), "%s: task submitted", _PREFIX)
            self._pass()

    def _wait_for_next_pass(self) -> bool:
        """Sleep until the next pass is due (False: stopped); no timer while nothing is pending."""
        with self._cond:
            while not self._stopping and not self._pending:
                self._clock.wait_condition(self._cond, None)
            deadline = self._clock.monotonic() + self._interval
            while not self._stopping:
                left = deadline - self._clock.monotonic()
                if left <= 0:
                    return True
                self._clock.wait_condition(self._cond, left)
            return False

    def _pass(self) -> None:
        """One periodic pass, then `_settle`."""
        writes = self._armed_writes()
        try:
            self.run_once()
        except Exception:  # a bug in one pass must not end the periodic cleanup
            log.exception("%s: pass failed", _PREFIX)
        self._settle(writes)

    def _armed_writes(self) -> int:
        with self._cond:
            return self._writes

    def _settle(self, writes: int) -> None:
        """Keep passes scheduled only if the checkpoint (re-read now) holds entries a pass acts
        on, or a write armed the cleanup since ``writes`` was taken (it may not be in the read)."""
        try:
            pending = _pending(self._claims.entries().values())
        except Exception as err:  # the node lock timed out, the file went unreadable
            log.warning("%s: unable to get checkpoint after the pass: %s", _PREFIX, err)
            pending = True
        with self._cond:
            self._pending = pending or self._writes != writes

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
