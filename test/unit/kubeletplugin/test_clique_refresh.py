"""The plugin's clique-ID refresh and its opt-in ``nvidia.com/gpu.clique`` node label (upstream
v0.5): re-detection every 10 minutes on the injected clock, only non-empty changes adopted,
errors only logged; the label set at start (a failure stops start-up), on every tick and removed
on graceful shutdown; every reader of the clique ID sees a refreshed value."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from testsupport.kp_harness import (
    CLIQUE,
    DRIVER_NS,
    NODE,
    Kubelet,
    channel_params,
    make_config,
    seed_claim,
    seed_domain,
)

from pkg.api import constants as c
from pkg.base.clock import RealClock
from pkg.kube import resources as res
from pkg.kubeletplugin.clique import CliqueLabelError, CliqueRefresher, NodeCliqueLabel
from pkg.kubeletplugin.discovery.fake import FakeDiscovery
from pkg.kubeletplugin.driver import KubeletPlugin
from pkg.testing.clock import FakeClock
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer

CLUSTER, _, CLIQUE_NUM = CLIQUE.rpartition(".")
OTHER = f"{CLUSTER}.9"
LABEL = c.GPU_CLIQUE_NODE_LABEL


def write_fabric(path: Path, clique: str, *, state: str = "COMPLETED") -> None:
    """FAKE_GPU_CONFIG file for a node in ``clique`` (``""``: no NVLink)."""
    config: dict[str, Any] = {"gpuCount": 2}
    if clique:
        cluster, _, number = clique.rpartition(".")
        config.update(clusterUUID=cluster, cliqueId=int(number), fabric={"state": state})
    path.write_text(json.dumps(config))


def discovery_from(path: Path) -> FakeDiscovery:
    return FakeDiscovery.from_setting(str(path), node_name=NODE)


def node_labels(api: FakeApiServer) -> dict[str, str]:
    node = api.client().get(res.NODES, NODE)
    return dict(node["metadata"].get("labels") or {})


# -- the refresher on its own ----------------------------------------------------------------------


def test_first_refresh_runs_one_interval_after_start_and_adopts_a_change(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "gpus.json"
    write_fabric(config, CLIQUE)
    clock = FakeClock()
    refresher = CliqueRefresher(initial=CLIQUE, discovery=discovery_from(config), clock=clock)
    refresher.start()
    try:
        write_fabric(config, OTHER)  # fabric partitioning moved the node
        assert clock.block_until_waiters(1)
        assert clock.waits == [600.0]
        clock.step(599.0)
        assert clock.waiters() == 1 and refresher.clique_id() == CLIQUE
        with caplog.at_level(logging.INFO):
            clock.step(1.0)
            eventually(lambda: refresher.clique_id() == OTHER, what="the new clique adopted")
        assert (
            f'GPU clique ID changed from "{CLIQUE}" to "{OTHER}", updating '
            "nvidia.com/gpu.clique node label"
        ) in caplog.messages
        assert clock.block_until_waiters(1)  # and it keeps ticking
    finally:
        refresher.stop()


def test_an_empty_detection_never_replaces_a_clique(tmp_path: Path) -> None:
    config = tmp_path / "gpus.json"
    write_fabric(config, "")
    changes: list[str] = []
    refresher = CliqueRefresher(
        initial=CLIQUE,
        discovery=discovery_from(config),
        clock=FakeClock(),
        on_change=changes.append,
    )
    refresher.refresh()
    assert refresher.clique_id() == CLIQUE and changes == []


def test_a_node_without_a_clique_adopts_one_and_reports_the_change(tmp_path: Path) -> None:
    config = tmp_path / "gpus.json"
    write_fabric(config, CLIQUE)
    changes: list[str] = []
    refresher = CliqueRefresher(
        initial="", discovery=discovery_from(config), clock=FakeClock(), on_change=changes.append
    )
    refresher.refresh()
    refresher.refresh()  # unchanged: no second report
    assert refresher.clique_id() == CLIQUE and changes == [CLIQUE]


@pytest.mark.parametrize(
    "broken",
    [lambda p: p.write_text("{not json"), lambda p: write_fabric(p, OTHER, state="IN_PROGRESS")],
    ids=["unreadable-config", "strict-fabric-error"],
)
def test_a_failed_refresh_is_logged_and_the_next_one_still_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, broken: Any
) -> None:
    config = tmp_path / "gpus.json"
    write_fabric(config, CLIQUE)
    clock = FakeClock()
    refresher = CliqueRefresher(initial=CLIQUE, discovery=discovery_from(config), clock=clock)
    refresher.start()
    try:
        broken(config)
        assert clock.block_until_waiters(1)
        clock.step(600.0)
        eventually(
            lambda: any(
                m.startswith("error refreshing nvidia.com/gpu.clique node label: ")
                for m in caplog.messages
            ),
            what="the refresh error logged",
        )
        assert refresher.clique_id() == CLIQUE
        write_fabric(config, OTHER)
        assert clock.block_until_waiters(1)
        clock.step(600.0)
        eventually(lambda: refresher.clique_id() == OTHER, what="the next tick")
    finally:
        refresher.stop()


def test_each_tick_patches_the_label_with_the_current_clique(
    api: FakeApiServer, tmp_path: Path
) -> None:
    config = tmp_path / "gpus.json"
    write_fabric(config, CLIQUE)
    clock = FakeClock()
    label = NodeCliqueLabel(client=api.client(), node_name=NODE, clock=RealClock())
    refresher = CliqueRefresher(
        initial=CLIQUE, discovery=discovery_from(config), clock=clock, label=label
    )
    refresher.start()
    try:
        assert node_labels(api)[LABEL] == CLIQUE
        api.client().patch(res.NODES, NODE, {"metadata": {"labels": {LABEL: None}}})
        assert clock.block_until_waiters(1)
        clock.step(600.0)  # unchanged clique: the label is put back
        eventually(lambda: node_labels(api).get(LABEL) == CLIQUE, what="label restored")
        write_fabric(config, OTHER)
        assert clock.block_until_waiters(1)
        clock.step(600.0)
        eventually(lambda: node_labels(api).get(LABEL) == OTHER, what="label follows the clique")
    finally:
        refresher.stop()
    assert LABEL not in node_labels(api)


def test_a_failed_label_patch_on_a_tick_is_only_logged(
    api: FakeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    label = NodeCliqueLabel(client=api.client(), node_name=NODE, clock=RealClock())
    refresher = CliqueRefresher(initial=CLIQUE, discovery=None, clock=FakeClock(), label=label)
    api.inject_error("PATCH", res.NODES, 500)
    refresher.refresh()
    assert any(
        m.startswith(
            "error refreshing nvidia.com/gpu.clique node label: error patching node with label "
            f"nvidia.com/gpu.clique={CLIQUE}: "
        )
        for m in caplog.messages
    ), caplog.messages


# -- the plugin: label at start and shutdown, readers of the clique ID ---------------------------


@contextmanager
def plugin_on(
    api: FakeApiServer, root: Path, *, clique: str, label: bool, **config: Any
) -> Iterator[tuple[KubeletPlugin, Kubelet, Path]]:
    """A started plugin whose fake GPUs come from a file the test may rewrite."""
    fabric = root / "gpus.json"
    write_fabric(fabric, clique)
    discovery = discovery_from(fabric)
    cfg = dataclasses.replace(make_config(root), gpu_clique_label=label, **config)
    plugin = KubeletPlugin(
        config=cfg, client=api.client(), devices=discovery.discover(), discovery=discovery
    )
    plugin.start()
    try:
        yield plugin, Kubelet(cfg), fabric
    finally:
        plugin.stop()


def node_annotations(api: FakeApiServer) -> dict[str, str]:
    node = api.client().get(res.NODES, NODE)
    return dict(node["metadata"].get("annotations") or {})


def test_label_is_set_at_start_and_removed_on_shutdown(api: FakeApiServer, root: Path) -> None:
    """With its mark for the controller (which then leaves the label to the plugin)."""
    owner = c.GPU_CLIQUE_MANAGED_ANNOTATION
    api.client().patch(res.NODES, NODE, {"metadata": {"annotations": {owner: "true"}}})
    with plugin_on(api, root, clique=CLIQUE, label=True):
        assert node_labels(api)[LABEL] == CLIQUE
        assert node_annotations(api)[owner] == c.GPU_CLIQUE_MANAGED_BY_PLUGIN
    assert LABEL not in node_labels(api)
    assert owner not in node_annotations(api)


def test_without_the_flag_the_plugin_never_touches_the_label(
    api: FakeApiServer, root: Path
) -> None:
    api.client().patch(res.NODES, NODE, {"metadata": {"labels": {LABEL: "set-by-gfd"}}})
    with plugin_on(api, root, clique=CLIQUE, label=False):
        assert node_labels(api)[LABEL] == "set-by-gfd"
    assert node_labels(api)[LABEL] == "set-by-gfd"


def test_an_empty_clique_writes_no_label(api: FakeApiServer, root: Path) -> None:
    api.clear_log()
    with plugin_on(api, root, clique="", label=True):
        assert LABEL not in node_labels(api)
        patches = [path for method, path in api.request_log if method == "PATCH"]
        assert patches == []


def test_a_label_patch_error_fails_start_up(api: FakeApiServer, root: Path) -> None:
    fabric = root / "gpus.json"
    write_fabric(fabric, CLIQUE)
    discovery = discovery_from(fabric)
    cfg = dataclasses.replace(make_config(root), gpu_clique_label=True)
    plugin = KubeletPlugin(
        config=cfg, client=api.client(), devices=discovery.discover(), discovery=discovery
    )
    api.inject_error("PATCH", res.NODES, 403)
    with pytest.raises(CliqueLabelError) as failed:
        plugin.start()
    assert str(failed.value).startswith(
        "error starting ComputeDomain manager: error setting nvidia.com/gpu.clique node label: "
        f"error patching node with label nvidia.com/gpu.clique={CLIQUE}: "
    )
    assert not cfg.dra_socket.exists()  # nothing was served


def test_a_failed_removal_on_shutdown_is_only_logged(
    api: FakeApiServer, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with plugin_on(api, root, clique=CLIQUE, label=True):
        api.inject_error("PATCH", res.NODES, 500)
    assert node_labels(api)[LABEL] == CLIQUE
    assert any(
        m.startswith("error removing nvidia.com/gpu.clique node label: ") for m in caplog.messages
    )


def test_removal_on_shutdown_waits_only_its_timeout(
    api: FakeApiServer, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with plugin_on(api, root, clique=CLIQUE, label=True, clique_label_removal_timeout=0.2) as (
        plugin,
        _kubelet,
        _fabric,
    ):
        api.inject_stall("PATCH", res.NODES, 3.0)
        began = time.monotonic()
        plugin.clique.stop()
        assert time.monotonic() - began < 2.0
    assert any("error removing nvidia.com/gpu.clique node label" in m for m in caplog.messages)


def test_every_reader_sees_a_refreshed_clique(api: FakeApiServer, root: Path) -> None:
    """Start without a clique; after a refresh adopts one, a channel claim is released on the
    clique object ``<cd>.<clique>`` with channel device nodes, a daemon claim gets the new
    ``CLIQUE_ID`` and the fabric-imex-mgmt node, and the slice publishes the new cliqueID."""
    caps = root / "fabric-imex-mgmt"
    caps.write_text("DeviceFileMinor: 5\nDeviceFileMode: 256\n")
    with plugin_on(api, root, clique="", label=True, imex_mgmt_caps_file=caps) as (
        plugin,
        kubelet,
        fabric,
    ):
        assert LABEL not in node_labels(api)
        write_fabric(fabric, CLIQUE)
        plugin.clique.refresh()
        assert plugin.clique.clique_id() == CLIQUE
        assert node_labels(api)[LABEL] == CLIQUE

        cd = seed_domain(api)  # Ready only in its clique object <cd>.<CLIQUE>
        channel = seed_claim(api, params=channel_params(cd))
        result = kubelet.prepare(channel).claims[channel["metadata"]["uid"]]
        assert result.error == ""
        spec = json.loads(
            (root / "cdi" / f"{c.CDI_VENDOR}-claim_{channel['metadata']['uid']}.yaml").read_text()
        )
        nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
        assert [n["path"] for n in nodes] == ["/dev/nvidia-caps-imex-channels/channel0"]

        params = {"apiVersion": c.API_VERSION, "kind": c.DAEMON_CONFIG_KIND, "domainID": cd}
        daemon = seed_claim(
            api, namespace=DRIVER_NS, device=c.DAEMON_DEVICE_NAME, request="daemon", params=params
        )
        result = kubelet.prepare(daemon).claims[daemon["metadata"]["uid"]]
        assert result.error == ""
        spec = json.loads(
            (root / "cdi" / f"{c.CDI_VENDOR}-claim_{daemon['metadata']['uid']}.yaml").read_text()
        )
        edits = spec["devices"][0]["containerEdits"]
        assert f"CLIQUE_ID={CLIQUE}" in edits["env"]
        assert [n["path"] for n in edits["deviceNodes"]] == ["/dev/nvidia-caps/nvidia-cap5"]

        def published() -> set[str]:
            return {
                d["attributes"]["cliqueID"]["string"]
                for s in api.objects(res.RESOURCE_SLICES)
                for d in s["spec"]["devices"]
            }

        eventually(lambda: published() == {CLIQUE}, what="the slice republished")
