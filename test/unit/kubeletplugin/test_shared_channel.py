"""Several pods of one ComputeDomain on one node: the node's channel shared.

Claims of the same domain share ``channel-0`` (one node label, one daemon, the channel device
in each claim's CDI spec, one checkpoint entry per claim with the scheduler's ``shareID``);
a claim of another domain is refused with upstream's text; Unprepare of one claim leaves the
others' channel, label and CDI spec until the last is gone; a restarted plugin picks all of it
up from the checkpoint. The slice's ``channel-0`` may be allocated several times and is tainted
for the domain using it, so the scheduler keeps other domains' claims away.
Fake API server, the plugin's real sockets, an injected clock.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from testsupport.kp_harness import (
    NODE,
    Kubelet,
    channel_params,
    running_plugin,
    seed_claim,
    seed_domain,
)

from pkg.api import constants as c
from pkg.api.channelshare import channel_taint
from pkg.base.types import JSON
from pkg.kube import resources as res
from pkg.kubeletplugin.checkpoint import CHECKPOINT_FILE, ClaimEntry, ClaimState, canonical_status
from pkg.kubeletplugin.checkpointformat import (
    CheckpointCompatibility,
    decode_checkpoint,
    encode_checkpoint,
)
from pkg.kubeletplugin.driver import KubeletPlugin
from pkg.kubeletplugin.state import channel_domain
from pkg.testing.clock import FakeClock
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer

CHANNEL_NODE = "/dev/nvidia-caps-imex-channels/channel0"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=1_781_111_149.0)


def shared_claim(api: FakeApiServer, cd: str) -> JSON:
    """A channel claim of ``cd`` as the scheduler allocates a shared ``channel-0``."""
    return seed_claim(api, params=channel_params(cd), share_id=str(uuid.uuid4()))


def uid(claim: JSON) -> str:
    return str(claim["metadata"]["uid"])


def prepare(kubelet: Kubelet, claim: JSON) -> Any:
    """The kubelet's answer for ``claim`` (``.error``, ``.devices``)."""
    return kubelet.prepare(claim).claims[uid(claim)]


def node_label(api: FakeApiServer) -> str | None:
    node = api.client().get(res.NODES, NODE)
    labels: dict[str, str] = node["metadata"].get("labels") or {}
    return labels.get(c.COMPUTE_DOMAIN_LABEL)


def cdi_nodes(root: Path, claim: JSON) -> list[str]:
    """Device-node paths of the claim's CDI spec (``[]`` when it has none)."""
    spec = root / "cdi" / f"{c.CDI_VENDOR}-claim_{uid(claim)}.yaml"
    if not spec.exists():
        return []
    doc = json.loads(spec.read_text())
    return [n["path"] for d in doc["devices"] for n in d["containerEdits"].get("deviceNodes", [])]


def channel_device(api: FakeApiServer) -> JSON:
    [obj] = api.objects(res.RESOURCE_SLICES)
    [channel] = [d for d in obj["spec"]["devices"] if d["name"] == c.CHANNEL_DEVICE_NAME]
    return dict(channel)


def taint_is(api: FakeApiServer, domain: str) -> None:
    """Wait until the published ``channel-0`` carries the taint of ``domain`` (none if "")."""
    want = [channel_taint(domain)] if domain else None
    eventually(
        lambda: api.objects(res.RESOURCE_SLICES) and channel_device(api).get("taints") == want,
        what=f"channel-0 tainted for {domain or 'nobody'}",
    )


def checkpoint(plugin: KubeletPlugin) -> dict[str, ClaimEntry]:
    """The checkpoint file as the Go driver reads it: it must verify."""
    decoded = decode_checkpoint(plugin.store.path.read_bytes())
    assert decoded.problems == ()
    return decoded.entries


def test_claims_of_one_domain_share_the_nodes_channel(
    api: FakeApiServer, root: Path, clock: FakeClock
) -> None:
    cd = seed_domain(api)
    first, second = shared_claim(api, cd), shared_claim(api, cd)
    with running_plugin(api, root, clock=clock) as (plugin, kubelet):
        eventually(lambda: api.objects(res.RESOURCE_SLICES), what="the slice")
        assert channel_device(api)["allowMultipleAllocations"] is True
        assert "taints" not in channel_device(api)  # a free channel: any domain may get it
        for claim in (first, second):
            answer = prepare(kubelet, claim)
            assert answer.error == ""
            assert [d.device_name for d in answer.devices] == [c.CHANNEL_DEVICE_NAME]
            assert cdi_nodes(root, claim) == [CHANNEL_NODE]  # the device in each pod
        assert node_label(api) == cd  # one label ...
        entries = checkpoint(plugin)  # ... and one entry per claim, upstream's shape
        assert {u: e.state for u, e in entries.items()} == {
            uid(first): ClaimState.PREPARE_COMPLETED,
            uid(second): ClaimState.PREPARE_COMPLETED,
        }
        for claim in (first, second):
            [device] = entries[uid(claim)].devices
            result = claim["status"]["allocation"]["devices"]["results"][0]
            assert device.share_id == result["shareID"]
            assert entries[uid(claim)].targets == (("channel", cd),)
        taint_is(api, cd)


