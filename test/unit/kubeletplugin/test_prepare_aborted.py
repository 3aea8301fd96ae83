"""``PrepareAborted``: upstream v0.4.1+'s checkpoint tombstone, on the wire and in the plugin.

The wire test builds the expected file by hand, following the documented format (field order,
Go escaping) and checksum (FNV-1a 32 over go-spew's ``([]uint8)[b b b]`` rendering, computed
here independently of `gojson`), so it pins the format rather than our own writer's output.
The state-machine tests drive the plugin over its real sockets, on a fake clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from testsupport.kp_harness import (
    DRIVER_NS,
    NODE,
    channel_params,
    running_plugin,
    seed_claim,
    seed_domain,
)

from pkg.api import constants as c
from pkg.base.types import JSON
from pkg.kube import resources as res
from pkg.kubeletplugin.checkpoint import CheckpointStore, ClaimEntry, ClaimState, canonical_status
from pkg.kubeletplugin.checkpointformat import decode_checkpoint, encode_checkpoint
from pkg.runtime.logsetup import V
from pkg.testing.clock import FakeClock
from pkg.testing.fakeapiserver import FakeApiServer

FIXTURES = Path(__file__).parent / "testdata" / "upstream_checkpoint"
CD = "cd0e0f00-aaaa-4bbb-8ccc-000000000042"
UID_A = "0a1b2c3d-0000-4000-8000-00000000000a"
UID_B = "0a1b2c3d-0000-4000-8000-00000000000b"
# 2026-06-10T17:05:49Z
T0 = 1781111149.0


def spew_fnv32a(data: bytes) -> int:
    """The kubelet checkpoint checksum, written out from its definition."""
    rendered = ("([]uint8)[" + " ".join(str(b) for b in data) + "]").encode()
    h = 0x811C9DC5
    for byte in rendered:
        h ^= byte
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h


def test_checksum_definition_matches_a_file_the_go_driver_wrote() -> None:
    """Guards the hand-written checksum: it reproduces both checksums of a Go-written file."""
    raw = (FIXTURES / "v2-aborted.json").read_text()
    v1 = raw[raw.index('"v1":') + 5 : raw.index(',"v2":')]
    v2 = raw[raw.index('"v2":') + 5 : -1]
    top, v2_sum = int(raw[12 : raw.index(",")]), int(v2[12 : v2.index(",")])
    assert spew_fnv32a(f'{{"checksum":0,"v1":{v1}}}'.encode()) == top
    zeroed = '{"checksum":0' + v2[v2.index(",") :]
    assert spew_fnv32a(zeroed.encode()) == v2_sum


STATUS = (
    '{"allocation":{"devices":{"results":[{"request":"channel","driver":"compute-domain.nvidia.com",'
    '"pool":"node-a","device":"channel-0"}],"config":[{"source":"FromClaim","requests":["channel"],'
    '"opaque":{"driver":"compute-domain.nvidia.com","parameters":{"apiVersion":'
    '"resource.nvidia.com/v1beta1","kind":"ComputeDomainChannelConfig","domainID":"' + CD + '"}}}]'
    "}}}"
)
DEVICES = (
    '[{"devices":[{"channel":{"info":{"id":0},"device":{"Requests":["channel"],"PoolName":"node-a",'
    '"DeviceName":"channel-0","CDIDeviceIDs":["k8s.compute-domain.nvidia.com/claim=' + UID_A + "-"
    'channel-0"]}},"daemon":null}],"configState":{"Type":"channel","ComputeDomain":"' + CD + '"}}]'
)


def upstream_file() -> bytes:
    """A completed claim (name kept) and an aborted one, as upstream v0.5 writes them."""
    completed = (
        f'{{"checkpointState":"PrepareCompleted","status":{STATUS},"preparedDevices":{DEVICES},'
        '"name":"job","namespace":"team"}'
    )
    aborted = (
        f'{{"checkpointState":"PrepareAborted","status":{STATUS},"name":"w\\u003c1\\u003e",'
        '"namespace":"team","abortedAt":"2026-06-10T17:05:49Z"}'
    )
    claims = f'{{"{UID_A}":{completed},"{UID_B}":{aborted}}}'
    v2_tail = f',"preparedClaims":{claims},"nodeBootID":"boot-9"}}'
    v2_sum = spew_fnv32a(('{"checksum":0' + v2_tail).encode())
    v1 = f'{{"preparedClaims":{{"{UID_A}":{{"status":{STATUS},"preparedDevices":{DEVICES}}}}}}}'
    top = spew_fnv32a(f'{{"checksum":0,"v1":{v1}}}'.encode())
    return f'{{"checksum":{top},"v1":{v1},"v2":{{"checksum":{v2_sum}{v2_tail}}}'.encode()


def test_aborted_entry_round_trips_byte_for_byte() -> None:
    data = upstream_file()
    decoded = decode_checkpoint(data)
    assert decoded.problems == () and decoded.boot_id == "boot-9"
    aborted, completed = decoded.entries[UID_B], decoded.entries[UID_A]
    assert (aborted.state, aborted.aborted_at, aborted.name, aborted.groups) == (
        ClaimState.PREPARE_ABORTED,
        "2026-06-10T17:05:49Z",
        "w<1>",
        (),
    )
    assert (completed.state, completed.name, completed.namespace) == (
        ClaimState.PREPARE_COMPLETED,
        "job",
        "team",
    )
    assert encode_checkpoint(decoded.entries, boot_id="boot-9") == data


def test_our_tombstone_is_written_as_upstream_writes_it() -> None:
    """Built from our own model (not decoded from the file), the bytes are still upstream's."""
    status = canonical_status(decode_checkpoint(upstream_file()).entries[UID_A].status)
    completed = decode_checkpoint(upstream_file()).entries[UID_A]
    aborted = ClaimEntry(
        uid=UID_B,
        state=ClaimState.PREPARE_ABORTED,
        status=status,
        namespace="team",
        name="w<1>",
        aborted_at="2026-06-10T17:05:49Z",
    )
    entries = {UID_B: aborted, UID_A: completed}
    assert encode_checkpoint(entries, boot_id="boot-9") == upstream_file()


