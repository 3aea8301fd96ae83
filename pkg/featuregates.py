"""Feature gates shared by every binary (controller, kubelet plugin, IMEX daemon).

Owns the gate names, their upstream defaults and the inter-gate dependency check. The spec
format is upstream's ``--feature-gates``/``FEATURE_GATES`` string: ``"Name=true,Other=false"``
(whitespace and a trailing comma are tolerated, so the controller can hand its rendered map to
the daemons verbatim).

Invariants:
- an unknown gate name or a non-boolean value is a :class:`FeatureGateError` naming the culprit
  and listing the known gates -- a typo must never silently run with defaults;
- :class:`FeatureGates` is immutable; :meth:`FeatureGates.render` round-trips through
  :meth:`FeatureGates.parse` and lists every known gate, explicitly set or not;
- :meth:`FeatureGates.validate` rejects ``ComputeDomainCliques`` without
  ``IMEXDaemonsWithDNSNames`` (upstream ``ValidateFeatureGates``).

This is the bottom layer: standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

IMEX_DAEMONS_WITH_DNS_NAMES: Final = "IMEXDaemonsWithDNSNames"
COMPUTE_DOMAIN_CLIQUES: Final = "ComputeDomainCliques"
CRASH_ON_NVLINK_FABRIC_ERRORS: Final = "CrashOnNVLinkFabricErrors"

DEFAULTS: Final[Mapping[str, bool]] = {
    IMEX_DAEMONS_WITH_DNS_NAMES: True,
    COMPUTE_DOMAIN_CLIQUES: True,
    CRASH_ON_NVLINK_FABRIC_ERRORS: True,
}

# gate -> gates that must also be enabled when it is enabled.
REQUIRES: Final[Mapping[str, tuple[str, ...]]] = {
    COMPUTE_DOMAIN_CLIQUES: (IMEX_DAEMONS_WITH_DNS_NAMES,),
}

_TRUE = {"true", "1", "t", "yes", "on"}
_FALSE = {"false", "0", "f", "no", "off"}


class FeatureGateError(ValueError):
    """A feature-gate spec that cannot be used (unknown gate, bad value, unmet dependency)."""


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise FeatureGateError(f'feature gate "{name}": invalid value "{raw}", expected true or false')


@dataclass(frozen=True)
class FeatureGates:
    """An immutable set of gate overrides on top of :data:`DEFAULTS`."""

    overrides: Mapping[str, bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.overrides) - set(DEFAULTS))
        if unknown:
            raise FeatureGateError(
                f'unknown feature gate "{unknown[0]}"; known gates: {", ".join(sorted(DEFAULTS))}'
            )
        # Freeze a private copy so a caller mutating its dict cannot change our answers.
        object.__setattr__(self, "overrides", dict(self.overrides))

    @classmethod
    def parse(cls, spec: str | None) -> FeatureGates:
        """Parse ``"A=true,B=false"``; ``None`` or ``""`` means all defaults."""
        overrides: dict[str, bool] = {}
        for raw_item in (spec or "").split(","):
            item = raw_item.strip()
            if not item:
                continue
            name, sep, raw = item.partition("=")
            name = name.strip()
            if not sep or not name:
                raise FeatureGateError(f'invalid feature gate entry "{item}", expected Name=bool')
            if name not in DEFAULTS:
                raise FeatureGateError(
                    f'unknown feature gate "{name}"; known gates: {", ".join(sorted(DEFAULTS))}'
                )
            overrides[name] = _parse_bool(name, raw)
        return cls(overrides=overrides)

    def enabled(self, name: str) -> bool:
        """Whether gate ``name`` is on; an unknown name is a programming error."""
        if name not in DEFAULTS:
            raise FeatureGateError(f'unknown feature gate "{name}"')
        return self.overrides.get(name, DEFAULTS[name])

    def validate(self) -> FeatureGates:
        """Check inter-gate dependencies; returns ``self`` so it can be chained after parse."""
        for gate, needs in sorted(REQUIRES.items()):
            if not self.enabled(gate):
                continue
            for need in needs:
                if not self.enabled(need):
                    raise FeatureGateError(
                        f"feature gate {gate} requires {need} to be enabled "
                        f"(set {need}=true or {gate}=false)"
                    )
        return self

    def as_dict(self) -> dict[str, bool]:
        """Every known gate with its effective value."""
        return {name: self.enabled(name) for name in sorted(DEFAULTS)}

    def render(self) -> str:
        """The full effective map as ``"A=true,B=false"`` (for the daemons' ``FEATURE_GATES``)."""
        return ",".join(
            f"{name}={'true' if value else 'false'}" for name, value in self.as_dict().items()
        )
