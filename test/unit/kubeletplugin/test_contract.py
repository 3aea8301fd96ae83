"""Contract tests: a python "kubelet" drives the plugin's real Unix sockets."""

from __future__ import annotations

import json
import os
import stat
import threading
import uuid
from pathlib import Path

import grpc
import pytest
from testsupport.kp_harness import (
    CLIQUE,
    DRIVER_NS,
    NODE,
    Kubelet,
    channel_params,
    running_plugin,
    seed_claim,
    seed_domain,
    set_daemon_ready,
)

from pkg.api import constants as c
from pkg.draplugin.proto.gen import grpc_health_v1_pb2 as hpb
from pkg.draplugin.proto.gen import grpc_health_v1_pb2_grpc as hgrpc
from pkg.kube import resources as res
from pkg.kubeletplugin.discovery.base import FabricInfo, GpuInfo
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer


def node_label(api: FakeApiServer) -> str | None:
    node = api.client().get(res.NODES, NODE)
    return (node["metadata"].get("labels") or {}).get(c.COMPUTE_DOMAIN_LABEL)


def classified(error: str) -> str:
    """The error after upstream's ``error preparing devices for claim '<ns>/<name>:<uid>': ``."""
    prefix, sep, rest = error.partition("': ")
    assert prefix.startswith("error preparing devices for claim '") and sep, error
    return rest


def cdi_spec(root: Path, uid: str) -> dict[str, object] | None:
    path = root / "cdi" / f"{c.CDI_VENDOR}-claim_{uid}.yaml"  # the Go driver's name
    return json.loads(path.read_text()) if path.exists() else None


def test_registration_handshake_and_socket_modes(api: FakeApiServer, root: Path) -> None:
    with running_plugin(api, root) as (plugin, kubelet):
        info = kubelet.get_info()
        assert info.type == "DRAPlugin"
        assert info.name == c.DRIVER_NAME
        assert info.endpoint == str(plugin.config.dra_socket)
        assert list(info.supported_versions) == [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
        ]
        kubelet.notify(False, "boom")
        assert plugin.registration.status.error == "boom"
        kubelet.notify(True)
        assert plugin.registration.status.registered
        for sock in (plugin.config.dra_socket, plugin.config.registration_socket):
            mode = os.stat(sock).st_mode
            assert stat.S_ISSOCK(mode)
            assert not mode & stat.S_IWOTH
    assert not plugin.config.dra_socket.exists()
    assert not plugin.config.registration_socket.exists()


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_prepare_and_unprepare_channel(api: FakeApiServer, root: Path, version: str) -> None:
    cd = seed_domain(api)
    claim = seed_claim(api, params=channel_params(cd))
    uid = claim["metadata"]["uid"]
    with running_plugin(api, root) as (_plugin, kubelet):
        assert kubelet.prepare(version=version).claims == {}
        resp = kubelet.prepare(claim, version=version)
        result = resp.claims[uid]
        assert result.error == ""
        (device,) = result.devices
        assert (device.pool_name, device.device_name) == (NODE, c.CHANNEL_DEVICE_NAME)
        assert list(device.request_names) == ["channel"]
        assert list(device.cdi_device_ids) == [f"{c.CDI_VENDOR}/claim={uid}-channel-0"]
        spec = cdi_spec(root, uid)
        assert spec is not None
        # Names not starting with a letter need CDI 0.5.0; otherwise 0.3.0 is enough.
        assert spec["cdiVersion"] == ("0.3.0" if uid[0].isalpha() else "0.5.0")
        nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]  # type: ignore[index]
        assert nodes == [
            {
                "path": "/dev/nvidia-caps-imex-channels/channel0",
                "type": "c",
                "major": 235,
                "minor": 0,
                "fileMode": 0o666,
            }
        ]
        assert node_label(api) == cd
        # Retries and duplicates: same answer, one entry per UID.
        again = kubelet.prepare(claim, claim, version=version)
        assert list(again.claims) == [uid] and again.claims[uid] == result
        un = kubelet.unprepare(claim, version=version)
        assert list(un.claims) == [uid] and un.claims[uid].error == ""
        assert node_label(api) is None
        assert cdi_spec(root, uid) is None
        assert kubelet.unprepare(claim, version=version).claims[uid].error == ""


