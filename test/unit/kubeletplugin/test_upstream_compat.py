"""Drop-in replacement of the Go plugin: its checkpoint, Prepare semantics and texts.

A python "kubelet" drives the plugin's real sockets against the in-process fake API server.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import grpc
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
from pkg.draplugin.proto.gen import grpc_health_v1_pb2 as hpb
from pkg.draplugin.proto.gen import grpc_health_v1_pb2_grpc as hgrpc
from pkg.kube import resources as res
from pkg.kubeletplugin import gojson
from pkg.kubeletplugin.checkpoint import (
    ClaimEntry,
    ClaimState,
    DeviceGroup,
    PreparedDevice,
    canonical_status,
)
from pkg.kubeletplugin.checkpointformat import decode_checkpoint, encode_checkpoint
from pkg.testing.fakeapiserver import FakeApiServer

FIXTURES = Path(__file__).parent / "testdata" / "upstream_checkpoint"
CHANNEL_UID = "5f0c9a52-1111-4e2b-9d7e-000000000001"
DAEMON_UID = "5f0c9a52-2222-4e2b-9d7e-000000000002"
STARTED_UID = "5f0c9a52-3333-4e2b-9d7e-000000000003"
FIXTURE_CD = "cd0e0f00-aaaa-4bbb-8ccc-000000000042"


def node_labels(api: FakeApiServer) -> dict[str, str]:
    return dict(api.client().get(res.NODES, NODE)["metadata"].get("labels") or {})


def set_node_label(api: FakeApiServer, value: str) -> None:
    node = api.client().get(res.NODES, NODE)
    node["metadata"].setdefault("labels", {})[c.COMPUTE_DOMAIN_LABEL] = value
    api.client().update(res.NODES, node)


def go_spec_path(root: Path, uid: str) -> Path:
    """Where the Go plugin's CDI cache writes a claim spec (default extension .yaml)."""
    return root / "cdi" / f"{c.CDI_VENDOR}-claim_{uid}.yaml"


def base_specs(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "cdi").iterdir() if "-device_base." in p.name)


def daemon_params(cd: str) -> dict[str, Any]:
    return {"apiVersion": c.API_VERSION, "kind": c.DAEMON_CONFIG_KIND, "domainID": cd}


def ref(uid: str, name: str, namespace: str) -> dict[str, Any]:
    return {"metadata": {"uid": uid, "name": name, "namespace": namespace}}


# -- switching from the Go driver ------------------------------------------------------------------


def test_claims_prepared_by_the_go_driver_are_unprepared(api: FakeApiServer, root: Path) -> None:
    """The Go driver's file (same path, as it wrote it) is picked up, not moved aside: its stale
    PrepareStarted claim is collected, its completed claims unprepare cleanly -- node label,
    domain dir and the Go driver's ``.yaml`` CDI specs."""
    plugin_dir = root / "plugins" / c.DRIVER_NAME
    plugin_dir.mkdir(parents=True)
    (plugin_dir / "checkpoint.json").write_bytes(
        (FIXTURES / "v2-completed-started.json").read_bytes()
    )
    (plugin_dir / "domains" / FIXTURE_CD).mkdir(parents=True)
    (root / "cdi").mkdir()
    for uid in (CHANNEL_UID, DAEMON_UID):
        go_spec_path(root, uid).write_text("cdiVersion: 0.5.0\n")
    # The Go driver's base spec, and one an earlier build of this driver left as .json.
    (root / "cdi" / f"{c.CDI_VENDOR}-device_base.yaml").write_text("cdiVersion: 0.5.0\n")
    (root / "cdi" / f"{c.CDI_VENDOR}-device_base.json").write_text("{}")
    set_node_label(api, FIXTURE_CD)
    with running_plugin(api, root) as (plugin, kubelet):
        assert plugin.checkpoint_problem == ""
        # One definition of .../device=all (two would be a CDI conflict): the Go driver's file
        # name, with this driver's content.
        assert base_specs(root) == [f"{c.CDI_VENDOR}-device_base.yaml"]
        assert "NVIDIA_VISIBLE_DEVICES=void" in plugin.cdi.base_spec_path().read_text()
        # The stale PrepareStarted claim (gone from the API) is unprepared at start and left as
        # a PrepareAborted tombstone; the completed channel claim of the same domain keeps the
        # label.
        entries = plugin.store.entries()
        assert set(entries) == {CHANNEL_UID, DAEMON_UID, STARTED_UID}
        assert entries[STARTED_UID].state == ClaimState.PREPARE_ABORTED
        assert node_labels(api)[c.COMPUTE_DOMAIN_LABEL] == FIXTURE_CD

        resp = kubelet.unprepare(ref(CHANNEL_UID, "workload-claim", "team"))
        assert resp.claims[CHANNEL_UID].error == ""
        assert c.COMPUTE_DOMAIN_LABEL not in node_labels(api)
        assert not go_spec_path(root, CHANNEL_UID).exists()

        resp = kubelet.unprepare(ref(DAEMON_UID, "computedomain-daemon-x", "nvidia-dra-driver"))
        assert resp.claims[DAEMON_UID].error == ""
        assert not (plugin_dir / "domains" / FIXTURE_CD).exists()
        assert not go_spec_path(root, DAEMON_UID).exists()
        decoded = decode_checkpoint((plugin_dir / "checkpoint.json").read_bytes())
        assert decoded.problems == () and set(decoded.entries) == {STARTED_UID}


