"""Upstream's opaque-config resolution: order, precedence, errors (pure, no API server)."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest

from pkg.api import constants as c
from pkg.draplugin.errors import PermanentError
from pkg.kubeletplugin.claims import config_groups, status_targets


def uid_for(name: str) -> str:
    """A readable name turned into the UID form opaque configs require."""
    return str(uuid.uuid5(uuid.NAMESPACE_OID, name))


def claim_with(configs: list[dict[str, Any]], device: str = "channel-0") -> dict[str, Any]:
    result = {"request": "req/sub", "driver": c.DRIVER_NAME, "pool": "n", "device": device}
    return {"status": {"allocation": {"devices": {"results": [result], "config": configs}}}}


def opaque(
    source: str, requests: list[str], kind: str = c.CHANNEL_CONFIG_KIND, **params: Any
) -> dict[str, Any]:
    body = {"apiVersion": c.API_VERSION, "kind": kind, **params}
    return {
        "source": source,
        "requests": requests,
        "opaque": {"driver": c.DRIVER_NAME, "parameters": body},
    }


def domain(configs: list[dict[str, Any]], device: str = "channel-0") -> str:
    (group,) = config_groups(claim_with(configs, device))
    return group.config.domain_id


@pytest.mark.parametrize(
    ("configs", "expected"),
    [
        # The last matching config wins, even a `requests: []` one after one naming the request.
        (
            [
                opaque("FromClaim", ["req"], domainID=uid_for("named")),
                opaque("FromClaim", [], domainID=uid_for("any")),
            ],
            uid_for("any"),
        ),
        (
            [
                opaque("FromClaim", [], domainID=uid_for("any")),
                opaque("FromClaim", ["req"], domainID=uid_for("named")),
            ],
            uid_for("named"),
        ),
        # Class configs come first whatever their position, so the claim's win.
        (
            [
                opaque("FromClaim", [], domainID=uid_for("claim")),
                opaque("FromClass", ["req"], domainID=uid_for("class")),
            ],
            uid_for("claim"),
        ),
        # A subrequest matches its own name and its request's name.
        (
            [
                opaque("FromClaim", ["req/sub"], domainID=uid_for("sub")),
                opaque("FromClaim", ["other"], domainID=uid_for("x")),
            ],
            uid_for("sub"),
        ),
        # `requests: []` of the other type is skipped, not an error.
        (
            [
                opaque("FromClaim", [], domainID=uid_for("ch")),
                opaque("FromClaim", [], kind=c.DAEMON_CONFIG_KIND, domainID=uid_for("d")),
            ],
            uid_for("ch"),
        ),
    ],
    ids=[
        "later-empty-beats-named",
        "later-named",
        "claim-after-class",
        "subrequest",
        "skip-other-type",
    ],
)
def test_last_matching_config_wins(configs: list[dict[str, Any]], expected: str) -> None:
    assert domain(configs) == expected


@pytest.mark.parametrize(
    ("configs", "device", "message"),
    [
        (
            [{"source": "FromClaim", "requests": []}],
            "channel-0",
            "config[0]: only opaque parameters are supported",
        ),
        (
            [
                opaque("FromClaim", [], domainID=uid_for("x")),
                {"source": "FromElsewhere", "opaque": {"driver": "other", "parameters": {}}},
            ],
            "channel-0",
            "config[1]: invalid config source: 'FromElsewhere'",
        ),
        (
            [opaque("FromClaim", ["req"], domainID=uid_for("x"))],
            "daemon-0",
            "cannot apply ComputeDomainChannelConfig to request: req/sub",
        ),
        ([], "channel-0", "no ComputeDomainChannelConfig"),
        (
            [opaque("FromClaim", [], domainID=uid_for("x"))],
            "daemon-1",
            "requested device is not allocatable: daemon-1",
        ),
        (
            [opaque("FromClaim", [], domainID=uid_for("x"))],
            "channel-7",
            "requested device is not allocatable: channel-7",
        ),
    ],
    ids=[
        "no-opaque",
        "bad-source-other-driver",
        "type-mismatch",
        "missing",
        "unpublished-daemon",
        "unpublished-channel",
    ],
)
def test_permanent_errors(configs: list[dict[str, Any]], device: str, message: str) -> None:
    with pytest.raises(PermanentError, match=re.escape(message)):
        config_groups(claim_with(configs, device))


def test_status_targets_is_lenient() -> None:
    configs = [
        {"source": "FromClaim", "requests": []},  # no opaque: skipped, not an error
        opaque("FromClaim", [], domainID=uid_for("cd"), unknown=1),  # non-strict decoding
    ]
    assert status_targets(claim_with(configs, "daemon-3")["status"]) == ()
    assert status_targets(claim_with(configs)["status"]) == (("channel", uid_for("cd")),)
    assert status_targets({"allocation": "garbage"}) == ()


def test_channel_and_daemon_in_one_claim_are_prepared_by_their_own_configs() -> None:
    """Upstream prepares each config group of a claim; a claim holding both devices of a node
    is not refused (it was: "expected exactly one device ... got 2")."""
    claim = claim_with(
        [
            opaque("FromClaim", ["ch"], domainID=uid_for("a")),
            opaque("FromClaim", ["dm"], c.DAEMON_CONFIG_KIND, domainID=uid_for("b")),
        ]
    )
    results = claim["status"]["allocation"]["devices"]["results"]
    results[:] = [
        {"request": "dm", "driver": c.DRIVER_NAME, "pool": "n", "device": "daemon-0"},
        {"request": "ch", "driver": c.DRIVER_NAME, "pool": "n", "device": "channel-0"},
        {"request": "x", "driver": "other.example.com", "pool": "n", "device": "gpu-0"},
    ]
    groups = config_groups(claim)
    assert [(g.kind, g.config.domain_id, g.result["device"]) for g in groups] == [
        ("daemon", uid_for("b"), "daemon-0"),
        ("channel", uid_for("a"), "channel-0"),
    ]


def test_a_device_named_twice_is_refused() -> None:
    claim = claim_with([opaque("FromClaim", [], domainID=uid_for("a"))])
    results = claim["status"]["allocation"]["devices"]["results"]
    results.append({**results[0], "request": "other", "adminAccess": True})
    with pytest.raises(PermanentError, match="named channel-0 in the claim, got 2"):
        config_groups(claim)


def test_a_claim_without_our_results_has_no_groups() -> None:
    claim = claim_with([opaque("FromClaim", [], domainID=uid_for("a"))])
    claim["status"]["allocation"]["devices"]["results"][0]["driver"] = "other.example.com"
    assert config_groups(claim) == ()
