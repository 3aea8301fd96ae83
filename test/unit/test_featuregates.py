"""Feature-gate parsing, defaults, dependency validation and rendering."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pkg import featuregates as fg
from pkg.featuregates import FeatureGateError, FeatureGates


def test_defaults_match_upstream() -> None:
    gates = FeatureGates.parse(None).validate()
    assert gates.enabled(fg.IMEX_DAEMONS_WITH_DNS_NAMES)
    assert gates.enabled(fg.COMPUTE_DOMAIN_CLIQUES)
    assert gates.enabled(fg.CRASH_ON_NVLINK_FABRIC_ERRORS)


@pytest.mark.parametrize(
    ("spec", "gate", "expected"),
    [
        (
            "IMEXDaemonsWithDNSNames=false,ComputeDomainCliques=false",
            "IMEXDaemonsWithDNSNames",
            False,
        ),
        (" CrashOnNVLinkFabricErrors = False , ", "CrashOnNVLinkFabricErrors", False),
        ("ComputeDomainCliques=1", "ComputeDomainCliques", True),
        ("", "ComputeDomainCliques", True),
    ],
    ids=["ip-mode", "whitespace-trailing-comma", "numeric-bool", "empty"],
)
def test_parse(spec: str, gate: str, expected: bool) -> None:
    assert FeatureGates.parse(spec).validate().enabled(gate) is expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("NoSuchGate=true", "unrecognized feature gate: NoSuchGate"),
        ("ComputeDomainCliques=yes", 'invalid value "yes"'),
        ("ComputeDomainCliques=maybe", 'invalid value "maybe"'),
        ("ComputeDomainCliques", "expected Name=bool"),
        ("=true", "expected Name=bool"),
    ],
    ids=["unknown", "not-parsebool", "bad-bool", "no-value", "no-name"],
)
def test_parse_errors(spec: str, message: str) -> None:
    with pytest.raises(FeatureGateError, match=message):
        FeatureGates.parse(spec)


def test_unknown_gate_error_lists_known_gates() -> None:
    with pytest.raises(FeatureGateError, match="IMEXDaemonsWithDNSNames"):
        FeatureGates.parse("Typo=true")


def test_cliques_require_dns_names() -> None:
    gates = FeatureGates.parse("IMEXDaemonsWithDNSNames=false")
    with pytest.raises(
        FeatureGateError, match="ComputeDomainCliques requires IMEXDaemonsWithDNSNames to also"
    ):
        gates.validate()


def test_enabled_unknown_name_raises() -> None:
    with pytest.raises(FeatureGateError):
        FeatureGates().enabled("Nope")


def test_overrides_are_copied() -> None:
    src = {fg.COMPUTE_DOMAIN_CLIQUES: False}
    gates = FeatureGates(overrides=src)
    src[fg.COMPUTE_DOMAIN_CLIQUES] = True
    assert not gates.enabled(fg.COMPUTE_DOMAIN_CLIQUES)


@given(st.dictionaries(st.sampled_from(sorted(fg.DEFAULTS)), st.booleans()))
def test_render_round_trips(overrides: dict[str, bool]) -> None:
    gates = FeatureGates(overrides=overrides)
    again = FeatureGates.parse(gates.render())
    assert again.as_dict() == gates.as_dict()
    assert set(again.as_dict()) == set(fg.DEFAULTS)


@pytest.mark.parametrize("name", sorted(fg.UPSTREAM_ONLY))
def test_upstream_only_gates_are_accepted_with_a_warning(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A shared FEATURE_GATES value (e.g. MPSSupport, set for the GPU plugin) must not stop us."""
    with caplog.at_level("WARNING", logger="pkg.featuregates"):
        gates = FeatureGates.parse(f"{name}=true,ComputeDomainCliques=true")
    assert gates.enabled(name) and gates.unimplemented() == [name]
    assert gates.as_dict() == FeatureGates().as_dict()  # nothing this driver does changes
    assert f"feature gate {name}=true is known to the Go driver but not implemented" in caplog.text
    assert f"{name}=true" in gates.render()


def test_all_beta_switch_sets_unnamed_beta_gates() -> None:
    """component-base semantics: AllBeta=false turns off every Beta gate not named explicitly."""
    gates = FeatureGates.parse("AllBeta=false,IMEXDaemonsWithDNSNames=true").validate()
    assert gates.enabled(fg.IMEX_DAEMONS_WITH_DNS_NAMES)
    assert not gates.enabled(fg.COMPUTE_DOMAIN_CLIQUES)
    assert not gates.enabled(fg.CRASH_ON_NVLINK_FABRIC_ERRORS)
    again = FeatureGates.parse(gates.render())
    assert again.as_dict() == gates.as_dict()
    assert FeatureGates.parse("AllAlpha=true").enabled("MPSSupport")
    assert FeatureGates.parse("AllAlpha=true").enabled(fg.COMPUTE_DOMAIN_CLIQUES)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("DeviceMetadata=true", "DeviceMetadata requires PassthroughSupport to also be enabled"),
        ("DynamicMIG=true,MPSSupport=true", "DynamicMIG is currently mutually exclusive with MPS"),
    ],
    ids=["requires", "exclusive"],
)
def test_upstream_gpu_gate_rules_are_validated(spec: str, message: str) -> None:
    with pytest.raises(FeatureGateError, match=message):
        FeatureGates.parse(spec).validate()


def test_host_managed_imex_gate_is_implemented_alpha_and_off() -> None:
    """Upstream v0.5: HostManagedIMEXDaemon is Alpha, default off, and now acted upon."""
    gates = FeatureGates.parse(f"{fg.HOST_MANAGED_IMEX_DAEMON}=true").validate()
    assert gates.enabled(fg.HOST_MANAGED_IMEX_DAEMON)
    assert gates.unimplemented() == []
    assert fg.HOST_MANAGED_IMEX_DAEMON not in fg.UPSTREAM_ONLY
    assert fg.STAGES[fg.HOST_MANAGED_IMEX_DAEMON] == fg.ALPHA
    assert not FeatureGates().enabled(fg.HOST_MANAGED_IMEX_DAEMON)
    assert FeatureGates.parse("AllAlpha=true").enabled(fg.HOST_MANAGED_IMEX_DAEMON)
    assert not FeatureGates.parse("AllBeta=true").enabled(fg.HOST_MANAGED_IMEX_DAEMON)
    assert "HostManagedIMEXDaemon=false" in FeatureGates().render()


def test_with_overrides_forces_gates_without_touching_the_original() -> None:
    gates = FeatureGates.parse("HostManagedIMEXDaemon=true")
    forced = gates.with_overrides(
        {fg.IMEX_DAEMONS_WITH_DNS_NAMES: False, fg.COMPUTE_DOMAIN_CLIQUES: False}
    )
    assert not forced.enabled(fg.IMEX_DAEMONS_WITH_DNS_NAMES)
    assert not forced.enabled(fg.COMPUTE_DOMAIN_CLIQUES)
    assert forced.enabled(fg.HOST_MANAGED_IMEX_DAEMON)
    assert gates.enabled(fg.COMPUTE_DOMAIN_CLIQUES)