def test_all_mode_injects_2048_channels(api: FakeApiServer, root: Path) -> None:
    cd = seed_domain(api)
    claim = seed_claim(api, params=channel_params(cd, allocationMode="All"))
    with running_plugin(api, root) as (_plugin, kubelet):
        assert kubelet.prepare(claim).claims[claim["metadata"]["uid"]].error == ""
        spec = cdi_spec(root, claim["metadata"]["uid"])
        assert spec is not None
        nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]  # type: ignore[index]
        assert len(nodes) == 2048
        assert {n["minor"] for n in nodes} == set(range(2048))


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"unexpectedField": 1}, 'strict decoding error: unknown field "unexpectedField"'),
        ({"allocationMode": "Many"}, 'field "allocationMode"'),
        ({"domainID": ""}, 'field "domainID"'),
    ],
    ids=["unknown-field", "bad-mode", "empty-domain"],
)
def test_bad_opaque_config_is_permanent_and_names_field(
    api: FakeApiServer, root: Path, params: dict[str, object], needle: str
) -> None:
    cd = seed_domain(api)
    claim = seed_claim(api, params={**channel_params(cd), **params})
    good = seed_claim(api, params=channel_params(cd))
    with running_plugin(api, root) as (_plugin, kubelet):
        resp = kubelet.prepare(claim, good)
        error = resp.claims[claim["metadata"]["uid"]].error
        assert classified(error).startswith("permanent error") and needle in error
        assert resp.claims[good["metadata"]["uid"]].error == ""  # plugin keeps serving


def test_malformed_requests_get_per_claim_errors(api: FakeApiServer, root: Path) -> None:
    unallocated = seed_claim(api, allocated=False)
    with running_plugin(api, root) as (_plugin, kubelet):
        missing = {"namespace": "team", "name": "ghost", "uid": "0000"}
        no_uid = {"namespace": "team", "name": "x", "uid": ""}
        resp = kubelet.prepare(missing, no_uid, unallocated)
        assert set(resp.claims) == {"0000", "", unallocated["metadata"]["uid"]}
        assert "not found" in resp.claims["0000"].error
        assert "uid" in resp.claims[""].error
        assert "not allocated" in resp.claims[unallocated["metadata"]["uid"]].error


def test_cross_namespace_and_missing_domain_are_permanent(api: FakeApiServer, root: Path) -> None:
    cd = seed_domain(api, namespace="other")
    claim = seed_claim(api, params=channel_params(cd))
    orphan = seed_claim(api, params=channel_params(str(uuid.uuid4())))
    with running_plugin(api, root) as (_plugin, kubelet):
        error = kubelet.prepare(claim).claims[claim["metadata"]["uid"]].error
        assert classified(error).startswith("permanent") and "namespace is different" in error
        # Names the claim's own namespace only: the domain's stays the other tenant's business.
        assert "(claim namespace team)" in error and "other" not in error
        error = kubelet.prepare(orphan).claims[orphan["metadata"]["uid"]].error
        assert classified(error).startswith("permanent") and "not found" in error
        assert node_label(api) is None


def test_waits_for_daemon_ready_event_and_times_out_retryably(
    api: FakeApiServer, root: Path
) -> None:
    cd = seed_domain(api, ready=False)
    claim = seed_claim(api, params=channel_params(cd))
    uid = claim["metadata"]["uid"]
    with running_plugin(api, root) as (_plugin, kubelet):
        # 3.2 s client deadline - 3 s safety margin = 0.2 s budget: no long real wait.
        resp = kubelet.prepare(claim, timeout=3.2)
        error = classified(resp.claims[uid].error)
        assert error.startswith("retryable error: current node not ready")
        assert node_label(api) == cd  # label stays so the daemon can be scheduled
        result: dict[str, object] = {}
        waiter = threading.Thread(target=lambda: result.update(r=kubelet.prepare(claim)))
        waiter.start()
        set_daemon_ready(api, cd, ready=True)
        waiter.join(10)
        assert result["r"].claims[uid].error == ""  # type: ignore[attr-defined]