def test_store_keeps_tombstones_of_the_go_driver(tmp_path: Path) -> None:
    """They used to be dropped at start; now they survive a restart byte for byte."""
    (tmp_path / "checkpoint.json").write_bytes((FIXTURES / "v2-aborted.json").read_bytes())
    store = CheckpointStore(directory=tmp_path, boot_id="boot-1")
    assert not store.open().corrupt
    entry = store.entries()["5f0c9a52-3333-4e2b-9d7e-000000000003"]
    assert (entry.state, entry.aborted_at) == (ClaimState.PREPARE_ABORTED, "2026-05-02T08:00:00Z")
    assert store.path.read_bytes() == (FIXTURES / "v2-aborted.json").read_bytes()


# -- the state machine -------------------------------------------------------------------------


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=T0)


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(1, logger="pkg.kubeletplugin")
    yield caplog


def lines(caplog: pytest.LogCaptureFixture, prefix: str) -> list[tuple[int, str]]:
    """(level, message) of the records starting with ``prefix``."""
    return [
        (r.levelno, r.getMessage()) for r in caplog.records if r.getMessage().startswith(prefix)
    ]


def plugin_dir(root: Path) -> Path:
    return root / "plugins" / c.DRIVER_NAME


def write_checkpoint(root: Path, *entries: ClaimEntry) -> None:
    plugin_dir(root).mkdir(parents=True, exist_ok=True)
    data = encode_checkpoint({e.uid: e for e in entries}, boot_id="boot-1")
    (plugin_dir(root) / "checkpoint.json").write_bytes(data)


def started_entry(claim: JSON, **overrides: Any) -> ClaimEntry:
    meta = claim["metadata"]
    fields: dict[str, Any] = {
        "uid": meta["uid"],
        "state": ClaimState.PREPARE_STARTED,
        "status": canonical_status(claim["status"]),
        "namespace": meta["namespace"],
        "name": meta["name"],
    }
    fields.update(overrides)
    return ClaimEntry(**fields)


def node_label(api: FakeApiServer) -> str | None:
    labels = api.client().get(res.NODES, NODE)["metadata"].get("labels") or {}
    return labels.get(c.COMPUTE_DOMAIN_LABEL)


def set_node_label(api: FakeApiServer, value: str) -> None:
    node = api.client().get(res.NODES, NODE)
    node["metadata"].setdefault("labels", {})[c.COMPUTE_DOMAIN_LABEL] = value
    api.client().update(res.NODES, node)


def spec_path(root: Path, uid: str) -> Path:
    return root / "cdi" / f"{c.CDI_VENDOR}-claim_{uid}.yaml"


def text(claim: JSON) -> str:
    meta = claim["metadata"]
    return f"{meta['namespace']}/{meta['name']}:{meta['uid']}"


