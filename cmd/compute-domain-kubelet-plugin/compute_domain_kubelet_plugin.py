"""compute-domain-kubelet-plugin: the ComputeDomain DRA kubelet plugin of one node.

Parses upstream's flags/env (`pkg.kubeletplugin.options`; ``--version`` prints the build and
exits first), logs the build as its first line and the start-up configuration, discovers
devices (NVML or fake GPUs), builds `pkg.kubeletplugin.driver.KubeletPlugin` and runs it until
SIGTERM/SIGINT, then unlinks its sockets and exits 0. A bad flag or env value exits 2 with
``--flag (or ENV): ...``; start-up failures (bad feature gates or namespace names, bad device
state, missing /proc/devices entry) exit 1 with ``cannot start: ...``; a bad
``IMEX_MODE``/``IMEX_ISOLATION`` (`pkg.imex.mode`) exits 1 with upstream's ``Error: imex
configuration validation failed: ...`` line, and host-managed IMEX mode skips the
driver-version check (the host's IMEX, not ours, runs). Tracing follows the standard ``OTEL_*``
env (`pkg.runtime.tracing`); pending spans are flushed on exit. The metrics path
(``--metrics-path``, ``/metrics``) serves `BUILD_INFO_METRIC` from the start. The API client
keeps upstream's client-side limit, ``--kube-api-qps``/``--kube-api-burst`` per API group, and
speaks the ``resource.k8s.io`` version the cluster serves (`pkg.kube.resourceapi`, discovered
before the plugin starts and logged once; none supported exits 1 with ``cannot start: ...``).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path

try:
    import pkg  # noqa: F401
except ImportError:  # run as a script from a checkout: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from prometheus_client import CollectorRegistry

from pkg.base.clock import RealClock
from pkg.featuregates import IMEX_DAEMONS_WITH_DNS_NAMES, FeatureGateError, FeatureGates
from pkg.imex.mode import ImexModeConfig, validate_or_exit
from pkg.kube.config import KubeConfigError, load_api_client
from pkg.kube.errors import ApiError
from pkg.kube.resourceapi import UnsupportedResourceApiError, use_served_resource_api
from pkg.kubeletplugin.clique import CliqueLabelError
from pkg.kubeletplugin.discovery import DiscoveryError
from pkg.kubeletplugin.discovery.base import check_driver_version
from pkg.kubeletplugin.driver import KubeletPlugin
from pkg.kubeletplugin.options import (
    PROG,
    api_client_of,
    build_discovery,
    parse_args,
    plugin_config,
)
from pkg.kubeletplugin.procdevices import ProcDevicesError
from pkg.runtime.buildinfo import load_build_info
from pkg.runtime.buildinfometric import register_build_info
from pkg.runtime.logsetup import setup_logging
from pkg.runtime.startupconfig import startup_config
from pkg.runtime.tracing import setup_tracing

# The plugin's metrics are upstream's nvidia_dra_*; the component name keeps this one apart from
# the controller's (nvidia_dra_compute_domain_controller_build_info) without a job label.
BUILD_INFO_METRIC = "nvidia_dra_compute_domain_kubelet_plugin_build_info"

log = logging.getLogger(PROG)


def main(argv: list[str]) -> int:
    args = parse_args(argv, os.environ)
    setup_logging(args.v, logging_format=args.logging_format, vmodule=args.vmodule)
    build_info = load_build_info()
    log.info("%s", build_info.startup_message(PROG))
    registry = CollectorRegistry()
    register_build_info(registry, name=BUILD_INFO_METRIC, info=build_info)
    try:
        gates = FeatureGates.parse(args.feature_gates).validate()
    except FeatureGateError as err:
        log.error("cannot start: %s", err)
        return 1
    dump = startup_config(
        revision=build_info.revision,
        gates=gates.all_values(),
        flags=args.dump(),
        type_name="*main.Flags",
    )
    log.info("%s", dump)
    imex = validate_or_exit(
        ImexModeConfig(mode=args.imex_mode, isolation=args.imex_isolation),
        gates=gates,
        stderr=sys.stderr,
    )
    try:
        config = plugin_config(args, imex=imex)
    except ValueError as err:
        log.error("cannot start: %s", err)
        return 1
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
    except KubeConfigError as err:
        log.error("cannot start: %s", err)
        return 1
    client = api_client_of(args, api_client)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        if not use_served_resource_api(client, clock=RealClock(), stop=stop):
            return 0
    except (UnsupportedResourceApiError, ApiError) as err:
        log.error("cannot start: %s", err)
        return 1
    tracing = setup_tracing(PROG, env=os.environ)
    plugin = KubeletPlugin(
        config=config,
        client=client,
        devices=devices,
        registry=registry,
        tracer=tracing.tracer,
        discovery=discovery,
    )
    try:
        plugin.start()
    except (ProcDevicesError, OSError, CliqueLabelError) as err:
        log.error("cannot start: %s", err)
        tracing.shutdown()
        return 1
    log.info(
        "started on node %s (clique %r, %d GPUs)",
        config.node_name,
        devices.clique_id,
        len(devices.gpus),
    )
    stop.wait()
    log.info("shutting down")
    plugin.stop()
    tracing.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
