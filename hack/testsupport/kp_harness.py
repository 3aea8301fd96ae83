"""Test harness: fake API server objects, a plugin under test and a python "kubelet" client.

The "kubelet" is `pkg.draplugin.client` (the same client the kubelet stand-in and the plugin's
liveness probe use) over the plugin's real Unix sockets.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pkg.api import constants as c
from pkg.base.clock import Clock
from pkg.base.types import JSON
from pkg.draplugin.claims import ClaimRef
from pkg.draplugin.client import DraClient, RegistrationClient
from pkg.draplugin.proto.gen import kubelet_pluginregistration_v1_pb2 as reg
from pkg.kube import resources as res
from pkg.kubeletplugin.checkpointformat import CheckpointCompatibility
from pkg.kubeletplugin.discovery import NodeDevices
from pkg.kubeletplugin.discovery.base import GpuInfo
from pkg.kubeletplugin.driver import KubeletPlugin, PluginConfig
from pkg.testing.fakeapiserver import FakeApiServer

NODE = "node-a"
DRIVER_NS = "nvidia-dra-driver"
CLIQUE = "2c9f7d4e-3b1a-4e5f-9a8b-7c6d5e4f3a2b.7"
PROC_DEVICES = (
    "Character devices:\n  1 mem\n195 nvidia\n235 nvidia-caps-imex-channels\n"
    "236 nvidia-caps\n\nBlock devices:\n  8 sd\n"
)


@contextmanager
def short_tmpdir() -> Iterator[Path]:
    # Unix socket paths must stay under 108 bytes; pytest's tmp_path can be too long.
    path = Path(tempfile.mkdtemp(prefix="kp", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def make_config(root: Path, *, healthcheck_port: int = -1) -> PluginConfig:
    (root / "proc-devices").write_text(PROC_DEVICES)
    (root / "boot_id").write_text("boot-1\n")
    return PluginConfig(
        node_name=NODE,
        namespace=DRIVER_NS,
        cdi_root=root / "cdi",
        registrar_dir=root / "reg",
        plugins_dir=root / "plugins",
        proc_devices=root / "proc-devices",
        imex_mgmt_caps_file=root / "no-caps",
        healthcheck_port=healthcheck_port,
        boot_id_file=root / "boot_id",
        retry_delay=0.05,
        domain_grace=0.1,
    )


def seed_world(api: FakeApiServer, *, node: str = NODE) -> None:
    api.seed(res.NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})


def seed_domain(
    api: FakeApiServer,
    *,
    namespace: str = "team",
    ready: bool = True,
    clique: str = CLIQUE,
    node: str = NODE,
) -> str:
    cd = api.seed(
        res.COMPUTE_DOMAINS,
        {
            "apiVersion": c.API_VERSION,
            "kind": c.COMPUTE_DOMAIN_KIND,
            "metadata": {"name": f"cd-{uuid.uuid4().hex[:6]}", "namespace": namespace},
            "spec": {"channel": {"resourceClaimTemplate": {"name": "rct"}}},
            "status": {
                "status": "Ready",
                "nodes": [
                    {"name": node, "status": "Ready" if ready else "NotReady", "cliqueID": clique}
                ],
            }
            if not clique
            else {},
        },
    )
    uid = str(cd["metadata"]["uid"])
    if clique:
        set_daemon_ready(api, uid, ready=ready, node=node)
    return uid


def set_daemon_ready(api: FakeApiServer, cd_uid: str, *, ready: bool, node: str = NODE) -> None:
    client = api.client()
    name = c.clique_object_name(cd_uid, CLIQUE)
    daemons = [
        {
            "nodeName": node,
            "ipAddress": "10.0.0.1",
            "cliqueID": CLIQUE,
            "index": 0,
            "status": "Ready" if ready else "NotReady",
        }
    ]
    try:
        obj = client.get(res.COMPUTE_DOMAIN_CLIQUES, name, namespace=DRIVER_NS)
        obj["daemons"] = daemons
        client.update(res.COMPUTE_DOMAIN_CLIQUES, obj)
    except Exception:
        api.seed(
            res.COMPUTE_DOMAIN_CLIQUES,
            {
                "apiVersion": c.API_VERSION,
                "kind": c.COMPUTE_DOMAIN_CLIQUE_KIND,
                "metadata": {"name": name, "namespace": DRIVER_NS},
                "daemons": daemons,
            },
        )


def channel_params(cd_uid: str, **extra: Any) -> JSON:
    return {"apiVersion": c.API_VERSION, "kind": c.CHANNEL_CONFIG_KIND, "domainID": cd_uid, **extra}


def seed_claim(
    api: FakeApiServer,
    *,
    namespace: str = "team",
    name: str | None = None,
    device: str = c.CHANNEL_DEVICE_NAME,
    params: JSON | None = None,
    request: str = "channel",
    allocated: bool = True,
    share_id: str | None = None,
) -> JSON:
    """An allocated claim of one of our devices; ``share_id`` is the scheduler's mark of one
    allocation of a device shared by several claims (``allowMultipleAllocations``)."""
    name = name or f"claim-{uuid.uuid4().hex[:8]}"
    status: JSON = {}
    if allocated:
        config = (
            []
            if params is None
            else [
                {
                    "source": "FromClaim",
                    "requests": [],
                    "opaque": {"driver": c.DRIVER_NAME, "parameters": params},
                }
            ]
        )
        status = {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": request,
                            "driver": c.DRIVER_NAME,
                            "pool": NODE,
                            "device": device,
                            **({"shareID": share_id} if share_id else {}),
                        }
                    ],
                    "config": config,
                }
            }
        }
    return api.seed(
        res.RESOURCE_CLAIMS,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": request}]}},
            "status": status,
        },
    )


@dataclass
class Kubelet:
    """A python stand-in for the kubelet: talks to the plugin's real Unix sockets."""

    config: PluginConfig

    def get_info(self) -> reg.PluginInfo:
        with RegistrationClient(self.config.registration_socket) as client:
            return client.get_info(timeout=1)

    def notify(self, registered: bool, error: str = "") -> None:
        with RegistrationClient(self.config.registration_socket) as client:
            client.notify_registration_status(registered=registered, error=error, timeout=5)

    def prepare(self, *claims: JSON, version: str = "v1", timeout: float = 45.0) -> Any:
        with DraClient(self.config.dra_socket, service=f"{version}.DRAPlugin") as client:
            return client.node_prepare_resources(map(self._ref, claims), timeout=timeout)

    def unprepare(self, *claims: JSON, version: str = "v1") -> Any:
        with DraClient(self.config.dra_socket, service=f"{version}.DRAPlugin") as client:
            return client.node_unprepare_resources(map(self._ref, claims), timeout=45)

    @staticmethod
    def _ref(obj: JSON) -> ClaimRef:
        meta = obj.get("metadata", obj)
        return ClaimRef(
            namespace=meta.get("namespace", ""), uid=meta.get("uid", ""), name=meta.get("name", "")
        )


@contextmanager
def running_plugin(
    api: FakeApiServer,
    root: Path,
    *,
    clique: str = CLIQUE,
    healthcheck_port: int = -1,
    gpus: tuple[GpuInfo, ...] = (),
    clock: Clock | None = None,
    compatibility: CheckpointCompatibility = CheckpointCompatibility.V0_4_1,
) -> Iterator[tuple[KubeletPlugin, Kubelet]]:
    config = dataclasses.replace(
        make_config(root, healthcheck_port=healthcheck_port),
        checkpoint_compatibility=compatibility,
    )
    devices = NodeDevices(driver_version="580.65.06", gpus=gpus, clique_id=clique)
    plugin = KubeletPlugin(config=config, client=api.client(), devices=devices, clock=clock)
    plugin.start()
    try:
        yield plugin, Kubelet(config)
    finally:
        plugin.stop()
