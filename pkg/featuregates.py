"""Feature gates shared by every binary (controller, kubelet plugin, IMEX daemon).

Owns the gate names, their upstream defaults and the inter-gate dependency check. The spec
format is upstream's ``--feature-gates``/``FEATURE_GATES`` string: ``"Name=true,Other=false"``
(whitespace and a trailing comma are tolerated, so the controller can hand its rendered map to
the daemons verbatim). Values are parsed by `pkg.base.strconv.parse_bool`
(Go's ``strconv.ParseBool``), the parser of every boolean flag and env variable too.

Three kinds of names, mirroring what upstream's binaries accept (``pkg/featuregates`` plus
component-base's logging gates and its ``AllAlpha``/``AllBeta`` switches):

- :data:`DEFAULTS` -- the gates this driver implements, with upstream's defaults (stages in
  :data:`STAGES`: the Beta gates are on, the Alpha ``HostManagedIMEXDaemon`` and
  ``FabricManagerPartitioning`` are off; the latter only tolerates pending fabric registration
  on single-node NVLink systems here, the partition activation is the GPU plugin's);
- :data:`UPSTREAM_ONLY` -- gates the Go driver knows but this driver does not implement (GPU
  plugin and logging gates). A shared ``FEATURE_GATES`` value may carry them, so they are
  accepted, logged as a warning, and passed on to the daemons -- never acted upon;
- ``AllAlpha``/``AllBeta`` -- component-base's switches: they set every gate of that stage that
  is not named explicitly (``AllBeta=false`` therefore turns this driver's gates off).

Invariants:
- any other name is a :class:`FeatureGateError` with component-base's wording
  (``unrecognized feature gate: <name>``), so a typo stops the binary instead of silently
  running with defaults -- the same outcome as upstream's flag parsing;
- :class:`FeatureGates` is immutable; :meth:`FeatureGates.render` round-trips through
  :meth:`FeatureGates.parse`;
- :meth:`FeatureGates.validate` applies upstream's ``ValidateFeatureGates`` rules, including
  the ones among GPU gates, so a spec is accepted here exactly when upstream accepts it.

This is a low layer: standard library and `pkg.base` only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from pkg.base.strconv import parse_bool

log = logging.getLogger(__name__)

IMEX_DAEMONS_WITH_DNS_NAMES: Final = "IMEXDaemonsWithDNSNames"
COMPUTE_DOMAIN_CLIQUES: Final = "ComputeDomainCliques"
CRASH_ON_NVLINK_FABRIC_ERRORS: Final = "CrashOnNVLinkFabricErrors"
HOST_MANAGED_IMEX_DAEMON: Final = "HostManagedIMEXDaemon"
FABRIC_MANAGER_PARTITIONING: Final = "FabricManagerPartitioning"

ALPHA: Final = "Alpha"
BETA: Final = "Beta"
ALL_ALPHA: Final = "AllAlpha"
ALL_BETA: Final = "AllBeta"

DEFAULTS: Final[Mapping[str, bool]] = {
    IMEX_DAEMONS_WITH_DNS_NAMES: True,
    COMPUTE_DOMAIN_CLIQUES: True,
    CRASH_ON_NVLINK_FABRIC_ERRORS: True,
    HOST_MANAGED_IMEX_DAEMON: False,
    FABRIC_MANAGER_PARTITIONING: False,
}
STAGES: Final[Mapping[str, str]] = {
    **dict.fromkeys(DEFAULTS, BETA),
    HOST_MANAGED_IMEX_DAEMON: ALPHA,
    FABRIC_MANAGER_PARTITIONING: ALPHA,
}

# Known to the Go driver (name -> (default, stage)); accepted here, never acted upon.
UPSTREAM_ONLY: Final[Mapping[str, tuple[bool, str]]] = {
    "TimeSlicingSettings": (False, ALPHA),
    "MPSSupport": (False, ALPHA),
    "PassthroughSupport": (False, ALPHA),
    "NVMLDeviceHealthCheck": (False, ALPHA),
    "DynamicMIG": (False, ALPHA),
    "DeviceMetadata": (False, ALPHA),
    "DRAListTypeAttributes": (False, ALPHA),
    "ConsumableShares": (False, ALPHA),
    # component-base logging gates (upstream forces ContextualLogging on at start-up)
    "ContextualLogging": (True, BETA),
    "LoggingAlphaOptions": (False, ALPHA),
    "LoggingBetaOptions": (True, BETA),
}
_SWITCHES: Final[Mapping[str, str]] = {ALL_ALPHA: ALPHA, ALL_BETA: BETA}

# gate -> gates that must also be enabled when it is enabled (upstream ValidateFeatureGates).
REQUIRES: Final[Mapping[str, tuple[str, ...]]] = {
    COMPUTE_DOMAIN_CLIQUES: (IMEX_DAEMONS_WITH_DNS_NAMES,),
    "DeviceMetadata": ("PassthroughSupport",),
}
# Pairs that must not both be enabled (upstream ValidateFeatureGates, GPU gates).
EXCLUSIVE: Final[tuple[tuple[str, str], ...]] = (
    ("DynamicMIG", "PassthroughSupport"),
    ("DynamicMIG", "NVMLDeviceHealthCheck"),
    ("DynamicMIG", "MPSSupport"),
    ("PassthroughSupport", "NVMLDeviceHealthCheck"),
)


class FeatureGateError(ValueError):
    """A feature-gate spec that cannot be used (unknown gate, bad value, unmet dependency)."""


def known_gates() -> list[str]:
    """Every name a spec may carry, sorted."""
    return sorted({*DEFAULTS, *UPSTREAM_ONLY, *_SWITCHES})


def _check_known(name: str) -> None:
    if name not in DEFAULTS and name not in UPSTREAM_ONLY and name not in _SWITCHES:
        raise FeatureGateError(
            f"unrecognized feature gate: {name} (known gates: {', '.join(known_gates())})"
        )


def _parse_bool(name: str, raw: str) -> bool:
    """The gate's value: `parse_bool` after the spec's whitespace is trimmed."""
    try:
        return parse_bool(raw.strip())
    except ValueError as err:
        raise FeatureGateError(
            f'feature gate "{name}": invalid value "{raw}", expected true or false'
        ) from err


@dataclass(frozen=True)
class FeatureGates:
    """An immutable set of gate overrides on top of :data:`DEFAULTS`."""

    overrides: Mapping[str, bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in sorted(self.overrides):
            _check_known(name)
        # Freeze a private copy so a caller mutating its dict cannot change our answers.
        object.__setattr__(self, "overrides", dict(self.overrides))

    @classmethod
    def parse(cls, spec: str | None) -> FeatureGates:
        """Parse ``"A=true,B=false"``; ``None`` or ``""`` means all defaults.

        Raises `FeatureGateError` for an unrecognized name or a bad value; logs one warning per
        gate the Go driver knows but this driver does not implement.
        """
        overrides: dict[str, bool] = {}
        for raw_item in (spec or "").split(","):
            item = raw_item.strip()
            if not item:
                continue
            name, sep, raw = item.partition("=")
            name = name.strip()
            if not sep or not name:
                raise FeatureGateError(f'invalid feature gate entry "{item}", expected Name=bool')
            _check_known(name)
            overrides[name] = _parse_bool(name, raw)
        gates = cls(overrides=overrides)
        for name in gates.unimplemented():
            log.warning(
                "feature gate %s=%s is known to the Go driver but not implemented by this "
                "driver; accepted and ignored",
                name,
                str(overrides[name]).lower(),
            )
        return gates

    def unimplemented(self) -> list[str]:
        """Explicitly set gates this driver accepts but does not act upon, sorted."""
        return sorted(n for n in self.overrides if n not in DEFAULTS)

    def enabled(self, name: str) -> bool:
        """Whether gate ``name`` is on: explicit value, else ``AllAlpha``/``AllBeta``, else default.

        An unrecognized name is a programming error (`FeatureGateError`).
        """
        _check_known(name)
        if name in self.overrides:
            return self.overrides[name]
        if name in _SWITCHES:
            return False
        default, stage = (DEFAULTS[name], STAGES[name]) if name in DEFAULTS else UPSTREAM_ONLY[name]
        for switch, switch_stage in _SWITCHES.items():
            if stage == switch_stage and switch in self.overrides:
                return self.overrides[switch]
        return default

    def validate(self) -> FeatureGates:
        """Check inter-gate dependencies; returns ``self`` so it can be chained after parse."""
        for gate, needs in sorted(REQUIRES.items()):
            if not self.enabled(gate):
                continue
            for need in needs:
                if not self.enabled(need):
                    raise FeatureGateError(
                        f"feature gate {gate} requires {need} to also be enabled "
                        f"(set {need}=true or {gate}=false)"
                    )
        for first, second in EXCLUSIVE:
            if self.enabled(first) and self.enabled(second):
                raise FeatureGateError(
                    f"feature gate {first} is currently mutually exclusive with {second}"
                )
        return self

    def with_overrides(self, forced: Mapping[str, bool]) -> FeatureGates:
        """A new set: this one's explicit values with ``forced`` applied on top.

        Used after :meth:`validate` when a mode pins gates (host-managed IMEX turns
        ``IMEXDaemonsWithDNSNames`` and ``ComputeDomainCliques`` off, like upstream's
        ``SetFromMap``); the result is not re-validated, and ``self`` is unchanged.
        """
        return FeatureGates(overrides={**self.overrides, **forced})

    def as_dict(self) -> dict[str, bool]:
        """Every gate this driver implements with its effective value."""
        return {name: self.enabled(name) for name in sorted(DEFAULTS)}

    def all_values(self) -> dict[str, bool]:
        """Every gate a spec may name (the Go driver's too) with its effective value, sorted:
        the map the binaries print at start-up as upstream does."""
        return {name: self.enabled(name) for name in known_gates()}

    def render(self) -> str:
        """``"A=true,B=false"`` for the daemons' ``FEATURE_GATES``.

        Lists every implemented gate with its effective value, then every explicitly set
        upstream-only gate or switch, so the daemons see what the controller was given.
        """
        values = self.as_dict()
        values.update({name: self.overrides[name] for name in self.unimplemented()})
        return ",".join(f"{name}={'true' if value else 'false'}" for name, value in values.items())
