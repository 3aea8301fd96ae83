"""Command line of the compute-domain-controller, compatible with upstream's flags and env names.

Owns the controller's flag table (:data:`CONTROLLER_FLAGS`, one row per flag with its env
variable, parser, default and help) and the parsing of ``argv`` + environment into a frozen
:class:`Options`. The rules every binary shares -- flag wins over env, one or two dashes, Go
booleans and durations, ``--flag (or ENV): message`` errors with exit 2, ``--version``, ``-v``,
``--logging-format``, ``--vmodule``, repeated ``--additional-namespaces``/``--feature-gates``
accumulating as upstream's -- are `pkg.runtime.flags`'s. Invariant: an :class:`Options`
that exists passed validation (required values present, leader-election timings consistent,
feature gates valid), so the binary fails fast with a message naming the flag instead of
failing later. A bad ``IMEX_MODE``/``IMEX_ISOLATION`` exits 1 with upstream's text
(`pkg.imex.mode`).
"""

from __future__ import annotations

import re
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pkg.api import constants as c
from pkg.api.namespaces import parse_namespace_list
from pkg.featuregates import COMPUTE_DOMAIN_CLIQUES, FeatureGateError, FeatureGates
from pkg.imex.mode import (
    DRIVER_MANAGED,
    ISOLATION_DOMAIN,
    ImexModeConfig,
    effective_gates,
    validate_or_exit,
)
from pkg.reconcilers.config import (
    DEFAULT_DAEMON_SERVICE_ACCOUNT,
    ControllerConfig,
    parse_extra_env,
)
from pkg.runtime.flags import (
    Flag,
    FlagError,
    FlagTable,
    FlagValues,
    Repeat,
    parse_bool,
    parse_duration,
    parse_http_path,
    parse_int,
)

__all__ = ["CONTROLLER_FLAGS", "Options", "parse_duration", "parse_options"]


@dataclass(frozen=True)
class Options:
    """Everything the binary needs, parsed and validated."""

    controller: ControllerConfig
    gates: FeatureGates
    pod_name: str
    kubeconfig: str | None
    kube_api_qps: float
    kube_api_burst: int
    events_qps: float
    events_burst: int
    http_endpoint: str
    metrics_path: str
    debug_endpoints: bool
    leader_election: bool
    lease_namespace: str
    lease_name: str
    lease_duration: float
    renew_deadline: float
    retry_period: float
    verbosity: int
    logging_format: str = "text"
    vmodule: str = ""
    # every flag's effective value by flag name, for the start-up dump (`startup_config`)
    flag_values: tuple[tuple[str, object], ...] = ()


