"""The checkpoint file is the Go driver's: same shape, same checksums, byte for byte.

Fixtures in testdata/upstream_checkpoint/ were written by Go's ``MarshalCheckpoint`` (see the
README there); every test that reads them would fail with the previous, driver-private format.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from pkg.imex.mode import ImexModeConfig
from pkg.kubeletplugin import gojson
from pkg.kubeletplugin.checkpoint import (
    PREVIOUS_BOOT_FILE,
    TOMBSTONES_FILE,
    CheckpointStore,
    ClaimEntry,
    ClaimState,
    DeviceGroup,
    PreparedDevice,
    canonical_status,
)
from pkg.kubeletplugin.checkpointformat import (
    CheckpointCompatibility,
    decode_checkpoint,
    encode_checkpoint,
    persisted,
)
from pkg.kubeletplugin.options import parse_args, plugin_config

FIXTURES = Path(__file__).parent / "testdata" / "upstream_checkpoint"
CHANNEL_UID = "5f0c9a52-1111-4e2b-9d7e-000000000001"
DAEMON_UID = "5f0c9a52-2222-4e2b-9d7e-000000000002"
STARTED_UID = "5f0c9a52-3333-4e2b-9d7e-000000000003"
CD = "cd0e0f00-aaaa-4bbb-8ccc-000000000042"


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def install(directory: Path, name: str) -> Path:
    path = directory / "checkpoint.json"
    path.write_bytes(fixture(name))
    return path


# -- Go's primitives ------------------------------------------------------------------------------


def test_checksum_and_marshal_match_the_go_driver() -> None:
    raw = fixture("v2-completed-started.json")
    doc = gojson.loads(raw)
    assert gojson.marshal(doc) == raw  # Go's escaping (\u003c ...) and compact form
    top = gojson.checksum(gojson.marshal({"checksum": 0, "v1": doc["v1"]}))
    assert top == int(doc["checksum"])
    assert gojson.checksum(gojson.marshal({**doc["v2"], "checksum": 0})) == int(
        doc["v2"]["checksum"]
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("a<b>&c", b'"a\\u003cb\\u003e\\u0026c"'),
        ("\b\f\n\r\t\x01\u2028\x7f", b'"\\b\\f\\n\\r\\t\\u0001\\u2028\x7f"'),
        ("\ud800", '"\ufffd"'.encode()),
        ({"b": [1, True, None], "a": gojson.RawNumber("1.50")}, b'{"b":[1,true,null],"a":1.50}'),
        ({"f": [1.5, 1e300]}, b'{"f":[1.5,1e+300]}'),
    ],
    ids=["html", "control", "lone-surrogate", "order-and-raw-number", "float-in-raw-value"],
)
def test_marshal_escapes_like_go(value: Any, expected: bytes) -> None:
    assert gojson.marshal(value) == expected


def test_canonical_status_is_what_go_keeps() -> None:
    """Unknown fields (e.g. skipNodeOperations of a 1.37 server) drop, times lose sub-seconds,
    absent non-omitempty fields appear as Go's zero values, map keys sort."""
    api_status = {
        "allocation": {
            "allocationTimestamp": "2026-05-01T14:30:00.123+02:00",
            "devices": {
                "results": [
                    {
                        "device": "channel-0",
                        "request": "channel",
                        "driver": "compute-domain.nvidia.com",
                        "pool": "node-a",
                        "skipNodeOperations": ["x"],
                        "consumedCapacity": {"z": "1", "a": "2Gi"},
                    }
                ],
            },
        },
        "devices": [{"driver": "d", "pool": "p", "device": "x"}],
        "futureField": 1,
    }
    assert canonical_status(api_status) == {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "channel",
                        "driver": "compute-domain.nvidia.com",
                        "pool": "node-a",
                        "device": "channel-0",
                        "consumedCapacity": {"a": "2Gi", "z": "1"},
                    }
                ]
            },
            "allocationTimestamp": "2026-05-01T12:30:00Z",
        },
        "devices": [{"driver": "d", "pool": "p", "device": "x", "conditions": None}],
    }
    with pytest.raises(gojson.SchemaError, match="results"):
        canonical_status({"allocation": {"devices": {"results": "nope"}}})


