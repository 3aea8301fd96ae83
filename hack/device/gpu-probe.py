#!/usr/bin/env python3
"""Read-only probe of the kubelet plugin's node discovery against a real NVIDIA driver.

Run on a machine with a GPU and its driver (no Kubernetes needed). It runs the plugin's own
code paths, the ones `pkg.kubeletplugin.driver.Driver` runs at start, and prints what each
found, so a real driver's answers can be compared with what the fake-GPU lanes assume:

* driver-root detection (`DriverRoot.nvml_library`, `DriverRoot.scan`) for every candidate
  root that exists (``/``, ``/usr/local/nvidia``, ``/run/nvidia/driver``, or ``--root``);
* NVML discovery (`NvmlDiscovery.discover` with NVML bound to the root's library by
  `load_pynvml`): driver version, GPUs, fabric info, the clique it derives; timed over
  ``--repeat`` runs (init, queries, shutdown: what every plugin start and refresh pays);
* the single-node-NVLink check (`is_single_node_nvlink`), the ``/proc/devices`` majors the
  plugin needs (`procdevices`) and the fabric-imex-mgmt capability node it would inject;
* whether an IMEX channel node made from that major opens (mknod in a temporary directory,
  open read-only, close, removed): what a workload's ``channel0`` is.

Nothing on the host changes: the temporary device node lives in a directory the probe creates
and removes. Output: a human-readable report on stdout and, with ``--json PATH``, the same as
JSON. Exit status 0 even when a section fails: the failure is the finding.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pkg.kubeletplugin import procdevices
from pkg.kubeletplugin.discovery.base import DiscoveryError
from pkg.kubeletplugin.discovery.fabric import is_single_node_nvlink, select_dev_root
from pkg.kubeletplugin.discovery.nvml import NvmlDiscovery, load_pynvml
from pkg.kubeletplugin.driverroot import DriverRoot, DriverRootError

CANDIDATE_ROOTS = ("/", "/usr/local/nvidia", "/run/nvidia/driver")


def _section(name: str, report: dict[str, Any], body: Callable[[], Any]) -> None:
    start = time.perf_counter()
    try:
        report[name] = {"ok": True, "result": body()}
    except Exception as err:  # a failing section is a finding, not a crash
        report[name] = {"ok": False, "error": f"{type(err).__name__}: {err}"}
    report[name]["seconds"] = round(time.perf_counter() - start, 4)


def _scan_root(root: str) -> dict[str, Any]:
    dr = DriverRoot(host=Path(root), container=Path(root))
    out: dict[str, Any] = {}
    try:
        out["nvml_library"] = str(dr.nvml_library())
    except DriverRootError as err:
        out["nvml_library_error"] = str(err)
    files = dr.scan()
    out["driver_version_from_library"] = files.version
    out["binaries"] = [b.container_path for b in files.binaries]
    out["libraries"] = len(files.libraries)
    out["library_dirs"] = list(files.library_dirs())
    out["missing_imex"] = list(files.missing_imex)
    out["imex_mgmt_caps_file"] = str(dr.imex_mgmt_caps_file())
    return out


def _discover(root: str, repeat: int) -> dict[str, Any]:
    dr = DriverRoot(host=Path(root), container=Path(root))
    nvml = load_pynvml(dr.nvml_library())
    single = is_single_node_nvlink(select_dev_root(Path(root)))
    timings: list[float] = []
    result: dict[str, Any] = {"single_node_nvlink": single}
    for _ in range(repeat):
        start = time.perf_counter()
        try:
            devices = NvmlDiscovery(nvml=nvml, strict_fabric=True, single_node_nvlink=single)
            found = devices.discover()
        except DiscoveryError as err:
            result["strict_error"] = str(err)
            found = NvmlDiscovery(
                nvml=nvml, strict_fabric=False, single_node_nvlink=single
            ).discover()
        timings.append(time.perf_counter() - start)
    result["driver_version"] = found.driver_version
    result["clique_id"] = found.clique_id
    result["gpus"] = [
        {
            "index": g.index,
            "uuid": g.uuid,
            "minor": g.minor,
            "fabric": {
                "supported": g.fabric.supported,
                "state": g.fabric.state,
                "status": g.fabric.status,
                "cluster_uuid": g.fabric.cluster_uuid,
                "clique_id": g.fabric.clique_id,
            },
        }
        for g in found.gpus
    ]
    result["discover_ms"] = {
        "runs": repeat,
        "p50": round(statistics.median(timings) * 1000, 2),
        "min": round(min(timings) * 1000, 2),
        "max": round(max(timings) * 1000, 2),
    }
    return result


def _proc_devices() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in (
        procdevices.IMEX_CHANNELS_DEVICE,
        procdevices.NVIDIA_CAPS_DEVICE,
        procdevices.NVIDIA_UVM_DEVICE,
    ):
        out[name] = procdevices.optional_char_device_major(name)
    return out


def _mgmt_node(root: str) -> dict[str, Any]:
    caps_file = DriverRoot(host=Path(root), container=Path(root)).imex_mgmt_caps_file()
    major = procdevices.char_device_major(procdevices.NVIDIA_CAPS_DEVICE)
    return procdevices.imex_mgmt_node(caps_file=caps_file, caps_major=major).to_cdi()


def _channel_opens() -> dict[str, Any]:
    major = procdevices.char_device_major(procdevices.IMEX_CHANNELS_DEVICE)
    (node,) = procdevices.imex_channel_nodes(major, 1)
    with tempfile.TemporaryDirectory(prefix="gpu-probe-") as tmp:
        path = Path(tmp) / "channel0"
        os.mknod(path, 0o600 | 0o020000, os.makedev(node.major, node.minor))
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as err:
            return {"node": node.to_cdi(), "opened": False, "error": str(err)}
        os.close(fd)
    return {"node": node.to_cdi(), "opened": True}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", action="append", help="driver root to try (repeatable)")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    roots = args.root or [r for r in CANDIDATE_ROOTS if Path(r).is_dir()]
    report: dict[str, Any] = {
        "host": {"machine": platform.machine(), "kernel": platform.release()},
        "python": sys.version.split()[0],
    }
    for root in roots:
        _section(f"driver_root {root}", report, lambda r=root: _scan_root(r))  # type: ignore[misc]
    usable = [r for r in roots if report[f"driver_root {r}"]["result"].get("nvml_library")]
    report["usable_roots"] = usable
    if usable:
        _section("nvml_discovery", report, lambda: _discover(usable[0], args.repeat))
        _section("imex_mgmt_node", report, lambda: _mgmt_node(usable[0]))
    _section("proc_devices", report, _proc_devices)
    _section("imex_channel0_opens", report, _channel_opens)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