def test_label_held_by_other_domain_is_retryable(api: FakeApiServer, root: Path) -> None:
    cd = seed_domain(api)
    node = api.client().get(res.NODES, NODE)
    node["metadata"]["labels"] = {c.COMPUTE_DOMAIN_LABEL: "someone-else"}
    api.client().update(res.NODES, node)
    claim = seed_claim(api, params=channel_params(cd))
    with running_plugin(api, root) as (_plugin, kubelet):
        error = kubelet.prepare(claim).claims[claim["metadata"]["uid"]].error
        assert classified(error).startswith("retryable") and "another ComputeDomain" in error
        assert node_label(api) == "someone-else"


def test_other_domains_channel_claim_waits_for_first(api: FakeApiServer, root: Path) -> None:
    cd = seed_domain(api)
    first = seed_claim(api, params=channel_params(cd))
    second = seed_claim(api, params=channel_params(seed_domain(api)))
    with running_plugin(api, root) as (_plugin, kubelet):
        assert kubelet.prepare(first).claims[first["metadata"]["uid"]].error == ""
        error = kubelet.prepare(second).claims[second["metadata"]["uid"]].error
        assert error.endswith(
            f"allocation failed: channel 0 already allocated by claim {first['metadata']['uid']} "
            "(according to checkpoint)"
        )
        kubelet.unprepare(first)
        assert kubelet.prepare(second).claims[second["metadata"]["uid"]].error == ""


def test_node_without_clique_gets_no_channel_device(api: FakeApiServer, root: Path) -> None:
    cd = seed_domain(api, clique="")
    claim = seed_claim(api, params=channel_params(cd))
    with running_plugin(api, root, clique="") as (_plugin, kubelet):
        result = kubelet.prepare(claim).claims[claim["metadata"]["uid"]]
        assert result.error == ""
        assert list(result.devices[0].cdi_device_ids) == []
        assert cdi_spec(root, claim["metadata"]["uid"]) is None


def test_daemon_claim_gets_domain_env_and_mount(api: FakeApiServer, root: Path) -> None:
    cd = seed_domain(api)
    params = {"apiVersion": c.API_VERSION, "kind": c.DAEMON_CONFIG_KIND, "domainID": cd}
    claim = seed_claim(
        api,
        namespace=DRIVER_NS,  # where the controller's daemon templates live
        device=c.DAEMON_DEVICE_NAME,
        request="daemon",
        params=params,
    )
    uid = claim["metadata"]["uid"]
    with running_plugin(api, root) as (plugin, kubelet):
        result = kubelet.prepare(claim).claims[uid]
        assert list(result.devices[0].cdi_device_ids) == [
            f"{c.CDI_VENDOR}/device=all",
            f"{c.CDI_VENDOR}/claim={uid}-daemon-0",
        ]
        edits = cdi_spec(root, uid)["devices"][0]["containerEdits"]  # type: ignore[index]
        assert f"CLIQUE_ID={CLIQUE}" in edits["env"] and f"COMPUTE_DOMAIN_UUID={cd}" in edits["env"]
        domain_dir = plugin.config.plugin_dir / "domains" / cd
        assert edits["mounts"][0] == {
            "containerPath": "/imexd",
            "hostPath": str(domain_dir),
            "options": ["rw", "nosuid", "nodev", "bind"],
        }
        assert domain_dir.is_dir()
        assert node_label(api) is None  # daemon claims never label
        kubelet.unprepare(claim)
        assert not domain_dir.exists()


