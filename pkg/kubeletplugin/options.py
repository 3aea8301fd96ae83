"""Command line and environment of ``compute-domain-kubelet-plugin``, parsed into `PluginOptions`.

Owns the plugin's flag table, :data:`PLUGIN_FLAGS` (upstream's flag and env names, one row
each, on the shared mechanism `pkg.runtime.flags`: flag wins over env, empty env is unset except
for ``IMEX_MODE``/``IMEX_ISOLATION``, Go booleans, ``--flag (or ENV): message`` errors with exit 2,
``--version``, ``-v``, ``--logging-format``, ``--vmodule``), and turning the parsed options into
what the binary builds: the `PluginConfig`, the API client (with upstream's client-side limit)
and the device discovery backend.

``-v`` reads ``V`` (upstream's variable), else ``LOG_VERBOSITY``; a repeated
``--additional-namespaces`` or ``--feature-gates`` accumulates as upstream's does
(`pkg.runtime.flags.Repeat`); ``--host_driver-root`` is upstream's other name of
``--nvidia-driver-root``.

Invariants: a `PluginOptions` that exists has a node name and values of the right types; its
fields are exactly the table's rows (a unit test holds them together). Feature gates and
``ADDITIONAL_NAMESPACES`` are checked later by the binary, which exits 1 with ``cannot start:
...`` for them as it always has, and the IMEX mode by `pkg.imex.mode` with upstream's message.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

from pkg.api.constants import GROUP
from pkg.api.namespaces import parse_namespace_list
from pkg.featuregates import (
    CRASH_ON_NVLINK_FABRIC_ERRORS,
    FABRIC_MANAGER_PARTITIONING,
    FeatureGates,
)
from pkg.imex.mode import DEFAULT_HOST_SOCKET_PATH, DRIVER_MANAGED, ISOLATION_DOMAIN, ImexModeConfig
from pkg.kube.client import ApiConnection, RestClient
from pkg.kubeletplugin.checkpointformat import CheckpointCompatibility
from pkg.kubeletplugin.discovery import DeviceDiscovery, DiscoveryError
from pkg.kubeletplugin.discovery.fabric import is_single_node_nvlink, select_dev_root
from pkg.kubeletplugin.discovery.fake import FakeDiscovery
from pkg.kubeletplugin.discovery.nvml import NvmlDiscovery, load_pynvml
from pkg.kubeletplugin.driver import PluginConfig
from pkg.kubeletplugin.driverroot import DriverRoot, DriverRootError
from pkg.runtime.flags import (
    Flag,
    FlagTable,
    Repeat,
    choice,
    parse_bool,
    parse_http_path,
    parse_int,
)

__all__ = [
    "PLUGIN_FLAGS",
    "PluginOptions",
    "api_client_of",
    "build_discovery",
    "parse_args",
    "plugin_config",
]

PROG: Final = "compute-domain-kubelet-plugin"

# Formatted by hand (`# fmt: skip` at its end): one flag per row or two, read like the docs'
# flag table; `ruff format` would give every argument of a row its own line.
# -v reads component-base's V first, as upstream's plugin does; LOG_VERBOSITY (the variable the
# charts set) when V is unset, as this plugin always has.
PLUGIN_FLAGS: Final = FlagTable(prog=PROG, verbosity_env=("V", "LOG_VERBOSITY"), flags=(
    Flag("node-name", "NODE_NAME", str, "", "this node (required)"),
    Flag("namespace", "NAMESPACE", str, "default", "driver namespace"),
    Flag("additional-namespaces", "ADDITIONAL_NAMESPACES", str, "",
         "more namespaces whose IMEX daemons' claims are prepared (comma separated; the "
         "controller's ADDITIONAL_NAMESPACES)", repeat=Repeat.LIST),
    Flag("cdi-root", "CDI_ROOT", str, "/var/run/cdi", "directory of the CDI spec files"),
    # Upstream's names: the host path of the driver installation and its mount in this pod.
    Flag("nvidia-driver-root", ("NVIDIA_DRIVER_ROOT", "HOST_DRIVER_ROOT"), str, "/",
         "the driver installation's path on the host", aliases=("--host_driver-root",)),
    Flag("container-driver-root", "DRIVER_ROOT_CTR_PATH", str, "/driver-root",
         "where the host's driver root is mounted in this container"),
    Flag("kubelet-registrar-directory-path", "KUBELET_REGISTRAR_DIRECTORY_PATH", str,
         "/var/lib/kubelet/plugins_registry", "the kubelet's plugin registration directory"),
    Flag("kubelet-plugins-directory-path", "KUBELET_PLUGINS_DIRECTORY_PATH", str,
         "/var/lib/kubelet/plugins", "the kubelet's plugin data directory"),
    Flag("healthcheck-port", "HEALTHCHECK_PORT", parse_int, -1,
         "port of the gRPC health service (negative: none)"),
    Flag("http-endpoint", "HTTP_ENDPOINT", str, "",
         "host:port for metrics (--metrics-path), /healthz, /readyz"),
    Flag("metrics-path", "METRICS_PATH", parse_http_path, "/metrics",
         "HTTP path of the metrics on --http-endpoint (empty: none)"),
    Flag("debug-endpoints", "DEBUG_ENDPOINTS", parse_bool, False,
         "also serve /debug/informers (every cache's keys and resourceVersions) on "
         "--http-endpoint"),
    Flag("feature-gates", "FEATURE_GATES", str, "", "A=true,B=false", repeat=Repeat.MAP),
    Flag("kubeconfig", "KUBECONFIG", str, None, "kubeconfig file (default: in-cluster)"),
    Flag("kube-api-qps", "KUBE_API_QPS", float, 5.0,
         "client QPS of each clientset (Kubernetes groups; resource.nvidia.com); 0 or less: "
         "no client-side limit"),
    Flag("kube-api-burst", "KUBE_API_BURST", parse_int, 10,
         "client burst of each clientset (Kubernetes groups; resource.nvidia.com)"),
    Flag("device-discovery", "DEVICE_DISCOVERY", choice("nvml", "fake"), "nvml",
         "nvml (the GPUs of this node) or fake (FAKE_GPU_CONFIG, for tests)"),
    Flag("gpu-clique-label-enabled", "GPU_CLIQUE_LABEL_ENABLED", parse_bool, False,
         "keep nvidia.com/gpu.clique=<clique ID> on this node (removed on graceful shutdown)"),
    Flag("imex-mode", "IMEX_MODE", str, DRIVER_MANAGED,
         "driverManaged or hostManaged (the node's own nvidia-imex service)",
         empty_env_overrides=True),
    Flag("imex-isolation", "IMEX_ISOLATION", str, ISOLATION_DOMAIN,
         'domain ("" means domain; channel is not supported yet)', empty_env_overrides=True),
    Flag("imex-host-socket-path", "IMEX_HOST_SOCKET_PATH", str, DEFAULT_HOST_SOCKET_PATH,
         "host IMEX control socket, as seen inside the driver root"),
    Flag("alt-proc-devices-path", "ALT_PROC_DEVICES_PATH", str, "/proc/devices",
         "the host's /proc/devices as mounted in this container", cli=False),
    Flag("checkpoint-compatibility", "CHECKPOINT_COMPATIBILITY",
         choice(*(str(v) for v in CheckpointCompatibility)), str(CheckpointCompatibility.V0_4_1),
         "the oldest upstream kubelet plugin this node's checkpoint must stay readable by "
         "(set before rolling a node back to it; not an upstream flag)"),
    Flag("fake-gpu-config", "FAKE_GPU_CONFIG", str, "",
         "the fake GPUs of --device-discovery=fake (JSON)", cli=False),
))  # fmt: skip
"""The plugin's flags: upstream's names and env variables, one row each."""


@dataclass(frozen=True)
class PluginOptions:
    """Every row of :data:`PLUGIN_FLAGS` by its dest, parsed; see the table for meanings."""

    node_name: str
    namespace: str
    additional_namespaces: str
    cdi_root: str
    nvidia_driver_root: str
    container_driver_root: str
    kubelet_registrar_directory_path: str
    kubelet_plugins_directory_path: str
    healthcheck_port: int
    http_endpoint: str
    metrics_path: str
    debug_endpoints: bool
    feature_gates: str
    kubeconfig: str | None
    kube_api_qps: float
    kube_api_burst: int
    device_discovery: str
    gpu_clique_label_enabled: bool
    imex_mode: str
    imex_isolation: str
    imex_host_socket_path: str
    alt_proc_devices_path: str
    checkpoint_compatibility: str
    fake_gpu_config: str
    v: int
    logging_format: str
    vmodule: str

    def dump(self) -> dict[str, object]:
        """Every value by dest, sorted: the start-up dump's ``Flags:``."""
        return dict(sorted(dataclasses.asdict(self).items()))


