"""The real plugin's ``/metrics`` (``HTTP_ENDPOINT``) names its build, labels and all."""

from __future__ import annotations

import json
import platform
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from testsupport.kp_harness import CLIQUE, DRIVER_NS, NODE, make_config

from pkg.runtime.buildinfo import load_build_info
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer

REPO = Path(__file__).resolve().parents[3]
ENTRY = REPO / "cmd" / "compute-domain-kubelet-plugin" / "compute_domain_kubelet_plugin.py"
METRIC = "nvidia_dra_compute_domain_kubelet_plugin_build_info"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def kubeconfig(root: Path, url: str) -> Path:
    path = root / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "fake",
                "clusters": [{"name": "fake", "cluster": {"server": url}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
            }
        )
    )
    return path


def scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            return str(resp.read().decode())
    except (urllib.error.URLError, OSError):
        return None


def test_metrics_endpoint_serves_the_build_info_gauge(api: FakeApiServer, root: Path) -> None:
    make_config(root)  # writes the fake /proc/devices
    port = free_port()
    env = {
        "NODE_NAME": NODE,
        "NAMESPACE": DRIVER_NS,
        "CDI_ROOT": str(root / "cdi"),
        "KUBELET_REGISTRAR_DIRECTORY_PATH": str(root / "reg"),
        "KUBELET_PLUGINS_DIRECTORY_PATH": str(root / "plugins"),
        "ALT_PROC_DEVICES_PATH": str(root / "proc-devices"),
        "KUBECONFIG": str(kubeconfig(root, api.url)),
        "DEVICE_DISCOVERY": "fake",
        "FAKE_GPU_CONFIG": json.dumps(
            {"gpuCount": 1, "clusterUUID": CLIQUE.split(".")[0], "cliqueId": 7}
        ),
        "HTTP_ENDPOINT": f"127.0.0.1:{port}",
    }
    plugin = subprocess.Popen([sys.executable, str(ENTRY)], env=env, cwd="/")
    try:
        texts: list[str] = []

        def scraped() -> bool:
            text = scrape(port)
            texts.extend([text] if text else [])
            return bool(text)

        eventually(scraped, 30)
        (family,) = [f for f in text_string_to_metric_families(texts[0]) if f.name == METRIC]
        info = load_build_info()
        assert family.type == "gauge"
        assert [(s.labels, s.value) for s in family.samples] == [
            (
                {
                    "version": info.version,
                    "revision": info.revision,
                    "build_date": info.build_date,
                    "python_version": platform.python_version(),
                },
                1.0,
            )
        ]
        plugin.send_signal(signal.SIGTERM)
        assert plugin.wait(15) == 0
    finally:
        if plugin.poll() is None:
            plugin.kill()
            plugin.wait(5)