def test_no_sharing_while_the_checkpoint_is_kept_for_v25_12(
    api: FakeApiServer, root: Path, clock: FakeClock
) -> None:
    """v25.12.0's checkpoint cannot record a shared device (no ShareID): at that
    ``--checkpoint-compatibility`` level ``channel-0`` is published exclusive, as upstream
    does, and stays untainted while a claim holds it."""
    cd = seed_domain(api)
    claim = seed_claim(api, params=channel_params(cd))
    level = CheckpointCompatibility.V25_12_0
    with running_plugin(api, root, clock=clock, compatibility=level) as (plugin, kubelet):
        eventually(lambda: api.objects(res.RESOURCE_SLICES), what="the slice")
        assert "allowMultipleAllocations" not in channel_device(api)
        assert prepare(kubelet, claim).error == ""
        assert set(checkpoint(plugin)) == {uid(claim)}
        assert "nodeBootID" not in json.loads(plugin.store.path.read_bytes())["v2"]
        assert "taints" not in channel_device(api)
        assert "allowMultipleAllocations" not in channel_device(api)


def test_a_claim_of_another_domain_is_refused_and_kept_away(
    api: FakeApiServer, root: Path, clock: FakeClock
) -> None:
    cd, other = seed_domain(api), seed_domain(api)
    first, foreign = shared_claim(api, cd), shared_claim(api, other)
    with running_plugin(api, root, clock=clock) as (plugin, kubelet):
        assert prepare(kubelet, first).error == ""
        error = prepare(kubelet, foreign).error
        assert error.endswith(
            f"allocation failed: channel 0 already allocated by claim {uid(first)} "
            "(according to checkpoint)"
        ), error
        assert "retryable error: allocation failed" in error, error
        assert uid(foreign) not in plugin.store.entries()
        assert cdi_nodes(root, foreign) == []
        assert node_label(api) == cd
        taint_is(api, cd)  # the scheduler keeps the other domain's claims off this node


def test_unprepare_leaves_the_others_channel_until_the_last(
    api: FakeApiServer, root: Path, clock: FakeClock
) -> None:
    cd = seed_domain(api)
    claims = [shared_claim(api, cd) for _ in range(3)]
    with running_plugin(api, root, clock=clock) as (plugin, kubelet):
        for claim in claims:
            assert prepare(kubelet, claim).error == ""
        taint_is(api, cd)
        for i, claim in enumerate(claims):
            for _ in range(2):  # Unprepare is idempotent
                assert kubelet.unprepare(claim).claims[uid(claim)].error == ""
            rest = claims[i + 1 :]
            assert set(plugin.store.entries()) == {uid(r) for r in rest}
            assert cdi_nodes(root, claim) == []
            for other in rest:
                assert cdi_nodes(root, other) == [CHANNEL_NODE]
            assert node_label(api) == (cd if rest else None)
            taint_is(api, cd if rest else "")
        # The channel is free again: another domain's claim is prepared.
        fresh = shared_claim(api, seed_domain(api))
        assert prepare(kubelet, fresh).error == ""


def test_a_started_claim_of_the_domain_keeps_the_label(
    api: FakeApiServer, root: Path, clock: FakeClock
) -> None:
    """A claim of the domain still being prepared (PrepareStarted, e.g. by a plugin killed
    while it waited for the daemon) needs the label too: the completed one's Unprepare leaves
    it, the Started one's removes it (and leaves upstream's tombstone)."""
    cd = seed_domain(api)
    done, pending = shared_claim(api, cd), shared_claim(api, cd)
    started = ClaimEntry(
        uid=uid(pending),
        state=ClaimState.PREPARE_STARTED,
        status=canonical_status(pending["status"]),
        namespace="team",
        name=pending["metadata"]["name"],
    )
    directory = root / "plugins" / c.DRIVER_NAME
    directory.mkdir(parents=True)
    (directory / CHECKPOINT_FILE).write_bytes(encode_checkpoint({started.uid: started}, boot_id=""))
    with running_plugin(api, root, clock=clock) as (plugin, kubelet):
        assert plugin.store.entries()[uid(pending)].state == ClaimState.PREPARE_STARTED
        assert prepare(kubelet, done).error == ""
        assert kubelet.unprepare(done).claims[uid(done)].error == ""
        assert node_label(api) == cd
        taint_is(api, cd)
        assert kubelet.unprepare(pending).claims[uid(pending)].error == ""
        assert node_label(api) is None
        assert plugin.store.entries()[uid(pending)].state == ClaimState.PREPARE_ABORTED
        taint_is(api, "")


