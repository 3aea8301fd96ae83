"""Command line and environment of ``compute-domain-daemon`` parsed into :class:`Options`.

Owns the daemon's option table, ``_OPTIONS``: each option once, as its flag row (name, env,
parser, default, help) and the :class:`Options` field it fills (checked at import: every field
is filled once). The flag table :data:`DAEMON_FLAGS` and the construction of :class:`Options`
are derived from it, on the shared mechanism (`pkg.runtime.flags`: flag wins over env, empty
env is unset, Go booleans, ``--version``, ``-v``/``--v``/``--verbosity`` with env ``V`` as
upstream's, else ``LOG_VERBOSITY`` as our DaemonSets set, ``--logging-format``,
``--vmodule``). Two kinds of rows:

- the upstream env contract, env-only: CDI (``CLIQUE_ID``, ``COMPUTE_DOMAIN_UUID``,
  ``COMPUTE_DOMAIN_NAME``, ``COMPUTE_DOMAIN_NAMESPACE``, and ours, ``TRACEPARENT``, the domain's
  formation trace when tracing is on), downward API (``NODE_NAME``, ``POD_IP``, ``POD_UID``,
  ``POD_NAME``, ``POD_NAMESPACE``), ``MAX_NODES_PER_IMEX_DOMAIN`` and
  ``CLIQUE_JOIN_BY_CONTROLLER`` (ours, ``true`` in our DaemonSets: the controller writes the
  clique entry);
- flags with an env fallback: ``--feature-gates`` (repeatable, each laid over
  ``FEATURE_GATES`` as upstream's) and our additions (config directory, hosts
  file, IMEX binaries, termination log, IMEX ports, metrics address, kubeconfig, and IMEX's own
  authentication/encryption under imexd.cfg's key names, ``IMEX_ENABLE_AUTH_ENCRYPTION`` and
  friends, off as upstream ships it: :attr:`Options.auth`); the docs' table is generated from
  :data:`DAEMON_FLAGS` (``hack/gen-flag-docs.py``).

The IMEX binaries are looked up through ``PATH`` like upstream's: in the daemon container they
exist only if the kubelet plugin injected them from the driver root through CDI (at
``/usr/bin/nvidia-imex`` for a standard installation). The two binary flags are for running the
daemon outside a container; no shipped manifest sets them. The termination log is where the
kubelet reads the container's termination message (``terminationMessagePath``).

Errors: every unusable command line or value is an :class:`OptionsError` (the binary prints it
and exits 1, as it always has); values name their flag or env variable.

Invariant: parsing never touches the network or the file system; :meth:`Options.validate_run`
reports missing CDI edits with upstream's exact message.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pkg.api import constants as c
from pkg.api import daemoncontract as dc
from pkg.featuregates import FeatureGateError, FeatureGates
from pkg.imex import config as imex
from pkg.runtime.flags import (
    Flag,
    FlagError,
    FlagTable,
    FlagValues,
    Repeat,
    parse_bool,
    parse_duration,
    parse_int,
)

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
    # IMEX_ENABLE_AUTH_ENCRYPTION and friends (imexd.cfg's names): off unless set
    auth: imex.AuthConfig = field(default_factory=imex.AuthConfig)
    traceparent: str = ""  # CDI env TRACEPARENT: the domain's formation trace (may be empty)
    join_by_controller: bool = False  # CLIQUE_JOIN_BY_CONTROLLER=true (our DaemonSets)
    logging_format: str = "text"  # --logging-format / LOGGING_FORMAT: text (klog) or json
    vmodule: str = ""  # --vmodule / VMODULE: klog per-file verbosity, pattern=N,...
    # --imex-start-timeout / IMEX_START_TIMEOUT (ours): seconds IMEX may stay not ready before
    # the daemon says so in a Warning Event on its pod; 0 turns the warning off
    imex_start_timeout: float = 60.0
    # every row's effective value by dest, for the start-up dump (`startup_config`)
    flag_values: tuple[tuple[str, object], ...] = ()

    @property
    def config_path(self) -> str:
        return os.path.join(self.config_dir, imex.CONFIG_FILE_NAME)

    @property
    def nodes_config_path(self) -> str:
        return os.path.join(self.config_dir, imex.NODES_CONFIG_FILE_NAME)

    def validate_run(self) -> None:
        if not self.domain_uid:
            raise OptionsError(CDI_MISSING)
        missing = [
            env
            for env, value in (
                (dc.NODE_NAME, self.node_name),
                (dc.POD_NAMESPACE, self.pod_namespace),
            )
            if not value
        ]
        if self.clique_id and not self.pod_ip:
            missing.append(dc.POD_IP)
        if missing:
            raise OptionsError(f"missing required environment: {', '.join(missing)}")


_AUTH_KEYS: Final = (
    "SERVER_KEY",
    "SERVER_CERT",
    "SERVER_CERT_AUTH",
    "CLIENT_KEY",
    "CLIENT_CERT",
    "CLIENT_CERT_AUTH",
    "SECURITY_TARGET_OVERRIDE",
)
"""imexd.cfg's key and certificate settings, ``IMEX_<key>``: flag ``--imex-<key>``."""


