"""The plugin's flag table (`pkg.kubeletplugin.options`): upstream's names, env fallbacks,
defaults, errors, and the `PluginConfig` built from them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from kubernetes import client as k8s_client

from pkg.featuregates import FeatureGates
from pkg.imex.mode import DEFAULT_HOST_SOCKET_PATH, ImexModeConfig
from pkg.kube.config import Connection
from pkg.kubeletplugin.options import (
    PLUGIN_FLAGS,
    PluginOptions,
    api_client_of,
    parse_args,
    plugin_config,
)

NODE = ["--node-name", "n1"]


def test_options_fields_are_the_tables_rows() -> None:
    """`parse_args` builds `PluginOptions` from the table's values by name."""
    fields = {f.name: f for f in dataclasses.fields(PluginOptions)}
    assert list(fields) == [f.dest for f in PLUGIN_FLAGS.all_flags]
    defaults = parse_args(NODE, {})
    for row in PLUGIN_FLAGS.all_flags:
        if row.dest != "node_name":
            assert getattr(defaults, row.dest) == row.default, row.dest


def test_upstream_defaults() -> None:
    opts = parse_args(NODE, {})
    assert (opts.namespace, opts.cdi_root, opts.healthcheck_port) == ("default", "/var/run/cdi", -1)
    assert opts.kubelet_registrar_directory_path == "/var/lib/kubelet/plugins_registry"
    assert opts.kubelet_plugins_directory_path == "/var/lib/kubelet/plugins"
    assert (opts.nvidia_driver_root, opts.container_driver_root) == ("/", "/driver-root")
    assert (opts.imex_mode, opts.imex_isolation) == ("driverManaged", "domain")
    assert opts.imex_host_socket_path == DEFAULT_HOST_SOCKET_PATH
    assert (opts.kubeconfig, opts.device_discovery, opts.v) == (None, "nvml", 0)
    assert not opts.gpu_clique_label_enabled and not opts.debug_endpoints
    assert opts.alt_proc_devices_path == "/proc/devices"


def test_env_fallbacks_and_flags_win() -> None:
    env = {
        "NODE_NAME": "env-node",
        "HOST_DRIVER_ROOT": "/old",
        "LOG_VERBOSITY": "6",
        "GPU_CLIQUE_LABEL_ENABLED": "True",
        "HEALTHCHECK_PORT": "51515",
        "ALT_PROC_DEVICES_PATH": "/alt",
        "KUBECONFIG": "/kc",
    }
    opts = parse_args([], env)
    assert (opts.node_name, opts.nvidia_driver_root, opts.v) == ("env-node", "/old", 6)
    assert opts.gpu_clique_label_enabled and opts.healthcheck_port == 51515
    assert (opts.alt_proc_devices_path, opts.kubeconfig) == ("/alt", "/kc")
    assert (
        parse_args([], {**env, "NVIDIA_DRIVER_ROOT": "/run/nvidia/driver"}).nvidia_driver_root
        == "/run/nvidia/driver"
    )
    opts = parse_args(["--node-name=flag", "-v=2", "--gpu-clique-label-enabled=false"], env)
    assert (opts.node_name, opts.v, opts.gpu_clique_label_enabled) == ("flag", 2, False)


def test_empty_env_is_unset_except_for_the_imex_settings() -> None:
    opts = parse_args(
        NODE, {"NAMESPACE": "", "CDI_ROOT": "", "IMEX_MODE": "", "IMEX_ISOLATION": ""}
    )
    assert (opts.namespace, opts.cdi_root) == ("default", "/var/run/cdi")
    assert (opts.imex_mode, opts.imex_isolation) == ("", "")  # refused later, upstream's text


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {}, "--node-name (or NODE_NAME): required"),
        (
            NODE,
            {"GPU_CLIQUE_LABEL_ENABLED": "yes"},
            '--gpu-clique-label-enabled (or GPU_CLIQUE_LABEL_ENABLED): invalid boolean "yes"',
        ),
        (
            [*NODE, "--device-discovery=gpu"],
            {},
            '--device-discovery (or DEVICE_DISCOVERY): invalid choice "gpu"',
        ),
        (NODE, {"LOG_VERBOSITY": "high"}, '--v (or V, LOG_VERBOSITY): "high" is not an integer'),
    ],
    ids=["no-node", "bool-yes", "bad-discovery", "bad-verbosity"],
)
def test_bad_values_exit_2_naming_flag_and_env(
    argv: list[str], env: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv, env)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_plugin_config_from_options() -> None:
    opts = parse_args(
        [*NODE, "--namespace=drv", "--http-endpoint=:8081"],
        {
            "ADDITIONAL_NAMESPACES": "old, drv",
            "GPU_CLIQUE_LABEL_ENABLED": "1",
            "KUBELET_PLUGINS_DIRECTORY_PATH": "/plugins",
        },
    )
    imex = ImexModeConfig()
    config = plugin_config(opts, imex=imex)
    assert (config.node_name, config.namespace, config.additional_namespaces) == (
        "n1",
        "drv",
        ("old",),
    )
    assert (config.metrics_host, config.metrics_port, config.healthcheck_port) == ("", 8081, -1)
    assert config.plugins_dir == Path("/plugins") and config.proc_devices == Path("/proc/devices")
    assert config.gpu_clique_label and config.imex is imex
    assert plugin_config(parse_args(NODE, {}), imex=imex).metrics_port == -1
    with pytest.raises(ValueError, match="Bad_NS"):
        plugin_config(parse_args(NODE, {"ADDITIONAL_NAMESPACES": "Bad_NS"}), imex=imex)


