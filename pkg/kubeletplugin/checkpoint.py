"""The plugin's durable record of what it prepared: ``<plugin data dir>/checkpoint.json``.

Owns the file format, atomic persistence and the corrupt-file policy. Shape (version 1)::

    {"kind": "ComputeDomainPluginCheckpoint", "version": 1, "nodeBootID": "<boot_id>",
     "checksum": "sha256:<hex over version+nodeBootID+claims>",
     "claims": {"<uid>": {"checksum": "sha256:<hex over entry>", "entry": {...ClaimEntry...}}}}

Invariants:
* Every write goes to a temp file in the same directory, is fsynced, renamed over the old file,
  and the directory is fsynced: after a crash the file is the old or the new version.
* Entries move ``PrepareStarted`` -> ``PrepareCompleted`` -> removed; the Started record is
  durable *before* any side effect (CDI file, node label) so a crash can always be undone.
* Readers re-load the file when it changed on disk (inode/mtime/size), so a second plugin
  instance (rolling update) working under the same node lock sees the other's writes.
* Entries written during another boot (``/proc/sys/kernel/random/boot_id`` differs) are dropped
  on open: device nodes and ``/var/run/cdi`` do not survive a reboot (upstream behaviour).

Corrupt-file policy (never a silent reset, never a crash loop): if the file cannot be parsed,
has an unknown kind/version (a foreign file, e.g. the Go driver's), or its checksum does not
verify, then (1) the file is moved aside to ``checkpoint.json.corrupt-<unix-ts>`` and kept for
inspection; (2) every claim entry whose own checksum still verifies is recovered and written to a
fresh checkpoint, so a flipped byte loses at most the entry it hit; (3) the plugin keeps serving,
but reports the problem in the log (ERROR), in the metric
``nvidia_dra_checkpoint_corruptions_total`` and as NOT_SERVING on the health service name
``checkpoint`` until the next restart (liveness stays SERVING, so the kubelet does not restart
us into the same state). Claims whose entries were lost are still cleaned up: Unprepare of an
unknown claim always deletes the CDI spec named after its UID, and the node label is only ever
removed by value, so a lost entry cannot make us remove another domain's label.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from pkg.kubeletplugin.cdi import atomic_write

log = logging.getLogger(__name__)

CHECKPOINT_FILE: Final = "checkpoint.json"
KIND: Final = "ComputeDomainPluginCheckpoint"
VERSION: Final = 1
BOOT_ID_PATH: Final = Path("/proc/sys/kernel/random/boot_id")


class ClaimState(enum.StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"


@dataclass(frozen=True)
class PreparedDevice:
    """One device as reported to the kubelet (``Device`` of the DRA API)."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]


