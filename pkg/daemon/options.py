"""Command line and environment of ``compute-domain-daemon`` parsed into :class:`Options`.

Owns the upstream env contract (CDI: ``CLIQUE_ID``, ``COMPUTE_DOMAIN_UUID``,
``COMPUTE_DOMAIN_NAME``, ``COMPUTE_DOMAIN_NAMESPACE``, and ours, ``TRACEPARENT``, the domain's
formation trace when tracing is on; downward API: ``NODE_NAME``, ``POD_IP``,
``POD_UID``, ``POD_NAME``, ``POD_NAMESPACE``; ``MAX_NODES_PER_IMEX_DOMAIN``; ``FEATURE_GATES``;
``CLIQUE_JOIN_BY_CONTROLLER``, ours, ``true`` in our DaemonSets: the controller writes the
clique entry) plus our additions, each a flag with an env fallback:

=====================  ========================  =========================================
flag                   env                       default
=====================  ========================  =========================================
``--config-dir``       ``IMEX_CONFIG_DIR``       ``/imexd``
``--hosts-file``       ``IMEX_HOSTS_FILE``       ``/etc/hosts``
``--imex-binary``      ``IMEX_BINARY``           ``nvidia-imex`` (a shell-quoted command)
``--imex-ctl-binary``  ``IMEX_CTL_BINARY``       ``nvidia-imex-ctl``
``--termination-log``  ``TERMINATION_LOG``       ``/dev/termination-log``
``--imex-server-port`` ``IMEX_SERVER_PORT``      50000
``--imex-cmd-port``    ``IMEX_CMD_PORT``         50005
``--metrics-address``  ``METRICS_ADDRESS``       empty = no endpoint; ``:9400``, ``127.0.0.1:0``
``--kubeconfig``       ``KUBECONFIG``            in-cluster, else ~/.kube/config
``--feature-gates``    ``FEATURE_GATES``         upstream defaults
=====================  ========================  =========================================

The IMEX binaries are looked up through ``PATH`` like upstream's: in the daemon container they
exist only if the kubelet plugin injected them from the driver root through CDI (at
``/usr/bin/nvidia-imex`` for a standard installation). The two binary flags are for running the
daemon outside a container; no shipped manifest sets them. The termination log is where the
kubelet reads the container's termination message (``terminationMessagePath``).

Invariant: parsing never touches the network or the file system; :meth:`Options.validate_run`
reports missing CDI edits with upstream's exact message.
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from pkg.api import constants as c
from pkg.featuregates import FeatureGateError, FeatureGates
from pkg.runtime.logsetup import LoggingConfigError, parse_vmodule, validate_logging_format
from pkg.runtime.versionflag import add_version_flag

CDI_MISSING: Final = (
    "CDI container edits did not apply -- is CDI enabled in your container runtime?"
)


class OptionsError(ValueError):
    """Unusable command line or environment; the message is shown to the user as is."""


@dataclass(frozen=True)
class Options:
    command: str  # "run" or "check"
    verbosity: int
    clique_id: str
    domain_uid: str
    domain_name: str
    domain_namespace: str
    node_name: str
    pod_ip: str
    pod_uid: str
    pod_name: str
    pod_namespace: str
    max_nodes: int
    gates: FeatureGates
    config_dir: str
    hosts_file: str
    imex_argv: tuple[str, ...]
    imex_ctl_argv: tuple[str, ...]
    termination_log: str
    server_port: int
    cmd_port: int
    metrics_address: str
    kubeconfig: str | None
    traceparent: str = ""  # CDI env TRACEPARENT: the domain's formation trace (may be empty)
    join_by_controller: bool = False  # CLIQUE_JOIN_BY_CONTROLLER=true (our DaemonSets)
    logging_format: str = "text"  # --logging-format / LOGGING_FORMAT: text (klog) or json
    vmodule: str = ""  # --vmodule / VMODULE: klog per-file verbosity, pattern=N,...

    @property
    def config_path(self) -> str:
        return os.path.join(self.config_dir, "imexd.cfg")

    @property
    def nodes_config_path(self) -> str:
        return os.path.join(self.config_dir, "nodes.cfg")

    def validate_run(self) -> None:
        if not self.domain_uid:
            raise OptionsError(CDI_MISSING)
        missing = [
            env
            for env, value in (("NODE_NAME", self.node_name), ("POD_NAMESPACE", self.pod_namespace))
            if not value
        ]
        if self.clique_id and not self.pod_ip:
            missing.append("POD_IP")
        if missing:
            raise OptionsError(f"missing required environment: {', '.join(missing)}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="compute-domain-daemon")
    add_version_flag(p)
    p.add_argument("-v", "--verbosity", type=int, default=None, help="log verbosity (>=4: debug)")
    p.add_argument("--feature-gates", default=None)
    p.add_argument("--config-dir", default=None)
    p.add_argument("--hosts-file", default=None)
    p.add_argument("--imex-binary", default=None)
    p.add_argument("--imex-ctl-binary", default=None)
    p.add_argument("--termination-log", default=None)
    p.add_argument("--imex-server-port", type=int, default=None)
    p.add_argument("--imex-cmd-port", type=int, default=None)
    p.add_argument("--metrics-address", default=None)
    p.add_argument("--kubeconfig", default=None)
    p.add_argument("--logging-format", default=None, help="text (klog, default) or json")
    p.add_argument("--vmodule", default=None, help="per-file verbosity: pattern=N,...")
    p.add_argument("command", choices=["run", "check"])
    return p


def _int(raw: str | int | None, *, name: str, default: int) -> int:
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as err:
        raise OptionsError(f"{name}: {raw!r} is not an integer") from err


def _bool(raw: str | None, *, name: str) -> bool:
    value = (raw or "").strip().lower()
    if value in ("", "false", "0"):
        return False
    if value in ("true", "1"):
        return True
    raise OptionsError(f"{name}={raw!r}: must be true or false")


def _binary(flag: str | None, env_value: str | None, name: str) -> tuple[str, ...]:
    explicit = flag or env_value
    return tuple(shlex.split(explicit)) if explicit else (name,)


def parse(argv: Sequence[str], env: Mapping[str, str]) -> Options:
    """Parse ``argv`` (without the program name) with ``env`` as fallback for every flag.

    ``--version`` (and ``--help``) print to stdout and raise ``SystemExit(0)`` as soon as they
    are met, without a command and before ``env`` is read; a bad command line raises
    `OptionsError` after argparse printed the usage."""
    try:
        args = _parser().parse_args(list(argv))
    except SystemExit as err:
        if err.code == 0:
            raise
        raise OptionsError("invalid command line (see usage above)") from err
    try:
        gates = FeatureGates.parse(
            args.feature_gates if args.feature_gates is not None else env.get("FEATURE_GATES")
        ).validate()
    except FeatureGateError as err:
        raise OptionsError(str(err)) from err
    try:
        logging_format = validate_logging_format(
            args.logging_format or env.get("LOGGING_FORMAT") or "text"
        )
        vmodule = args.vmodule if args.vmodule is not None else env.get("VMODULE", "")
        parse_vmodule(vmodule)
    except LoggingConfigError as err:
        raise OptionsError(str(err)) from err
    max_nodes = _int(env.get("MAX_NODES_PER_IMEX_DOMAIN"), name="MAX_NODES_PER_IMEX_DOMAIN",
                     default=c.DEFAULT_MAX_NODES_PER_IMEX_DOMAIN)  # fmt: skip
    if not 1 <= max_nodes <= 9999:
        raise OptionsError(f"MAX_NODES_PER_IMEX_DOMAIN={max_nodes} outside 1..9999")
    return Options(
        command=args.command,
        verbosity=args.verbosity
        if args.verbosity is not None
        else _int(env.get("LOG_VERBOSITY"), name="LOG_VERBOSITY", default=2),
        clique_id=env.get("CLIQUE_ID", ""),
        domain_uid=env.get("COMPUTE_DOMAIN_UUID", ""),
        domain_name=env.get("COMPUTE_DOMAIN_NAME", ""),
        domain_namespace=env.get("COMPUTE_DOMAIN_NAMESPACE") or "default",
        node_name=env.get("NODE_NAME", ""),
        pod_ip=env.get("POD_IP", ""),
        pod_uid=env.get("POD_UID", ""),
        pod_name=env.get("POD_NAME", ""),
        pod_namespace=env.get("POD_NAMESPACE", ""),
        max_nodes=max_nodes,
        gates=gates,
        config_dir=args.config_dir or env.get("IMEX_CONFIG_DIR") or "/imexd",
        hosts_file=args.hosts_file or env.get("IMEX_HOSTS_FILE") or "/etc/hosts",
        imex_argv=_binary(args.imex_binary, env.get("IMEX_BINARY"), "nvidia-imex"),
        imex_ctl_argv=_binary(args.imex_ctl_binary, env.get("IMEX_CTL_BINARY"), "nvidia-imex-ctl"),
        termination_log=args.termination_log
        or env.get("TERMINATION_LOG")
        or "/dev/termination-log",
        server_port=_int(
            args.imex_server_port or env.get("IMEX_SERVER_PORT"),
            name="IMEX_SERVER_PORT",
            default=50000,
        ),
        cmd_port=_int(
            args.imex_cmd_port or env.get("IMEX_CMD_PORT"), name="IMEX_CMD_PORT", default=50005
        ),
        metrics_address=args.metrics_address or env.get("METRICS_ADDRESS") or "",
        kubeconfig=args.kubeconfig or env.get("KUBECONFIG") or None,
        traceparent=env.get("TRACEPARENT", ""),
        join_by_controller=_bool(
            env.get(c.CLIQUE_JOIN_BY_CONTROLLER_ENV), name=c.CLIQUE_JOIN_BY_CONTROLLER_ENV
        ),
        logging_format=logging_format,
        vmodule=vmodule,
    )
