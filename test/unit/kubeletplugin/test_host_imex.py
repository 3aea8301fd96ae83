"""Host-managed IMEX mode in the kubelet plugin (upstream v0.5 #1236).

The readiness query (`HostImexCtl`: lookup under the dev root, ``chroot`` argv, upstream's error
strings) with an injected process runner, and Prepare/Unprepare of a plugin started in
host-managed mode against the fake API server: readiness ok / not ready / ctl missing, no
clique, ``allocationMode: All`` ignored, daemon claims refused, no node label either way, and
only ``channel-0`` published.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import yaml
from testsupport.kp_harness import (  # type: ignore[import-not-found, unused-ignore]
    CLIQUE,
    DRIVER_NS,
    NODE,
    channel_params,
    make_config,
    seed_claim,
    short_tmpdir,
)

from pkg.api import constants as c
from pkg.base.types import JSON
from pkg.draplugin.claims import ClaimRef
from pkg.draplugin.errors import PermanentError, RetryableError
from pkg.imex.ctl import CommandResult
from pkg.imex.mode import ImexModeConfig
from pkg.kube import resources as res
from pkg.kubeletplugin.discovery import NodeDevices
from pkg.kubeletplugin.driver import KubeletPlugin
from pkg.kubeletplugin.hostimex import DAEMON_CLAIMS_REFUSED, HostImexCtl, HostImexError
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer

SOCKET = "/etc/nvidia-imex/imex_ctrl.sock"
REPO = Path(__file__).resolve().parents[3]
PLUGIN = REPO / "cmd" / "compute-domain-kubelet-plugin" / "compute_domain_kubelet_plugin.py"


@dataclass
class FakeRunner:
    """`CommandRunner` answering every command with ``result`` (or raising ``error``)."""

    result: CommandResult = field(default_factory=lambda: CommandResult(0, "READY\n"))
    error: Exception | None = None
    calls: list[list[str]] = field(default_factory=list)

    def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        self.calls.append(list(argv))
        if self.error is not None:
            raise self.error
        return self.result


def dev_root(path: Path, *, ctl_dir: str | None = "usr/bin") -> Path:
    """A driver root with ``dev/`` (so it is the dev root) and, unless None, the ctl."""
    (path / "dev").mkdir(parents=True, exist_ok=True)
    if ctl_dir is not None:
        (path / ctl_dir).mkdir(parents=True, exist_ok=True)
        ctl = path / ctl_dir / "nvidia-imex-ctl"
        ctl.write_text("#!/bin/sh\n")
        ctl.chmod(0o755)
    return path


# -- HostImexCtl --------------------------------------------------------------------------------


def test_ready_query_runs_chrooted_ctl_with_the_socket(tmp_path: Path) -> None:
    runner = FakeRunner(result=CommandResult(0, "READY\n"))
    ctl = HostImexCtl(dev_root=dev_root(tmp_path), socket_path=SOCKET, runner=runner)
    ctl.check_ready()
    assert runner.calls == [["chroot", str(tmp_path), "nvidia-imex-ctl", "-q", f"--u={SOCKET}"]]


@pytest.mark.parametrize("where", ["opt/bin", "usr/sbin", "sbin", "bin", "."])
def test_ctl_is_found_in_every_upstream_directory(tmp_path: Path, where: str) -> None:
    ctl = HostImexCtl(
        dev_root=dev_root(tmp_path, ctl_dir=where), socket_path=SOCKET, runner=FakeRunner()
    )
    assert ctl.find_ctl() == f"/{where}/nvidia-imex-ctl".replace("/./", "/")


def test_ctl_symlink_resolves_inside_the_root_and_a_directory_is_skipped(tmp_path: Path) -> None:
    root = dev_root(tmp_path, ctl_dir="opt/imex")
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "nvidia-imex-ctl").symlink_to("/opt/imex/nvidia-imex-ctl")
    (root / "opt" / "bin" / "nvidia-imex-ctl").mkdir(parents=True)  # not a regular file
    ctl = HostImexCtl(dev_root=root, socket_path=SOCKET, runner=FakeRunner())
    assert ctl.find_ctl() == "/usr/bin/nvidia-imex-ctl"


@pytest.mark.parametrize(
    ("runner", "message"),
    [
        (
            FakeRunner(result=CommandResult(0, "UNAVAILABLE\n")),
            "host nvidia-imex daemon not ready: UNAVAILABLE\n",
        ),
        (
            FakeRunner(result=CommandResult(1, "connect: No such file or directory\n")),
            'error running nvidia-imex-ctl (socket "/etc/nvidia-imex/imex_ctrl.sock"): exit status '
            "1, output: connect: No such file or directory\n",
        ),
        (
            FakeRunner(error=subprocess.TimeoutExpired(["chroot"], 30)),
            'error running nvidia-imex-ctl (socket "/etc/nvidia-imex/imex_ctrl.sock"): no answer '
            "within 30s, output: ",
        ),
    ],
    ids=["not-ready", "exit-1", "timeout"],
)
def test_not_ready_answers_carry_upstreams_text(
    tmp_path: Path, runner: FakeRunner, message: str
) -> None:
    ctl = HostImexCtl(dev_root=dev_root(tmp_path), socket_path=SOCKET, runner=runner)
    with pytest.raises(HostImexError) as err:
        ctl.check_ready()
    assert str(err.value) == message


def test_output_need_only_contain_ready(tmp_path: Path) -> None:
    runner = FakeRunner(result=CommandResult(0, "IMEX state: READY (2 nodes)\n"))
    HostImexCtl(dev_root=dev_root(tmp_path), socket_path=SOCKET, runner=runner).check_ready()


def test_missing_ctl_is_named_and_nothing_runs(tmp_path: Path) -> None:
    runner = FakeRunner()
    ctl = HostImexCtl(dev_root=dev_root(tmp_path, ctl_dir=None), socket_path=SOCKET, runner=runner)
    with pytest.raises(HostImexError) as err:
        ctl.check_ready()
    assert str(err.value) == (
        f'nvidia-imex-ctl not found under driver root "{tmp_path}": error locating '
        '"nvidia-imex-ctl" (is nvidia-imex installed on this node?)'
    )
    assert runner.calls == []


# -- the plugin in host-managed mode ------------------------------------------------------------


@contextmanager
def host_managed_plugin(
    server: FakeApiServer,
    root: Path,
    runner: FakeRunner,
    *,
    clique: str = CLIQUE,
    ctl: bool = True,
) -> Iterator[KubeletPlugin]:
    config = replace(
        make_config(root),
        imex=ImexModeConfig(mode="hostManaged"),
        container_driver_root=dev_root(root / "driver-root", ctl_dir="usr/bin" if ctl else None),
    )
    server.seed(res.NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    plugin = KubeletPlugin(
        config=config,
        client=server.client(),
        command_runner=runner,
        devices=NodeDevices(driver_version="580.65.06", gpus=(), clique_id=clique),
    )
    plugin.start()
    try:
        yield plugin
    finally:
        plugin.stop()


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as srv:
        yield srv


def seed_domain(server: FakeApiServer, *, namespace: str = "team", name: str = "cd") -> str:
    cd = server.seed(
        res.COMPUTE_DOMAINS,
        {
            "apiVersion": c.API_VERSION,
            "kind": c.COMPUTE_DOMAIN_KIND,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"channel": {"resourceClaimTemplate": {"name": "rct"}}},
            "status": {"status": "Ready"},
        },
    )
    return str(cd["metadata"]["uid"])


def cdi_device_nodes(root: Path, claim: JSON) -> list[JSON]:
    spec = root / "cdi" / f"k8s.compute-domain.nvidia.com-claim_{claim['metadata']['uid']}.yaml"
    if not spec.exists():  # nothing to inject: no claim spec at all
        return []
    doc = yaml.safe_load(spec.read_text())
    return [n for d in doc["devices"] for n in d["containerEdits"].get("deviceNodes") or []]


def node_labels(server: FakeApiServer) -> dict[str, str]:
    return dict(server.objects(res.NODES)[0]["metadata"].get("labels") or {})


def prepare(plugin: KubeletPlugin, claim: JSON) -> object:
    return plugin.prepare_claim(claim, deadline=time.monotonic() + 5)


def test_ready_host_imex_gives_one_channel_even_for_all(server: FakeApiServer) -> None:
    runner = FakeRunner()
    with short_tmpdir() as root, host_managed_plugin(server, root, runner) as plugin:
        uid = seed_domain(server)
        claim = seed_claim(server, params=channel_params(uid, allocationMode="All"))
        devices = prepare(plugin, claim)
        assert [d.device_name for d in devices] == ["channel-0"]  # type: ignore[attr-defined]
        (dev,) = cdi_device_nodes(root, claim)
        assert dev["path"] == "/dev/nvidia-caps-imex-channels/channel0"
        assert runner.calls[0][:3] == ["chroot", str(root / "driver-root"), "nvidia-imex-ctl"]
        assert c.COMPUTE_DOMAIN_LABEL not in node_labels(server)
        # Only channel-0 is published: no daemon runs here.
        eventually(lambda: bool(server.objects(res.RESOURCE_SLICES)))
        (slice_,) = server.objects(res.RESOURCE_SLICES)
        assert [d["name"] for d in slice_["spec"]["devices"]] == ["channel-0"]


def test_host_imex_not_ready_is_retryable_and_nothing_is_injected(server: FakeApiServer) -> None:
    runner = FakeRunner(result=CommandResult(0, "UNAVAILABLE\n"))
    with short_tmpdir() as root, host_managed_plugin(server, root, runner) as plugin:
        claim = seed_claim(server, params=channel_params(seed_domain(server)))
        with pytest.raises(RetryableError) as err:
            prepare(plugin, claim)
        assert str(err.value) == (
            "host nvidia-imex daemon readiness check failed: host nvidia-imex daemon not ready: "
            "UNAVAILABLE\n"
        )
        assert cdi_device_nodes(root, claim) == []
        # The kubelet's retry succeeds once the host says READY.
        runner.result = CommandResult(0, "READY\n")
        prepare(plugin, claim)
        assert len(cdi_device_nodes(root, claim)) == 1


def test_missing_ctl_fails_the_claim_retryably(server: FakeApiServer) -> None:
    runner = FakeRunner()
    with short_tmpdir() as root, host_managed_plugin(server, root, runner, ctl=False) as plugin:
        claim = seed_claim(server, params=channel_params(seed_domain(server)))
        with pytest.raises(
            RetryableError,
            match="readiness check failed: nvidia-imex-ctl not found under driver root",
        ):
            prepare(plugin, claim)
        assert runner.calls == []


def test_no_clique_succeeds_without_a_device_or_a_query(server: FakeApiServer) -> None:
    runner = FakeRunner(result=CommandResult(1, "unreachable"))
    with short_tmpdir() as root, host_managed_plugin(server, root, runner, clique="") as plugin:
        claim = seed_claim(server, params=channel_params(seed_domain(server)))
        prepare(plugin, claim)
        assert cdi_device_nodes(root, claim) == []
        assert runner.calls == []


def test_daemon_claim_is_refused_permanently(server: FakeApiServer) -> None:
    with short_tmpdir() as root, host_managed_plugin(server, root, FakeRunner()) as plugin:
        uid = seed_domain(server)
        params = {"apiVersion": c.API_VERSION, "kind": c.DAEMON_CONFIG_KIND, "domainID": uid}
        claim = seed_claim(
            server,
            namespace=DRIVER_NS,
            device=c.DAEMON_DEVICE_NAME,
            params=params,
            request="daemon",
        )
        with pytest.raises(PermanentError) as err:
            prepare(plugin, claim)
        assert str(err.value) == DAEMON_CLAIMS_REFUSED
        assert plugin.state is not None and plugin.state.entries() == {}


def test_other_namespace_is_permanent_and_a_held_channel_retryable(server: FakeApiServer) -> None:
    with short_tmpdir() as root, host_managed_plugin(server, root, FakeRunner()) as plugin:
        uid = seed_domain(server)
        foreign = seed_claim(server, namespace="other", params=channel_params(uid))
        with pytest.raises(PermanentError, match="namespace is different"):
            prepare(plugin, foreign)
        first = seed_claim(server, params=channel_params(uid))
        prepare(plugin, first)
        second = seed_claim(server, params=channel_params(seed_domain(server, name="cd2")))
        with pytest.raises(RetryableError, match="channel 0 already allocated by claim"):
            prepare(plugin, second)
        same = seed_claim(server, params=channel_params(uid))  # the same domain shares it
        devices = plugin.prepare_claim(same, deadline=time.monotonic() + 5)
        assert [d.device_name for d in devices] == [c.CHANNEL_DEVICE_NAME]


def test_unprepare_removes_no_node_label(server: FakeApiServer) -> None:
    with short_tmpdir() as root, host_managed_plugin(server, root, FakeRunner()) as plugin:
        uid = seed_domain(server)
        node = server.objects(res.NODES)[0]
        node["metadata"]["labels"] = {c.COMPUTE_DOMAIN_LABEL: uid}  # e.g. left by a past mode
        server.client().update(res.NODES, node)
        claim = seed_claim(server, params=channel_params(uid))
        prepare(plugin, claim)
        meta = claim["metadata"]
        plugin.unprepare_claim(
            ClaimRef(namespace=meta["namespace"], uid=meta["uid"], name=meta["name"]),
            deadline=time.monotonic() + 5,
        )
        assert plugin.state is not None and plugin.state.entries() == {}
        assert node_labels(server) == {c.COMPUTE_DOMAIN_LABEL: uid}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"IMEX_MODE": "hostManaged"},
            'imex.mode="hostManaged" requires the HostManagedIMEXDaemon feature gate to be enabled',
        ),
        ({"IMEX_MODE": ""}, 'unknown imex.mode ""'),
        (
            {"IMEX_ISOLATION": "channel"},
            'imex.isolation="channel" is not supported yet: per-workload IMEX channel allocation '
            "is not implemented",
        ),
        ({"IMEX_ISOLATION": "x"}, 'unknown imex.isolation "x": must be "domain" or "channel"'),
    ],
    ids=["no-gate", "empty-mode", "channel", "unknown-isolation"],
)
def test_plugin_binary_exits_1_on_bad_imex_config(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    base = {k: v for k, v in os.environ.items() if k not in ("FEATURE_GATES", "PYTHONPATH")}
    done = subprocess.run(
        [sys.executable, str(PLUGIN), "--node-name=n1"],
        env={**base, **env},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert f"Error: imex configuration validation failed: {message}\n" in done.stderr
