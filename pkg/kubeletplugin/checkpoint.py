"""The plugin's durable record of what it prepared: ``<plugin data dir>/checkpoint.json``.

Owns persistence and the corrupt-file policy. The file is the Go driver's checkpoint -- same
path, same JSON shape, same checksums (`checkpointformat`) -- so either driver picks up the
claims the other prepared, and a rollback never makes the Go plugin crash on the checksum.

Invariants:
* Every write goes to a temp file in the same directory, is fsynced, renamed over the old file,
  and the directory is fsynced: after a crash the file is the old or the new version.
* Entries move ``PrepareStarted`` -> ``PrepareCompleted`` -> removed, or ``PrepareStarted`` ->
  ``PrepareAborted`` (Unprepare before completion) -> expired by the cleanup (`state`,
  `cleanup`); the Started record is durable *before* any side effect (CDI file, node label) so
  a crash can always be undone.
* Readers re-load the file when it changed on disk (inode/mtime/size), so a second plugin
  instance (rolling update) working under the same node lock sees the other's writes.
* Entries written during another boot (``nodeBootID`` differs from
  ``/proc/sys/kernel/random/boot_id``) are dropped on open: device nodes and ``/var/run/cdi`` do
  not survive a reboot (upstream behaviour). A file without a boot ID (older Go driver) keeps its
  entries and gets the current one, as upstream does. ``PrepareAborted`` tombstones are kept
  like any entry (upstream v0.4.1+ writes and reads them).
* What ``checkpoint.json`` cannot hold survives restarts in two files of ours beside it, each a
  document in the same format (checksums included) that no Go plugin opens (it reads only
  ``checkpoint.json``): ``checkpoint.previous-boot.json`` keeps the entries dropped for another
  boot until their Unprepare takes them (`take_previous_boot`: their node label and domain dir
  outlived the reboot), and ``checkpoint.tombstones.json`` keeps the ``PrepareAborted``
  tombstones of this boot that the configured compatibility level leaves out of the file. So
  a second plugin restart before the kubelet's Unprepare loses neither. Each is written under
  the node lock before ``checkpoint.json``, removed once empty, and one that does not verify
  is ignored with an ERROR (what it held is then only what a restart would have lost anyway).
* The file stays readable by the Go plugin of ``--checkpoint-compatibility``
  (`checkpointformat.CheckpointCompatibility`, default v0.4.1): below v0.4.1 tombstones live
  in the tombstones file only, below v0.4.0 the file carries no boot ID and the node offers no
  device sharing (a shared claim still prepared is named in a warning at `open`: that Go plugin
  would refuse the file until it is unprepared). `open` rewrites the file in that shape, so an
  operator sets it, lets the plugin restart, and can then roll the node back.

Corrupt-file policy (never a silent reset, never a crash loop): if the file cannot be parsed or a
checksum does not verify, then (1) the file is moved aside to
``checkpoint.json.corrupt-<unix-ts>`` and kept for inspection; (2) the entries of a section whose
checksum still verifies (v2, else the PrepareCompleted claims of v1) are recovered and written to
a fresh checkpoint; (3) the plugin keeps serving, but reports the problem in the log (ERROR), in
the metric ``nvidia_dra_checkpoint_corruptions_total`` and as NOT_SERVING on the health service
name ``checkpoint`` until the next restart (liveness stays SERVING, so the kubelet does not
restart us into the same state). Claims whose entries were lost are still cleaned up: Unprepare
of an unknown claim always deletes the CDI specs named after its UID, and the node label is only
ever removed by value, so a lost entry cannot make us remove another domain's label.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pkg.base.files import atomic_write
from pkg.kubeletplugin.checkpointformat import (
    CheckpointCompatibility,
    ClaimEntry,
    ClaimState,
    DecodedCheckpoint,
    DeviceGroup,
    PreparedDevice,
    canonical_status,
    decode_checkpoint,
    encode_checkpoint,
)

log = logging.getLogger(__name__)

CHECKPOINT_FILE: Final = "checkpoint.json"
PREVIOUS_BOOT_FILE: Final = "checkpoint.previous-boot.json"
TOMBSTONES_FILE: Final = "checkpoint.tombstones.json"
BOOT_ID_PATH: Final = Path("/proc/sys/kernel/random/boot_id")
# Entries of earlier boots still awaiting their Unprepare. The kubelet unprepares them within
# minutes of the plugin's registration, so only a node whose kubelet state was lost too keeps
# any for long; beyond this many the oldest are forgotten (their labels are then the
# controller's orphan sweep's, as for a lost checkpoint).
MAX_PREVIOUS_BOOT: Final = 1024

__all__ = [
    "BOOT_ID_PATH",
    "CHECKPOINT_FILE",
    "PREVIOUS_BOOT_FILE",
    "TOMBSTONES_FILE",
    "CheckpointStore",
    "ClaimEntry",
    "ClaimState",
    "DeviceGroup",
    "OpenReport",
    "PreparedDevice",
    "canonical_status",
    "read_boot_id",
]


@dataclass(frozen=True)
class OpenReport:
    """Outcome of `CheckpointStore.open`, for logs, metrics and health."""

    corrupt: bool = False
    problem: str = ""
    moved_to: Path | None = None
    recovered: int = 0
    lost: int = 0
    dropped_other_boot: tuple[ClaimEntry, ...] = ()


class CheckpointStore:
    """Loads, verifies and atomically rewrites the checkpoint; not thread-safe by itself.

    Callers serialise mutations with the node lock (see `state.NodeLock`).
    """

    def __init__(
        self,
        *,
        directory: Path,
        boot_id: str,
        now: Callable[[], float] = time.time,
        compatibility: CheckpointCompatibility = CheckpointCompatibility.V0_4_1,
    ) -> None:
        self._path = directory / CHECKPOINT_FILE
        self._previous_path = directory / PREVIOUS_BOOT_FILE
        self._tombstones_path = directory / TOMBSTONES_FILE
        self._boot_id = boot_id
        self._compatibility = compatibility
        self._entries: dict[str, ClaimEntry] = {}
        self._stamp: tuple[int, int, int] | None = None
        self._previous: dict[str, ClaimEntry] = {}
        self._previous_stamp: tuple[int, int, int] | None = None
        self._tombstones_written: dict[str, ClaimEntry] | None = None  # None: not known yet
        self._now = now

    @property
    def path(self) -> Path:
        """The checkpoint file (``<plugin data dir>/checkpoint.json``, upstream's path)."""
        return self._path

    def open(self) -> OpenReport:
        """First load, applying the boot-ID rule and the corrupt-file policy (module doc), and
        picking up what the two files of ours beside it kept across the last restart."""
        self._previous = self._read_side(self._previous_path).entries
        self._previous_stamp = _stamp(self._previous_path)
        kept_tombstones = self._side_tombstones()
        if not self._path.exists():
            self._write(kept_tombstones)
            return OpenReport()
        raw = self._path.read_bytes()
        try:
            decoded = decode_checkpoint(raw)
        except ValueError as err:
            decoded = DecodedCheckpoint(entries={}, boot_id="", problems=(str(err),))
        entries, boot_id = dict(decoded.entries), decoded.boot_id
        report = OpenReport()
        if decoded.problems:
            problem = "; ".join(decoded.problems)
            moved = self._path.with_name(f"{CHECKPOINT_FILE}.corrupt-{int(self._now())}")
            os.replace(self._path, moved)
            report = OpenReport(
                corrupt=True,
                problem=problem,
                moved_to=moved,
                recovered=len(entries),
                lost=max(decoded.claims_seen - len(entries), 0),
            )
            log.error(
                "checkpoint %s is corrupt (%s): moved to %s, recovered %d entries, lost %d",
                self._path,
                problem,
                moved,
                report.recovered,
                report.lost,
            )
        dropped: tuple[ClaimEntry, ...] = ()
        if boot_id and self._boot_id and boot_id != self._boot_id:
            dropped = tuple(entries.values())
            entries = {}
            log.info("checkpoint from another boot (%s): dropped %d entries", boot_id, len(dropped))
            self._remember_previous_boot(dropped)
        for uid, tombstone in kept_tombstones.items():
            entries.setdefault(uid, tombstone)
        self._warn_unrepresentable(entries)
        self._write(entries)
        return OpenReport(
            corrupt=report.corrupt,
            problem=report.problem,
            moved_to=report.moved_to,
            recovered=report.recovered,
            lost=report.lost,
            dropped_other_boot=dropped,
        )

    def _warn_unrepresentable(self, entries: dict[str, ClaimEntry]) -> None:
        """Warn about prepared claims sharing a device when the configured Go plugin cannot
        record sharing: it refuses the whole file while they exist."""
        if self._compatibility.keeps_share_id:
            return
        holders: dict[tuple[str, str], set[str]] = {}
        for e in entries.values():
            for g in e.groups:
                for d in g.devices:
                    holders.setdefault((d.pool_name, d.device_name), set()).add(e.uid)
        shared = sorted(uid for uids in holders.values() if len(uids) > 1 for uid in uids)
        if shared:
            log.warning(
                "checkpoint compatibility %s cannot record devices shared by several claims; "
                "claims %s hold one, and the Go plugin of that version refuses this checkpoint "
                "until they are unprepared: drain their workloads before switching",
                self._compatibility,
                ", ".join(shared),
            )

    def entries(self) -> dict[str, ClaimEntry]:
        """Current entries, re-read if another writer replaced the file."""
        stamp = self._file_stamp()
        if stamp != self._stamp and stamp is not None:
            try:
                decoded = decode_checkpoint(self._path.read_bytes())
                if decoded.problems:
                    raise ValueError("; ".join(decoded.problems))
                # Tombstones the file's shape cannot hold stay ours: those we know and those
                # another instance (rolling update) wrote to the tombstones file.
                ours = {**self._side_tombstones(), **self._entries}
                memory_only = {
                    uid: e
                    for uid, e in ours.items()
                    if e.state == ClaimState.PREPARE_ABORTED
                    and not self._compatibility.keeps_aborted
                    and uid not in decoded.entries
                }
                self._entries = {**decoded.entries, **memory_only}
                self._stamp = stamp
            except ValueError as err:
                # Only atomic writes under the node lock touch the file after open(); keep the
                # last good copy.
                log.error(
                    "checkpoint changed on disk and does not verify (%s); keeping memory", err
                )
        return dict(self._entries)

    def put(self, entry: ClaimEntry) -> None:
        """Add or replace ``entry`` and persist the checkpoint."""
        entries = self.entries()
        entries[entry.uid] = entry
        self._write(entries)

    def remove(self, uid: str) -> None:
        """Drop the entry of claim ``uid`` (if any) and persist the checkpoint."""
        entries = self.entries()
        if entries.pop(uid, None) is not None:
            self._write(entries)

    def previous_boot(self) -> dict[str, ClaimEntry]:
        """The entries dropped for another boot whose Unprepare has not come yet."""
        self._reload_previous()
        return dict(self._previous)

    def take_previous_boot(self, uid: str) -> ClaimEntry | None:
        """Remove and return the entry claim ``uid`` had before a reboot (None if it had none);
        durable before it returns. The caller holds the node lock."""
        self._reload_previous()
        entry = self._previous.pop(uid, None)
        if entry is not None:
            self._write_side(self._previous_path, self._previous)
            self._previous_stamp = _stamp(self._previous_path)
        return entry

    def _remember_previous_boot(self, dropped: tuple[ClaimEntry, ...]) -> None:
        """Keep the live entries of ``dropped`` for their Unprepare (oldest beyond the cap
        forgotten); tombstones hold nothing to undo."""
        for entry in dropped:
            if entry.state != ClaimState.PREPARE_ABORTED:
                self._previous.pop(entry.uid, None)
                self._previous[entry.uid] = entry
        while len(self._previous) > MAX_PREVIOUS_BOOT:
            forgotten = next(iter(self._previous))
            del self._previous[forgotten]
            log.warning(
                "forgot the pre-reboot entry of claim %s (over %d)", forgotten, MAX_PREVIOUS_BOOT
            )
        self._write_side(self._previous_path, self._previous)
        self._previous_stamp = _stamp(self._previous_path)

    def _reload_previous(self) -> None:
        stamp = _stamp(self._previous_path)
        if stamp != self._previous_stamp:
            self._previous = self._read_side(self._previous_path).entries
            self._previous_stamp = stamp

    def _side_tombstones(self) -> dict[str, ClaimEntry]:
        """This boot's tombstones in the tombstones file (another boot's are meaningless: no
        Prepare retry outlives a reboot)."""
        side = self._read_side(self._tombstones_path)
        if side.boot_id != self._boot_id:
            return {}
        return {u: e for u, e in side.entries.items() if e.state == ClaimState.PREPARE_ABORTED}

    def _read_side(self, path: Path) -> DecodedCheckpoint:
        """One of our side files' entries; none when it is missing or does not verify."""
        try:
            decoded = decode_checkpoint(path.read_bytes())
        except FileNotFoundError:
            return DecodedCheckpoint(entries={}, boot_id="")
        except (OSError, ValueError) as err:
            decoded = DecodedCheckpoint(entries={}, boot_id="", problems=(str(err),))
        if decoded.problems:
            log.error("%s does not verify (%s): ignored", path, "; ".join(decoded.problems))
            return DecodedCheckpoint(entries={}, boot_id="")
        return decoded

    def _write_side(self, path: Path, entries: dict[str, ClaimEntry]) -> None:
        """Persist ``entries`` (the full format, whatever the compatibility level: no Go plugin
        reads this file); an empty set removes the file."""
        if not entries:
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, encode_checkpoint(entries, boot_id=self._boot_id), mode=0o600)

    def _write(self, entries: dict[str, ClaimEntry]) -> None:
        # The tombstones the file leaves out go first: a crash between the two writes then
        # leaves a tombstone too many (it expires), never one too few.
        tombstones = {
            uid: e
            for uid, e in entries.items()
            if e.state == ClaimState.PREPARE_ABORTED and not self._compatibility.keeps_aborted
        }
        if tombstones != self._tombstones_written:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._write_side(self._tombstones_path, tombstones)
            self._tombstones_written = tombstones
        data = encode_checkpoint(entries, boot_id=self._boot_id, compatibility=self._compatibility)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self._path, data, mode=0o600)
        self._entries = dict(entries)
        self._stamp = self._file_stamp()

    def _file_stamp(self) -> tuple[int, int, int] | None:
        return _stamp(self._path)


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """Identity of the file's current version (inode, mtime, size), None if it is missing."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    """The kernel's boot ID, or ``""`` if it cannot be read."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""
