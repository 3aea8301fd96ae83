"""Stale-claim cleanup (`pkg.kubeletplugin.cleanup`): upstream's passes, outcomes and log lines.

The plugin runs on a fake clock against the in-process fake API server; each test reads the
checkpoint and the log records (message and klog level) a pass leaves behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from testsupport.kp_harness import channel_params, running_plugin, seed_claim, seed_domain

from pkg.api import constants as c
from pkg.base.types import JSON
from pkg.draplugin.claims import ClaimRef
from pkg.kube import resources as res
from pkg.kubeletplugin.checkpoint import ClaimEntry, ClaimState, canonical_status
from pkg.kubeletplugin.checkpointformat import encode_checkpoint
from pkg.kubeletplugin.cleanup import CLEANUP_INTERVAL, CheckpointCleanup
from pkg.runtime.logsetup import V
from pkg.testing.clock import FakeClock
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer

PREFIX = "Checkpointed RC cleanup: "


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=1_781_111_149.0)


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(1, logger="pkg.kubeletplugin")
    yield caplog


def cleanup_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.getMessage().startswith(PREFIX) or "in checkpoint" in r.getMessage()
    ]


def entry_of(claim: JSON, state: ClaimState = ClaimState.PREPARE_STARTED, **kw: Any) -> ClaimEntry:
    meta = claim["metadata"]
    fields: dict[str, Any] = {
        "uid": meta["uid"],
        "state": state,
        "status": canonical_status(claim["status"]),
        "namespace": meta["namespace"],
        "name": meta["name"],
    }
    fields.update(kw)
    return ClaimEntry(**fields)


def write_checkpoint(root: Path, *entries: ClaimEntry) -> None:
    directory = root / "plugins" / c.DRIVER_NAME
    directory.mkdir(parents=True, exist_ok=True)
    data = encode_checkpoint({e.uid: e for e in entries}, boot_id="boot-1")
    (directory / "checkpoint.json").write_bytes(data)


def ref(claim: JSON) -> str:
    meta = claim["metadata"]
    return f"{meta['namespace']}/{meta['name']}:{meta['uid']}"


def test_startup_pass_unprepares_only_stale_started_claims(
    api: FakeApiServer, root: Path, clock: FakeClock, logs: pytest.LogCaptureFixture
) -> None:
    cd = seed_domain(api)
    gone = seed_claim(api, params=channel_params(cd))
    alive = seed_claim(api, params=channel_params(cd))
    nameless = seed_claim(api, params=channel_params(cd))
    replaced = seed_claim(api, params=channel_params(cd))
    completed = seed_claim(api, params=channel_params(cd))
    api.client().delete(res.RESOURCE_CLAIMS, gone["metadata"]["name"], namespace="team")
    old_uid = "0a1b2c3d-0000-4000-8000-0000000000ff"  # the claim was re-created since
    write_checkpoint(
        root,
        entry_of(gone),
        entry_of(alive),
        entry_of(nameless, name="", namespace=""),
        entry_of(replaced, uid=old_uid),
        entry_of(completed, ClaimState.PREPARE_COMPLETED),
    )
    replaced_ref = f"team/{replaced['metadata']['name']}"
    with running_plugin(api, root, clock=clock) as (plugin, kubelet):
        states = {uid: e.state for uid, e in plugin.store.entries().items()}
        assert states == {
            gone["metadata"]["uid"]: ClaimState.PREPARE_ABORTED,
            alive["metadata"]["uid"]: ClaimState.PREPARE_STARTED,
            nameless["metadata"]["uid"]: ClaimState.PREPARE_STARTED,
            old_uid: ClaimState.PREPARE_ABORTED,
            completed["metadata"]["uid"]: ClaimState.PREPARE_COMPLETED,
        }
        nameless_uid, replaced_uid = nameless["metadata"]["uid"], replaced["metadata"]["uid"]
        expected = [
            (V(4), f"{PREFIX}claims in PrepareStarted state: 4 (of 5)"),
            (
                V(4),
                f"{PREFIX}partially prepared claim '{ref(gone)}' is stale: not found in API server",
            ),
            (V(6), f"Marked claim PrepareAborted in checkpoint: {ref(gone)}"),
            (V(0), f"{PREFIX}unprepared stale claim: {ref(gone)}"),
            (V(4), f"{PREFIX}partially prepared claim not stale: {ref(alive)}"),
            (V(4), f"{PREFIX}skip checkpointed claim '{nameless_uid}': RC name not in checkpoint"),
            (
                V(4),
                f"{PREFIX}partially prepared claim '{replaced_ref}' is stale: UID changed "
                f"(checkpoint: {old_uid}, API server: {replaced_uid})",
            ),
            (V(6), f"Marked claim PrepareAborted in checkpoint: {replaced_ref}:{old_uid}"),
            (V(0), f"{PREFIX}unprepared stale claim: {replaced_ref}:{old_uid}"),
        ]
        seen = cleanup_lines(logs)
        assert sorted(seen) == sorted(expected)
        # Per claim: looked up, marked Aborted by the Unprepare, then reported.
        assert seen.index(expected[1]) < seen.index(expected[2]) < seen.index(expected[3])
        assert seen.index(expected[6]) < seen.index(expected[7]) < seen.index(expected[8])
        # The kubelet's own Unprepare arrives later and finds the tombstone.
        logs.clear()
        assert kubelet.unprepare(gone).claims[gone["metadata"]["uid"]].error == ""
        assert [r.getMessage() for r in logs.records if "noop" in r.getMessage()] == [
            f"Unprepare noop: claim in PrepareAborted state: {ref(gone)}"
        ]


def test_periodic_pass_every_ten_minutes(
    api: FakeApiServer, root: Path, clock: FakeClock, logs: pytest.LogCaptureFixture
) -> None:
    cd = seed_domain(api)
    claim = seed_claim(api, params=channel_params(cd))
    uid = claim["metadata"]["uid"]
    write_checkpoint(root, entry_of(claim))
    with running_plugin(api, root, clock=clock) as (plugin, _kubelet):
        assert plugin.store.entries()[uid].state == ClaimState.PREPARE_STARTED
        api.client().delete(res.RESOURCE_CLAIMS, claim["metadata"]["name"], namespace="team")
        assert plugin.cleanup is not None
        eventually(lambda: 600.0 in clock.waits, what="the cleanup waits for its interval")
        clock.step(599)
        assert plugin.store.entries()[uid].state == ClaimState.PREPARE_STARTED
        clock.step(1)
        eventually(lambda: plugin.store.entries()[uid].state == ClaimState.PREPARE_ABORTED)
        assert (V(6), f"{PREFIX}task submitted") in cleanup_lines(logs)


def test_lookup_failure_skips_the_claim_until_the_next_pass(
    api: FakeApiServer, root: Path, clock: FakeClock, logs: pytest.LogCaptureFixture
) -> None:
    cd = seed_domain(api)
    claim = seed_claim(api, params=channel_params(cd))
    uid = claim["metadata"]["uid"]
    api.client().delete(res.RESOURCE_CLAIMS, claim["metadata"]["name"], namespace="team")
    write_checkpoint(root, entry_of(claim))
    api.inject_error("GET", res.RESOURCE_CLAIMS, 403, name=claim["metadata"]["name"])
    with running_plugin(api, root, clock=clock) as (plugin, _kubelet):
        assert plugin.store.entries()[uid].state == ClaimState.PREPARE_STARTED
        skipped = [m for lvl, m in cleanup_lines(logs) if "getClaimByName failed" in m]
        assert len(skipped) == 1 and skipped[0].startswith(
            f"{PREFIX}skip for checkpointed claim {uid}: getClaimByName failed (retry later): "
        )
        assert plugin.cleanup is not None
        plugin.cleanup.run_once()
        assert plugin.store.entries()[uid].state == ClaimState.PREPARE_ABORTED


def test_started_claim_does_not_block_channel_zero(
    api: FakeApiServer, root: Path, clock: FakeClock
) -> None:
    """Only PrepareCompleted claims hold channel 0 (upstream's
    ``assertImexChannelNotAllocated``); a completed one refuses a claim of another domain with
    upstream's text (one of its own domain would share the channel)."""
    cd = seed_domain(api)
    stuck = seed_claim(api, params=channel_params(seed_domain(api)))
    second = seed_claim(api, params=channel_params(cd))
    third = seed_claim(api, params=channel_params(seed_domain(api)))
    write_checkpoint(root, entry_of(stuck))  # its claim still exists: not stale
    with running_plugin(api, root, clock=clock) as (plugin, kubelet):
        assert plugin.store.entries()[stuck["metadata"]["uid"]].state == ClaimState.PREPARE_STARTED
        assert kubelet.prepare(second).claims[second["metadata"]["uid"]].error == ""
        error = kubelet.prepare(third).claims[third["metadata"]["uid"]].error
        assert error.endswith(
            f"allocation failed: channel 0 already allocated by claim {second['metadata']['uid']} "
            "(according to checkpoint)"
        ), error
        assert third["metadata"]["uid"] not in plugin.store.entries()