def test_damaged_go_checkpoint_keeps_the_verified_claims_and_reports_it(
    api: FakeApiServer, root: Path
) -> None:
    """Upstream crash-loops on a checksum mismatch; this driver keeps serving: the file is moved
    aside, the claims of the section that still verifies (v1: the completed ones) stay
    unpreparable, and health service ``checkpoint`` says NOT_SERVING (liveness stays SERVING)."""
    raw = (FIXTURES / "v2-completed-started.json").read_bytes()
    v2 = gojson.marshal(gojson.loads(raw)["v2"])
    damaged = raw.replace(v2, v2.replace(b"workload-claim", b"workload-clain"))
    plugin_dir = root / "plugins" / c.DRIVER_NAME
    plugin_dir.mkdir(parents=True)
    (plugin_dir / "checkpoint.json").write_bytes(damaged)
    set_node_label(api, FIXTURE_CD)
    with running_plugin(api, root, healthcheck_port=0) as (plugin, kubelet):
        assert "v2 checksum mismatch" in plugin.checkpoint_problem
        assert [p.read_bytes() for p in plugin_dir.glob("checkpoint.json.corrupt-*")] == [damaged]
        assert set(plugin.store.entries()) == {CHANNEL_UID, DAEMON_UID}
        assert plugin.health is not None
        with grpc.insecure_channel(f"127.0.0.1:{plugin.health.port}") as ch:
            stub = hgrpc.HealthStub(ch)
            status = {
                s: stub.Check(hpb.HealthCheckRequest(service=s), timeout=10).status
                for s in ("checkpoint", "liveness")
            }
        assert status == {
            "checkpoint": hpb.HealthCheckResponse.NOT_SERVING,
            "liveness": hpb.HealthCheckResponse.SERVING,
        }
        resp = kubelet.unprepare(ref(CHANNEL_UID, "workload-claim", "team"))
        assert resp.claims[CHANNEL_UID].error == ""
        assert c.COMPUTE_DOMAIN_LABEL not in node_labels(api)


def test_claim_completed_by_the_go_driver_is_served_from_its_record(
    api: FakeApiServer, root: Path
) -> None:
    """Prepare is idempotent across drivers: no side effect, the Go driver's devices back."""
    cd = seed_domain(api)
    claim = seed_claim(api, params=channel_params(cd), request="channel")
    uid = claim["metadata"]["uid"]
    recorded = PreparedDevice(("channel",), NODE, "channel-0", (f"{c.CDI_VENDOR}/claim={uid}-x",))
    entry = ClaimEntry(
        uid=uid,
        state=ClaimState.PREPARE_COMPLETED,
        status=canonical_status(claim["status"]),
        groups=(DeviceGroup("channel", cd, (recorded,)),),
        namespace="team",
        name=claim["metadata"]["name"],
    )
    plugin_dir = root / "plugins" / c.DRIVER_NAME
    plugin_dir.mkdir(parents=True)
    (plugin_dir / "checkpoint.json").write_bytes(encode_checkpoint({uid: entry}, boot_id="boot-1"))
    with running_plugin(api, root) as (_plugin, kubelet):
        result = kubelet.prepare(claim).claims[uid]
        assert result.error == ""
        assert list(result.devices[0].cdi_device_ids) == [f"{c.CDI_VENDOR}/claim={uid}-x"]
        assert c.COMPUTE_DOMAIN_LABEL not in node_labels(api)  # nothing was redone


