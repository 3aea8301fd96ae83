"""The Go driver's checkpoint format, and the claim records the plugin keeps in it.

Owns the model (`ClaimEntry`) and its exact wire form, so a node can switch between this driver
and the Go driver in either direction without losing a prepared claim. The shape is upstream's
``Checkpoint`` (``cmd/compute-domain-kubelet-plugin/checkpoint*.go``, ``prepared.go``)::

    {"checksum": <v1 checksum>,
     "v1": {"preparedClaims": {uid: {"status", "preparedDevices"}}},    # PrepareCompleted only
     "v2": {"checksum": <v2 checksum>,
            "preparedClaims": {uid: {"checkpointState", "status", "preparedDevices",
                                     "name", "namespace", "abortedAt"}},
            "nodeBootID": "<boot_id>"}}

``status`` is the claim's ``ResourceClaimStatus`` (``k8s.io/api`` v0.36, upstream's vendored
version); ``preparedDevices`` is a list of groups ``{"devices": [{"channel"|"daemon": {"info":
{"id": N}, "device": {"Requests", "PoolName", "DeviceName", "CDIDeviceIDs"}}}], "configState":
{"Type", "ComputeDomain"}}``. The v1 checksum covers ``{"checksum":0,"v1":...}``, the v2 checksum
covers v2 with its own checksum zeroed; both are `gojson.checksum` over Go's marshal output.

Invariants:
* `encode_checkpoint` writes exactly the bytes Go's ``MarshalCheckpoint`` writes for the same
  content (`gojson.canonical` + `gojson.marshal`), so the Go driver's re-marshal matches;
* `decode_checkpoint` accepts a section when its checksum matches either the file's own bytes
  (any upstream version, including fields newer than ours) or our canonical re-marshal, and
  verifies each section on its own so a damaged file still yields the entries of a verified one;
* a v1-only file (older upstream) reads as PrepareCompleted entries without name/namespace;
* ``name``/``namespace`` are written for every state, ``abortedAt`` (`go_time`) only for
  ``PrepareAborted`` entries, which -- like ``PrepareStarted`` ones -- are left out of ``v1``
  (the downgrade view holds only completed claims).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Final

from pkg.kubeletplugin import gojson
from pkg.kubeletplugin.claims import requested_devices, status_targets
from pkg.kubeletplugin.gojson import (
    BOOL,
    INT,
    STRING,
    Field,
    Map,
    Ptr,
    Raw,
    SchemaError,
    Slice,
    Struct,
    Time,
)


class CheckpointCompatibility(enum.StrEnum):
    """The oldest Go plugin a checkpoint must stay readable by (``--checkpoint-compatibility``).

    The Go plugin verifies a section by re-marshalling it with its own types, so any field it
    lacks fails the checksum and it reports ``checkpoint is corrupted`` on every Prepare and
    Unprepare (`hack/checkpoint-compat.py` runs each version's own code on our files):

    * ``v0.4.1`` (default): upstream's newest shape -- ``nodeBootID``, ``PrepareAborted``
      tombstones with ``abortedAt``; v0.4.1 and newer read it;
    * ``v0.4.0``: no ``PrepareAborted`` entries (v0.4.0 lacks ``abortedAt``); tombstones are
      kept in memory only;
    * ``v25.12.0``: that, and no ``nodeBootID`` either (v25.12.0's v2 section has no such
      field), so entries of a previous boot are kept after a reboot until the kubelet or the
      cleanup unprepares them, as v25.12.0 itself does; and no device sharing: v25.12.0's
      device type has no ``ShareID``, so the node publishes ``channel-0`` exclusive again and
      several pods of one domain per node are not offered (`keeps_share_id`).
    """

    V0_4_1 = "v0.4.1"
    V0_4_0 = "v0.4.0"
    V25_12_0 = "v25.12.0"

    @property
    def keeps_aborted(self) -> bool:
        """Whether ``PrepareAborted`` tombstones may be written to the file."""
        return self is CheckpointCompatibility.V0_4_1

    @property
    def keeps_boot_id(self) -> bool:
        """Whether ``nodeBootID`` may be written to the file."""
        return self is not CheckpointCompatibility.V25_12_0

    @property
    def keeps_share_id(self) -> bool:
        """Whether a device's ``ShareID`` may be written, i.e. whether claims may share one."""
        return self is not CheckpointCompatibility.V25_12_0


class ClaimState(enum.StrEnum):
    """``checkpointState``: Started -> Completed -> (deleted), or Started -> Aborted -> (expired).

    ``PrepareAborted`` is the tombstone Unprepare leaves for a claim that never completed: it
    holds no devices, keeps the status a Prepare retry is compared with, and carries
    ``abortedAt`` so the cleanup can expire it.
    """

    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"
    PREPARE_ABORTED = "PrepareAborted"


@dataclass(frozen=True)
class PreparedDevice:
    """One device as reported to the kubelet (upstream ``CheckpointedDevice``).

    ``request_names`` keeps subrequest names (``req/sub``) as stored; the gRPC answer strips
    them. ``share_id``/``metadata`` are carried through from files the Go driver wrote.
    """

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None
    metadata: Any = None


@dataclass(frozen=True)
class DeviceGroup:
    """Devices prepared with one opaque config (upstream ``PreparedDeviceGroup``)."""

    kind: str  # configState.Type: "channel" | "daemon"
    domain_id: str  # configState.ComputeDomain
    devices: tuple[PreparedDevice, ...] = ()


@dataclass(frozen=True)
class ClaimEntry:
    """What Unprepare needs without the API: the claim may be deleted by then.

    ``status`` is the claim's status at Prepare in Go's canonical form (see `canonical_status`);
    ``groups`` is empty until PrepareCompleted. ``targets`` says which ComputeDomains the claim
    touches, from the groups or -- for a PrepareStarted entry -- from the configs in ``status``.
    """

    uid: str
    state: ClaimState
    status: Mapping[str, Any] = field(default_factory=dict)
    groups: tuple[DeviceGroup, ...] = ()
    namespace: str = ""
    name: str = ""
    aborted_at: str | None = None

    @functools.cached_property
    def targets(self) -> tuple[tuple[str, str], ...]:
        """``(kind, domainID)`` pairs this claim prepared or was preparing."""
        if self.groups:
            return tuple((g.kind, g.domain_id) for g in self.groups)
        return status_targets(self.status)

    @property
    def kind(self) -> str:
        """The first target's kind (``channel``/``daemon``), ``""`` if unknown."""
        return self.targets[0][0] if self.targets else ""

    @property
    def domain_id(self) -> str:
        """The first target's ComputeDomain UID, ``""`` if unknown."""
        return self.targets[0][1] if self.targets else ""

    @property
    def devices(self) -> tuple[PreparedDevice, ...]:
        """Every prepared device, in group order."""
        return tuple(d for g in self.groups for d in g.devices)

    def held_devices(self) -> set[str]:
        """Names of our devices this claim holds: its non-adminAccess allocation results."""
        return requested_devices(self.status)


# -- the wire schema (Go structs) --------------------------------------------------------------

_NODE_SELECTOR_REQUIREMENT: Final = Struct(
    (Field("key", STRING), Field("operator", STRING), Field("values", Slice(STRING), True))
)
_NODE_SELECTOR: Final = Struct(
    (
        Field(
            "nodeSelectorTerms",
            Slice(
                Struct(
                    (
                        Field("matchExpressions", Slice(_NODE_SELECTOR_REQUIREMENT), True),
                        Field("matchFields", Slice(_NODE_SELECTOR_REQUIREMENT), True),
                    )
                )
            ),
        ),
    )
)
_DEVICE_TOLERATION: Final = Struct(
    (
        Field("key", STRING, True),
        Field("operator", STRING, True),
        Field("value", STRING, True),
        Field("effect", STRING, True),
        Field("tolerationSeconds", Ptr(INT), True),
    )
)
_RESULT: Final = Struct(
    (
        Field("request", STRING),
        Field("driver", STRING),
        Field("pool", STRING),
        Field("device", STRING),
        Field("adminAccess", Ptr(BOOL), True),
        Field("tolerations", Slice(_DEVICE_TOLERATION), True),
        Field("bindingConditions", Slice(STRING), True),
        Field("bindingFailureConditions", Slice(STRING), True),
        Field("shareID", Ptr(STRING), True),
        # resource.Quantity values: the API server sends them canonical, so kept as sent.
        Field("consumedCapacity", Map(Raw()), True),
    )
)
_CONFIG: Final = Struct(
    (
        Field("source", STRING),
        Field("requests", Slice(STRING), True),
        Field("opaque", Ptr(Struct((Field("driver", STRING), Field("parameters", Raw())))), True),
    )
)
_CONDITION: Final = Struct(
    (
        Field("type", STRING),
        Field("status", STRING),
        Field("observedGeneration", INT, True),
        Field("lastTransitionTime", Time()),
        Field("reason", STRING),
        Field("message", STRING),
    )
)
_DEVICE_STATUS: Final = Struct(
    (
        Field("driver", STRING),
        Field("pool", STRING),
        Field("device", STRING),
        Field("shareID", Ptr(STRING), True),
        Field("conditions", Slice(_CONDITION)),
        Field("data", Ptr(Raw()), True),
        Field(
            "networkData",
            Ptr(
                Struct(
                    (
                        Field("interfaceName", STRING, True),
                        Field("ips", Slice(STRING), True),
                        Field("hardwareAddress", STRING, True),
                    )
                )
            ),
            True,
        ),
    )
)
RESOURCE_CLAIM_STATUS: Final = Struct(
    (
        Field(
            "allocation",
            Ptr(
                Struct(
                    (
                        Field(
                            "devices",
                            Struct(
                                (
                                    Field("results", Slice(_RESULT), True),
                                    Field("config", Slice(_CONFIG), True),
                                )
                            ),
                            True,
                        ),
                        Field("nodeSelector", Ptr(_NODE_SELECTOR), True),
                        Field("allocationTimestamp", Ptr(Time()), True),
                    )
                )
            ),
            True,
        ),
        Field(
            "reservedFor",
            Slice(
                Struct(
                    (
                        Field("apiGroup", STRING, True),
                        Field("resource", STRING),
                        Field("name", STRING),
                        Field("uid", STRING),
                    )
                )
            ),
            True,
        ),
        Field("devices", Slice(_DEVICE_STATUS), True),
    )
)
_DEVICE: Final = Struct(
    (
        Field("Requests", Slice(STRING)),
        Field("PoolName", STRING),
        Field("DeviceName", STRING),
        Field("CDIDeviceIDs", Slice(STRING)),
        Field("ShareID", Ptr(STRING), True),
        Field("Metadata", Ptr(Raw()), True),
    )
)
_TYPED_DEVICE: Final = Struct(
    (Field("info", Ptr(Struct((Field("id", INT),)))), Field("device", Ptr(_DEVICE)))
)
_PREPARED_DEVICES: Final = Slice(
    Ptr(
        Struct(
            (
                Field(
                    "devices",
                    Slice(
                        Struct(
                            (
                                Field("channel", Ptr(_TYPED_DEVICE)),
                                Field("daemon", Ptr(_TYPED_DEVICE)),
                            )
                        )
                    ),
                ),
                Field(
                    "configState",
                    Struct((Field("Type", STRING), Field("ComputeDomain", STRING))),
                ),
            )
        )
    )
)
_CLAIM_V2: Final = Struct(
    (
        Field("checkpointState", STRING),
        Field("status", RESOURCE_CLAIM_STATUS, True),
        Field("preparedDevices", _PREPARED_DEVICES, True),
        Field("name", STRING, True),
        Field("namespace", STRING, True),
        Field("abortedAt", Ptr(Time()), True),
    )
)
_V2: Final = Struct(
    (
        Field("checksum", INT),
        Field("preparedClaims", Map(_CLAIM_V2), True),
        Field("nodeBootID", STRING, True),
    )
)
_V1: Final = Struct(
    (
        Field(
            "preparedClaims",
            Map(
                Struct(
                    (
                        Field("status", RESOURCE_CLAIM_STATUS, True),
                        Field("preparedDevices", _PREPARED_DEVICES, True),
                    )
                )
            ),
            True,
        ),
    )
)


def go_time(epoch: float) -> str:
    """``metav1.Time`` on the wire: RFC 3339 in UTC, whole seconds (``abortedAt``)."""
    return datetime.fromtimestamp(int(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_go_time(value: str) -> float:
    """Epoch seconds of a `go_time` string (as `decode_checkpoint` normalises every time)."""
    return datetime.fromisoformat(value).timestamp()


def same_status(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two canonical claim statuses are semantically equal.

    Compared by their Go marshal, so a status read back from the file (numbers kept as source
    text) equals the same status fetched from the API server.
    """
    return gojson.marshal(dict(a)) == gojson.marshal(dict(b))


def canonical_status(status: Any) -> dict[str, Any]:
    """A claim status as the Go driver stores it; `SchemaError` if it cannot be one."""
    out: dict[str, Any] = gojson.canonical(status, RESOURCE_CLAIM_STATUS, where="status")
    return out


# -- entries <-> wire ---------------------------------------------------------------------------


def _device_to_wire(device: PreparedDevice, fallback_kind: str) -> dict[str, Any]:
    kind, _, index = device.device_name.rpartition("-")
    if kind not in ("channel", "daemon"):
        kind = fallback_kind
    typed = {
        "info": {"id": int(index) if index.isdigit() else 0},
        "device": {
            "Requests": list(device.request_names),
            "PoolName": device.pool_name,
            "DeviceName": device.device_name,
            "CDIDeviceIDs": list(device.cdi_device_ids),
            "ShareID": device.share_id,
            "Metadata": device.metadata,
        },
    }
    return {
        "channel": typed if kind == "channel" else None,
        "daemon": typed if kind != "channel" else None,
    }


def _groups_to_wire(groups: tuple[DeviceGroup, ...]) -> list[dict[str, Any]]:
    return [
        {
            "devices": [_device_to_wire(d, g.kind) for d in g.devices],
            "configState": {"Type": g.kind, "ComputeDomain": g.domain_id},
        }
        for g in groups
    ]


def _groups_from_wire(raw: list[Any] | None) -> tuple[DeviceGroup, ...]:
    groups: list[DeviceGroup] = []
    for group in raw or []:
        if group is None:
            continue
        devices: list[PreparedDevice] = []
        for item in group["devices"] or []:
            typed = item["channel"] or item["daemon"]
            dev = (typed or {}).get("device")
            if dev is None:
                continue
            devices.append(
                PreparedDevice(
                    request_names=tuple(dev["Requests"] or ()),
                    pool_name=dev["PoolName"],
                    device_name=dev["DeviceName"],
                    cdi_device_ids=tuple(dev["CDIDeviceIDs"] or ()),
                    share_id=dev.get("ShareID"),
                    metadata=dev.get("Metadata"),
                )
            )
        state = group["configState"]
        groups.append(DeviceGroup(state["Type"], state["ComputeDomain"], tuple(devices)))
    return tuple(groups)


def _entry_from_wire(uid: str, raw: Mapping[str, Any]) -> ClaimEntry:
    state = raw.get("checkpointState", ClaimState.PREPARE_COMPLETED)
    try:
        claim_state = ClaimState(state)
    except ValueError as err:
        raise SchemaError(f"claim {uid}: unsupported checkpointState {state!r}") from err
    return ClaimEntry(
        uid=uid,
        state=claim_state,
        status=raw["status"],
        groups=_groups_from_wire(raw.get("preparedDevices")),
        namespace=raw.get("namespace", ""),
        name=raw.get("name", ""),
        aborted_at=raw.get("abortedAt"),
    )


def _claim_to_wire(entry: ClaimEntry) -> dict[str, Any]:
    return {
        "checkpointState": str(entry.state),
        "status": dict(entry.status),
        "preparedDevices": _groups_to_wire(entry.groups),
        "name": entry.name,
        "namespace": entry.namespace,
        "abortedAt": entry.aborted_at,
    }


def persisted(
    entries: Mapping[str, ClaimEntry], compatibility: CheckpointCompatibility
) -> dict[str, ClaimEntry]:
    """The entries a file of ``compatibility`` holds: without tombstones it cannot hold, and
    without devices' ``ShareID`` where its Go plugin has no such field (v25.12.0 would drop it
    on re-marshalling and then fail the checksum: `checkpoint is corrupted` on every Unprepare
    of the node, seen on real nodes for claims allocated while channel-0 was shareable)."""
    kept = {
        uid: e
        for uid, e in entries.items()
        if compatibility.keeps_aborted or e.state != ClaimState.PREPARE_ABORTED
    }
    if compatibility.keeps_share_id:
        return kept
    return {uid: _without_share_ids(e) for uid, e in kept.items()}


def _without_share_ids(entry: ClaimEntry) -> ClaimEntry:
    if not any(d.share_id for g in entry.groups for d in g.devices):
        return entry
    groups = tuple(
        replace(g, devices=tuple(replace(d, share_id=None) for d in g.devices))
        for g in entry.groups
    )
    return replace(entry, groups=groups)


def encode_checkpoint(
    entries: Mapping[str, ClaimEntry],
    *,
    boot_id: str,
    compatibility: CheckpointCompatibility = CheckpointCompatibility.V0_4_1,
) -> bytes:
    """The file the Go driver's ``MarshalCheckpoint`` writes for these entries, in the shape
    the Go plugins down to ``compatibility`` verify (`persisted` entries; no ``nodeBootID``
    below v0.4.0)."""
    claims = {uid: _claim_to_wire(e) for uid, e in persisted(entries, compatibility).items()}
    boot = boot_id if compatibility.keeps_boot_id else ""
    v2 = gojson.canonical(
        {"checksum": 0, "preparedClaims": claims, "nodeBootID": boot}, _V2, where="v2"
    )
    v2["checksum"] = gojson.checksum(gojson.marshal(v2))
    completed = {
        uid: {"status": c["status"], "preparedDevices": c["preparedDevices"]}
        for uid, c in claims.items()
        if c["checkpointState"] == ClaimState.PREPARE_COMPLETED
    }
    v1 = gojson.canonical({"preparedClaims": completed}, _V1, where="v1")
    top_checksum = gojson.checksum(gojson.marshal({"checksum": 0, "v1": v1}))
    return gojson.marshal({"checksum": top_checksum, "v1": v1, "v2": v2})


# -- reading ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodedCheckpoint:
    """Result of `decode_checkpoint`: entries from the verified sections and what was wrong."""

    entries: dict[str, ClaimEntry]
    boot_id: str
    problems: tuple[str, ...] = ()
    claims_seen: int = 0


def _verified(raw_form: Any, canonical_form: Any, expected: int) -> bool:
    """Whether ``expected`` is the checksum of the file's own bytes or of our re-marshal."""
    return expected in (
        gojson.checksum(gojson.marshal(raw_form)),
        gojson.checksum(gojson.marshal(canonical_form)),
    )


def _pick(doc: Mapping[str, Any], name: str) -> Any:
    """A top-level field, matched the way Go's decoder matches keys."""
    found = None
    for key, value in doc.items():
        if key == name or str(key).lower() == name:
            found = value
    return found


def _section(raw: Any, schema: Struct, where: str) -> tuple[dict[str, Any] | None, str]:
    if raw is None:
        return None, ""
    try:
        return gojson.canonical(raw, schema, where=where), ""
    except SchemaError as err:
        return None, f"undecodable {where}: {err}"


def decode_checkpoint(data: bytes) -> DecodedCheckpoint:
    """Parse and verify a checkpoint file.

    Raises `ValueError` if the file is not a checkpoint at all (not JSON, not an object, no
    numeric checksum, nested too deeply to decode); otherwise returns the entries of the
    verified section (v2, else v1) and one problem string per failed check -- no problems means
    the Go driver accepts the file too. Never raises anything else, whatever ``data`` holds.
    """
    try:
        return _decode(data)
    except RecursionError as err:
        raise ValueError("not a checkpoint: JSON nested too deeply to decode") from err


def _decode(data: bytes) -> DecodedCheckpoint:
    """`decode_checkpoint`'s phases: parse the top level, decode both sections, verify their
    checksums, convert the claims of the section to trust (v2, else v1)."""
    doc, top_checksum = _parse_top(data)
    problems: list[str] = []
    raw_v1, raw_v2 = _pick(doc, "v1"), _pick(doc, "v2")
    v1, problem = _section(raw_v1, _V1, "v1")
    problems += [problem] if problem else []
    v2, problem = _section(raw_v2, _V2, "v2")
    problems += [problem] if problem else []

    v1_ok = _v1_verified(raw_v1, v1, top_checksum)
    if not v1_ok:
        problems.append("v1 checksum mismatch")
    v2_ok, problem = _v2_verified(raw_v2, v2)
    problems += [problem] if problem else []

    seen = max(
        len((v2 or {}).get("preparedClaims") or {}),
        len((v1 or {}).get("preparedClaims") or {}),
        _count(raw_v1),
        _count(raw_v2),
    )  # claims in the file, whether or not they verified
    trusted_v2 = v2 if v2_ok else None
    boot_id = trusted_v2.get("nodeBootID", "") if trusted_v2 is not None else ""
    try:
        entries = _entries(v1 if v1_ok else None, trusted_v2)
    except SchemaError as err:
        problems.append(str(err))
        entries = {}
    return DecodedCheckpoint(
        entries=entries, boot_id=boot_id, problems=tuple(problems), claims_seen=seen
    )


def _parse_top(data: bytes) -> tuple[dict[Any, Any], int]:
    """The file's top-level object and its checksum; `ValueError` if it is not a checkpoint."""
    try:
        doc = gojson.loads(data)
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"not valid JSON: {err}") from err
    if not isinstance(doc, dict):
        raise ValueError("not a checkpoint: the top level is not a JSON object")
    try:
        top_checksum = gojson.canonical(_pick(doc, "checksum"), INT, where="checksum")
    except SchemaError as err:
        raise ValueError(f"not a checkpoint of this format: {err}") from err
    return doc, top_checksum


def _v1_verified(raw_v1: Any, v1: dict[str, Any] | None, top_checksum: int) -> bool:
    """Whether the top-level checksum covers the v1 section (absent counts as covered) and the
    section, if present, decoded."""
    return _verified(
        {"checksum": 0, **({"v1": raw_v1} if raw_v1 is not None else {})},
        {"checksum": 0, **({"v1": v1} if v1 is not None else {})},
        top_checksum,
    ) and (raw_v1 is None or v1 is not None)


def _v2_verified(raw_v2: Any, v2: dict[str, Any] | None) -> tuple[bool, str]:
    """Whether the v2 section decoded and matches its own checksum, and the problem if not
    (none for an absent or undecodable section: `_section` reported that already)."""
    if v2 is None:
        return False, ""
    if not isinstance(raw_v2, dict):
        return True, ""
    ok = _verified({**raw_v2, "checksum": 0}, {**v2, "checksum": 0}, v2["checksum"])
    return ok, "" if ok else "v2 checksum mismatch"


def _entries(v1: dict[str, Any] | None, v2: dict[str, Any] | None) -> dict[str, ClaimEntry]:
    """Entries of the verified section to trust: v2 if given, else v1; `SchemaError` if a claim
    in it does not convert."""
    section = v2 if v2 is not None else v1
    claims = (section or {}).get("preparedClaims") or {}
    return {uid: _entry_from_wire(uid, claim) for uid, claim in claims.items()}


def _count(raw: Any) -> int:
    claims = raw.get("preparedClaims") if isinstance(raw, dict) else None
    return len(claims) if isinstance(claims, dict) else 0