@dataclass(frozen=True)
class ClaimEntry:
    """What Unprepare needs without the API: the claim may be deleted by then."""

    uid: str
    namespace: str
    name: str
    state: ClaimState
    kind: str  # "channel" | "daemon"
    domain_id: str
    devices: tuple[PreparedDevice, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["state"] = str(self.state)
        return out

    @classmethod
    def from_json(cls, raw: Any) -> ClaimEntry:
        if not isinstance(raw, dict):
            raise ValueError("entry is not an object")
        return cls(
            uid=str(raw["uid"]),
            namespace=str(raw["namespace"]),
            name=str(raw["name"]),
            state=ClaimState(raw["state"]),
            kind=str(raw["kind"]),
            domain_id=str(raw["domain_id"]),
            devices=tuple(
                PreparedDevice(
                    request_names=tuple(d["request_names"]),
                    pool_name=str(d["pool_name"]),
                    device_name=str(d["device_name"]),
                    cdi_device_ids=tuple(d["cdi_device_ids"]),
                )
                for d in raw.get("devices", [])
            ),
        )


def _checksum(value: Any) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


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
        self, *, directory: Path, boot_id: str, now: Callable[[], float] = time.time
    ) -> None:
        self._path = directory / CHECKPOINT_FILE
        self._boot_id = boot_id
        self._entries: dict[str, ClaimEntry] = {}
        self._entry_sums: dict[str, str] = {}
        self._stamp: tuple[int, int, int] | None = None
        self._now = now

    @property
    def path(self) -> Path:
        return self._path

    def open(self) -> OpenReport:
        """First load, applying the boot-ID rule and the corrupt-file policy (module doc)."""
        if not self._path.exists():
            self._write({})
            return OpenReport()
        raw = self._path.read_bytes()
        try:
            entries, boot_id = self._parse(raw)
            report = OpenReport()
        except ValueError as err:
            entries, boot_id = self._salvage(raw), self._boot_id
            moved = self._path.with_name(f"{CHECKPOINT_FILE}.corrupt-{int(self._now())}")
            os.replace(self._path, moved)
            report = OpenReport(
                corrupt=True,
                problem=str(err),
                moved_to=moved,
                recovered=len(entries),
                lost=max(_count_claims(raw) - len(entries), 0),
            )
            log.error(
                "checkpoint %s is corrupt (%s): moved to %s, recovered %d entries, lost %d",
                self._path, err, moved, report.recovered, report.lost,
            )  # fmt: skip
        dropped: tuple[ClaimEntry, ...] = ()
        if boot_id != self._boot_id:
            dropped = tuple(entries.values())
            entries = {}
            log.info("checkpoint from another boot (%s): dropped %d entries", boot_id, len(dropped))
        self._write(entries)
        return OpenReport(
            corrupt=report.corrupt,
            problem=report.problem,
            moved_to=report.moved_to,
            recovered=report.recovered,
            lost=report.lost,
            dropped_other_boot=dropped,
        )

    def entries(self) -> dict[str, ClaimEntry]:
        """Current entries, re-read if another writer replaced the file."""
        stamp = self._file_stamp()
        if stamp != self._stamp and stamp is not None:
            try:
                self._entries, _ = self._parse(self._path.read_bytes())
                self._entry_sums = {}
                self._stamp = stamp
            except ValueError as err:
                # Only our own atomic writes touch the file after open(); keep the last good copy.
                log.error(
                    "checkpoint changed on disk and does not verify (%s); keeping memory", err
                )
        return dict(self._entries)

    def put(self, entry: ClaimEntry) -> None:
        entries = self.entries()
        entries[entry.uid] = entry
        self._entry_sums.pop(entry.uid, None)
        self._write(entries)

    def remove(self, uid: str) -> None:
        entries = self.entries()
        if entries.pop(uid, None) is not None:
            self._write(entries)

    def _write(self, entries: dict[str, ClaimEntry]) -> None:
        claims: dict[str, Any] = {}
        for uid, entry in entries.items():
            body = entry.to_json()
            checksum = self._entry_sums.get(uid) or _checksum(body)
            self._entry_sums[uid] = checksum
            claims[uid] = {"checksum": checksum, "entry": body}
        data = {"version": VERSION, "nodeBootID": self._boot_id, "claims": claims}
        doc = {"kind": KIND, **data, "checksum": _checksum(data)}
        self._path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self._path, json.dumps(doc, indent=1).encode(), mode=0o600)
        self._entries = dict(entries)
        self._stamp = self._file_stamp()

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = self._path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    @staticmethod
    def _parse(raw: bytes) -> tuple[dict[str, ClaimEntry], str]:
        try:
            doc = json.loads(raw)
        except ValueError as err:
            raise ValueError(f"not valid JSON: {err}") from err
        if not isinstance(doc, dict) or doc.get("kind") != KIND:
            raise ValueError("not a checkpoint of this plugin (unknown kind; foreign file?)")
        if doc.get("version") != VERSION:
            raise ValueError(f"unsupported checkpoint version {doc.get('version')!r}")
        data = {k: doc.get(k) for k in ("version", "nodeBootID", "claims")}
        if doc.get("checksum") != _checksum(data):
            raise ValueError("file checksum mismatch")
        entries: dict[str, ClaimEntry] = {}
        try:
            for uid, item in (doc.get("claims") or {}).items():
                entry = ClaimEntry.from_json(item["entry"])
                if entry.uid != uid:
                    raise ValueError(f"entry {uid} names claim {entry.uid}")
                entries[uid] = entry
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"malformed entry: {err}") from err
        return entries, str(doc.get("nodeBootID") or "")

    @staticmethod
    def _salvage(raw: bytes) -> dict[str, ClaimEntry]:
        """Entries whose own checksum verifies, from a file that failed as a whole."""
        try:
            doc = json.loads(raw)
            claims = doc.get("claims") if isinstance(doc, dict) else None
        except ValueError:
            return {}
        recovered: dict[str, ClaimEntry] = {}
        for uid, item in (claims or {}).items() if isinstance(claims, dict) else ():
            try:
                if item["checksum"] == _checksum(item["entry"]):
                    entry = ClaimEntry.from_json(item["entry"])
                    if entry.uid == uid:
                        recovered[uid] = entry
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
        return recovered


def _count_claims(raw: bytes) -> int:
    try:
        doc = json.loads(raw)
    except ValueError:
        return 0
    claims = doc.get("claims") if isinstance(doc, dict) else None
    return len(claims) if isinstance(claims, dict) else 0


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
