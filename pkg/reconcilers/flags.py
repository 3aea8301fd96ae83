"""Command line of the compute-domain-controller, compatible with upstream's flags and env names.

Owns parsing ``argv`` + environment into a frozen :class:`Options`. Every flag also reads the
upstream environment variable when it is not given on the command line (flag wins), long flags
accept one or two dashes and ``--flag=value`` as Go's ``flag`` package does, booleans accept a
bare ``--flag``, and durations accept Go syntax (``15s``, ``1m30s``, ``500ms``) or plain
seconds. Invariant: an :class:`Options` that exists passed validation (required values present,
leader-election timings consistent, feature gates valid), so the binary fails fast with a
message naming the flag instead of failing later.
"""

from __future__ import annotations

import argparse
import re
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
from pkg.runtime.logsetup import LoggingConfigError, parse_vmodule, validate_logging_format
from pkg.runtime.versionflag import add_version_flag

__all__ = ["Options", "parse_duration", "parse_options"]

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Go duration (``1m30s``) or plain seconds → seconds."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f'invalid duration "{text}"')
    return sum(float(n) * _UNITS[u] for n, u in parts)


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "t", "true", "yes", "on"):
        return True
    if value in ("0", "f", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f'invalid boolean "{text}"')


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


# (flag, env, type, default, help)
_FLAGS: tuple[tuple[str, str | None, Callable[[str], Any], object, str], ...] = (
    ("pod-name", "POD_NAME", str, "", "name of this pod (leader identity prefix)"),
    ("namespace", "NAMESPACE", str, "default", "driver namespace"),
    ("image-name", "IMAGE_NAME", str, "", "image of the IMEX daemon DaemonSets (required)"),
    ("cd-daemon-image-pull-secret-names", "CD_DAEMON_IMAGE_PULL_SECRET_NAMES", str, "",
     "image pull secrets for the daemons (comma or space separated)"),
    ("log-verbosity-cd-daemon", "LOG_VERBOSITY_CD_DAEMON", int, 1, "daemon -v"),
    ("max-nodes-per-imex-domain", "MAX_NODES_PER_IMEX_DOMAIN", int,
     c.DEFAULT_MAX_NODES_PER_IMEX_DOMAIN, "daemons per clique"),
    ("cd-daemon-service-account", "CD_DAEMON_SERVICE_ACCOUNT", str,
     DEFAULT_DAEMON_SERVICE_ACCOUNT, "ServiceAccount of the daemon pods"),
    ("cd-daemon-extra-env", "CD_DAEMON_EXTRA_ENV", str, "",
     "extra daemon env, comma separated NAME=value (e.g. HTTPS_PROXY=http://proxy:3128)"),
    ("node-loss-grace-period", "NODE_LOSS_GRACE_PERIOD", parse_duration, 60.0,
     "how long a node may be NotReady/unreachable before its daemon leaves the domain"),
    ("cleanup-interval", "CLEANUP_INTERVAL", parse_duration, 0.0,
     "backstop orphan sweep period (0: only at start and when an orphan may exist)"),
    ("clique-entry-grace-period", "CLIQUE_ENTRY_GRACE_PERIOD", parse_duration, 30.0,
     "how long a clique entry outlives its node's last daemon pod before it is pruned"),
    ("status-update-interval", "STATUS_UPDATE_INTERVAL", parse_duration, 1.0,
     "least time between status writes of one domain that only move counts (0: no coalescing)"),
    ("domain-batch-period", "DOMAIN_BATCH_PERIOD", parse_duration, 0.2,
     "least time between two reconciles of one domain that events ask for (0: one per event)"),
    ("http-endpoint", "HTTP_ENDPOINT", str, "", "host:port for /metrics, /healthz, /readyz"),
    ("metrics-path", "METRICS_PATH", str, "/metrics", "metrics path"),
    ("pprof-path", "PPROF_PATH", str, "", "accepted for compatibility; ignored"),
    ("debug-endpoints", "DEBUG_ENDPOINTS", _bool, False,
     "also serve /debug/informers (every cache's keys and resourceVersions) on --http-endpoint"),
    ("additional-namespaces", "ADDITIONAL_NAMESPACES", str, "",
     "more namespaces whose daemon DaemonSets, pods and cliques are watched, adopted and "
     "torn down (comma separated; new daemons are created in --namespace)"),
    ("leader-election-enabled", "LEADER_ELECTION_ENABLED", _bool, False, "run leader election"),
    ("leader-election-lease-lock-namespace", "LEADER_ELECTION_LEASE_LOCK_NAMESPACE", str, "",
     "Lease namespace (default: --namespace)"),
    ("leader-election-lease-lock-name", "LEADER_ELECTION_LEASE_LOCK_NAME", str,
     "nvidia-compute-domain-controller", "Lease name"),
    ("leader-election-lease-duration", "LEADER_ELECTION_LEASE_DURATION", parse_duration, 15.0, ""),
    ("leader-election-renew-deadline", "LEADER_ELECTION_RENEW_DEADLINE", parse_duration, 10.0, ""),
    ("leader-election-retry-period", "LEADER_ELECTION_RETRY_PERIOD", parse_duration, 2.0, ""),
    ("kubeconfig", "KUBECONFIG", str, "", "kubeconfig file (default: in-cluster)"),
    ("kube-api-qps", "KUBE_API_QPS", float, 5.0,
     "client QPS, per API group (core, apps, resource.k8s.io, resource.nvidia.com)"),
    # A domain's allocations arrive together: one node label write each, up to 18 per clique.
    # 30 lets one full clique's labels out at once (upstream's 10 held the last 8 of 18 to
    # 5 per second, 0.2-0.8 s late); the sustained rate stays --kube-api-qps.
    ("kube-api-burst", "KUBE_API_BURST", int, 30, "client burst, per API group"),
    ("events-qps", "EVENTS_QPS", float, 5.0,
     "QPS of the separate client that writes Events (never spends the reconcile budget)"),
    ("events-burst", "EVENTS_BURST", int, 10, "burst of the Events client"),
    ("feature-gates", "FEATURE_GATES", str, "", "A=true,B=false"),
    ("imex-mode", "IMEX_MODE", str, DRIVER_MANAGED,
     "who runs IMEX: driverManaged (a daemon per domain) or hostManaged (the node's own "
     "nvidia-imex service; needs the HostManagedIMEXDaemon gate)"),
    ("imex-isolation", "IMEX_ISOLATION", str, ISOLATION_DOMAIN,
     'IMEX channel isolation: domain ("" means domain; channel is not supported yet)'),
    ("logging-format", "LOGGING_FORMAT", str, "text", "log format: text (klog) or json"),
    ("vmodule", "VMODULE", str, "", "per-file log verbosity, pattern=N,... (klog)"),
)  # fmt: skip
# Upstream's CLI lets a set-but-empty variable override these defaults (IMEX_MODE="" is then
# refused by the IMEX validation); every other variable counts only when non-empty.
_EMPTY_ENV_OVERRIDES = frozenset({"IMEX_MODE", "IMEX_ISOLATION"})


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="compute-domain-controller", allow_abbrev=False)
    add_version_flag(p, "--version", "-version")
    for name, _env, type_, _default, help_ in _FLAGS:
        dest = name.replace("-", "_")
        kwargs: dict[str, Any] = {"dest": dest, "help": help_, "default": None}
        if type_ is _bool:
            kwargs.update(nargs="?", const=True, type=_bool)
        else:
            kwargs["type"] = type_
        p.add_argument(f"--{name}", f"-{name}", **kwargs)
    p.add_argument("-v", "--v", dest="v", type=int, default=None, help="log verbosity")
    return p