def parse_args(argv: Sequence[str], env: Mapping[str, str] | None = None) -> PluginOptions:
    """Parse ``argv`` (without the program name) with ``env`` (default: the process's) as
    fallback. ``--version`` prints the build and raises ``SystemExit(0)`` before ``env`` is
    read; a bad value or a missing node name prints the usage and raises ``SystemExit(2)``."""
    env = os.environ if env is None else env
    values = PLUGIN_FLAGS.parse_or_exit(argv, env)
    if not values.get_str("node_name"):
        PLUGIN_FLAGS.exit_with(PLUGIN_FLAGS.error("node_name", "required"))
    # The table's parsers and defaults give each row its field's type (test_plugin_options).
    return PluginOptions(**cast(dict[str, Any], dict(values.values)))


def plugin_config(opts: PluginOptions, *, imex: ImexModeConfig) -> PluginConfig:
    """The driver's configuration from the options and the validated IMEX mode; raises
    ``ValueError`` for an invalid ``ADDITIONAL_NAMESPACES`` name."""
    additional = parse_namespace_list(opts.additional_namespaces)
    host, _, port = opts.http_endpoint.rpartition(":")
    return PluginConfig(
        node_name=opts.node_name,
        namespace=opts.namespace,
        additional_namespaces=tuple(n for n in additional if n != opts.namespace),
        cdi_root=Path(opts.cdi_root),
        registrar_dir=Path(opts.kubelet_registrar_directory_path),
        plugins_dir=Path(opts.kubelet_plugins_directory_path),
        proc_devices=Path(opts.alt_proc_devices_path),
        driver_root=Path(opts.nvidia_driver_root),
        container_driver_root=Path(opts.container_driver_root),
        healthcheck_port=opts.healthcheck_port,
        metrics_port=int(port) if port else -1,
        metrics_host=host,
        metrics_path=opts.metrics_path,
        debug_endpoints=opts.debug_endpoints,
        gpu_clique_label=opts.gpu_clique_label_enabled,
        imex=imex,
        imex_host_socket_path=opts.imex_host_socket_path,
        checkpoint_compatibility=CheckpointCompatibility(opts.checkpoint_compatibility),
    )


