"""The plugin's HTTP endpoint: metrics and probes always, ``/debug/informers`` only when enabled."""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from testsupport.kp_harness import DRIVER_NS, NODE, make_config, seed_domain

from pkg.kube import resources as res
from pkg.kubeletplugin.discovery import NodeDevices
from pkg.kubeletplugin.driver import KubeletPlugin
from pkg.kubeletplugin.options import parse_args
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer

REPO = Path(__file__).resolve().parents[3]


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def start(
    api: FakeApiServer, root: Path, *, debug: bool, metrics_path: str = "/metrics"
) -> KubeletPlugin:
    config = dataclasses.replace(
        make_config(root),
        metrics_port=0,
        metrics_host="127.0.0.1",
        debug_endpoints=debug,
        metrics_path=metrics_path,
    )
    devices = NodeDevices(driver_version="580.65.06", gpus=(), clique_id="")
    plugin = KubeletPlugin(config=config, client=api.client(), devices=devices)
    plugin.start()
    return plugin


def rvs(api: FakeApiServer, resource: res.Resource) -> dict[str, str]:
    out = {}
    for o in api.objects(resource):
        meta = o["metadata"]
        key = f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]
        out[key] = str(meta["resourceVersion"])
    return out


def test_debug_informers_lists_every_cache_when_enabled(api: FakeApiServer, root: Path) -> None:
    seed_domain(api, clique="")
    plugin = start(api, root, debug=True)
    try:
        assert plugin.http is not None
        base = f"http://127.0.0.1:{plugin.http.port}"
        assert get(base + "/healthz") == (200, b"ok")
        eventually(lambda: get(base + "/readyz") == (200, b"ok"))
        code, body = get(base + "/metrics")
        assert code == 200 and b"nvidia_dra_requests_total" in body

        def doc() -> dict[str, Any]:
            out: dict[str, Any] = json.loads(get(base + "/debug/informers")[1])
            return out

        d = doc()
        assert (d["component"], d["node"]) == ("compute-domain-kubelet-plugin", NODE)
        slices = {(i["resource"], i["namespace"], i["fieldSelector"]): i for i in d["informers"]}
        assert set(slices) == {
            ("computedomains", None, None),
            ("computedomaincliques", DRIVER_NS, None),
            ("resourceslices", None, f"spec.nodeName={NODE}"),
            ("nodes", None, f"metadata.name={NODE}"),
        }
        eventually(lambda: all(i["synced"] for i in doc()["informers"]))

        def cached(resource: str) -> dict[str, str]:
            return next(i["objects"] for i in doc()["informers"] if i["resource"] == resource)

        eventually(lambda: cached("computedomains") == rvs(api, res.COMPUTE_DOMAINS) != {})
        eventually(lambda: cached("resourceslices") == rvs(api, res.RESOURCE_SLICES) != {})
    finally:
        plugin.stop()
    assert plugin.http is not None
    with pytest.raises(RuntimeError):  # stopped: the port is closed
        _ = plugin.http.port


def test_debug_informers_is_off_by_default(api: FakeApiServer, root: Path) -> None:
    plugin = start(api, root, debug=False)
    try:
        assert plugin.http is not None
        base = f"http://127.0.0.1:{plugin.http.port}"
        assert get(base + "/debug/informers")[0] == 404
        assert get(base + "/metrics")[0] == 200
    finally:
        plugin.stop()


def test_flag_and_env(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_args(["--node-name", "n"], {}).debug_endpoints is False
    assert parse_args(["--node-name", "n", "--debug-endpoints"], {}).debug_endpoints is True
    env = {"DEBUG_ENDPOINTS": "true"}
    assert parse_args(["--node-name", "n"], env).debug_endpoints is True
    assert parse_args(["--node-name", "n", "--debug-endpoints=false"], env).debug_endpoints is False
    with pytest.raises(SystemExit) as exc:
        parse_args(["--node-name", "n"], {"DEBUG_ENDPOINTS": "maybe"})
    assert exc.value.code == 2
    assert "DEBUG_ENDPOINTS" in capsys.readouterr().err


def test_metrics_are_served_at_the_metrics_path(api: FakeApiServer, root: Path) -> None:
    """``--metrics-path`` moves the metrics as upstream's does; the probes stay."""
    path = parse_args(["--node-name", "n", "--metrics-path=plugin/metrics"], {}).metrics_path
    plugin = start(api, root, debug=False, metrics_path=path)
    try:
        assert plugin.http is not None
        base = f"http://127.0.0.1:{plugin.http.port}"
        code, body = get(base + "/plugin/metrics")
        assert code == 200 and b"nvidia_dra_requests_total" in body
        assert get(base + "/metrics")[0] == 404
        assert get(base + "/healthz") == (200, b"ok")
    finally:
        plugin.stop()