def _unchanged(value: Any, _flag: Flag) -> object:
    return value


def _command_line(value: Any, flag: Flag) -> object:
    """A shell-quoted command as argv; empty: the row's default command."""
    return tuple(shlex.split(str(value))) or tuple(shlex.split(str(flag.default)))


def _none_if_empty(value: Any, _flag: Flag) -> object:
    return value or None


@dataclass(frozen=True)
class _Option:
    """One daemon option: its flag row and the field of :class:`Options` its value fills.

    ``field`` defaults to the row's dest; ``auth.<name>`` is a field of :attr:`Options.auth`.
    ``convert`` turns the row's typed value into the field's (given the row, for its default).
    """

    flag: Flag
    field: str = ""
    convert: Callable[[Any, Flag], object] = _unchanged

    @property
    def target(self) -> tuple[str, str]:
        """(group, field): group ``auth`` for :class:`imex.AuthConfig`, else ``""``."""
        group, _, name = (self.field or self.flag.dest).rpartition(".")
        return group, name


def _env_only(name: str, env: str, help_: str, *, field: str = "") -> _Option:
    return _Option(Flag(name, env, str, "", help_, cli=False), field=field)


_OPTIONS: Final[tuple[_Option, ...]] = (
    _env_only("clique-id", dc.CLIQUE_ID, "NVLink clique of this node (CDI; empty: no clique)"),
    _env_only(
        "compute-domain-uuid",
        dc.COMPUTE_DOMAIN_UUID,
        "UID of the ComputeDomain (CDI)",
        field="domain_uid",
    ),
    _env_only(
        "compute-domain-name",
        dc.COMPUTE_DOMAIN_NAME,
        "name of the ComputeDomain (CDI)",
        field="domain_name",
    ),
    _Option(
        Flag(
            "compute-domain-namespace",
            dc.COMPUTE_DOMAIN_NAMESPACE,
            str,
            "default",
            "namespace of the ComputeDomain (CDI)",
            cli=False,
        ),
        field="domain_namespace",
    ),
    _env_only(
        "traceparent",
        dc.TRACEPARENT,
        "the domain's formation trace (CDI, ours; empty when tracing is off)",
    ),
    _env_only("node-name", dc.NODE_NAME, "this node (downward API)"),
    _env_only("pod-ip", dc.POD_IP, "this pod's IP (downward API; needed with a clique)"),
    _env_only("pod-uid", dc.POD_UID, "this pod's UID (downward API)"),
    _env_only("pod-name", dc.POD_NAME, "this pod's name (downward API)"),
    _env_only("pod-namespace", dc.POD_NAMESPACE, "this pod's namespace (downward API)"),
    _Option(
        Flag(
            "max-nodes-per-imex-domain",
            dc.MAX_NODES_PER_IMEX_DOMAIN,
            parse_int,
            c.DEFAULT_MAX_NODES_PER_IMEX_DOMAIN,
            "daemons per clique, 1..9999",
            cli=False,
        ),
        field="max_nodes",
    ),
    _Option(
        Flag(
            "join-by-controller",
            dc.CLIQUE_JOIN_BY_CONTROLLER,
            parse_bool,
            False,
            "the controller writes this daemon's clique entry (ours; true in our DaemonSets)",
            cli=False,
        )
    ),
    # The field gets the gates `parse` validated, not the text.
    _Option(
        Flag(
            "feature-gates",
            dc.FEATURE_GATES,
            str,
            "",
            "A=true,B=false (upstream defaults)",
            repeat=Repeat.MAP,
        ),
        field="gates",
    ),
    _Option(
        Flag(
            "config-dir",
            "IMEX_CONFIG_DIR",
            str,
            dc.CONFIG_DIR,
            "directory of imexd.cfg and nodes.cfg",
        )
    ),
    _Option(
        Flag(
            "hosts-file",
            imex.HOSTS_FILE_ENV,
            str,
            imex.DEFAULT_HOSTS_FILE,
            "hosts file the IMEX peer names are written to",
        )
    ),
    _Option(
        Flag(
            "imex-binary", "IMEX_BINARY", str, "nvidia-imex", "IMEX daemon (a shell-quoted command)"
        ),
        field="imex_argv",
        convert=_command_line,
    ),
    _Option(
        Flag(
            "imex-ctl-binary",
            "IMEX_CTL_BINARY",
            str,
            "nvidia-imex-ctl",
            "IMEX control tool (a shell-quoted command)",
        ),
        field="imex_ctl_argv",
        convert=_command_line,
    ),
    _Option(
        Flag(
            "termination-log",
            "TERMINATION_LOG",
            str,
            "/dev/termination-log",
            "where the kubelet reads the termination message",
        )
    ),
    _Option(
        Flag(
            "imex-server-port",
            dc.IMEX_SERVER_PORT,
            parse_int,
            imex.DEFAULT_SERVER_PORT,
            "IMEX server port",
        ),
        field="server_port",
    ),
    _Option(
        Flag(
            "imex-cmd-port", dc.IMEX_CMD_PORT, parse_int, imex.DEFAULT_CMD_PORT, "IMEX command port"
        ),
        field="cmd_port",
    ),
    # IMEX's own authentication/encryption (imexd.cfg keys of the same names); off, as
    # upstream ships it. Set them through the controller's --cd-daemon-extra-env.
    _Option(
        Flag(
            "imex-enable-auth-encryption",
            "IMEX_ENABLE_AUTH_ENCRYPTION",
            parse_bool,
            False,
            "IMEX authentication and encryption between the domain's daemons (needs the keys)",
        ),
        field="auth.enabled",
    ),
    _Option(
        Flag(
            "imex-auth-encryption-mode",
            "IMEX_AUTH_ENCRYPTION_MODE",
            str,
            imex.AuthConfig.mode,
            "IMEX_AUTH_ENCRYPTION_MODE of imexd.cfg",
        ),
        field="auth.mode",
    ),
    _Option(
        Flag(
            "imex-auth-source",
            "IMEX_AUTH_SOURCE",
            str,
            "",
            "IMEX_AUTH_SOURCE of imexd.cfg: where IMEX reads the keys below (FILE: paths)",
        ),
        field="auth.source",
    ),
    *(
        _Option(
            Flag(
                f"imex-{key.lower().replace('_', '-')}",
                f"IMEX_{key}",
                str,
                "",
                f"IMEX_{key} of imexd.cfg",
            ),
            field=f"auth.{key.lower()}",
        )
        for key in _AUTH_KEYS
    ),
    _Option(
        Flag(
            "imex-start-timeout",
            "IMEX_START_TIMEOUT",
            parse_duration,
            60.0,
            "ours: IMEX not ready this long (Go duration or seconds) since the daemon "
            "started or IMEX was last ready: one Warning Event IMEXNotReady on the pod, "
            "with the last error (0: off)",
        )
    ),
    _Option(
        Flag(
            "metrics-address",
            "METRICS_ADDRESS",
            str,
            "",
            "host:port of /metrics (empty: no endpoint; :9400, 127.0.0.1:0)",
        )
    ),
    _Option(
        Flag(
            "kubeconfig",
            "KUBECONFIG",
            str,
            None,
            "kubeconfig file (default: in-cluster, else ~/.kube/config)",
        ),
        convert=_none_if_empty,
    ),
)
"""Every daemon option once: flag name, env, parser, default, help and the field it fills."""