# -- idle: no timer while nothing can expire --------------------------------


class ScriptedClaims:
    """A `CheckpointedClaims` whose entries the test sets; counts the passes."""

    def __init__(self) -> None:
        self.current: dict[str, ClaimEntry] = {}
        self.passes = 0

    def entries(self) -> dict[str, ClaimEntry]:
        return dict(self.current)

    def unprepare(self, ref: ClaimRef, *, deadline: float) -> None:
        raise AssertionError(f"unexpected unprepare of {ref}")

    def expire_aborted(self, *, ttl: float) -> int:
        self.passes += 1  # the last step of every pass
        return 0


def nameless(uid: str, state: ClaimState) -> ClaimEntry:
    """An entry a pass looks at but leaves alone (no claim name to look up, not Aborted)."""
    return ClaimEntry(uid=uid, state=state, status={}, namespace="", name="")


def test_cleanup_sleeps_without_a_timer_until_an_entry_can_expire(api: FakeApiServer) -> None:
    """The 600 s pass ran forever; now it runs only while a Started or Aborted entry exists."""
    clock = FakeClock()
    claims = ScriptedClaims()
    claims.current = {"done": nameless("done", ClaimState.PREPARE_COMPLETED)}
    cleanup = CheckpointCleanup(claims=claims, client=api.client(), clock=clock)
    cleanup.start()
    try:
        assert claims.passes == 1  # the start-up pass
        assert clock.block_until_untimed_waiters(1), "the idle cleanup did not wait for a write"
        assert clock.waiters() == 0 and clock.waits == [] and not cleanup.pending()
        cleanup.checkpoint_changed(claims.current.values())  # a write with nothing to expire
        assert clock.block_until_untimed_waiters(1) and clock.waits == []
        # A Prepare records PrepareStarted: passes resume, the first one interval later.
        claims.current["new"] = nameless("new", ClaimState.PREPARE_STARTED)
        cleanup.checkpoint_changed(claims.current.values())
        assert clock.block_until_waiters(1)
        clock.step(CLEANUP_INTERVAL)
        eventually(lambda: claims.passes == 2 and clock.waiters() == 1, what="second pass")
        assert cleanup.pending()  # the entry is still there: next pass one interval later
        del claims.current["new"]  # completed and unprepared meanwhile
        clock.step(CLEANUP_INTERVAL)
        eventually(lambda: claims.passes == 3 and clock.untimed_waiters() == 1)
        assert clock.waiters() == 0 and not cleanup.pending()
    finally:
        cleanup.stop()