def test_unprepare_of_started_marks_it_aborted(
    api: FakeApiServer, root: Path, clock: FakeClock, logs: pytest.LogCaptureFixture
) -> None:
    """Devices are undone (label removed, CDI spec deleted) and the entry becomes a tombstone
    holding the status, the kubelet's name/namespace and ``abortedAt``; a second Unprepare is a
    no-op that touches nothing."""
    cd = seed_domain(api)
    claim = seed_claim(api, params=channel_params(cd))
    uid = claim["metadata"]["uid"]
    write_checkpoint(root, started_entry(claim, name="", namespace=""))
    set_node_label(api, cd)
    spec_path(root, uid).parent.mkdir(parents=True, exist_ok=True)
    spec_path(root, uid).write_text("cdiVersion: 0.5.0\n")
    with running_plugin(api, root, clock=clock) as (plugin, kubelet):
        clock.step(7)
        assert kubelet.unprepare(claim).claims[uid].error == ""
        entry = plugin.store.entries()[uid]
        assert (entry.state, entry.name, entry.namespace, entry.aborted_at, entry.groups) == (
            ClaimState.PREPARE_ABORTED,
            claim["metadata"]["name"],
            "team",
            "2026-06-10T17:05:56Z",
            (),
        )
        assert entry.status == canonical_status(claim["status"])
        assert node_label(api) is None and not spec_path(root, uid).exists()
        assert lines(logs, "Marked claim PrepareAborted") == [
            (V(6), f"Marked claim PrepareAborted in checkpoint: {text(claim)}")
        ]

        set_node_label(api, cd)  # e.g. another claim of the domain labelled it meanwhile
        spec_path(root, uid).write_text("cdiVersion: 0.5.0\n")
        assert kubelet.unprepare(claim).claims[uid].error == ""
        assert plugin.store.entries()[uid] == entry
        assert node_label(api) == cd and spec_path(root, uid).exists()
        assert lines(logs, "Unprepare noop") == [
            (V(2), f"Unprepare noop: claim in PrepareAborted state: {text(claim)}")
        ]


def test_prepare_of_aborted_claim_with_the_same_status_is_a_permanent_error(
    api: FakeApiServer, root: Path, clock: FakeClock
) -> None:
    cd = seed_domain(api)
    claim = seed_claim(api, params=channel_params(cd))
    uid = claim["metadata"]["uid"]
    write_checkpoint(root, started_entry(claim))
    with running_plugin(api, root, clock=clock) as (plugin, kubelet):
        assert kubelet.unprepare(claim).claims[uid].error == ""
        error = kubelet.prepare(claim).claims[uid].error
        assert error.endswith(
            f"permanent error: stale prepare for claim {text(claim)}: claim prepare was already "
            "aborted"
        ), error
        assert plugin.store.entries()[uid].state == ClaimState.PREPARE_ABORTED
        assert node_label(api) is None and not spec_path(root, uid).exists()


def test_prepare_of_aborted_claim_with_a_new_status_prepares_it(
    api: FakeApiServer, root: Path, clock: FakeClock, logs: pytest.LogCaptureFixture
) -> None:
    """A re-allocated claim (different status) is prepared normally; Unprepare of the completed
    claim then deletes its entry."""
    cd = seed_domain(api)
    claim = seed_claim(api, params=channel_params(cd))
    uid = claim["metadata"]["uid"]
    write_checkpoint(
        root,
        started_entry(claim, state=ClaimState.PREPARE_ABORTED, aborted_at="2026-06-10T17:00:00Z"),
    )
    claim["status"]["reservedFor"] = [{"resource": "pods", "name": "w", "uid": "pod-1"}]
    claim = api.client().update(res.RESOURCE_CLAIMS, claim, subresource="status")
    with running_plugin(api, root, clock=clock) as (plugin, kubelet):
        assert kubelet.prepare(claim).claims[uid].error == ""
        entry = plugin.store.entries()[uid]
        assert (entry.state, entry.name, entry.namespace, entry.aborted_at) == (
            ClaimState.PREPARE_COMPLETED,
            claim["metadata"]["name"],
            "team",
            None,
        )
        assert node_label(api) == cd and spec_path(root, uid).exists()

        assert kubelet.prepare(claim).claims[uid].error == ""
        assert lines(logs, "Skip prepare") == [
            (V(4), f"Skip prepare: claim already in PrepareCompleted state: {text(claim)}")
        ]
        assert kubelet.unprepare(claim).claims[uid].error == ""
        assert uid not in plugin.store.entries()
        assert node_label(api) is None and not spec_path(root, uid).exists()
        assert lines(logs, "Deleted claim") == [
            (V(6), f"Deleted claim from checkpoint: {text(claim)}")
        ]
        assert kubelet.unprepare(claim).claims[uid].error == ""
        assert lines(logs, "Unprepare noop") == [
            (V(2), f"Unprepare noop: claim not found in checkpoint data: {text(claim)}")
        ]
        # upstream's V(1) success lines, also for the idempotent and no-op calls
        assert (
            lines(logs, "Prepared devices")
            == [(V(1), f"Prepared devices for claim '{text(claim)}': [channel-0]")] * 2
        )
        assert (
            lines(logs, "Unprepared devices")
            == [(V(1), f"Unprepared devices for claim '{text(claim)}'")] * 2
        )


