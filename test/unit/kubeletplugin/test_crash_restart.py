"""The plugin is SIGKILLed between checkpoint steps, then restarted through the real entry point."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from testsupport.kp_harness import (
    CLIQUE,
    DRIVER_NS,
    NODE,
    Kubelet,
    channel_params,
    make_config,
    seed_claim,
    seed_domain,
)

from pkg.api import constants as c
from pkg.kube import resources as res
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
ENTRY = REPO / "cmd" / "compute-domain-kubelet-plugin" / "compute_domain_kubelet_plugin.py"


def start_real_plugin(api: FakeApiServer, root: Path) -> subprocess.Popen[bytes]:
    kubeconfig = root / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "fake",
                "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
            }
        )
    )
    fake_gpus = {"gpuCount": 2, "clusterUUID": CLIQUE.split(".")[0], "cliqueId": 7}
    env = {
        **os.environ,
        "NODE_NAME": NODE,
        "NAMESPACE": DRIVER_NS,
        "CDI_ROOT": str(root / "cdi"),
        "KUBELET_REGISTRAR_DIRECTORY_PATH": str(root / "reg"),
        "KUBELET_PLUGINS_DIRECTORY_PATH": str(root / "plugins"),
        "ALT_PROC_DEVICES_PATH": str(root / "proc-devices"),
        "KUBECONFIG": str(kubeconfig),
        "DEVICE_DISCOVERY": "fake",
        "FAKE_GPU_CONFIG": json.dumps(fake_gpus),
    }
    return subprocess.Popen([sys.executable, str(ENTRY)], env=env, cwd="/")


def answers(kubelet: Kubelet) -> bool:
    try:
        kubelet.get_info()
        kubelet.prepare(timeout=2)
    except grpc.RpcError:
        return False
    return True


@pytest.mark.parametrize("crash_at", ["PrepareStarted", "PrepareCompleted"])
def test_sigkill_between_checkpoint_steps(api: FakeApiServer, root: Path, crash_at: str) -> None:
    config = make_config(root)
    kubelet = Kubelet(config)
    cd = seed_domain(api)
    claim = seed_claim(api, params=channel_params(cd))
    uid = claim["metadata"]["uid"]
    crashing = subprocess.Popen(
        [sys.executable, "-m", "testsupport.kp_crashing_plugin", str(root), api.url, crash_at],
        stdout=subprocess.PIPE,
    )
    assert crashing.stdout is not None and crashing.stdout.readline().strip() == b"READY"
    with pytest.raises(grpc.RpcError):
        kubelet.prepare(claim, timeout=10)
    assert crashing.wait(10) == -signal.SIGKILL
    checkpoint = json.loads((config.plugin_dir / "checkpoint.json").read_text())
    assert checkpoint["v2"]["preparedClaims"][uid]["checkpointState"] == "PrepareStarted"

    plugin = start_real_plugin(api, root)
    try:
        eventually(lambda: answers(kubelet), 20)  # stale socket files exist until it rebinds
        result = kubelet.prepare(claim).claims[uid]
        assert result.error == ""
        assert list(result.devices[0].cdi_device_ids) == [f"{c.CDI_VENDOR}/claim={uid}-channel-0"]
        assert kubelet.unprepare(claim).claims[uid].error == ""
        node = api.client().get(res.NODES, NODE)
        assert c.COMPUTE_DOMAIN_LABEL not in (node["metadata"].get("labels") or {})
        plugin.send_signal(signal.SIGTERM)
        assert plugin.wait(15) == 0
        assert not config.dra_socket.exists() and not config.registration_socket.exists()
    finally:
        if plugin.poll() is None:
            plugin.kill()


def test_stale_started_entry_of_deleted_claim_is_unprepared_at_start(
    api: FakeApiServer, root: Path
) -> None:
    config = make_config(root)
    cd = seed_domain(api)
    claim = seed_claim(api, params=channel_params(cd))
    uid = claim["metadata"]["uid"]
    crashing = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "testsupport.kp_crashing_plugin",
            str(root),
            api.url,
            "PrepareCompleted",
        ],
        stdout=subprocess.PIPE,
    )
    assert crashing.stdout is not None and crashing.stdout.readline().strip() == b"READY"
    with pytest.raises(grpc.RpcError):
        Kubelet(config).prepare(claim, timeout=10)
    crashing.wait(10)
    api.client().delete(res.RESOURCE_CLAIMS, claim["metadata"]["name"], namespace="team")
    plugin = start_real_plugin(api, root)
    try:

        def cleaned() -> bool:
            # Unprepared, and left as upstream's PrepareAborted tombstone (no devices).
            doc = json.loads((config.plugin_dir / "checkpoint.json").read_text())
            entry = doc["v2"].get("preparedClaims", {}).get(uid, {})
            return (
                entry.get("checkpointState") == "PrepareAborted" and "preparedDevices" not in entry
            )

        eventually(cleaned, 20)
        node = api.client().get(res.NODES, NODE)
        assert c.COMPUTE_DOMAIN_LABEL not in (node["metadata"].get("labels") or {})
    finally:
        plugin.kill()
        plugin.wait(5)