def test_checkpoint_written_here_is_the_go_drivers_shape(api: FakeApiServer, root: Path) -> None:
    """Rollback direction: the file verifies under Go's rules and keeps subrequest names, while
    the kubelet gets them stripped (as the Go kubeletplugin library does)."""
    cd = seed_domain(api)
    claim = seed_claim(api, params=channel_params(cd), request="channel/fast")
    uid = claim["metadata"]["uid"]
    with running_plugin(api, root) as (plugin, kubelet):
        result = kubelet.prepare(claim).claims[uid]
        assert result.error == "" and list(result.devices[0].request_names) == ["channel"]
        raw = plugin.store.path.read_bytes()
    decoded = decode_checkpoint(raw)
    assert decoded.problems == () and decoded.boot_id == "boot-1"
    stored = decoded.entries[uid]
    assert stored.state == ClaimState.PREPARE_COMPLETED and stored.targets == (("channel", cd),)
    assert stored.devices[0].request_names == ("channel/fast",)
    assert encode_checkpoint(decoded.entries, boot_id="boot-1") == raw


# -- Prepare semantics -----------------------------------------------------------------------------


def test_daemon_device_held_by_another_claim_is_refused(api: FakeApiServer, root: Path) -> None:
    cd = seed_domain(api)
    first, second = (
        seed_claim(
            api,
            namespace=DRIVER_NS,
            device=c.DAEMON_DEVICE_NAME,
            request="daemon",
            params=daemon_params(cd),
        )
        for _ in range(2)
    )
    with running_plugin(api, root) as (_plugin, kubelet):
        assert kubelet.prepare(first).claims[first["metadata"]["uid"]].error == ""
        error = kubelet.prepare(second).claims[second["metadata"]["uid"]].error
        assert "retryable error: requested device daemon-0 is already allocated" in error
        assert first["metadata"]["uid"] in error
        kubelet.unprepare(first)
        assert kubelet.prepare(second).claims[second["metadata"]["uid"]].error == ""


@pytest.mark.parametrize("device", ["daemon-1", "channel-5"])
def test_unpublished_device_is_a_permanent_per_claim_error(
    api: FakeApiServer, root: Path, device: str
) -> None:
    cd = seed_domain(api)
    kind = device.split("-", maxsplit=1)[0]
    params = channel_params(cd) if kind == "channel" else daemon_params(cd)
    claim = seed_claim(api, device=device, request=kind, params=params)
    good = seed_claim(api, params=channel_params(cd))
    with running_plugin(api, root) as (_plugin, kubelet):
        resp = kubelet.prepare(claim, good)
        error = resp.claims[claim["metadata"]["uid"]].error
        assert f"permanent error: requested device is not allocatable: {device}" in error
        assert resp.claims[good["metadata"]["uid"]].error == ""
        assert c.COMPUTE_DOMAIN_LABEL in node_labels(api)  # only the good claim labelled


def test_error_texts_match_the_go_driver(
    api: FakeApiServer, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cd = seed_domain(api)
    claim = seed_claim(api, params=channel_params(cd, unexpectedField=1))
    meta = claim["metadata"]
    with caplog.at_level(logging.INFO), running_plugin(api, root) as (_plugin, kubelet):
        error = kubelet.prepare(claim).claims[meta["uid"]].error
    prefix = (
        f"error preparing devices for claim '{meta['namespace']}/{meta['name']}:{meta['uid']}': "
    )
    assert error.startswith(prefix + "permanent error: ")
    assert 'strict decoding error: unknown field "unexpectedField"' in error
    assert f"Permanent error preparing devices for claim {meta['uid']}: " in caplog.text