_SHARED_FIELDS: Final = {"v": "verbosity", "logging_format": "logging_format", "vmodule": "vmodule"}
"""Fields filled by the rows every table gets from `pkg.runtime.flags`, by dest."""

DAEMON_FLAGS: Final = FlagTable(
    prog="compute-domain-daemon",
    # V first, as upstream's daemon reads it; LOG_VERBOSITY (set by the DaemonSets) if unset.
    verbosity_env=("V", dc.LOG_VERBOSITY),
    verbosity_default=2,
    verbosity_aliases=("--verbosity",),
    commands=("run", "check"),
    command_help=(
        ("run", "keep this node's IMEX in its domain: membership, config files, nvidia-imex"),
        ("check", "exit 0 if this node's IMEX is ready (the pod's probes run it)"),
    ),
    flags=tuple(option.flag for option in _OPTIONS),
)
"""The daemon's flags and env contract, one row each (derived from the option table)."""

_AUTH_ENV_NAMES: Final = {
    option.target[1]: option.flag.env_names[0] for option in _OPTIONS if option.target[0] == "auth"
}
"""How an error names an ``auth`` field: its env variable."""


def _check_table() -> None:
    """The option table fills every field of `Options` (and of its ``auth``) exactly once."""
    filled = [option.target for option in _OPTIONS]
    filled += [("", name) for name in (*_SHARED_FIELDS.values(), "command", "flag_values")]
    wanted = [("", f.name) for f in dataclasses.fields(Options) if f.name != "auth"]
    wanted += [("auth", f.name) for f in dataclasses.fields(imex.AuthConfig)]
    if sorted(filled) != sorted(wanted):
        raise AssertionError(f"daemon option table and Options differ: {filled} != {wanted}")


