"""config/components/host-managed-imex: env, gate, and no daemon-only objects (upstream's chart)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from pkg.imex.mode import DEFAULT_HOST_SOCKET_PATH, ImexModeConfig

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "config"
KUBECTL = Path(sys.executable).parent / "kubectl"  # the venv running the tests
DAEMON_ONLY = {
    ("DeviceClass", "compute-domain-daemon.nvidia.com"),
    ("ServiceAccount", "compute-domain-daemon"),
    ("Role", "compute-domain-daemon"),
    ("RoleBinding", "compute-domain-daemon"),
    ("ValidatingAdmissionPolicy", "compute-domain-daemon-pods"),
    ("ValidatingAdmissionPolicyBinding", "compute-domain-daemon-pods"),
    ("ValidatingAdmissionPolicy", "compute-domain-daemon-cliques"),
    ("ValidatingAdmissionPolicyBinding", "compute-domain-daemon-cliques"),
    ("ValidatingAdmissionPolicy", "compute-domain-daemon-device-claims"),
    ("ValidatingAdmissionPolicyBinding", "compute-domain-daemon-device-claims"),
}


def render(*, resources: list[Path], components: tuple[Path, ...] = ()) -> list[dict[str, Any]]:
    if not KUBECTL.is_file():
        pytest.fail(f"{KUBECTL} not found: the manifest tests need kubectl in the venv")
    with tempfile.TemporaryDirectory(prefix="kustomize-") as scratch:
        (Path(scratch) / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "resources": [os.path.relpath(r, scratch) for r in resources],
                    "components": [os.path.relpath(c, scratch) for c in components],
                }
            )
        )
        out = subprocess.run(
            [str(KUBECTL), "kustomize", scratch],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
    return [o for o in yaml.safe_load_all(out.stdout) if o]


def kinds(objs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """(kind, name) of each object; the generated ConfigMap without its content hash."""
    return {
        (
            o["kind"],
            o["metadata"]["name"].rsplit("-", 1)[0]
            if o["kind"] == "ConfigMap"
            else o["metadata"]["name"],
        )
        for o in objs
    }


def env(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, str]:
    (obj,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    (container,) = obj["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_component_switches_both_binaries_and_drops_daemon_objects() -> None:
    base = render(resources=[CONFIG / "default"])
    host = render(
        resources=[CONFIG / "default"], components=(CONFIG / "components" / "host-managed-imex",)
    )
    assert kinds(base) >= DAEMON_ONLY
    assert kinds(host) == kinds(base) - DAEMON_ONLY
    assert ("DeviceClass", "compute-domain-default-channel.nvidia.com") in kinds(host)
    controller = env(host, "Deployment", "compute-domain-controller")
    plugin = env(host, "DaemonSet", "compute-domain-kubelet-plugin")
    for got in (controller, plugin):
        mode = ImexModeConfig(mode=got["IMEX_MODE"], isolation=got["IMEX_ISOLATION"])
        assert mode.validate(gate_enabled=True).host_managed
    assert plugin["IMEX_HOST_SOCKET_PATH"] == DEFAULT_HOST_SOCKET_PATH
    assert "IMEX_HOST_SOCKET_PATH" not in controller
    (ds,) = [o for o in host if o["kind"] == "DaemonSet"]
    (plugin_ctr,) = ds["spec"]["template"]["spec"]["containers"]
    assert plugin_ctr["securityContext"]["privileged"], "chroot needs CAP_SYS_CHROOT"
    (cm,) = [
        o for o in host if o["kind"] == "ConfigMap" and "driver-config" in o["metadata"]["name"]
    ]
    assert "HostManagedIMEXDaemon=true" in cm["data"]["FEATURE_GATES"].split(",")


def test_e2e_overlay_is_the_real_node_overlay_plus_the_component() -> None:
    objs = render(resources=[CONFIG / "overlays" / "e2e-real-nodes-host-imex"])
    assert not DAEMON_ONLY & kinds(objs)
    assert env(objs, "DaemonSet", "compute-domain-kubelet-plugin")["IMEX_MODE"] == "hostManaged"
    (ds,) = [o for o in objs if o["kind"] == "DaemonSet"]
    (plugin,) = ds["spec"]["template"]["spec"]["containers"]
    caps = plugin["securityContext"]["capabilities"]
    assert (caps["drop"], caps["add"]) == (["ALL"], ["SYS_CHROOT"])  # unprivileged fake-GPU plugin
