"""What one simulated GPU node *is*: its name, loopback IP, NVLink clique and on-disk folders.

Owns the per-node directory tree (the stand-ins for ``/var/lib/kubelet/plugins``,
``.../plugins_registry``, ``/var/run/cdi``, ``/proc/devices`` and the fake GPU inventory) and the
clique layouts tests choose. Pure data and file writing: no Kubernetes, no processes.

Directory of node ``<name>`` under a fleet root::

    <root>/<name>/plugins/             KUBELET_PLUGINS_DIRECTORY_PATH (plugin dir, checkpoint)
    <root>/<name>/plugins_registry/    KUBELET_REGISTRAR_DIRECTORY_PATH (registration sockets)
    <root>/<name>/cdi/                 CDI_ROOT (spec dir the CDI resolver reads)
    <root>/<name>/proc/devices         ALT_PROC_DEVICES_PATH (has nvidia-caps-imex-channels)
    <root>/<name>/driver-root/         NVIDIA_DRIVER_ROOT: a fake driver installation with the
                                       IMEX simulator as usr/bin/nvidia-imex(-ctl)
                                       (pkg.testing.fakedriverroot)
    <root>/<name>/gpus.json            FAKE_GPU_CONFIG (GPU UUIDs + fabric info = clique)
    <root>/<name>/kubelet/             the stand-in's own state (dra_manager_state.json)
    <root>/<name>/pods/<uid>/          per-pod files (hosts file, volumes)
    <root>/<name>/containers/          <ns>_<pod>_<container>.json: edits a container received
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pkg.testing.fakedriverroot import FakeDriverRoot

IMEX_CHANNELS_MAJOR = 235
NVIDIA_CAPS_MAJOR = 236
FABRIC_IMEX_MGMT_MINOR = 512
FAKE_DRIVER_VERSION = "570.170.01"
GPU_CLIQUE_LABEL = "nvidia.com/gpu.clique"
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes including the NUL


@dataclass(frozen=True)
class Clique:
    """One NVLink clique: GPUs on nodes of the same clique share ``cluster_uuid.clique_id``."""

    cluster_uuid: str
    clique_id: int

    @property
    def id(self) -> str:
        """The ComputeDomain clique ID string, ``<clusterUUID>.<cliqueId>``."""
        return f"{self.cluster_uuid}.{self.clique_id}"

    @classmethod
    def numbered(cls, n: int, *, cluster: int = 1) -> Clique:
        """Deterministic clique ``n`` of fabric cluster ``cluster`` (for readable test output)."""
        return cls(str(uuid.UUID(int=(cluster << 64) | 0xC11E)), n)


@dataclass(frozen=True)
class NodeSpec:
    """A simulated node. ``clique=None`` is a non-NVLink (non-MNNVL) node.

    ``driver_root_omit`` leaves files out of its fake driver root (e.g. ``("nvidia-imex",)``).
    """

    name: str
    ip: str
    clique: Clique | None
    gpus: int = 4
    labels: dict[str, str] = field(default_factory=dict)
    driver_root_omit: tuple[str, ...] = ()

    @property
    def clique_id(self) -> str:
        return self.clique.id if self.clique else ""


def node_ip(index: int) -> str:
    """Loopback address of node number ``index`` (1-based): 127.0.0.<10+index>.

    127.0.0.1 is left to the control plane and 127.0.0.2 to IMEX's unused-slot sentinel.
    """
    if not 1 <= index <= 240:
        raise ValueError(f"node index {index} out of range 1..240")
    return f"127.0.0.{10 + index}"


def layout(
    cliques: Sequence[int | None],
    *,
    prefix: str = "gpu-node",
    gpus: int = 4,
    first_index: int = 1,
    cluster: int = 1,
) -> list[NodeSpec]:
    """Node specs from a clique per node: ``[0, 0, 1, 1, None]`` = two cliques + one non-NVLink.

    Names are ``<prefix>-<i>``; IPs follow :func:`node_ip`.
    """
    specs = []
    for offset, c in enumerate(cliques):
        i = first_index + offset
        specs.append(
            NodeSpec(
                name=f"{prefix}-{i}",
                ip=node_ip(i),
                clique=None if c is None else Clique.numbered(c, cluster=cluster),
                gpus=gpus,
            )
        )
    return specs


class NodeDirs:
    """The folders and fake host files of one node (created by :meth:`create`)."""

    def __init__(
        self,
        root: Path,
        spec: NodeSpec,
        *,
        logs: Path | None = None,
        zipapp_interpreter: str | None = None,
    ) -> None:
        """``zipapp_interpreter``: the IMEX zipapps' ``#!`` line (default this Python, ``-S``)."""
        self.spec = spec
        self.zipapp_interpreter = zipapp_interpreter or f"{sys.executable} -S"
        self.root = root / spec.name
        self.plugins = self.root / "plugins"
        self.registry = self.root / "plugins_registry"
        self.cdi = self.root / "cdi"
        self.proc_devices = self.root / "proc" / "devices"
        self.driver_root = self.root / "driver-root"
        self.gpu_config = self.root / "gpus.json"
        self.kubelet = self.root / "kubelet"
        self.pods = self.root / "pods"
        self.containers = self.root / "containers"
        self.logs = logs if logs is not None else self.root / "logs"

    def create(self) -> NodeDirs:
        sock = self.plugins / "compute-domain.nvidia.com" / "dra.sock"
        if len(str(sock)) > MAX_SOCKET_PATH:
            raise ValueError(
                f"{sock} is longer than {MAX_SOCKET_PATH} bytes (Unix socket limit): "
                "use a shorter fleet root directory"
            )
        for d in (
            self.plugins,
            self.registry,
            self.cdi,
            self.proc_devices.parent,
            self.kubelet,
            self.pods,
            self.containers,
            self.logs,
        ):
            d.mkdir(parents=True, exist_ok=True)
        self.proc_devices.write_text(proc_devices_text())
        self.write_driver_root(omit=self.spec.driver_root_omit)
        self.gpu_config.write_text(json.dumps(gpu_config(self.spec), indent=1))
        return self

    def write_driver_root(self, *, omit: Sequence[str] = ()) -> FakeDriverRoot:
        """(Re)create the node's fake driver root; its IMEX zipapps run under
        ``zipapp_interpreter``: by default this Python with ``-S`` (no site-packages: the
        zipapps carry all they import, so each simulated ``nvidia-imex``/``nvidia-imex-ctl``
        start costs less CPU), or ``zclient`` to fork them from a zygote.
        """
        return FakeDriverRoot.create(
            self.driver_root,
            driver_version=FAKE_DRIVER_VERSION,
            python=self.zipapp_interpreter,
            imex_mgmt_minor=FABRIC_IMEX_MGMT_MINOR,
            omit=omit,
        )

    def pod_dir(self, pod_uid: str) -> Path:
        d = self.pods / pod_uid
        d.mkdir(parents=True, exist_ok=True)
        return d

    def container_record(self, namespace: str, pod: str, container: str) -> Path:
        return self.containers / f"{namespace}_{pod}_{container}.json"

    def cdi_files(self) -> list[Path]:
        return sorted(p for p in self.cdi.iterdir() if p.suffix in (".json", ".yaml"))


