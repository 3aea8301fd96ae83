"""Reading a ResourceClaim: which result is ours and which opaque config applies to it.

Owns upstream's config resolution (``GetOpaqueDeviceConfigs`` + ``getConfigResultsMap``):

* every config must come from the class (``FromClass``) or the claim (``FromClaim``) and must
  carry ``opaque`` -- anything else is an error, even in a config meant for another driver;
* configs of other drivers are skipped; ours are strictly decoded, class configs first, then the
  claim's, each in their listed order;
* walking that list from the **last** entry backwards, the first config that names the result's
  request (``req``, or ``req/sub`` for a subrequest) or that has empty ``requests`` and the
  result's type wins -- a later ``requests: []`` config beats an earlier one naming the request;
  a config naming the request but of the other type is an error;
* results are grouped by the config that applies to them (`config_groups`), and each group is
  prepared on its own, so one claim may hold both ``channel-0`` and ``daemon-0``;
* only the devices this node publishes (``channel-0``, ``daemon-0``; `slice_devices` is what
  the ResourceSlice says about them) can be prepared.

Fetching the claim and checking the kubelet's reference is the library's
(`pkg.draplugin.claims`); this module only reads the object it hands over.

Invariant: `config_groups` is pure and every failure is a `PermanentError` that names the
offending config, field or device, because retrying the same claim cannot fix it.
`status_targets` is the lenient twin for stored state (checkpoint entries written by either
driver): it never raises and skips what it cannot read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pkg.api.channelshare import channel_taint
from pkg.api.constants import (
    CHANNEL_CONFIG_KIND,
    CHANNEL_DEVICE_NAME,
    DAEMON_CONFIG_KIND,
    DAEMON_DEVICE_NAME,
    DRIVER_NAME,
)
from pkg.api.opaque import (
    ChannelConfig,
    OpaqueConfig,
    OpaqueConfigError,
    decode_opaque_config,
)
from pkg.base.types import JSON
from pkg.draplugin.errors import PermanentError

SOURCE_CLASS = "FromClass"
SOURCE_CLAIM = "FromClaim"
PUBLISHED_DEVICES: dict[str, str] = {CHANNEL_DEVICE_NAME: "channel", DAEMON_DEVICE_NAME: "daemon"}


def slice_devices(
    clique_id: str, *, daemon: bool = True, channel_domain: str = "", shared: bool = True
) -> list[JSON]:
    """The ResourceSlice devices of a node: ``channel-0`` and ``daemon-0`` with upstream's
    attributes ``type`` (string) and ``id`` (int) plus ``cliqueID`` (string, ``""`` on non-NVLink
    nodes) so placement can select on it. Without ``daemon`` (host-managed IMEX mode: the
    driver runs no IMEX daemon) only ``channel-0``.

    Several pods of one ComputeDomain on one node (an extension): ``channel-0`` is published
    with ``allowMultipleAllocations`` (DRAConsumableCapacity), so the scheduler may give it to
    more than one claim, and while ``channel_domain`` (`state.channel_domain`) uses it, with
    the ``NoSchedule`` taint ``resource.nvidia.com/computeDomain=<that domain>`` (DRADeviceTaints),
    which only that domain's claims tolerate (the controller's workload template carries the
    toleration, `pkg.api.channelshare`): a claim of another domain goes to another node, as
    upstream's exclusive device sends it. ``daemon-0`` stays exclusive. Without ``shared`` (a
    checkpoint kept readable by a Go plugin that cannot record sharing) ``channel-0`` is
    exclusive, as upstream publishes it."""

    def device(name: str, kind: str) -> JSON:
        return {
            "name": name,
            "attributes": {
                "type": {"string": kind},
                "id": {"int": 0},
                "cliqueID": {"string": clique_id},
            },
        }

    channel = device(CHANNEL_DEVICE_NAME, "channel")
    if shared:
        channel["allowMultipleAllocations"] = True
    if shared and channel_domain:
        channel["taints"] = [channel_taint(channel_domain)]
    return [channel, device(DAEMON_DEVICE_NAME, "daemon")] if daemon else [channel]


def device_kind(device_name: str) -> str:
    """``channel`` or ``daemon`` for a device this node publishes; `PermanentError` otherwise."""
    kind = PUBLISHED_DEVICES.get(device_name)
    if kind is None:
        raise PermanentError(
            f"requested device is not allocatable: {device_name} (driver {DRIVER_NAME} "
            f"publishes only {', '.join(PUBLISHED_DEVICES)} on each node)"
        )
    return kind


def _kind_by_prefix(device_name: str) -> str | None:
    for kind in ("channel", "daemon"):
        if device_name.startswith(f"{kind}-"):
            return kind
    return None


def _kind_of(config: OpaqueConfig) -> str:
    return "channel" if isinstance(config, ChannelConfig) else "daemon"


_Configs = list[tuple[list[str], OpaqueConfig]]


def _configs(devices: Mapping[str, Any], *, strict: bool) -> _Configs:
    """Our decoded configs in precedence order (lowest first); lenient mode skips bad ones."""
    by_source: dict[str, list[tuple[int, Any]]] = {SOURCE_CLASS: [], SOURCE_CLAIM: []}
    for index, raw in enumerate(devices.get("config") or []):
        source = raw.get("source") if isinstance(raw, Mapping) else None
        if source not in by_source:
            if strict:
                raise PermanentError(f"config[{index}]: invalid config source: {source!r}")
            continue
        by_source[source].append((index, raw))
    out: _Configs = []
    for index, raw in by_source[SOURCE_CLASS] + by_source[SOURCE_CLAIM]:
        opaque = raw.get("opaque")
        if not isinstance(opaque, Mapping):
            if strict:
                raise PermanentError(
                    f"config[{index}]: only opaque parameters are supported by this driver"
                )
            continue
        if opaque.get("driver") != DRIVER_NAME:
            continue
        try:
            decoded = decode_opaque_config(opaque.get("parameters"), strict=strict)
        except OpaqueConfigError as err:
            if strict:
                raise PermanentError(f"config[{index}] (opaque parameters): {err}") from err
            continue
        out.append(([str(r) for r in raw.get("requests") or []], decoded))
    return out


def _select(configs: _Configs, *, request: str, kind: str, strict: bool) -> OpaqueConfig | None:
    base_request = request.split("/", 1)[0]
    for requests, config in reversed(configs):
        if request in requests or base_request in requests:
            if _kind_of(config) == kind:
                return config
            if not strict:
                return None
            wrong = CHANNEL_CONFIG_KIND if kind == "daemon" else DAEMON_CONFIG_KIND
            raise PermanentError(
                f"cannot apply {wrong} to request: {request} (it was allocated a {kind} device)"
            )
        if not requests and _kind_of(config) == kind:
            return config
    return None


def _our_results(status: Mapping[str, Any]) -> tuple[Mapping[str, Any], list[Any]]:
    devices = (status.get("allocation") or {}).get("devices") or {}
    results = [
        r
        for r in devices.get("results") or []
        if isinstance(r, Mapping) and r.get("driver") == DRIVER_NAME
    ]
    return devices, results


@dataclass(frozen=True)
class ConfigGroup:
    """One of our allocation results and the opaque config that applies to it.

    Upstream groups results by config and prepares each group on its own; a group holds one
    device here because each config type fits only one of the two devices a node publishes,
    and a device is allocated at most once per claim.
    """

    kind: str  # "channel" | "daemon"
    config: OpaqueConfig
    result: JSON


def config_groups(claim: JSON) -> tuple[ConfigGroup, ...]:
    """Each of our allocation results with its config, in the claim's order; ``()`` if none.

    Upstream's ``getConfigResultsMap`` + per-config ``applyConfig``: a claim may hold both
    ``channel-0`` and ``daemon-0``, each prepared with its own config. A device named twice
    (only possible with adminAccess) is refused. Pure; every failure is a `PermanentError`.
    """
    devices, ours = _our_results(claim.get("status") or {})
    configs = _configs(devices, strict=True)
    out: list[ConfigGroup] = []
    for result in ours:
        request = str(result.get("request", ""))
        name = str(result.get("device", ""))
        kind = device_kind(name)
        chosen = _select(configs, request=request, kind=kind, strict=True)
        if chosen is None:
            wanted = CHANNEL_CONFIG_KIND if kind == "channel" else DAEMON_CONFIG_KIND
            raise PermanentError(f'no {wanted} for request "{request}" (a domainID is required)')
        out.append(ConfigGroup(kind, chosen, dict(result)))
    names = [str(g.result.get("device", "")) for g in out]
    for name in dict.fromkeys(names):
        count = names.count(name)
        if count != 1:
            raise PermanentError(
                f"expected exactly one device of driver {DRIVER_NAME} named {name} in the "
                f"claim, got {count}"
            )
    return tuple(out)


def status_targets(status: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """``(kind, domainID)`` of each of our results in a stored claim status; never raises."""
    try:
        devices, ours = _our_results(status)
        configs = _configs(devices, strict=False)
    except (AttributeError, TypeError):
        return ()
    out: list[tuple[str, str]] = []
    for result in ours:
        kind = _kind_by_prefix(str(result.get("device", "")))
        if kind is None:
            continue
        config = _select(configs, request=str(result.get("request", "")), kind=kind, strict=False)
        if config is not None and config.domain_id:
            out.append((kind, config.domain_id))
    return tuple(out)


def requested_devices(status: Mapping[str, Any]) -> set[str]:
    """Names of our devices a claim status holds, without adminAccess ones (never raises)."""
    try:
        _, ours = _our_results(status)
    except (AttributeError, TypeError):
        return set()
    return {str(r.get("device", "")) for r in ours if r.get("adminAccess") is not True}
