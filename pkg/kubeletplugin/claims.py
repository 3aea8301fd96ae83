"""Reading a ResourceClaim: which result is ours and which opaque config applies to it.

Owns upstream's config resolution (``getConfigResultsMap``): configs from the DeviceClass come
first, then the claim's; later entries take precedence; a config naming the result's request
(``req`` or ``req/sub``) beats one with empty ``requests``; configs of other drivers are ignored.
Invariant: everything here is pure and every failure is a `PermanentError` that names the
offending config and field (strict decoding), because retrying the same claim cannot fix it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pkg.api.constants import DRIVER_NAME
from pkg.api.opaque import (
    ChannelConfig,
    DaemonConfig,
    OpaqueConfig,
    OpaqueConfigError,
    decode_opaque_config,
)
from pkg.kube.client import JSON
from pkg.kubeletplugin.errors import PermanentError

_SOURCES = ("FromClass", "FromClaim")


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it in Node(Un)PrepareResources."""

    namespace: str
    uid: str
    name: str


def device_kind(device_name: str) -> str:
    if device_name.startswith("channel-"):
        return "channel"
    if device_name.startswith("daemon-"):
        return "daemon"
    raise PermanentError(f'device "{device_name}" is not a device of driver {DRIVER_NAME}')


def resolve_claim_config(claim: JSON) -> tuple[JSON, OpaqueConfig] | None:
    """Our allocation result and its decoded config, or None if the claim has none of ours."""
    devices = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
    ours = [r for r in devices.get("results") or [] if r.get("driver") == DRIVER_NAME]
    if not ours:
        return None
    if len(ours) != 1:
        raise PermanentError(
            f"expected exactly one device of driver {DRIVER_NAME} in the claim, got {len(ours)}"
        )
    result = ours[0]
    request = str(result.get("request", ""))
    base_request = request.split("/", 1)[0]
    kind = device_kind(str(result.get("device", "")))

    configs: list[tuple[list[str], OpaqueConfig]] = []
    raw_configs = devices.get("config") or []
    ordered = sorted(
        enumerate(raw_configs),
        key=lambda item: (
            _SOURCES.index(item[1].get("source")) if item[1].get("source") in _SOURCES else -1
        ),
    )
    for index, raw in ordered:
        opaque = raw.get("opaque")
        if not opaque or opaque.get("driver") != DRIVER_NAME:
            continue
        if raw.get("source") not in _SOURCES:
            raise PermanentError(f"config[{index}]: unsupported source {raw.get('source')!r}")
        try:
            decoded = decode_opaque_config(opaque.get("parameters"), strict=True)
        except OpaqueConfigError as err:
            raise PermanentError(f"config[{index}] (opaque parameters): {err}") from err
        configs.append(([str(r) for r in raw.get("requests") or []], decoded))

    chosen: OpaqueConfig | None = None
    for requests, config in reversed(configs):
        if request in requests or base_request in requests:
            chosen = config
            break
    if chosen is None:
        for requests, config in reversed(configs):
            if not requests and _kind_of(config) == kind:
                chosen = config
                break
    if chosen is None:
        wanted = "ComputeDomainChannelConfig" if kind == "channel" else "ComputeDomainDaemonConfig"
        raise PermanentError(f'no {wanted} for request "{request}" (a domainID is required)')
    if _kind_of(chosen) != kind:
        raise PermanentError(
            f"cannot apply {type(chosen).__name__.replace('Config', '')} config to request "
            f'"{request}" allocated a {kind} device'
        )
    return result, chosen


def _kind_of(config: OpaqueConfig) -> str:
    if isinstance(config, ChannelConfig):
        return "channel"
    assert isinstance(config, DaemonConfig)
    return "daemon"