def parse_options(argv: Sequence[str], env: Mapping[str, str]) -> Options:
    """Parse and validate; raises ``SystemExit(2)`` with a message on bad input.

    ``--version`` (or ``-version``) prints the build's version line (`pkg.runtime.versionflag`)
    and raises ``SystemExit(0)`` as soon as it is met, before the environment is read or
    anything is validated."""
    parser = _parser()
    ns = vars(parser.parse_args(list(argv)))
    values: dict[str, Any] = {}
    for name, env_name, type_, default, _help in _FLAGS:
        dest = name.replace("-", "_")
        value = ns[dest]
        if (
            value is None
            and env_name
            and (
                env.get(env_name, "") != ""
                or (env_name in _EMPTY_ENV_OVERRIDES and env_name in env)
            )
        ):
            try:
                value = type_(env[env_name])
            except (ValueError, argparse.ArgumentTypeError) as exc:
                parser.error(f"environment {env_name}: {exc}")
        values[dest] = default if value is None else value
    verbosity = ns["v"] if ns["v"] is not None else int(env.get("V", "0") or 0)
    try:
        logging_format = validate_logging_format(str(values["logging_format"]))
        vmodule = str(values["vmodule"])
        parse_vmodule(vmodule)
    except LoggingConfigError as exc:
        parser.error(str(exc))
    if not values["image_name"]:
        parser.error("--image-name (or IMAGE_NAME) is required")
    try:
        gates = FeatureGates.parse(str(values["feature_gates"])).validate()
    except FeatureGateError as exc:
        parser.error(f"--feature-gates: {exc}")
    imex = validate_or_exit(
        ImexModeConfig(mode=str(values["imex_mode"]), isolation=str(values["imex_isolation"])),
        gates=gates, stderr=sys.stderr,
    )  # fmt: skip
    gates = effective_gates(gates, imex)
    secrets = tuple(
        s for s in re.split(r"[,\s]+", str(values["cd_daemon_image_pull_secret_names"])) if s
    )
    try:
        extra_env = parse_extra_env(str(values["cd_daemon_extra_env"]))
        additional = tuple(
            n
            for n in parse_namespace_list(str(values["additional_namespaces"]))
            if n != values["namespace"]
        )
        controller = ControllerConfig(
            namespace=str(values["namespace"]),
            image_name=str(values["image_name"]),
            log_verbosity_cd_daemon=int(values["log_verbosity_cd_daemon"]),
            max_nodes_per_imex_domain=int(values["max_nodes_per_imex_domain"]),
            feature_gates=gates.render(),
            image_pull_secret_names=secrets,
            daemon_service_account=str(values["cd_daemon_service_account"]),
            daemon_extra_env=extra_env,
            node_loss_grace_period=float(values["node_loss_grace_period"]),
            cleanup_interval=float(values["cleanup_interval"]),
            clique_entry_grace_period=float(values["clique_entry_grace_period"]),
            status_update_interval=float(values["status_update_interval"]),
            domain_batch_period=float(values["domain_batch_period"]),
            compute_domain_cliques=gates.enabled(COMPUTE_DOMAIN_CLIQUES),
            additional_namespaces=additional,
            imex=imex,
        ).validate()
    except ValueError as exc:
        parser.error(str(exc))
    return Options(
        controller=controller,
        gates=gates,
        pod_name=str(values["pod_name"]) or socket.gethostname(),
        kubeconfig=str(values["kubeconfig"]) or None,
        kube_api_qps=float(values["kube_api_qps"]),
        kube_api_burst=int(values["kube_api_burst"]),
        events_qps=float(values["events_qps"]),
        events_burst=int(values["events_burst"]),
        http_endpoint=str(values["http_endpoint"]),
        metrics_path=str(values["metrics_path"]),
        debug_endpoints=bool(values["debug_endpoints"]),
        leader_election=bool(values["leader_election_enabled"]),
        lease_namespace=str(values["leader_election_lease_lock_namespace"] or values["namespace"]),
        lease_name=str(values["leader_election_lease_lock_name"]),
        lease_duration=float(values["leader_election_lease_duration"]),
        renew_deadline=float(values["leader_election_renew_deadline"]),
        retry_period=float(values["leader_election_retry_period"]),
        verbosity=int(verbosity),
        logging_format=logging_format,
        vmodule=vmodule,
        flag_values=tuple(sorted({**values, "v": int(verbosity)}.items())),
    )
