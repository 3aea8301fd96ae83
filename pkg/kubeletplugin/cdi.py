"""CDI spec files for prepared claims (vendor ``k8s.compute-domain.nvidia.com``).

Owns the on-disk CDI documents in the CDI root (``/var/run/cdi`` by default):

* the base spec ``k8s.compute-domain.nvidia.com-device_base.yaml`` (class ``device``) with one
  device ``all`` (GPU management nodes; always carries ``NVIDIA_VISIBLE_DEVICES=void`` so the
  device is never empty, which CDI rejects);
* one spec per claim ``k8s.compute-domain.nvidia.com-claim_<claimUID>.yaml`` (class ``claim``)
  whose device names are ``<claimUID>-<device>`` so a name is never reused across claims.

The file names are the Go driver's exactly (its CDI cache writes ``.yaml``; the content here is
JSON, which is YAML): two files defining ``.../device=all`` in one directory would be a CDI
conflict that makes runtimes drop the device, and after a switch either driver must overwrite
and delete the other's files. ``.json`` names of earlier builds are removed as well.

Invariants: files are written atomically (temp file in the same directory, fsync, rename), so a
runtime never reads half a spec; ``cdiVersion`` is the lowest version the content needs (older
CDI libraries inside runtimes reject newer versions); deleting a missing spec is not an error.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from pkg.api.constants import CDI_VENDOR
from pkg.base.files import atomic_write

CLASS_DEVICE: Final = "device"
CLASS_CLAIM: Final = "claim"
BASE_DEVICE: Final = "all"


@dataclass(frozen=True)
class ContainerEdits:
    env: tuple[str, ...] = ()
    device_nodes: tuple[dict[str, Any], ...] = ()
    mounts: tuple[dict[str, Any], ...] = ()

    def is_empty(self) -> bool:
        return not (self.env or self.device_nodes or self.mounts)

    def to_cdi(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = list(self.device_nodes)
        if self.mounts:
            out["mounts"] = list(self.mounts)
        return out


@dataclass(frozen=True)
class CdiDevice:
    name: str
    edits: ContainerEdits = field(default_factory=ContainerEdits)


def qualified_name(cdi_class: str, device: str) -> str:
    """Fully-qualified CDI device ID ``vendor/class=name`` (what the kubelet passes to CRI)."""
    return f"{CDI_VENDOR}/{cdi_class}={device}"


def claim_device_name(claim_uid: str, device: str) -> str:
    return f"{claim_uid}-{device}"


def minimum_version(spec: dict[str, Any]) -> str:
    """Lowest cdiVersion accepting the spec (mirrors the Go library's MinimumRequiredVersion)."""
    version = (0, 3, 0)
    kind_class = str(spec.get("kind", "")).partition("/")[2]
    if spec.get("annotations") or "." in kind_class:
        version = max(version, (0, 6, 0))
    edits = [spec.get("containerEdits") or {}]
    for device in spec.get("devices", []):
        edits.append(device.get("containerEdits") or {})
        if device.get("annotations"):
            version = max(version, (0, 6, 0))
        if re.match(r"^[^A-Za-z]", str(device.get("name", ""))):
            version = max(version, (0, 5, 0))
    for edit in edits:
        if any("hostPath" in n for n in edit.get("deviceNodes", [])):
            version = max(version, (0, 5, 0))
        if any("type" in m for m in edit.get("mounts", [])):
            version = max(version, (0, 4, 0))
        if edit.get("intelRdt") or edit.get("additionalGids"):
            version = max(version, (0, 7, 0))
    return ".".join(str(part) for part in version)


class CdiWriter:
    """Writes and removes this driver's CDI spec files under one CDI root directory."""

    def __init__(self, *, root: Path) -> None:
        self._root = root

    @property
    def root(self) -> Path:
        return self._root

    def base_spec_path(self) -> Path:
        """The base spec, under the Go driver's name."""
        return self._root / f"{CDI_VENDOR}-{CLASS_DEVICE}_base.yaml"

    def claim_spec_path(self, claim_uid: str) -> Path:
        """A claim's spec, under the Go driver's name."""
        return self._root / f"{CDI_VENDOR}-{CLASS_CLAIM}_{claim_uid.replace('/', '_')}.yaml"

    def write_base_spec(self, edits: ContainerEdits) -> str:
        """Write the ``device=all`` spec; returns its qualified device ID."""
        env = (*edits.env, "NVIDIA_VISIBLE_DEVICES=void")
        device = CdiDevice(BASE_DEVICE, ContainerEdits(env, edits.device_nodes, edits.mounts))
        self._write(self.base_spec_path(), self._spec(CLASS_DEVICE, [device]))
        self.base_spec_path().with_suffix(".json").unlink(missing_ok=True)  # earlier builds
        return qualified_name(CLASS_DEVICE, BASE_DEVICE)

    def write_claim_spec(self, claim_uid: str, devices: list[CdiDevice]) -> dict[str, str]:
        """Write the claim's spec; returns device -> qualified ID for devices with edits.

        Devices without edits get no CDI device (CDI forbids empty devices); no file is written
        if none has edits, and a stale file from an earlier attempt is removed.
        """
        named = [
            CdiDevice(claim_device_name(claim_uid, d.name), d.edits)
            for d in devices
            if not d.edits.is_empty()
        ]
        if not named:
            self.delete_claim_spec(claim_uid)
            return {}
        self._write(self.claim_spec_path(claim_uid), self._spec(CLASS_CLAIM, named))
        return {
            d.name: qualified_name(CLASS_CLAIM, claim_device_name(claim_uid, d.name))
            for d in devices
            if not d.edits.is_empty()
        }

    def delete_claim_spec(self, claim_uid: str) -> None:
        """Remove the claim's spec (also a ``.json`` one written by earlier builds)."""
        path = self.claim_spec_path(claim_uid)
        path.unlink(missing_ok=True)
        path.with_suffix(".json").unlink(missing_ok=True)

    @staticmethod
    def _spec(cdi_class: str, devices: list[CdiDevice]) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "cdiVersion": "",
            "kind": f"{CDI_VENDOR}/{cdi_class}",
            "devices": [{"name": d.name, "containerEdits": d.edits.to_cdi()} for d in devices],
        }
        spec["cdiVersion"] = minimum_version(spec)
        return spec

    def _write(self, path: Path, spec: dict[str, Any]) -> None:
        self._root.mkdir(mode=0o755, parents=True, exist_ok=True)
        atomic_write(path, json.dumps(spec, indent=2).encode())