# -- reading files the Go driver wrote ----------------------------------------------------------


def test_reads_upstream_v2_checkpoint() -> None:
    decoded = decode_checkpoint(fixture("v2-completed-started.json"))
    assert decoded.problems == () and decoded.boot_id == "boot-1"
    channel, daemon, started = (decoded.entries[u] for u in (CHANNEL_UID, DAEMON_UID, STARTED_UID))
    assert (channel.state, channel.targets) == (ClaimState.PREPARE_COMPLETED, (("channel", CD),))
    assert (channel.namespace, channel.name) == ("team", "workload-claim")
    assert channel.devices == (
        PreparedDevice(
            ("channel",),
            "node-a",
            "channel-0",
            (f"k8s.compute-domain.nvidia.com/claim={CHANNEL_UID}-channel-0",),
        ),
    )
    assert daemon.targets == (("daemon", CD),)
    assert daemon.devices[0].cdi_device_ids[0] == "k8s.compute-domain.nvidia.com/device=all"
    # A PrepareStarted entry has no devices: what to undo comes from its stored claim status.
    assert (started.state, started.devices, started.targets) == (
        ClaimState.PREPARE_STARTED,
        (),
        (("channel", CD),),
    )
    assert started.held_devices() == {"channel-0"}


@pytest.mark.parametrize(
    "name", ["v2-completed-started.json", "v2-no-boot-id.json", "v2-empty.json", "v2-aborted.json"]
)
def test_reencoding_reproduces_the_go_bytes(name: str) -> None:
    """What we write is exactly Go's MarshalCheckpoint output, so the Go driver's re-marshal
    matches and its checksum verification passes after a rollback."""
    decoded = decode_checkpoint(fixture(name))
    assert encode_checkpoint(decoded.entries, boot_id=decoded.boot_id) == fixture(name)


def test_store_writes_what_the_go_driver_writes(tmp_path: Path) -> None:
    entries = decode_checkpoint(fixture("v2-completed-started.json")).entries
    store = CheckpointStore(directory=tmp_path, boot_id="boot-1")
    store.open()
    for uid in (STARTED_UID, DAEMON_UID, CHANNEL_UID):
        store.put(entries[uid])
    assert store.path.read_bytes() == fixture("v2-completed-started.json")
    store.remove(STARTED_UID)
    store.remove(DAEMON_UID)
    store.remove(CHANNEL_UID)
    assert store.path.read_bytes() == fixture("v2-empty.json")


def test_store_keeps_upstream_entries_and_injects_missing_boot_id(tmp_path: Path) -> None:
    install(tmp_path, "v2-no-boot-id.json")
    store = CheckpointStore(directory=tmp_path, boot_id="boot-1")
    report = store.open()
    assert not report.corrupt and report.dropped_other_boot == ()
    assert set(store.entries()) == {CHANNEL_UID, DAEMON_UID, STARTED_UID}
    assert store.path.read_bytes() == fixture("v2-completed-started.json")


def test_store_reads_v1_only_checkpoint(tmp_path: Path) -> None:
    install(tmp_path, "v1-only.json")
    store = CheckpointStore(directory=tmp_path, boot_id="boot-1")
    assert not store.open().corrupt
    entries = store.entries()
    assert set(entries) == {CHANNEL_UID, DAEMON_UID}
    assert all(e.state == ClaimState.PREPARE_COMPLETED and e.name == "" for e in entries.values())
    assert entries[DAEMON_UID].targets == (("daemon", CD),)
    assert decode_checkpoint(store.path.read_bytes()).problems == ()


def test_store_keeps_aborted_tombstones(tmp_path: Path) -> None:
    install(tmp_path, "v2-aborted.json")
    store = CheckpointStore(directory=tmp_path, boot_id="boot-1")
    assert not store.open().corrupt
    assert set(store.entries()) == {CHANNEL_UID, DAEMON_UID, STARTED_UID}
    assert store.entries()[STARTED_UID].state == ClaimState.PREPARE_ABORTED
    assert store.path.read_bytes() == fixture("v2-aborted.json")


