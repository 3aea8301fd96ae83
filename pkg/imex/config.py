"""The ``imexd.cfg`` file read by ``nvidia-imex`` and ``nvidia-imex-ctl``: render and parse.

Owns the key set, taken from upstream's ``compute-domain-daemon-config.tmpl.cfg``, emitted in a
fixed order so the rendered file is byte-stable (golden-file tested) and a rewrite with the same
inputs never changes the file.

Invariants:
- every upstream key is present exactly once; values never contain a newline or ``#``;
- the server and command service bind to the same address (the daemon pod's IP), so a peer's
  ``nvidia-imex-ctl -N`` can reach it and nothing listens on other interfaces;
- authentication/encryption stays off unless keys are configured, as upstream ships it.

:func:`parse_config` is the one reader used by the simulator and the readiness query, so the
writer and the readers cannot disagree about the format (``KEY=VALUE``, ``#`` comments).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

DEFAULT_SERVER_PORT: Final = 50000
"""IMEX's ``SERVER_PORT`` unless configured (the daemon's ``--imex-server-port``)."""
DEFAULT_CMD_PORT: Final = 50005
"""IMEX's ``IMEX_CMD_PORT`` unless configured (the daemon's ``--imex-cmd-port``)."""
CONFIG_FILE_NAME: Final = "imexd.cfg"
"""This file, in the daemon's config directory."""
NODES_CONFIG_FILE_NAME: Final = "nodes.cfg"
"""The nodes config ``IMEX_NODE_CONFIG_FILE`` names, next to this file."""

# The env the daemon gives the IMEX process on top of its own: real IMEX ignores both; the
# simulator (pkg.imex.sim.imexd) resolves peers through the hosts file the daemon maintains
# and refuses peers of another domain.
HOSTS_FILE_ENV: Final = "IMEX_HOSTS_FILE"
"""The hosts file the daemon maintains (also the daemon's own ``--hosts-file`` env)."""
DEFAULT_HOSTS_FILE: Final = "/etc/hosts"
DOMAIN_ID_ENV: Final = "IMEX_DOMAIN_ID"
"""The domain's UID."""


class ImexConfigError(ValueError):
    """An IMEX config value that cannot be written or read back."""


@dataclass(frozen=True)
class AuthConfig:
    """IMEX authentication/encryption settings (``IMEX_ENABLE_AUTH_ENCRYPTION`` and friends).

    Empty by default, like upstream; set ``enabled`` plus the file paths to turn TLS on.
    """

    enabled: bool = False
    mode: str = "SSL_TLS"
    source: str = ""
    server_key: str = ""
    server_cert: str = ""
    server_cert_auth: str = ""
    client_key: str = ""
    client_cert: str = ""
    client_cert_auth: str = ""
    security_target_override: str = ""


@dataclass(frozen=True)
class ImexConfig:
    """Inputs of ``imexd.cfg``. ``bind_ip`` is the local address both services listen on."""

    bind_ip: str
    node_config_path: str
    server_port: int = DEFAULT_SERVER_PORT
    cmd_port: int = DEFAULT_CMD_PORT
    log_level: int = 4
    log_file_name: str = ""
    stats_file_name: str = "/var/log/nvidia-imex-stats.log"
    # RECOVERY: start serving without waiting for the whole domain; quorum is only awaited when
    # recovering after a peer was lost. This is what makes readiness local to one node.
    wait_for_quorum: str = "RECOVERY"
    # -1: keep imports from a disconnected peer forever; the peer may come back under a new IP.
    node_disconnected_grace_time: int = -1
    auth: AuthConfig = field(default_factory=AuthConfig)

    def entries(self) -> list[tuple[str, str]]:
        """All ``(key, value)`` pairs in file order."""
        a = self.auth
        pairs: list[tuple[str, str]] = [
            ("LOG_LEVEL", str(self.log_level)),
            ("LOG_FILE_NAME", self.log_file_name),
            ("STATS_FILE_NAME", self.stats_file_name),
            ("LOG_APPEND_TO_LOG", "0"),
            ("LOG_FILE_MAX_SIZE", "1024"),
            ("LOG_MAX_ROTATE_COUNT", "10"),
            ("LOG_USE_SYSLOG", "0"),
            ("DAEMONIZE", "0"),
            ("BIND_INTERFACE_IP", self.bind_ip),
            ("SERVER_PORT", str(self.server_port)),
            ("IMEX_NODE_CONFIG_FILE", self.node_config_path),
            ("NETWORK_INTERFACE", ""),
            ("IMEX_WAIT_FOR_QUORUM", self.wait_for_quorum),
            ("IMEX_ENABLE_AUTH_ENCRYPTION", "1" if a.enabled else "0"),
            ("IMEX_AUTH_ENCRYPTION_MODE", a.mode),
            ("IMEX_AUTH_SOURCE", a.source),
            ("IMEX_SERVER_KEY", a.server_key),
            ("IMEX_SERVER_CERT", a.server_cert),
            ("IMEX_SERVER_CERT_AUTH", a.server_cert_auth),
            ("IMEX_CLIENT_KEY", a.client_key),
            ("IMEX_CLIENT_CERT", a.client_cert),
            ("IMEX_CLIENT_CERT_AUTH", a.client_cert_auth),
            ("IMEX_SECURITY_TARGET_OVERRIDE", a.security_target_override),
            ("IMEX_GSS_SERVICE_NAME", "host"),
            ("IMEX_GSS_TIMEOUT_SEC", "30"),
            ("IMEX_GSS_RETRY_INTERVAL_SEC", "5"),
            ("IMEX_GSS_SEC_CONTEXT_LIFETIME_SEC", "-1"),
            ("IMEX_GSS_SHUTDOWN_ON_FAILURE", "0"),
            ("IMEX_CMD_ENABLED", "1"),
            ("IMEX_CMD_BIND_INTERFACE_IP", self.bind_ip),
            ("IMEX_CMD_PORT", str(self.cmd_port)),
            ("IMEX_CMD_UNIX_DOMAIN_PATH", ""),
            ("IMEX_NODE_DISCONNECTED_GRACE_TIME", str(self.node_disconnected_grace_time)),
        ]
        for key, value in pairs:
            if any(ch in value for ch in "\n\r#"):
                raise ImexConfigError(f"{key}: value {value!r} must not contain newlines or '#'")
        for port_key, port in (("SERVER_PORT", self.server_port), ("IMEX_CMD_PORT", self.cmd_port)):
            if not 0 < port < 65536:
                raise ImexConfigError(f"{port_key}: {port} is not a TCP port")
        return pairs

    def render(self) -> str:
        """The file content: a header comment, then one ``KEY=VALUE`` line per key."""
        lines = ["# Written by compute-domain-daemon; rewritten on every start. Do not edit."]
        lines += [f"{key}={value}" for key, value in self.entries()]
        return "\n".join(lines) + "\n"


def parse_config(text: str) -> dict[str, str]:
    """Read ``KEY=VALUE`` lines; blank lines and ``#`` comments are skipped, last key wins."""
    values: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ImexConfigError(f"line {lineno}: expected KEY=VALUE, got {raw!r}")
        values[key.strip()] = value.strip()
    return values


def read_config(path: str | os.PathLike[str]) -> dict[str, str]:
    """Parse the config file at ``path``."""
    return parse_config(Path(path).read_text(encoding="utf-8"))