def test_a_write_during_a_pass_keeps_the_cleanup_armed(api: FakeApiServer) -> None:
    """A tombstone written while a pass runs may be missing from the pass's final read."""
    clock = FakeClock()
    claims = ScriptedClaims()
    cleanup = CheckpointCleanup(claims=claims, client=api.client(), clock=clock)
    late = nameless("late", ClaimState.PREPARE_ABORTED)
    real_expire = claims.expire_aborted

    def expire_then_write(*, ttl: float) -> int:
        cleanup.checkpoint_changed([late])  # the kubelet's Unprepare, after the pass read
        return real_expire(ttl=ttl)

    claims.expire_aborted = expire_then_write  # type: ignore[method-assign]
    cleanup.start()
    try:
        assert cleanup.pending() and clock.block_until_waiters(1)
    finally:
        cleanup.stop()


def test_plugin_checkpoint_writes_arm_the_cleanup(
    api: FakeApiServer, root: Path, clock: FakeClock
) -> None:
    """Wiring: the plugin hands every checkpoint write to the cleanup."""
    cd = seed_domain(api)
    claim = seed_claim(api, params=channel_params(cd))
    uid = claim["metadata"]["uid"]
    with running_plugin(api, root, clock=clock) as (plugin, kubelet):
        assert plugin.cleanup is not None and not plugin.cleanup.pending()  # empty checkpoint
        # Another writer (a second plugin instance) left the claim PrepareStarted ...
        write_checkpoint(root, entry_of(claim))
        assert not plugin.cleanup.pending()
        # ... and the kubelet's Unprepare here turns it into a tombstone that must expire.
        assert kubelet.unprepare(claim).claims[uid].error == ""
        assert plugin.store.entries()[uid].state == ClaimState.PREPARE_ABORTED
        assert plugin.cleanup.pending()