def api_client_of(opts: PluginOptions, connection: ApiConnection) -> RestClient:
    """The plugin's API client over ``connection`` (`pkg.kube.config.load_api_client`) with
    upstream's client-side limit: ``--kube-api-qps`` and ``--kube-api-burst`` for each of its
    two clientsets, one budget shared by the Kubernetes API groups and one for
    resource.nvidia.com, as in the controller's client; a QPS of 0 or less sets no limit."""
    qps = opts.kube_api_qps
    return RestClient(
        connection,
        user_agent=PROG,
        qps=qps if qps > 0 else None,
        burst=opts.kube_api_burst,
        separate_groups=(GROUP,),
    )


def build_discovery(opts: PluginOptions, *, gates: FeatureGates | None = None) -> DeviceDiscovery:
    """Fake GPUs, or NVML loaded by absolute path from the driver root (no LD_LIBRARY_PATH).

    Gate CrashOnNVLinkFabricErrors decides whether a GPU with a fabric error stops start-up;
    with gate FabricManagerPartitioning a single-node NVLink system (probed under the dev root
    here, an I/O error is a `DiscoveryError`) tolerates incomplete fabric registrations.
    """
    gates = gates or FeatureGates()
    strict = gates.enabled(CRASH_ON_NVLINK_FABRIC_ERRORS)
    single_node = False
    if gates.enabled(FABRIC_MANAGER_PARTITIONING):
        single_node = is_single_node_nvlink(select_dev_root(Path(opts.container_driver_root)))
    if opts.device_discovery == "fake":
        return FakeDiscovery.from_setting(
            opts.fake_gpu_config,
            node_name=opts.node_name,
            strict_fabric=strict,
            single_node_nvlink=single_node,
        )
    root = DriverRoot(
        host=Path(opts.nvidia_driver_root), container=Path(opts.container_driver_root)
    )
    try:
        library = root.nvml_library()
    except DriverRootError as err:
        raise DiscoveryError(str(err)) from err
    return NvmlDiscovery(
        nvml=load_pynvml(library), strict_fabric=strict, single_node_nvlink=single_node
    )
