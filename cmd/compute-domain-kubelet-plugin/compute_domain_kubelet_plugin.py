"""compute-domain-kubelet-plugin: the ComputeDomain DRA kubelet plugin of one node.

Parses upstream's flags/env into a `PluginConfig` (``--version`` prints the build and exits
first), logs the build as its first line, discovers devices (NVML or fake GPUs), builds
`pkg.kubeletplugin.driver.KubeletPlugin` and runs it until SIGTERM/SIGINT, then unlinks its
sockets and exits 0. Start-up failures (bad device state, missing /proc/devices entry) exit 1
with the reason on stderr; a bad ``IMEX_MODE``/``IMEX_ISOLATION`` (`pkg.imex.mode`) exits 1 with
upstream's ``Error: imex configuration validation failed: ...`` line, and host-managed IMEX mode
skips the driver-version check (the host's IMEX, not ours, runs). Tracing follows the
standard ``OTEL_*`` env (`pkg.runtime.tracing`);
pending spans are flushed on exit. ``/metrics`` serves `BUILD_INFO_METRIC` from the start.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path

try:
    import pkg  # noqa: F401
except ImportError:  # run as a script from a checkout: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from prometheus_client import CollectorRegistry

from pkg.api.namespaces import parse_namespace_list
from pkg.featuregates import (
    CRASH_ON_NVLINK_FABRIC_ERRORS,
    FABRIC_MANAGER_PARTITIONING,
    IMEX_DAEMONS_WITH_DNS_NAMES,
    FeatureGateError,
    FeatureGates,
)
from pkg.imex.mode import (
    DEFAULT_HOST_SOCKET_PATH,
    DRIVER_MANAGED,
    ISOLATION_DOMAIN,
    ImexModeConfig,
    validate_or_exit,
)
from pkg.kube.client import RestClient
from pkg.kube.config import load_api_client
from pkg.kubeletplugin.clique import CliqueLabelError
from pkg.kubeletplugin.discovery import DeviceDiscovery, DiscoveryError
from pkg.kubeletplugin.discovery.base import check_driver_version
from pkg.kubeletplugin.discovery.fabric import is_single_node_nvlink, select_dev_root
from pkg.kubeletplugin.discovery.fake import FakeDiscovery
from pkg.kubeletplugin.discovery.nvml import NvmlDiscovery, load_pynvml
from pkg.kubeletplugin.driver import KubeletPlugin, PluginConfig
from pkg.kubeletplugin.driverroot import DriverRoot, DriverRootError
from pkg.kubeletplugin.procdevices import ProcDevicesError
from pkg.runtime.buildinfo import load_build_info
from pkg.runtime.buildinfometric import register_build_info
from pkg.runtime.logsetup import (
    LoggingConfigError,
    parse_vmodule,
    setup_logging,
    validate_logging_format,
)
from pkg.runtime.startupconfig import startup_config
from pkg.runtime.tracing import setup_tracing
from pkg.runtime.versionflag import add_version_flag

PROG = "compute-domain-kubelet-plugin"
# The plugin's metrics are upstream's nvidia_dra_*; the component name keeps this one apart from
# the controller's (nvidia_dra_compute_domain_controller_build_info) without a job label.
BUILD_INFO_METRIC = "nvidia_dra_compute_domain_kubelet_plugin_build_info"

log = logging.getLogger(PROG)


_TRUE = ("1", "t", "true", "yes", "on")
_FALSE = ("0", "f", "false", "no", "off", "")


def _env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_version_flag(p)
    p.add_argument("--node-name", default=_env("NODE_NAME"))
    p.add_argument("--namespace", default=_env("NAMESPACE", "default"))
    p.add_argument("--additional-namespaces", default=_env("ADDITIONAL_NAMESPACES"),
                   help="more namespaces whose IMEX daemons' claims are prepared (comma "
                   "separated; the controller's ADDITIONAL_NAMESPACES)")  # fmt: skip
    p.add_argument("--cdi-root", default=_env("CDI_ROOT", "/var/run/cdi"))
    # Upstream's names: the host path of the driver installation and its mount in this pod.
    host_root = _env("NVIDIA_DRIVER_ROOT") or _env("HOST_DRIVER_ROOT") or "/"
    p.add_argument("--nvidia-driver-root", default=host_root)
    p.add_argument("--container-driver-root", default=_env("DRIVER_ROOT_CTR_PATH", "/driver-root"))
    registrar = _env("KUBELET_REGISTRAR_DIRECTORY_PATH", "/var/lib/kubelet/plugins_registry")
    p.add_argument("--kubelet-registrar-directory-path", default=registrar)
    plugins = _env("KUBELET_PLUGINS_DIRECTORY_PATH", "/var/lib/kubelet/plugins")
    p.add_argument("--kubelet-plugins-directory-path", default=plugins)
    # String defaults go through `type` after the command line is read (--version first).
    p.add_argument("--healthcheck-port", type=int, default=_env("HEALTHCHECK_PORT", "-1"))
    p.add_argument("--http-endpoint", default=_env("HTTP_ENDPOINT"),
                   help="host:port for /metrics, /healthz, /readyz")  # fmt: skip
    p.add_argument("--debug-endpoints", action=argparse.BooleanOptionalAction, default=None,
                   help="also serve /debug/informers (every cache's keys and resourceVersions) "
                   "on --http-endpoint")  # fmt: skip
    p.add_argument("--feature-gates", default=_env("FEATURE_GATES"))
    p.add_argument("--kubeconfig", default=_env("KUBECONFIG") or None)
    p.add_argument("--device-discovery", choices=["nvml", "fake"],
                   default=_env("DEVICE_DISCOVERY", "nvml"))  # fmt: skip
    p.add_argument("-v", "--v", type=int, default=_env("LOG_VERBOSITY", "0"))
    p.add_argument("--logging-format", default=_env("LOGGING_FORMAT", "text"),
                   help="text (klog) or json")  # fmt: skip
    p.add_argument("--vmodule", default=_env("VMODULE"), help="per-file verbosity: pattern=N,...")
    p.add_argument("--gpu-clique-label-enabled", nargs="?", const="true", default=None,
                   help="keep nvidia.com/gpu.clique=<clique ID> on this node (removed on "
                   "graceful shutdown)")  # fmt: skip
    # An empty IMEX_MODE overrides the default (and fails validation), as upstream's CLI.
    p.add_argument(
        "--imex-mode",
        default=_env("IMEX_MODE", DRIVER_MANAGED),
        help="driverManaged or hostManaged (the node's own nvidia-imex service)",
    )
    p.add_argument(
        "--imex-isolation",
        default=_env("IMEX_ISOLATION", ISOLATION_DOMAIN),
        help='domain ("" means domain; channel is not supported yet)',
    )
    p.add_argument("--imex-host-socket-path",
                   default=_env("IMEX_HOST_SOCKET_PATH", DEFAULT_HOST_SOCKET_PATH),
                   help="host IMEX control socket, as seen inside the driver root")  # fmt: skip
    args = p.parse_args(argv)
    clique_label = args.gpu_clique_label_enabled
    if clique_label is None:
        clique_label = _env("GPU_CLIQUE_LABEL_ENABLED")
    if clique_label.strip().lower() not in _TRUE + _FALSE:
        p.error(f'--gpu-clique-label-enabled: invalid boolean "{clique_label}"')
    args.gpu_clique_label_enabled = clique_label.strip().lower() in _TRUE
    try:
        validate_logging_format(args.logging_format)
        parse_vmodule(args.vmodule)
    except LoggingConfigError as err:
        p.error(str(err))
    if args.debug_endpoints is None:
        value = _env("DEBUG_ENDPOINTS").strip().lower()
        if value not in _TRUE + _FALSE:
            p.error(f'environment DEBUG_ENDPOINTS: invalid boolean "{value}"')
        args.debug_endpoints = value in _TRUE
    if not args.node_name:
        p.error("--node-name (or NODE_NAME) is required")
    return args


def build_discovery(
    args: argparse.Namespace, *, gates: FeatureGates | None = None
) -> DeviceDiscovery:
    """Fake GPUs, or NVML loaded by absolute path from the driver root (no LD_LIBRARY_PATH).

    Gate CrashOnNVLinkFabricErrors decides whether a GPU with a fabric error stops start-up;
    with gate FabricManagerPartitioning a single-node NVLink system (probed under the dev root
    here, an I/O error is a `DiscoveryError`) tolerates incomplete fabric registrations.
    """
    gates = gates or FeatureGates()
    strict = gates.enabled(CRASH_ON_NVLINK_FABRIC_ERRORS)
    single_node = False
    if gates.enabled(FABRIC_MANAGER_PARTITIONING):
        single_node = is_single_node_nvlink(select_dev_root(Path(args.container_driver_root)))
    if args.device_discovery == "fake":
        return FakeDiscovery.from_setting(
            _env("FAKE_GPU_CONFIG"), node_name=args.node_name, strict_fabric=strict,
            single_node_nvlink=single_node,
        )  # fmt: skip
    root = DriverRoot(
        host=Path(args.nvidia_driver_root), container=Path(args.container_driver_root)
    )
    try:
        library = root.nvml_library()
    except DriverRootError as err:
        raise DiscoveryError(str(err)) from err
    return NvmlDiscovery(
        nvml=load_pynvml(library), strict_fabric=strict, single_node_nvlink=single_node
    )


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    setup_logging(args.v, logging_format=args.logging_format, vmodule=args.vmodule)
    build_info = load_build_info()
    log.info("%s", build_info.startup_message(PROG))
    registry = CollectorRegistry()
    register_build_info(registry, name=BUILD_INFO_METRIC, info=build_info)
    metrics_host, _, metrics_port = args.http_endpoint.rpartition(":")
    try:
        additional = parse_namespace_list(args.additional_namespaces)
    except ValueError as err:
        log.error("cannot start: %s", err)
        return 1
    config = PluginConfig(
        node_name=args.node_name,
        namespace=args.namespace,
        additional_namespaces=tuple(n for n in additional if n != args.namespace),
        cdi_root=Path(args.cdi_root),
        registrar_dir=Path(args.kubelet_registrar_directory_path),
        plugins_dir=Path(args.kubelet_plugins_directory_path),
        proc_devices=Path(_env("ALT_PROC_DEVICES_PATH", "/proc/devices")),
        driver_root=Path(args.nvidia_driver_root),
        container_driver_root=Path(args.container_driver_root),
        healthcheck_port=args.healthcheck_port,
        metrics_port=int(metrics_port) if metrics_port else -1,
        metrics_host=metrics_host,
        debug_endpoints=args.debug_endpoints,
        gpu_clique_label=args.gpu_clique_label_enabled,
    )
    try:
        gates = FeatureGates.parse(args.feature_gates).validate()
    except FeatureGateError as err:
        log.error("cannot start: %s", err)
        return 1
    dump = startup_config(revision=build_info.revision, gates=gates.all_values(),
                          flags=vars(args), type_name="*main.Flags")  # fmt: skip
    log.info("%s", dump)
    imex = validate_or_exit(
        ImexModeConfig(mode=args.imex_mode, isolation=args.imex_isolation),
        gates=gates, stderr=sys.stderr,
    )  # fmt: skip
    config = replace(config, imex=imex, imex_host_socket_path=args.imex_host_socket_path)
    try:
        discovery = build_discovery(args, gates=gates)
        devices = discovery.discover()
        if not imex.host_managed:  # the host's IMEX, not ours, needs the driver version
            check_driver_version(devices, dns_names=gates.enabled(IMEX_DAEMONS_WITH_DNS_NAMES))
    except DiscoveryError as err:
        log.error("cannot start: %s", err)
        return 1
    try:
        api_client = load_api_client(args.kubeconfig)
    except Exception as err:  # the kubernetes loader raises several unrelated types
        log.error("cannot load kubeconfig %s: %s", args.kubeconfig or "(in-cluster)", err)
        return 1
    client = RestClient(api_client, user_agent=PROG)
    tracing = setup_tracing(PROG, env=os.environ)
    plugin = KubeletPlugin(config=config, client=client, devices=devices, registry=registry,
                           tracer=tracing.tracer, discovery=discovery)  # fmt: skip
    try:
        plugin.start()
    except (ProcDevicesError, OSError, CliqueLabelError) as err:
        log.error("cannot start: %s", err)
        tracing.shutdown()
        return 1
    log.info("started on node %s (clique %r, %d GPUs)", config.node_name, devices.clique_id,
             len(devices.gpus))  # fmt: skip
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    log.info("shutting down")
    plugin.stop()
    tracing.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