# Formatted by hand (`# fmt: skip` at its end): one flag per row or two, read like the docs'
# flag table; `ruff format` would give every argument of a row its own line.
CONTROLLER_FLAGS = FlagTable(prog="compute-domain-controller", verbosity_env="V", flags=(
    Flag("pod-name", "POD_NAME", str, "", "name of this pod (leader identity prefix)"),
    Flag("namespace", "NAMESPACE", str, "default", "driver namespace"),
    Flag("image-name", "IMAGE_NAME", str, "", "image of the IMEX daemon DaemonSets (required)"),
    Flag("cd-daemon-image-pull-secret-names", "CD_DAEMON_IMAGE_PULL_SECRET_NAMES", str, "",
     "image pull secrets for the daemons (comma or space separated)"),
    Flag("log-verbosity-cd-daemon", "LOG_VERBOSITY_CD_DAEMON", parse_int, 1, "daemon -v"),
    Flag("max-nodes-per-imex-domain", "MAX_NODES_PER_IMEX_DOMAIN", parse_int,
     c.DEFAULT_MAX_NODES_PER_IMEX_DOMAIN, "daemons per clique"),
    Flag("cd-daemon-service-account", "CD_DAEMON_SERVICE_ACCOUNT", str,
     DEFAULT_DAEMON_SERVICE_ACCOUNT, "ServiceAccount of the daemon pods"),
    Flag("cd-daemon-extra-env", "CD_DAEMON_EXTRA_ENV", str, "",
     "extra daemon env, comma separated NAME=value (e.g. HTTPS_PROXY=http://proxy:3128)"),
    Flag("node-loss-grace-period", "NODE_LOSS_GRACE_PERIOD", parse_duration, 60.0,
     "how long a node may be NotReady/unreachable before its daemon leaves the domain"),
    Flag("cleanup-interval", "CLEANUP_INTERVAL", parse_duration, 0.0,
     "backstop orphan sweep period (0: only at start and when an orphan may exist)"),
    Flag("clique-entry-grace-period", "CLIQUE_ENTRY_GRACE_PERIOD", parse_duration, 30.0,
     "how long a clique entry outlives its node's last daemon pod before it is pruned"),
    Flag("status-update-interval", "STATUS_UPDATE_INTERVAL", parse_duration, 1.0,
     "least time between status writes of one domain that only move counts (0: no coalescing)"),
    Flag("domain-batch-period", "DOMAIN_BATCH_PERIOD", parse_duration, 0.2,
     "least time between two reconciles of one domain that events ask for (0: one per event)"),
    Flag("http-endpoint", "HTTP_ENDPOINT", str, "", "host:port for /metrics, /healthz, /readyz"),
    Flag("metrics-path", "METRICS_PATH", parse_http_path, "/metrics",
     "HTTP path of the metrics on --http-endpoint (empty: none)"),
    Flag("pprof-path", "PPROF_PATH", str, "", "accepted for compatibility; ignored"),
    Flag("debug-endpoints", "DEBUG_ENDPOINTS", parse_bool, False,
     "also serve /debug/informers (every cache's keys and resourceVersions) on --http-endpoint"),
    Flag("additional-namespaces", "ADDITIONAL_NAMESPACES", str, "",
     "more namespaces whose daemon DaemonSets, pods and cliques are watched, adopted and "
     "torn down (comma separated; new daemons are created in --namespace)",
     repeat=Repeat.LIST),
    Flag("leader-election-enabled", "LEADER_ELECTION_ENABLED", parse_bool, False,
     "run leader election"),
    Flag("leader-election-lease-lock-namespace", "LEADER_ELECTION_LEASE_LOCK_NAMESPACE", str, "",
     "Lease namespace (default: --namespace)"),
    Flag("leader-election-lease-lock-name", "LEADER_ELECTION_LEASE_LOCK_NAME", str,
     "nvidia-compute-domain-controller", "Lease name"),
    Flag("leader-election-lease-duration", "LEADER_ELECTION_LEASE_DURATION", parse_duration, 15.0,
     "how long a standby waits after the last renewal before it takes the Lease"),
    Flag("leader-election-renew-deadline", "LEADER_ELECTION_RENEW_DEADLINE", parse_duration, 10.0,
     "how long the leader keeps retrying a renewal before it steps down"),
    Flag("leader-election-retry-period", "LEADER_ELECTION_RETRY_PERIOD", parse_duration, 2.0,
     "time between two tries to acquire or renew the Lease"),
    Flag("kubeconfig", "KUBECONFIG", str, "", "kubeconfig file (default: in-cluster)"),
    # Upstream's limit and scope: one budget per clientset (the Kubernetes groups share one,
    # resource.nvidia.com has the other). A full clique's 18 node-label writes then wait up to
    # 1.6 s behind a burst of 10; --kube-api-burst=30 lets them out at once.
    Flag("kube-api-qps", "KUBE_API_QPS", float, 5.0,
     "client QPS of each clientset (Kubernetes groups; resource.nvidia.com)"),
    Flag("kube-api-burst", "KUBE_API_BURST", parse_int, 10,
     "client burst of each clientset (Kubernetes groups; resource.nvidia.com)"),
    Flag("events-qps", "EVENTS_QPS", float, 5.0,
     "QPS of the separate client that writes Events (never spends the reconcile budget)"),
    Flag("events-burst", "EVENTS_BURST", parse_int, 10, "burst of the Events client"),
    Flag("feature-gates", "FEATURE_GATES", str, "", "A=true,B=false", repeat=Repeat.MAP),
    # Upstream's CLI lets a set-but-empty IMEX_MODE/IMEX_ISOLATION override the default (the
    # IMEX validation then refuses it); every other variable counts only when non-empty.
    Flag("imex-mode", "IMEX_MODE", str, DRIVER_MANAGED,
     "who runs IMEX: driverManaged (a daemon per domain) or hostManaged (the node's own "
     "nvidia-imex service; needs the HostManagedIMEXDaemon gate)", empty_env_overrides=True),
    Flag("imex-isolation", "IMEX_ISOLATION", str, ISOLATION_DOMAIN,
     'IMEX channel isolation: domain ("" means domain; channel is not supported yet)',
     empty_env_overrides=True),
))  # fmt: skip
"""The controller's flags: upstream's names and env variables, this driver's defaults."""


