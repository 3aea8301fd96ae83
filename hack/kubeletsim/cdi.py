"""Resolving CDI device IDs into container edits, as the container runtime would.

Owns the boundary to ``cdi-resolve`` (``hack/cdi``), a tiny Go CLI over the real
``tags.cncf.io/container-device-interface`` library: it loads the node's CDI spec dirs, injects
the requested fully-qualified IDs into an empty OCI spec and prints the edits as JSON. An ID that
does not resolve (or an invalid spec) is a :class:`CdiError` carrying the library's message,
which the kubelet stand-in turns into a failed container start.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


class CdiError(RuntimeError):
    """CDI injection failed (unresolvable device ID, invalid spec, missing helper)."""


@dataclass(frozen=True)
class ContainerEdits:
    """What a container gets from its CDI devices (the subset this project produces)."""

    env: tuple[str, ...] = ()
    device_nodes: tuple[dict[str, Any], ...] = ()
    mounts: tuple[dict[str, Any], ...] = ()
    hooks: dict[str, Any] = field(default_factory=dict)

    def env_map(self) -> dict[str, str]:
        return dict(e.split("=", 1) for e in self.env if "=" in e)

    def to_json(self) -> dict[str, Any]:
        return {
            "env": list(self.env),
            "deviceNodes": list(self.device_nodes),
            "mounts": list(self.mounts),
            "hooks": self.hooks,
        }


class CdiResolver(Protocol):
    def resolve(self, spec_dirs: Sequence[Path], device_ids: Sequence[str]) -> ContainerEdits: ...


class GoCdiResolver:
    """Runs the ``cdi-resolve`` binary (built by ``hack/build-control-plane.sh``)."""

    def __init__(self, binary: Path, *, timeout: float = 20.0) -> None:
        self._binary = binary
        self._timeout = timeout

    def resolve(self, spec_dirs: Sequence[Path], device_ids: Sequence[str]) -> ContainerEdits:
        if not device_ids:
            return ContainerEdits()
        if not self._binary.is_file():
            raise CdiError(f"{self._binary} missing: run hack/build-control-plane.sh")
        argv = [
            str(self._binary),
            "--spec-dirs",
            ",".join(str(d) for d in spec_dirs),
            *device_ids,
        ]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=self._timeout, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise CdiError(f"cdi-resolve: {e}") from e
        if done.returncode != 0:
            raise CdiError(done.stderr.strip() or f"cdi-resolve exited {done.returncode}")
        return parse_edits(json.loads(done.stdout))


def parse_edits(doc: dict[str, Any]) -> ContainerEdits:
    return ContainerEdits(
        env=tuple(doc.get("env") or ()),
        device_nodes=tuple(doc.get("deviceNodes") or ()),
        mounts=tuple(doc.get("mounts") or ()),
        hooks=dict(doc.get("hooks") or {}),
    )
