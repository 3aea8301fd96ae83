"""IMEX_MODE / IMEX_ISOLATION validation: upstream's exact messages and the forced gates."""

from __future__ import annotations

import io

import pytest

from pkg import featuregates as fg
from pkg.featuregates import FeatureGates
from pkg.imex.mode import (
    VALIDATION_FAILED,
    ImexModeConfig,
    ImexModeError,
    effective_gates,
    validate_or_exit,
)


@pytest.mark.parametrize(
    ("mode", "isolation", "gate", "message"),
    [
        (
            "hostManaged",
            "domain",
            False,
            'imex.mode="hostManaged" requires the HostManagedIMEXDaemon feature gate to be enabled',
        ),
        ("", "domain", True, 'unknown imex.mode ""'),
        ("HostManaged", "", True, 'unknown imex.mode "HostManaged"'),
        (
            "driverManaged",
            "channel",
            False,
            'imex.isolation="channel" is not supported yet: per-workload IMEX channel allocation '
            "is not implemented",
        ),
        (
            "hostManaged",
            "node",
            True,
            'unknown imex.isolation "node": must be "domain" or "channel"',
        ),
        ("bogus", "bogus", True, 'unknown imex.mode "bogus"'),
    ],
    ids=[
        "host-without-gate",
        "empty-mode",
        "case-matters",
        "channel",
        "bad-isolation",
        "mode-reported-first",
    ],
)
def test_invalid_combinations_carry_upstreams_message(
    mode: str, isolation: str, gate: bool, message: str
) -> None:
    with pytest.raises(ImexModeError) as err:
        ImexModeConfig(mode=mode, isolation=isolation).validate(gate_enabled=gate)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("mode", "isolation", "gate", "host_managed"),
    [
        ("driverManaged", "domain", False, False),
        ("driverManaged", "", False, False),
        ("driverManaged", "domain", True, False),
        ("hostManaged", "", True, True),
        ("hostManaged", "domain", True, True),
    ],
)
def test_valid_combinations_normalise_isolation(
    mode: str, isolation: str, gate: bool, host_managed: bool
) -> None:
    got = ImexModeConfig(mode=mode, isolation=isolation).validate(gate_enabled=gate)
    assert got == ImexModeConfig(mode=mode, isolation="domain")
    assert got.host_managed is host_managed


def test_validate_or_exit_prints_upstreams_line_and_exits_1() -> None:
    stderr = io.StringIO()
    with pytest.raises(SystemExit) as exit_:
        validate_or_exit(ImexModeConfig(mode="hostManaged"), gates=FeatureGates(), stderr=stderr)
    assert exit_.value.code == 1
    assert stderr.getvalue() == (
        f'{VALIDATION_FAILED}imex.mode="hostManaged" requires the HostManagedIMEXDaemon '
        "feature gate to be enabled\n"
    )
    assert VALIDATION_FAILED == "Error: imex configuration validation failed: "


def test_host_managed_forces_the_daemon_gates_off() -> None:
    gates = FeatureGates.parse("HostManagedIMEXDaemon=true").validate()
    host = effective_gates(gates, ImexModeConfig(mode="hostManaged"))
    assert not host.enabled(fg.IMEX_DAEMONS_WITH_DNS_NAMES)
    assert not host.enabled(fg.COMPUTE_DOMAIN_CLIQUES)
    assert effective_gates(gates, ImexModeConfig()) is gates