def test_restart_picks_the_shared_channel_up_from_the_checkpoint(
    api: FakeApiServer, root: Path, clock: FakeClock
) -> None:
    cd = seed_domain(api)
    first, second = shared_claim(api, cd), shared_claim(api, cd)
    with running_plugin(api, root, clock=clock) as (_plugin, kubelet):
        before = {uid(c_): prepare(kubelet, c_).devices for c_ in (first, second)}
    api.client().delete(res.RESOURCE_SLICES, f"{NODE}-{c.DRIVER_NAME}")  # as the kubelet does
    with running_plugin(api, root, clock=clock) as (plugin, kubelet):
        taint_is(api, cd)  # published from the checkpoint, before any call
        for claim in (first, second):  # the kubelet re-prepares after a restart: same answer
            assert prepare(kubelet, claim).devices == before[uid(claim)]
        assert kubelet.unprepare(first).claims[uid(first)].error == ""
        assert node_label(api) == cd
        assert cdi_nodes(root, second) == [CHANNEL_NODE]
        assert set(checkpoint(plugin)) == {uid(second)}
        assert kubelet.unprepare(second).claims[uid(second)].error == ""
        assert node_label(api) is None
        taint_is(api, "")


def _entry(uid_: str, state: ClaimState, domain: str) -> ClaimEntry:
    status = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "r",
                        "driver": c.DRIVER_NAME,
                        "pool": NODE,
                        "device": c.CHANNEL_DEVICE_NAME,
                    }
                ],
                "config": [
                    {
                        "source": "FromClaim",
                        "requests": [],
                        "opaque": {"driver": c.DRIVER_NAME, "parameters": channel_params(domain)},
                    }
                ],
            }
        }
    }
    return ClaimEntry(uid=uid_, state=state, status=status)


@pytest.mark.parametrize(
    ("entries", "want"),
    [
        ([], ""),
        ([("a", ClaimState.PREPARE_ABORTED, "d-1")], ""),
        ([("a", ClaimState.PREPARE_STARTED, "d-1")], "d-1"),
        (
            [("a", ClaimState.PREPARE_STARTED, "d-1"), ("b", ClaimState.PREPARE_COMPLETED, "d-2")],
            "d-2",
        ),
        (
            [("b", ClaimState.PREPARE_STARTED, "d-2"), ("a", ClaimState.PREPARE_STARTED, "d-1")],
            "d-1",
        ),
    ],
    ids=["none", "aborted-holds-nothing", "started", "completed-first", "lowest-uid"],
)
def test_channel_domain(entries: list[tuple[str, ClaimState, str]], want: str) -> None:
    domains = {d: str(uuid.uuid5(uuid.NAMESPACE_OID, d)) for d in ("d-1", "d-2")}
    got = channel_domain(_entry(u, s, domains[d]) for u, s, d in entries)
    assert got == (domains[want] if want else "")


def _reboot(api: FakeApiServer, root: Path) -> None:
    """What a reboot leaves the plugin: its checkpoint under another boot ID (``/var/lib``
    stays), and no ResourceSlice (the kubelet deletes them when the plugin goes)."""
    path = root / "plugins" / c.DRIVER_NAME / CHECKPOINT_FILE
    entries = decode_checkpoint(path.read_bytes()).entries
    path.write_bytes(encode_checkpoint(dict(entries), boot_id="the-previous-boot"))
    api.client().delete(res.RESOURCE_SLICES, f"{NODE}-{c.DRIVER_NAME}")


@pytest.mark.parametrize("restarts", [1, 3], ids=["one-start", "two-more-restarts"])
@pytest.mark.parametrize("pod_still_runs", [True, False])
def test_a_claim_unprepared_after_a_reboot_takes_its_label_along(
    api: FakeApiServer, root: Path, clock: FakeClock, pod_still_runs: bool, restarts: int
) -> None:
    """After a reboot the plugin drops the previous boot's entries, but the node label they set
    is API state and outlived the reboot. The kubelet re-prepares the claim of a pod that still
    runs and only unprepares the claim of a pod deleted meanwhile: that Unprepare removes the
    label unless a claim of this boot still needs it (found by the real-node chaos soak: a
    reboot during pod deletion left the domain's daemon pod for minutes). Plugin restarts
    between the reboot and the kubelet's calls change nothing: what the dropped entries set up
    is kept on disk, not in one process's memory."""
    cd = seed_domain(api)
    kept, deleted = shared_claim(api, cd), shared_claim(api, cd)
    with running_plugin(api, root, clock=clock) as (_plugin, kubelet):
        for claim in (kept, deleted):
            assert prepare(kubelet, claim).error == ""
    _reboot(api, root)
    for _ in range(restarts - 1):
        with running_plugin(api, root, clock=clock):
            pass
    with running_plugin(api, root, clock=clock) as (plugin, kubelet):
        assert checkpoint(plugin) == {}
        assert node_label(api) == cd  # outlived the reboot
        if pod_still_runs:
            assert prepare(kubelet, kept).error == ""
        for _ in range(2):  # idempotent
            assert kubelet.unprepare(deleted).claims[uid(deleted)].error == ""
        assert node_label(api) == (cd if pod_still_runs else None)
        assert kubelet.unprepare(kept).claims[uid(kept)].error == ""
        assert node_label(api) is None