def parse_options(argv: Sequence[str], env: Mapping[str, str]) -> Options:
    """Parse and validate; raises ``SystemExit(2)`` with a message on bad input.

    ``--version`` (or ``-version``) prints the build's version line (`pkg.runtime.versionflag`)
    and raises ``SystemExit(0)`` as soon as it is met, before the environment is read or
    anything is validated; a bad ``IMEX_MODE``/``IMEX_ISOLATION`` raises ``SystemExit(1)``
    with upstream's message (`pkg.imex.mode.validate_or_exit`)."""
    table = CONTROLLER_FLAGS
    flags = table.parse_or_exit(argv, env)
    try:
        return _options(flags)
    except FlagError as err:
        table.exit_with(err)


def _options(flags: FlagValues) -> Options:
    """Check the parsed values together and build :class:`Options`; raises `FlagError`."""
    table = CONTROLLER_FLAGS
    if not flags.get_str("image_name"):
        raise table.error("image_name", "required")
    try:
        gates = FeatureGates.parse(flags.get_str("feature_gates")).validate()
    except FeatureGateError as exc:
        raise table.error("feature_gates", str(exc)) from exc
    imex = validate_or_exit(
        ImexModeConfig(mode=flags.get_str("imex_mode"), isolation=flags.get_str("imex_isolation")),
        gates=gates,
        stderr=sys.stderr,
    )
    gates = effective_gates(gates, imex)
    secrets = tuple(
        s for s in re.split(r"[,\s]+", flags.get_str("cd_daemon_image_pull_secret_names")) if s
    )
    try:
        extra_env = parse_extra_env(flags.get_str("cd_daemon_extra_env"))
        additional = tuple(
            n
            for n in parse_namespace_list(flags.get_str("additional_namespaces"))
            if n != flags.get_str("namespace")
        )
        controller = ControllerConfig(
            namespace=flags.get_str("namespace"),
            image_name=flags.get_str("image_name"),
            log_verbosity_cd_daemon=flags.get_int("log_verbosity_cd_daemon"),
            max_nodes_per_imex_domain=flags.get_int("max_nodes_per_imex_domain"),
            feature_gates=gates.render(),
            image_pull_secret_names=secrets,
            daemon_service_account=flags.get_str("cd_daemon_service_account"),
            daemon_extra_env=extra_env,
            node_loss_grace_period=flags.get_float("node_loss_grace_period"),
            cleanup_interval=flags.get_float("cleanup_interval"),
            clique_entry_grace_period=flags.get_float("clique_entry_grace_period"),
            status_update_interval=flags.get_float("status_update_interval"),
            domain_batch_period=flags.get_float("domain_batch_period"),
            compute_domain_cliques=gates.enabled(COMPUTE_DOMAIN_CLIQUES),
            additional_namespaces=additional,
            imex=imex,
        ).validate()
    except ValueError as exc:
        raise FlagError(str(exc)) from exc
    return Options(
        controller=controller,
        gates=gates,
        pod_name=flags.get_str("pod_name") or socket.gethostname(),
        kubeconfig=flags.get_str("kubeconfig") or None,
        kube_api_qps=flags.get_float("kube_api_qps"),
        kube_api_burst=flags.get_int("kube_api_burst"),
        events_qps=flags.get_float("events_qps"),
        events_burst=flags.get_int("events_burst"),
        http_endpoint=flags.get_str("http_endpoint"),
        metrics_path=flags.get_str("metrics_path"),
        debug_endpoints=flags.get_bool("debug_endpoints"),
        leader_election=flags.get_bool("leader_election_enabled"),
        lease_namespace=flags.get_str("leader_election_lease_lock_namespace")
        or flags.get_str("namespace"),
        lease_name=flags.get_str("leader_election_lease_lock_name"),
        lease_duration=flags.get_float("leader_election_lease_duration"),
        renew_deadline=flags.get_float("leader_election_renew_deadline"),
        retry_period=flags.get_float("leader_election_retry_period"),
        verbosity=flags.get_int("v"),
        logging_format=flags.get_str("logging_format"),
        vmodule=flags.get_str("vmodule"),
        flag_values=tuple(flags.dump().items()),
    )