def test_store_drops_entries_of_another_boot(tmp_path: Path) -> None:
    install(tmp_path, "v2-completed-started.json")
    store = CheckpointStore(directory=tmp_path, boot_id="boot-2")
    report = store.open()
    assert {e.uid for e in report.dropped_other_boot} == {CHANNEL_UID, DAEMON_UID, STARTED_UID}
    assert store.entries() == {}
    assert json.loads(store.path.read_bytes())["v2"]["nodeBootID"] == "boot-2"


def test_round_trip_of_own_entries(tmp_path: Path) -> None:
    status = canonical_status(
        {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "r/sub", "driver": "d", "pool": "n", "device": "channel-0"}
                    ]
                }
            }
        }
    )
    entry = ClaimEntry(
        uid="a",
        state=ClaimState.PREPARE_COMPLETED,
        status=status,
        groups=(DeviceGroup("channel", "cd", (PreparedDevice(("r/sub",), "n", "channel-0", ()),)),),
        namespace="ns",
        name="c",
    )
    store = CheckpointStore(directory=tmp_path, boot_id="b1")
    store.open()
    store.put(entry)
    reopened = CheckpointStore(directory=tmp_path, boot_id="b1")
    assert not reopened.open().corrupt
    assert reopened.entries() == {"a": entry}


# -- rollback compatibility (--checkpoint-compatibility) ------------------------------------------

# The fields each older Go plugin's types lack (upstream-v0.5-delta.md, checkpoint section):
# its verification re-marshals the section without them, so one present fails the checksum.
LACKS = {
    CheckpointCompatibility.V0_4_1: ((), ()),
    CheckpointCompatibility.V0_4_0: ((), ("abortedAt",)),
    CheckpointCompatibility.V25_12_0: (("nodeBootID",), ("abortedAt",)),
}
# And in each prepared device (`CheckpointedDevice`): v25.12.0's has no ShareID.
LACKS_IN_DEVICE = {CheckpointCompatibility.V25_12_0: ("ShareID",)}