def test_aborted_entries_expire_after_90_seconds_in_the_cleanup_pass(
    api: FakeApiServer, root: Path, clock: FakeClock, logs: pytest.LogCaptureFixture
) -> None:
    cd = seed_domain(api)
    aborted = seed_claim(api, params=channel_params(cd))
    no_time = seed_claim(api, params=channel_params(cd))
    write_checkpoint(
        root,
        started_entry(aborted, state=ClaimState.PREPARE_ABORTED, aborted_at="2026-06-10T17:05:00Z"),
        started_entry(no_time, state=ClaimState.PREPARE_ABORTED),
    )
    with running_plugin(api, root, clock=clock) as (plugin, _kubelet):
        # The start-up pass (T0 = 17:05:49) expired only the entry without abortedAt.
        assert set(plugin.store.entries()) == {aborted["metadata"]["uid"]}
        assert plugin.cleanup is not None
        clock.step(40)  # 89 s after abortedAt
        plugin.cleanup.run_once()
        assert set(plugin.store.entries()) == {aborted["metadata"]["uid"]}
        clock.step(1)
        plugin.cleanup.run_once()
        assert plugin.store.entries() == {}
    assert (
        lines(logs, "Checkpointed RC cleanup: deleted expired")
        == [(V(4), "Checkpointed RC cleanup: deleted expired PrepareAborted claim entries: 1")] * 2
    )


def test_aborted_entries_block_nothing_and_are_not_counted(
    api: FakeApiServer, root: Path, clock: FakeClock
) -> None:
    """A tombstone of a channel claim holds no channel: another claim of the domain gets
    channel 0, and the prepared-devices gauge counts only completed claims."""
    cd = seed_domain(api)
    old = seed_claim(api, params=channel_params(cd))
    new = seed_claim(api, params=channel_params(cd))
    write_checkpoint(
        root,
        started_entry(old, state=ClaimState.PREPARE_ABORTED, aborted_at="2026-06-10T17:05:40Z"),
    )
    with running_plugin(api, root, clock=clock) as (plugin, kubelet):
        assert plugin.store.entries()[old["metadata"]["uid"]].state == ClaimState.PREPARE_ABORTED
        assert kubelet.prepare(new).claims[new["metadata"]["uid"]].error == ""
        counted = [
            s.value
            for m in plugin.metrics.registry.collect()
            for s in m.samples
            if s.name == "nvidia_dra_prepared_devices"
        ]
        assert sum(counted) == 1.0


def test_driver_namespace_claim_with_channel_and_daemon_prepares_both(
    api: FakeApiServer, root: Path, clock: FakeClock
) -> None:
    """Each config group is prepared (was: "expected exactly one device")."""
    cd = seed_domain(api, namespace=DRIVER_NS)
    claim = seed_claim(api, namespace=DRIVER_NS, params=channel_params(cd))
    devices = claim["status"]["allocation"]["devices"]
    devices["results"] = [
        {"request": "daemon", "driver": c.DRIVER_NAME, "pool": NODE, "device": "daemon-0"},
        {"request": "channel", "driver": c.DRIVER_NAME, "pool": NODE, "device": "channel-0"},
    ]
    daemon = {"apiVersion": c.API_VERSION, "kind": c.DAEMON_CONFIG_KIND, "domainID": cd}
    devices["config"] = [
        {
            "source": "FromClaim",
            "requests": ["channel"],
            "opaque": {"driver": c.DRIVER_NAME, "parameters": channel_params(cd)},
        },
        {
            "source": "FromClaim",
            "requests": ["daemon"],
            "opaque": {"driver": c.DRIVER_NAME, "parameters": daemon},
        },
    ]
    claim = api.client().update(res.RESOURCE_CLAIMS, claim, subresource="status")
    uid = claim["metadata"]["uid"]
    with running_plugin(api, root, clock=clock) as (plugin, kubelet):
        result = kubelet.prepare(claim).claims[uid]
        assert result.error == ""
        assert [(d.device_name, list(d.cdi_device_ids)) for d in result.devices] == [
            ("daemon-0", [f"{c.CDI_VENDOR}/device=all", f"{c.CDI_VENDOR}/claim={uid}-daemon-0"]),
            ("channel-0", [f"{c.CDI_VENDOR}/claim={uid}-channel-0"]),
        ]
        entry = plugin.store.entries()[uid]
        assert [(g.kind, g.domain_id) for g in entry.groups] == [("daemon", cd), ("channel", cd)]
        assert node_label(api) == cd
        assert (plugin_dir(root) / "domains" / cd).is_dir()
        assert kubelet.unprepare(claim).claims[uid].error == ""
        assert node_label(api) is None
        assert not (plugin_dir(root) / "domains" / cd).exists()
