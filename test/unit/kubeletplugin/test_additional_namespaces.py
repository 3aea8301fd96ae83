"""``ADDITIONAL_NAMESPACES`` in the kubelet plugin: where daemon claims may be prepared.

The daemon device (the node's IMEX management device and a read-write host directory) stays
reserved to the driver's daemons: the driver namespace, plus the namespaces an
operator named for the controller, whose DaemonSets it adopts there. Anywhere else a daemon
claim is refused, permanently and before any side effect.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from testsupport.kp_harness import CLIQUE, DRIVER_NS, Kubelet, make_config, seed_claim, seed_domain

from pkg.api import constants as c
from pkg.kubeletplugin.discovery import NodeDevices
from pkg.kubeletplugin.driver import KubeletPlugin
from pkg.testing.fakeapiserver import FakeApiServer

REPO = Path(__file__).resolve().parents[3]
OLD_NS = "old-driver-ns"


@contextmanager
def plugin_with(
    api: FakeApiServer, root: Path, additional: tuple[str, ...]
) -> Iterator[tuple[KubeletPlugin, Kubelet]]:
    config = replace(make_config(root), additional_namespaces=additional)
    devices = NodeDevices(driver_version="580.65.06", gpus=(), clique_id=CLIQUE)
    plugin = KubeletPlugin(config=config, client=api.client(), devices=devices)
    plugin.start()
    try:
        yield plugin, Kubelet(config)
    finally:
        plugin.stop()


def daemon_claim(api: FakeApiServer, namespace: str) -> tuple[str, dict[str, object]]:
    cd = seed_domain(api, namespace="team")
    params = {"apiVersion": c.API_VERSION, "kind": c.DAEMON_CONFIG_KIND, "domainID": cd}
    claim = seed_claim(
        api, namespace=namespace, device=c.DAEMON_DEVICE_NAME, request="daemon", params=params
    )
    return cd, claim


@pytest.mark.parametrize(
    ("namespace", "prepared"),
    [(DRIVER_NS, True), (OLD_NS, True), ("team", False), ("other", False)],
    ids=["driver-namespace", "additional-namespace", "the-domain's-namespace", "another"],
)
def test_daemon_claims_are_prepared_in_the_driver_and_additional_namespaces_only(
    api: FakeApiServer, root: Path, namespace: str, prepared: bool
) -> None:
    cd, claim = daemon_claim(api, namespace)
    uid = str(claim["metadata"]["uid"])  # type: ignore[index]
    with plugin_with(api, root, (OLD_NS,)) as (plugin, kubelet):
        error = kubelet.prepare(claim).claims[uid].error
        if prepared:
            assert error == ""
            assert (plugin.config.plugin_dir / "domains" / cd).is_dir()
            kubelet.unprepare(claim)
        else:
            assert "ComputeDomain daemon claims are only prepared in the driver namespace" in error
            assert uid not in plugin.store.entries()
            assert not (plugin.config.plugin_dir / "domains" / cd).exists()


def test_without_additional_namespaces_only_the_driver_namespace_is_allowed(
    api: FakeApiServer, root: Path
) -> None:
    _cd, claim = daemon_claim(api, OLD_NS)
    uid = str(claim["metadata"]["uid"])  # type: ignore[index]
    with plugin_with(api, root, ()) as (_plugin, kubelet):
        assert "only prepared in the driver namespace" in kubelet.prepare(claim).claims[uid].error


def test_an_invalid_namespace_stops_the_plugin_at_start() -> None:
    script = REPO / "cmd" / "compute-domain-kubelet-plugin" / "compute_domain_kubelet_plugin.py"
    done = subprocess.run(
        [sys.executable, str(script), "--node-name=n", "--additional-namespaces=ok,Not_OK"],
        capture_output=True,
        text=True,
        cwd="/",
        check=False,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 1, done.stderr
    assert "additional-namespaces: 'Not_OK' is not a valid namespace name" in done.stderr
