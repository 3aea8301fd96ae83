"""Strict and lenient decoding of the opaque claim configs."""

from __future__ import annotations

from typing import Any

import pytest

from pkg.api import constants as c
from pkg.api.opaque import ChannelConfig, DaemonConfig, OpaqueConfigError, decode_opaque_config

U1 = "5f0c9a52-1111-4e2b-9d7e-000000000001"
U2 = "5f0c9a52-2222-4e2b-9d7e-000000000002"


def channel(**extra: Any) -> dict[str, Any]:
    return {"apiVersion": c.API_VERSION, "kind": c.CHANNEL_CONFIG_KIND, "domainID": U1, **extra}


def test_channel_defaults_to_single() -> None:
    cfg = decode_opaque_config(channel())
    assert cfg == ChannelConfig(domain_id=U1, allocation_mode="Single")
    assert isinstance(cfg, ChannelConfig) and cfg.channel_count == 1


def test_all_mode_has_2048_channels() -> None:
    cfg = decode_opaque_config(channel(allocationMode="All"))
    assert isinstance(cfg, ChannelConfig) and cfg.channel_count == 2048


def test_daemon_config() -> None:
    params = {"apiVersion": c.API_VERSION, "kind": c.DAEMON_CONFIG_KIND, "domainID": U2}
    assert decode_opaque_config(params) == DaemonConfig(domain_id=U2)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (channel(unexpectedField=1), 'strict decoding error: unknown field "unexpectedField"'),
        (channel(domainID=""), 'field "domainID": must not be empty'),
        (channel(domainID=5), 'field "domainID": expected a string'),
        (channel(allocationMode="Many"), 'field "allocationMode": unsupported value "Many"'),
        ({**channel(), "apiVersion": "v1"}, 'field "apiVersion": unsupported value "v1"'),
        ({**channel(), "kind": "GpuConfig"}, 'field "kind": unsupported value "GpuConfig"'),
        ({"kind": c.CHANNEL_CONFIG_KIND}, 'missing required field "apiVersion"'),
        ([], "must be a JSON object"),
    ],
    ids=[
        "unknown-field",
        "empty-domain",
        "wrong-type",
        "bad-mode",
        "bad-version",
        "bad-kind",
        "no-version",
        "not-object",
    ],
)
def test_strict_errors_name_the_field(params: Any, message: str) -> None:
    with pytest.raises(OpaqueConfigError, match=message.replace("(", r"\(")):
        decode_opaque_config(params)


def test_lenient_decoding_ignores_unknown_fields() -> None:
    cfg = decode_opaque_config(channel(futureField=True, domainID=""), strict=False)
    assert cfg == ChannelConfig(domain_id="", allocation_mode="Single")


def test_round_trip() -> None:
    cfg = ChannelConfig(domain_id=U1, allocation_mode="All")
    assert decode_opaque_config(cfg.to_parameters()) == cfg
    dcfg = DaemonConfig(domain_id=U2)
    assert decode_opaque_config(dcfg.to_parameters()) == dcfg


NOT_UIDS = [
    "/var/run/cdi",
    "..",
    "../../etc",
    "cd-a",
    U1.upper(),
    U1.replace("-", ""),
    U1 + "x",
    " " + U1,
    U1 + "\n",
    "{" + U1 + "}",
]


@pytest.mark.parametrize("kind", [c.CHANNEL_CONFIG_KIND, c.DAEMON_CONFIG_KIND])
@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
@pytest.mark.parametrize("domain_id", NOT_UIDS)
def test_domain_id_must_be_a_uid(kind: str, strict: bool, domain_id: str) -> None:
    """The plugin joins domainID into host paths, so only a UID may pass."""
    params = {"apiVersion": c.API_VERSION, "kind": kind, "domainID": domain_id}
    with pytest.raises(OpaqueConfigError, match=r'field "domainID": .* is not a ComputeDomain UID'):
        decode_opaque_config(params, strict=strict)