@pytest.mark.parametrize(
    "namespace", ["team", "other"], ids=["the-domain's-namespace", "a-third-namespace"]
)
def test_daemon_claim_outside_the_driver_namespace_is_refused_without_side_effects(
    api: FakeApiServer, root: Path, namespace: str
) -> None:
    """The daemon device (IMEX management device, read-write host directory) is for the
    controller's daemon claims in the driver namespace only, even for the tenant's own domain."""
    cd = seed_domain(api, namespace="team")
    params = {"apiVersion": c.API_VERSION, "kind": c.DAEMON_CONFIG_KIND, "domainID": cd}
    claim = seed_claim(
        api, namespace=namespace, device=c.DAEMON_DEVICE_NAME, request="daemon", params=params
    )
    uid = claim["metadata"]["uid"]
    with running_plugin(api, root) as (plugin, kubelet):
        error = kubelet.prepare(claim).claims[uid].error
        assert classified(error) == (
            "permanent error: ComputeDomain daemon claims are only prepared in the driver "
            f"namespace {DRIVER_NS}"
        )
        assert uid not in plugin.store.entries()  # not even PrepareStarted
        assert not plugin.store.path.exists() or uid not in plugin.store.path.read_text()
        assert not (plugin.config.plugin_dir / "domains" / cd).exists()
        assert cdi_spec(root, uid) is None
        assert node_label(api) is None


def test_slice_published_and_recreated_after_deletion(api: FakeApiServer, root: Path) -> None:
    with running_plugin(api, root) as (plugin, _kubelet):
        first = eventually(lambda: api.objects(res.RESOURCE_SLICES))[0]
        spec = first["spec"]
        assert spec["nodeName"] == NODE and spec["driver"] == c.DRIVER_NAME
        assert spec["pool"]["name"] == NODE and spec["pool"]["resourceSliceCount"] == 1
        assert first["metadata"]["ownerReferences"][0]["kind"] == "Node"
        attrs = {d["name"]: d["attributes"] for d in spec["devices"]}
        assert attrs["channel-0"] == {
            "type": {"string": "channel"},
            "id": {"int": 0},
            "cliqueID": {"string": CLIQUE},
        }
        assert attrs["daemon-0"]["type"] == {"string": "daemon"}
        api.client().delete(res.RESOURCE_SLICES, plugin.slices.name)
        again = eventually(
            lambda: [
                s
                for s in api.objects(res.RESOURCE_SLICES)
                if s["metadata"]["uid"] != first["metadata"]["uid"]
            ]
        )
        assert again[0]["spec"]["devices"] == spec["devices"]


def test_health_checks_both_sockets(api: FakeApiServer, root: Path) -> None:
    with running_plugin(api, root, healthcheck_port=0) as (plugin, kubelet):
        assert plugin.health is not None
        with grpc.insecure_channel(f"127.0.0.1:{plugin.health.port}") as ch:
            stub = hgrpc.HealthStub(ch)

            def check(service: str) -> int:
                return stub.Check(hpb.HealthCheckRequest(service=service), timeout=10).status

            assert check("liveness") == hpb.HealthCheckResponse.SERVING
            assert check("registration") == hpb.HealthCheckResponse.UNKNOWN
            kubelet.notify(False, "rejected")
            assert check("registration") == hpb.HealthCheckResponse.NOT_SERVING
            assert check("checkpoint") == hpb.HealthCheckResponse.SERVING
            plugin.config.registration_socket.unlink()
            assert check("") == hpb.HealthCheckResponse.NOT_SERVING


def test_kubelet_fixture_type() -> None:
    assert Kubelet.__name__ == "Kubelet"


def test_base_spec_gpu_nodes_need_no_host_stat(api: FakeApiServer, root: Path) -> None:
    # The real CDI library stats a host node only when type/major are missing; fake-GPU nodes
    # have no /dev/nvidiaN, so the base spec must carry them explicitly.
    gpus = tuple(
        GpuInfo(index=i, uuid=f"GPU-{i}", minor=i, fabric=FabricInfo(supported=False))
        for i in range(2)
    )
    with running_plugin(api, root, gpus=gpus) as (plugin, _):
        spec = json.loads(plugin.cdi.base_spec_path().read_text())
    nodes = [
        n
        for n in spec["devices"][0]["containerEdits"]["deviceNodes"]
        if n["path"] != "/dev/nvidiactl"  # the management node every driver has
    ]
    assert nodes, "fake GPUs must appear in the base spec"
    assert len(nodes) == 2
    for minor, node in enumerate(nodes):
        assert node == {"path": f"/dev/nvidia{minor}", "type": "c", "major": 195, "minor": minor}
