"""Turning a pod's container spec into what a runtime would execute, without a runtime.

Owns the kubelet's container-environment rules (downward-API ``fieldRef``s, ``$(VAR)``
expansion in env values, command and args, CDI env edits applied last), the selection of the
CDI device IDs each container receives (by ``resources.claims[].request`` and the devices'
``request_names``), and the mapping of container paths (CDI mounts, ``/etc/hosts``) onto
per-node host folders for containers that run as local processes. Pure functions over dicts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .cdi import ContainerEdits
from .registration import PreparedDevice

_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class PodSpecError(ValueError):
    """The pod asks for something the stand-in cannot provide (reported as a pod Event)."""


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: known vars replaced, ``$$`` -> ``$``, others kept."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env.get(name, m.group(0))

    return _VAR.sub(sub, value)


def field_ref(pod: Mapping[str, Any], path: str, *, node_ip: str) -> str:
    """Value of a downward-API ``fieldRef.fieldPath`` for ``pod`` (pod IP = node IP)."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": node_ip,
        "status.podIPs": node_ip,
        "status.hostIP": node_ip,
        "status.hostIPs": node_ip,
    }
    if path in simple:
        return str(simple[path])
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return str(meta.get(m.group(1), {}).get(m.group(2), ""))
    raise PodSpecError(f"unsupported fieldRef {path!r}")


def container_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    *,
    node_ip: str,
    edits: ContainerEdits,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The container's environment: ``extra`` (runtime-provided), spec env, then CDI env."""
    env: dict[str, str] = dict(extra or {})
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item:
            env[name] = expand(str(item["value"]), env)
        elif "valueFrom" in item:
            src = item["valueFrom"]
            if "fieldRef" in src:
                env[name] = field_ref(pod, src["fieldRef"]["fieldPath"], node_ip=node_ip)
            else:
                raise PodSpecError(f"env {name}: only fieldRef valueFrom is supported")
        else:
            env[name] = ""
    env.update(edits.env_map())
    return env


def command_line(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """``command`` + ``args`` with ``$(VAR)`` expanded (no image entrypoints here)."""
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    if not argv:
        raise PodSpecError(f"container {container.get('name')}: no command (images are not run)")
    return [expand(str(a), env) for a in argv]


def cdi_ids_for_container(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    prepared: Mapping[str, Sequence[PreparedDevice]],
) -> list[str]:
    """CDI IDs a container receives, given prepared devices per pod-claim *name*.

    A device serves the container if its ``request_names`` is empty or contains one of the
    requests the container names for that claim (no request named = all requests).
    """
    ids: list[str] = []
    for ref in (container.get("resources") or {}).get("claims") or []:
        for dev in prepared.get(ref["name"], ()):
            wanted = ref.get("request")
            if not dev.request_names or not wanted or wanted in dev.request_names:
                ids.extend(i for i in dev.cdi_device_ids if i not in ids)
    return ids


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


def cdi_mounts(edits: ContainerEdits) -> list[Mount]:
    return [
        Mount(
            container_path=str(m["destination"]),
            host_path=str(m["source"]),
            read_only="ro" in (m.get("options") or []),
        )
        for m in edits.mounts
        if "destination" in m and "source" in m
    ]


def hosts_file_text(pod: Mapping[str, Any], *, node_ip: str) -> str:
    """The kubelet-managed ``/etc/hosts`` of a pod (non-hostNetwork)."""
    meta, spec = pod.get("metadata", {}), pod.get("spec", {})
    hostname = spec.get("hostname") or meta.get("name", "")
    lines = [
        "# Kubernetes-managed hosts file.",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        "fe00::0\tip6-localnet",
        "fe00::0\tip6-mcastprefix",
        "fe00::1\tip6-allnodes",
        "fe00::2\tip6-allrouters",
        f"{node_ip}\t{hostname}",
    ]
    for alias in spec.get("hostAliases") or []:
        lines.append(f"{alias['ip']}\t" + "\t".join(alias.get("hostnames") or []))
    return "\n".join(lines) + "\n"