def proc_devices_text() -> str:
    """A ``/proc/devices`` with the two NVIDIA capability majors the plugin looks up."""
    return (
        "Character devices:\n"
        "  1 mem\n"
        "  4 /dev/vc/0\n"
        "195 nvidia-frontend\n"
        f"{IMEX_CHANNELS_MAJOR} nvidia-caps-imex-channels\n"
        f"{NVIDIA_CAPS_MAJOR} nvidia-caps\n"
        "\n"
        "Block devices:\n"
        "  7 loop\n"
        "253 virtblk\n"
    )


def gpu_config(spec: NodeSpec) -> dict[str, object]:
    """The fake GPU inventory (``FAKE_GPU_CONFIG``, schema in ``pkg.kubeletplugin.discovery.fake``).

    An NVLink node's GPUs report fabric state COMPLETED with the node's cluster UUID and clique
    ID; a non-NVLink node omits ``clusterUUID``, so its GPUs report NOT_SUPPORTED.
    """
    config: dict[str, object] = {"driverVersion": FAKE_DRIVER_VERSION, "gpuCount": spec.gpus}
    if spec.clique:
        config["clusterUUID"] = spec.clique.cluster_uuid
        config["cliqueId"] = spec.clique.clique_id
        config["fabric"] = {"state": "COMPLETED", "status": 0}
    return config