def test_dump_names_every_flag() -> None:
    dump = parse_args(NODE, {}).dump()
    assert list(dump) == sorted(dump) and dump["node_name"] == "n1" and dump["v"] == 0
    assert set(dump) == {f.dest for f in PLUGIN_FLAGS.all_flags}


def test_v_is_read_first_as_upstreams_then_log_verbosity() -> None:
    """Upstream's plugin reads ``V`` for ``-v``; ``LOG_VERBOSITY`` still works when it is unset."""
    assert parse_args(NODE, {"V": "5"}).v == 5
    assert parse_args(NODE, {"V": "5", "LOG_VERBOSITY": "3"}).v == 5
    assert parse_args(NODE, {"V": "", "LOG_VERBOSITY": "3"}).v == 3
    assert parse_args([*NODE, "-v", "1"], {"V": "5", "LOG_VERBOSITY": "3"}).v == 1


def test_repeated_namespaces_and_gates_accumulate_as_upstreams() -> None:
    opts = parse_args(
        [*NODE, "--additional-namespaces=a", "--additional-namespaces", "b,c"],
        {"ADDITIONAL_NAMESPACES": "from-env"},
    )
    assert plugin_config(opts, imex=ImexModeConfig()).additional_namespaces == ("a", "b", "c")
    opts = parse_args(
        [
            *NODE,
            "--feature-gates=MPSSupport=false",
            "--feature-gates",
            "CrashOnNVLinkFabricErrors=false",
        ],
        {"FEATURE_GATES": "MPSSupport=true,FabricManagerPartitioning=true"},
    )
    assert FeatureGates.parse(opts.feature_gates).overrides == {
        "MPSSupport": False,
        "FabricManagerPartitioning": True,
        "CrashOnNVLinkFabricErrors": False,
    }


def test_host_driver_root_is_upstreams_other_name_of_nvidia_driver_root() -> None:
    for spelling in (["--host_driver-root", "/run/nvidia/driver"], ["-host_driver-root=/r"]):
        opts = parse_args([*NODE, *spelling], {"NVIDIA_DRIVER_ROOT": "/env"})
        assert opts.nvidia_driver_root == spelling[-1].rpartition("=")[2]


def test_metrics_path_reaches_the_plugin_config() -> None:
    imex = ImexModeConfig()
    assert plugin_config(parse_args(NODE, {}), imex=imex).metrics_path == "/metrics"
    opts = parse_args([*NODE, "--metrics-path=custom/"], {"METRICS_PATH": "/env"})
    assert plugin_config(opts, imex=imex).metrics_path == "/custom"
    assert parse_args(NODE, {"METRICS_PATH": "/env"}).metrics_path == "/env"


def test_api_client_has_upstreams_client_side_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """5 QPS and a burst of 10 per clientset by default, as upstream's plugin client: the
    Kubernetes groups share one bucket, resource.nvidia.com has its own."""
    slept: list[float] = []
    monkeypatch.setattr("pkg.kube.client.time.sleep", slept.append)
    monkeypatch.setattr("pkg.kube.client.time.monotonic", lambda: 0.0)
    connection = Connection(k8s_client.Configuration())
    opts = parse_args(NODE, {})
    assert (opts.kube_api_qps, opts.kube_api_burst) == (5.0, 10)
    client = api_client_of(opts, connection)
    core, resource, nvidia = (
        client._throttle_for("/api/v1/nodes/n"),
        client._throttle_for("/apis/resource.k8s.io/v1/resourceslices"),
        client._throttle_for("/apis/resource.nvidia.com/v1beta1/computedomains"),
    )
    assert resource is core and nvidia is not core
    for _ in range(5):
        core.wait()
        resource.wait()  # the same clientset: the same budget
    for _ in range(10):
        nvidia.wait()  # the other clientset: its own budget
    assert slept == []
    resource.wait()
    assert slept == [pytest.approx(1 / 5.0)]
    opts = parse_args([*NODE, "--kube-api-qps=50"], {"KUBE_API_BURST": "2", "KUBE_API_QPS": "1"})
    assert (opts.kube_api_qps, opts.kube_api_burst) == (50.0, 2)
    assert api_client_of(parse_args([*NODE, "--kube-api-qps=0"], {}), connection)._throttle is None
