"""Who runs IMEX on a node (``IMEX_MODE``) and how channels are isolated (``IMEX_ISOLATION``).

Owns the two settings both the controller and the kubelet plugin read, upstream's names and
defaults for them, and the one validation both binaries apply right after the feature gates:

- ``driverManaged`` (default): the driver starts one IMEX daemon per ComputeDomain and node;
- ``hostManaged``: the node's own ``nvidia-imex.service`` serves the IMEX domain; the driver
  only hands out channel 0 after asking the host daemon (``nvidia-imex-ctl -q --u=<socket>``)
  whether it is ready. It needs the ``HostManagedIMEXDaemon`` gate, and it turns the gates
  that only shape driver-run daemons (:data:`HOST_MANAGED_FORCED_GATES`) off.

Isolation ``domain`` (default; ``""`` means the same) is the only one implemented, as upstream:
``channel`` is recognised and refused. The validation messages are upstream's words, because
operators' runbooks match them; a failing binary prints :data:`VALIDATION_FAILED` plus the
message on stderr and exits 1 (:func:`validate_or_exit`).

Invariant: an :class:`ImexModeConfig` returned by :meth:`ImexModeConfig.validate` (or
:func:`validate_or_exit`) holds one of the two modes and isolation ``domain``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, TextIO

from pkg.featuregates import (
    COMPUTE_DOMAIN_CLIQUES,
    HOST_MANAGED_IMEX_DAEMON,
    IMEX_DAEMONS_WITH_DNS_NAMES,
    FeatureGates,
)

__all__ = [
    "DEFAULT_HOST_SOCKET_PATH",
    "DRIVER_MANAGED",
    "HOST_MANAGED",
    "HOST_MANAGED_FORCED_GATES",
    "ISOLATION_CHANNEL",
    "ISOLATION_DOMAIN",
    "VALIDATION_FAILED",
    "ImexModeConfig",
    "ImexModeError",
    "effective_gates",
    "validate_or_exit",
]

DRIVER_MANAGED: Final = "driverManaged"
HOST_MANAGED: Final = "hostManaged"
ISOLATION_DOMAIN: Final = "domain"
ISOLATION_CHANNEL: Final = "channel"
DEFAULT_HOST_SOCKET_PATH: Final = "/etc/nvidia-imex/imex_ctrl.sock"
"""The host daemon's control socket, as seen inside the driver root (``IMEX_CMD_UNIX_DOMAIN_PATH``
in the host's ``/etc/nvidia-imex/config.cfg``)."""
VALIDATION_FAILED: Final = "Error: imex configuration validation failed: "
HOST_MANAGED_FORCED_GATES: Final[Mapping[str, bool]] = {
    IMEX_DAEMONS_WITH_DNS_NAMES: False,
    COMPUTE_DOMAIN_CLIQUES: False,
}
"""Gates host-managed mode pins after validation: both only shape daemons the driver runs."""


class ImexModeError(ValueError):
    """A mode/isolation/gate combination the driver does not run with; the text is upstream's."""


@dataclass(frozen=True)
class ImexModeConfig:
    """``IMEX_MODE`` and ``IMEX_ISOLATION`` as given (validate before use)."""

    mode: str = DRIVER_MANAGED
    isolation: str = ISOLATION_DOMAIN

    @property
    def host_managed(self) -> bool:
        """Whether the node's own IMEX service, not the driver, runs the IMEX domain."""
        return self.mode == HOST_MANAGED

    def validate(self, *, gate_enabled: bool) -> ImexModeConfig:
        """``self`` with ``""`` isolation normalised to ``domain``; :class:`ImexModeError`
        (upstream's message) for an unknown value, host-managed mode without the
        ``HostManagedIMEXDaemon`` gate (``gate_enabled``), or ``channel`` isolation.

        The mode is checked before the isolation, so a config wrong in both reports the mode.
        """
        if self.mode == HOST_MANAGED:
            if not gate_enabled:
                raise ImexModeError(
                    f'imex.mode="{HOST_MANAGED}" requires the {HOST_MANAGED_IMEX_DAEMON} '
                    "feature gate to be enabled"
                )
        elif self.mode != DRIVER_MANAGED:
            raise ImexModeError(f'unknown imex.mode "{self.mode}"')
        if self.isolation == ISOLATION_CHANNEL:
            raise ImexModeError(
                f'imex.isolation="{ISOLATION_CHANNEL}" is not supported yet: per-workload IMEX '
                "channel allocation is not implemented"
            )
        if self.isolation not in ("", ISOLATION_DOMAIN):
            raise ImexModeError(
                f'unknown imex.isolation "{self.isolation}": must be "{ISOLATION_DOMAIN}" or '
                f'"{ISOLATION_CHANNEL}"'
            )
        return ImexModeConfig(mode=self.mode, isolation=ISOLATION_DOMAIN)


def effective_gates(gates: FeatureGates, config: ImexModeConfig) -> FeatureGates:
    """The gates a binary runs with: ``gates`` unchanged in driver-managed mode; in host-managed
    mode, :data:`HOST_MANAGED_FORCED_GATES` applied on top (the startup dump still shows the
    gates as given)."""
    if not config.host_managed:
        return gates
    return gates.with_overrides(HOST_MANAGED_FORCED_GATES)


def validate_or_exit(
    config: ImexModeConfig, *, gates: FeatureGates, stderr: TextIO
) -> ImexModeConfig:
    """:meth:`ImexModeConfig.validate` against ``gates``; on failure writes
    ``Error: imex configuration validation failed: <msg>`` to ``stderr`` and raises
    ``SystemExit(1)``, as upstream's binaries do."""
    try:
        return config.validate(gate_enabled=gates.enabled(HOST_MANAGED_IMEX_DAEMON))
    except ImexModeError as err:
        stderr.write(f"{VALIDATION_FAILED}{err}\n")
        stderr.flush()
        raise SystemExit(1) from err