def _without_device_fields(claim: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """``claim`` (wire form) without ``fields`` in each prepared device."""
    if not fields or not claim.get("preparedDevices"):
        return claim
    claim = copy.deepcopy(claim)
    for group in claim["preparedDevices"]:
        for typed in group.get("devices") or []:
            for kind in typed.values():
                if kind and kind.get("device"):
                    for name in fields:
                        kind["device"].pop(name, None)
    return claim


def verifies_as(data: bytes, level: CheckpointCompatibility) -> bool:
    """What that Go plugin's VerifyChecksumV2 does to ``data`` (dropping what it lacks)."""
    v2 = gojson.loads(data)["v2"]
    top_fields, claim_fields = LACKS[level]
    known = {k: v for k, v in v2.items() if k not in top_fields}
    device_fields = LACKS_IN_DEVICE.get(level, ())
    known["preparedClaims"] = {
        uid: _without_device_fields(
            {k: v for k, v in claim.items() if k not in claim_fields}, device_fields
        )
        for uid, claim in (v2.get("preparedClaims") or {}).items()
    }
    if not known["preparedClaims"]:
        del known["preparedClaims"]
    return gojson.checksum(gojson.marshal({**known, "checksum": 0})) == int(v2["checksum"])


@pytest.mark.parametrize("level", list(CheckpointCompatibility))
def test_each_level_writes_what_that_go_plugin_verifies(level: CheckpointCompatibility) -> None:
    entries = decode_checkpoint(fixture("v2-aborted.json")).entries
    assert entries[STARTED_UID].state == ClaimState.PREPARE_ABORTED
    data = encode_checkpoint(entries, boot_id="boot-1", compatibility=level)
    assert verifies_as(data, level)
    v2 = json.loads(data)["v2"]
    assert ("nodeBootID" in v2) == level.keeps_boot_id
    assert (STARTED_UID in v2["preparedClaims"]) == level.keeps_aborted
    assert set(decode_checkpoint(data).entries) == set(persisted(entries, level))
    # The default (upstream's newest shape) is what v0.4.0 and v25.12.0 refuse.
    default = encode_checkpoint(entries, boot_id="boot-1")
    assert verifies_as(default, level) == (level == CheckpointCompatibility.V0_4_1)


def test_below_v0_4_1_tombstones_live_in_memory(tmp_path: Path) -> None:
    install(tmp_path, "v2-aborted.json")
    level = CheckpointCompatibility.V25_12_0
    store = CheckpointStore(directory=tmp_path, boot_id="boot-1", compatibility=level)
    assert not store.open().corrupt
    # open() rewrote the file in the shape v25.12.0 verifies; the tombstone stays ours.
    assert verifies_as(store.path.read_bytes(), level)
    assert STARTED_UID not in json.loads(store.path.read_bytes())["v2"]["preparedClaims"]
    assert store.entries()[STARTED_UID].state == ClaimState.PREPARE_ABORTED
    # Another instance (rolling update) writes the file: the memory-only tombstone survives.
    other = CheckpointStore(directory=tmp_path, boot_id="boot-1", compatibility=level)
    other.open()
    other.remove(CHANNEL_UID)
    assert set(store.entries()) == {DAEMON_UID, STARTED_UID}
    store.remove(STARTED_UID)  # the cleanup expires it
    assert set(store.entries()) == {DAEMON_UID}
    assert verifies_as(store.path.read_bytes(), level)


def with_share_id(entry: ClaimEntry, share_id: str, uid: str | None = None) -> ClaimEntry:
    """``entry`` (as claim ``uid``), its channel device allocated with ``share_id``."""
    [group] = entry.groups
    shared = dataclasses.replace(group.devices[0], share_id=share_id)
    return dataclasses.replace(
        entry, uid=uid or entry.uid, groups=(dataclasses.replace(group, devices=(shared,)),)
    )


def test_a_share_id_is_left_out_where_the_go_plugin_lacks_it(tmp_path: Path) -> None:
    """A claim allocated while channel-0 was shareable holds a ShareID even alone; v25.12.0
    would drop the field and fail the checksum (every Unprepare: `checkpoint is corrupted`,
    seen on real nodes). At its level the file leaves it out; at the others it stays."""
    entries = decode_checkpoint(fixture("v2-aborted.json")).entries
    entries[CHANNEL_UID] = with_share_id(entries[CHANNEL_UID], "share-1")
    for level in CheckpointCompatibility:
        data = encode_checkpoint(entries, boot_id="boot-1", compatibility=level)
        assert verifies_as(data, level), level
        assert ('"ShareID":"share-1"' in data.decode()) == level.keeps_share_id, level
        back = decode_checkpoint(data).entries[CHANNEL_UID]
        assert back == persisted(entries, level)[CHANNEL_UID]
    assert not verifies_as(
        encode_checkpoint(entries, boot_id="", compatibility=CheckpointCompatibility.V0_4_1),
        CheckpointCompatibility.V25_12_0,
    )


def test_a_shared_claim_at_v25_12_is_named_in_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    entries = decode_checkpoint(fixture("v2-aborted.json")).entries
    entries[CHANNEL_UID] = with_share_id(entries[CHANNEL_UID], "share-1")
    level = CheckpointCompatibility.V25_12_0
    # One claim holding channel-0 with a ShareID shares nothing: no warning.
    (tmp_path / "checkpoint.json").write_bytes(encode_checkpoint(entries, boot_id="boot-1"))
    with caplog.at_level("WARNING"):
        CheckpointStore(directory=tmp_path, boot_id="boot-1", compatibility=level).open()
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    # A second claim on the same device: both named.
    sibling = "0b6f3c1e-0000-4000-8000-000000000042"
    entries[sibling] = with_share_id(entries[CHANNEL_UID], "share-2", uid=sibling)
    (tmp_path / "checkpoint.json").write_bytes(encode_checkpoint(entries, boot_id="boot-1"))
    caplog.clear()
    store = CheckpointStore(directory=tmp_path, boot_id="boot-1", compatibility=level)
    with caplog.at_level("WARNING"):
        store.open()
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert CHANNEL_UID in warning and sibling in warning
    assert "v25.12.0" in warning and "drain" in warning
    default = CheckpointStore(directory=tmp_path, boot_id="boot-1")
    caplog.clear()
    with caplog.at_level("WARNING"):
        default.open()
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_plugin_flag_selects_the_level() -> None:
    opts = parse_args(["--node-name=n"], {"CHECKPOINT_COMPATIBILITY": "v25.12.0"})
    config = plugin_config(opts, imex=ImexModeConfig())
    assert config.checkpoint_compatibility is CheckpointCompatibility.V25_12_0
    default = plugin_config(parse_args(["--node-name=n"], {}), imex=ImexModeConfig())
    assert default.checkpoint_compatibility is CheckpointCompatibility.V0_4_1
    with pytest.raises(SystemExit):
        parse_args(["--node-name=n", "--checkpoint-compatibility=v0.3"], {})


# -- corrupt-file policy --------------------------------------------------------------------------


def tampered(name: str, section: str) -> bytes:
    """The fixture with one byte of a claim name changed inside ``section``."""
    raw = fixture(name)
    doc = gojson.loads(raw)
    body = gojson.marshal(doc[section])
    start = raw.index(body)
    bad = body.replace(b"node-a", b"node-b", 1)
    return raw[:start] + bad + raw[start + len(body) :]


def test_damaged_v2_recovers_completed_claims_from_v1(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.json").write_bytes(tampered("v2-completed-started.json", "v2"))
    store = CheckpointStore(directory=tmp_path, boot_id="boot-1", now=lambda: 1234.0)
    report = store.open()
    assert report.corrupt and "v2 checksum mismatch" in report.problem
    assert (report.recovered, report.lost) == (2, 1)
    assert report.moved_to == tmp_path / "checkpoint.json.corrupt-1234"
    assert report.moved_to.exists()
    assert set(store.entries()) == {CHANNEL_UID, DAEMON_UID}
    assert not CheckpointStore(directory=tmp_path, boot_id="boot-1").open().corrupt


def test_damaged_v1_recovers_everything_from_v2(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.json").write_bytes(tampered("v2-completed-started.json", "v1"))
    store = CheckpointStore(directory=tmp_path, boot_id="boot-1", now=lambda: 7.0)
    report = store.open()
    assert report.corrupt and "v1 checksum mismatch" in report.problem
    assert (report.recovered, report.lost) == (3, 0)
    assert store.path.read_bytes() == fixture("v2-completed-started.json")


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"\x00\xff",
        b"[]",
        b'{"checksum": 1, "v2": {"checksum": 2, "preparedClaims": {"x": {"status": 5}}}}',
        # The driver-private format of earlier builds of this driver.
        b'{"kind": "ComputeDomainPluginCheckpoint", "version": 1, "checksum": "sha256:00"}',
    ],
    ids=["truncated", "binary", "not-an-object", "wrong-types", "previous-private-format"],
)
def test_unusable_checkpoint_never_crashes(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "checkpoint.json").write_bytes(content)
    store = CheckpointStore(directory=tmp_path, boot_id="b1", now=lambda: 1.0)
    report = store.open()
    assert report.corrupt and report.problem
    assert (tmp_path / "checkpoint.json.corrupt-1").read_bytes() == content
    assert store.entries() == {}
    assert decode_checkpoint(store.path.read_bytes()).problems == ()


# -- what checkpoint.json cannot hold survives restarts (side files) ------------------------------


def reopen(directory: Path, boot_id: str, level: CheckpointCompatibility) -> CheckpointStore:
    """A new plugin process's store: nothing carried over in memory."""
    store = CheckpointStore(directory=directory, boot_id=boot_id, compatibility=level)
    assert not store.open().corrupt
    return store


@pytest.mark.parametrize("level", list(CheckpointCompatibility))
def test_tombstones_survive_two_restarts_at_every_level(
    tmp_path: Path, level: CheckpointCompatibility
) -> None:
    """Below v0.4.1 the file cannot hold a tombstone; two more restarts in the same boot still
    find it (a Prepare retry in flight must keep meeting it), and the Go plugin of that level
    still verifies checkpoint.json."""
    install(tmp_path, "v2-aborted.json")
    reopen(tmp_path, "boot-1", level)
    for _ in range(2):
        store = reopen(tmp_path, "boot-1", level)
        assert store.entries()[STARTED_UID].state == ClaimState.PREPARE_ABORTED
        assert verifies_as(store.path.read_bytes(), level)
    assert (tmp_path / TOMBSTONES_FILE).exists() == (not level.keeps_aborted)
    store.remove(STARTED_UID)  # the cleanup expires it
    assert STARTED_UID not in reopen(tmp_path, "boot-1", level).entries()
    assert not (tmp_path / TOMBSTONES_FILE).exists()


def test_tombstones_of_another_boot_are_dropped(tmp_path: Path) -> None:
    level = CheckpointCompatibility.V0_4_0
    install(tmp_path, "v2-aborted.json")
    reopen(tmp_path, "boot-1", level)
    assert STARTED_UID not in reopen(tmp_path, "boot-2", level).entries()


def test_previous_boot_entries_survive_restarts_until_taken(tmp_path: Path) -> None:
    """Entries dropped for another boot are kept in the previous-boot file: a second restart
    before their Unprepare still knows what they set up; taking one removes it for good; a
    later reboot adds to them, and tombstones are never kept (nothing to undo)."""
    install(tmp_path, "v2-aborted.json")
    store = reopen(tmp_path, "boot-2", CheckpointCompatibility.V0_4_1)
    assert store.entries() == {}
    kept = {CHANNEL_UID, DAEMON_UID}
    assert set(store.previous_boot()) == kept
    again = reopen(tmp_path, "boot-2", CheckpointCompatibility.V0_4_1)
    assert set(again.previous_boot()) == kept
    taken = again.take_previous_boot(CHANNEL_UID)
    assert taken is not None and taken.targets == (("channel", CD),)
    assert again.take_previous_boot(CHANNEL_UID) is None
    third = reopen(tmp_path, "boot-3", CheckpointCompatibility.V0_4_1)
    assert set(third.previous_boot()) == {DAEMON_UID}
    assert third.take_previous_boot(DAEMON_UID) is not None
    assert not (tmp_path / PREVIOUS_BOOT_FILE).exists()


def test_another_instance_sees_what_one_took(tmp_path: Path) -> None:
    """Two plugin instances (rolling update) under the node lock share the previous-boot file."""
    install(tmp_path, "v2-completed-started.json")
    first = reopen(tmp_path, "boot-2", CheckpointCompatibility.V0_4_1)
    second = reopen(tmp_path, "boot-2", CheckpointCompatibility.V0_4_1)
    assert second.take_previous_boot(CHANNEL_UID) is not None
    assert first.take_previous_boot(CHANNEL_UID) is None
    assert set(first.previous_boot()) == {DAEMON_UID, STARTED_UID}


@pytest.mark.parametrize("name", [PREVIOUS_BOOT_FILE, TOMBSTONES_FILE])
def test_a_side_file_that_does_not_verify_is_ignored_with_an_error(
    tmp_path: Path, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    install(tmp_path, "v2-completed-started.json")
    (tmp_path / name).write_bytes(b'{"checksum": 1, "v1": {}}')
    store = reopen(tmp_path, "boot-1", CheckpointCompatibility.V0_4_0)
    assert set(store.entries()) == {CHANNEL_UID, DAEMON_UID, STARTED_UID}
    assert store.previous_boot() == {}
    assert any(name in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)
