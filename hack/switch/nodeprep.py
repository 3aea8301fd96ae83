"""Node files upstream's Go plugin needs on top of the real-node lane's (``prepare_node``).

``realsupport.prepare_node`` gives each node ``/var/lib/compute-domain-fake/`` with our fake GPU
file, a ``proc-devices`` naming the ``nvidia-caps-imex-channels`` major, and the fake driver root
(``pkg.testing.fakedriverroot``: the IMEX simulator as ``nvidia-imex``/``nvidia-imex-ctl``,
placeholder libraries, ``proc/driver/nvidia/...``). Our driver reads only those. Upstream's
plugin also needs, and gets from :func:`prepare_node_for_both`:

* ``driver-root/usr/lib64/libnvidia-ml.so.1``: NVIDIA's mock NVML. Upstream's plugin looks for
  ``libnvidia-ml.so.1`` in ``usr/lib64`` first, so the placeholder in the multiarch directory
  stays for ours. The mock finds its profile at ``driver-root/config/config.yaml`` from the
  path it was loaded from: the GB200 profile with :data:`GPU_COUNT` GPUs in the clique of the
  lane's fake GPUs (``FAKE_GPUS``), so both drivers see the same NVLink clique, and the fake
  root's driver version: nvcdi finds the driver's library directory by
  ``libcuda.so.<driver version>`` (a placeholder of the fake root; only its path is used).
* ``driver-root/dev/``: the device nodes of upstream's mock-NVML setup (``nvidia<i>``,
  ``nvidiactl``, ``nvidia-uvm{,-tools}``), the IMEX channels and the ``fabric-imex-mgmt``
  capability, with the majors of the fake ``proc-devices``. With ``dev/`` in the driver root
  upstream's plugin takes the driver root as its dev root; its CDI library refuses to start
  without ``nvidia<i>`` nodes. Nothing opens them (no NVIDIA kernel module here): they exist
  to be found and described in CDI specs. Ours uses the dev root only for host-managed IMEX.
* ``driver-root/proc/devices``: a copy of the fake ``proc-devices``, for upstream versions
  built with ``upstream.PROC_PATCHES`` (v25.12.0), which read it there.
* ``driver-root/usr/bin/nvidia-smi`` answering ``--version``: upstream's init container waits
  until ``nvidia-smi --version`` (with the NVML preloaded) exits 0. Ours never runs it.
* ``/var/lib/compute-domain-fake/nvidia-cdi-hook``, a no-op: upstream's CDI specs carry
  ``nvidia-cdi-hook`` OCI hooks (``update-ldcache``, ``create-symlinks``), which runc runs on
  the node; NVIDIA's container toolkit is not installed here. The chart's
  ``nvidiaCDIHookPath`` points there.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import yaml
from localcluster.realnode import RealNode
from testsupport.realsupport import FAKE_GPUS, prepare_node

from pkg.testing.fakedriverroot import DEFAULT_DRIVER_VERSION

FAKE_DIR = "/var/lib/compute-domain-fake"
DRIVER_ROOT = f"{FAKE_DIR}/driver-root"
PROC_DEVICES = f"{FAKE_DIR}/proc-devices"
CDI_HOOK = f"{FAKE_DIR}/nvidia-cdi-hook"
GPU_COUNT = int(str(FAKE_GPUS["gpuCount"]))
SMI = '#!/bin/sh\n[ "$1" = --version ] && echo "NVIDIA-SMI (mock for the switch lane)"\nexit 0\n'
CHANNELS = 8  # channel0..7 device nodes (upstream's Single mode uses channel 0)
# (path under dev/, major, minor): majors as in hack/kind/nodes/worker/proc-devices.
DEV_NODES = (
    *((f"nvidia{i}", 195, i) for i in range(GPU_COUNT)),
    ("nvidiactl", 195, 255),
    ("nvidia-uvm", 510, 0),
    ("nvidia-uvm-tools", 510, 1),
    ("nvidia-caps/nvidia-cap512", 236, 512),  # fabric-imex-mgmt (DeviceFileMinor 512)
    *((f"nvidia-caps-imex-channels/channel{i}", 235, i) for i in range(CHANNELS)),
)
NOOP_HOOK = "#!/bin/sh\n# no-op stand-in for nvidia-cdi-hook (hack/switch/nodeprep.py)\nexit 0\n"


def mock_profile(profile: Path) -> str:
    """The GB200 profile with :data:`GPU_COUNT` GPUs in the lane's NVLink clique."""
    doc = yaml.safe_load(profile.read_text())
    doc["system"]["num_devices"] = GPU_COUNT
    # nvcdi locates the driver's libraries by ``libcuda.so.<driver version>``: the fake root's.
    doc["system"]["driver_version"] = DEFAULT_DRIVER_VERSION
    doc["system"]["nvml_version"] = f"12.{DEFAULT_DRIVER_VERSION}"
    fabric = doc["device_defaults"]["fabric"]
    fabric["cluster_uuid"] = FAKE_GPUS["clusterUUID"]
    fabric["clique_id"] = FAKE_GPUS["cliqueId"]
    return str(yaml.safe_dump(doc, sort_keys=False))


def prepare_node_for_both(node: RealNode, *, library: Path, profile: Path) -> None:
    """``prepare_node`` plus the files of the module docstring (mock NVML from ``library``)."""
    prepare_node(node)
    root = node.ns.path(DRIVER_ROOT)
    lib64 = root / "usr" / "lib64"
    lib64.mkdir(parents=True, exist_ok=True)
    shutil.copy2(library, lib64 / library.name)
    (lib64 / "libnvidia-ml.so.1").symlink_to(library.name)
    (root / "config").mkdir(exist_ok=True)
    (root / "config" / "config.yaml").write_text(mock_profile(profile))
    for rel, major, minor in DEV_NODES:
        dev = root / "dev" / rel
        dev.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    # For upstream versions with PROC_PATCHES (hack/switch/upstream.py): /driver-root/proc/devices.
    shutil.copy2(node.ns.path(PROC_DEVICES), root / "proc" / "devices")
    smi = root / "usr" / "bin" / "nvidia-smi"
    smi.write_text(SMI)
    smi.chmod(0o755)
    hook = node.ns.path(CDI_HOOK)
    hook.write_text(NOOP_HOOK)
    hook.chmod(0o755)