_check_table()


def parse(argv: Sequence[str], env: Mapping[str, str]) -> Options:
    """Parse ``argv`` (without the program name) with ``env`` as fallback for every flag.

    ``--version`` (and ``--help``) print to stdout and raise ``SystemExit(0)`` as soon as they
    are met, without a command and before ``env`` is read; a bad command line raises
    `OptionsError` after argparse printed the usage; a bad value raises `OptionsError` naming
    its flag or env variable."""
    try:
        flags = DAEMON_FLAGS.parse(argv, env)
    except SystemExit as err:
        if err.code == 0:
            raise
        raise OptionsError("invalid command line (see usage above)") from err
    except FlagError as err:
        raise OptionsError(str(err)) from err
    try:
        gates = FeatureGates.parse(flags.get_str("feature_gates")).validate()
    except FeatureGateError as err:
        raise OptionsError(str(err)) from err
    max_nodes = flags.get_int("max_nodes_per_imex_domain")
    if not 1 <= max_nodes <= 9999:
        raise OptionsError(f"MAX_NODES_PER_IMEX_DOMAIN={max_nodes} outside 1..9999")
    opts = _options(flags, gates=gates)
    for key, value in dataclasses.asdict(opts.auth).items():
        if isinstance(value, str) and any(ch in value for ch in "\n\r#"):
            name = _AUTH_ENV_NAMES[key]
            raise OptionsError(f"{name}: {value!r} must not contain newlines or '#'")
    return opts


def _options(flags: FlagValues, *, gates: FeatureGates) -> Options:
    """`Options` from the parsed rows (and the validated ``gates``), one field per option."""
    values = {**flags.values, "feature_gates": gates}
    fields: dict[str, Any] = {
        "command": flags.command or "",
        "flag_values": tuple(flags.dump().items()),
    }
    auth: dict[str, Any] = {}
    for option in _OPTIONS:
        group, name = option.target
        (auth if group else fields)[name] = option.convert(values[option.flag.dest], option.flag)
    for dest, name in _SHARED_FIELDS.items():
        fields[name] = flags[dest]
    return Options(**fields, auth=imex.AuthConfig(**auth))
