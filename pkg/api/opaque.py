"""Opaque device configs carried in ResourceClaims: ComputeDomainChannelConfig and
ComputeDomainDaemonConfig.

Invariant: decoding for Prepare is strict - an unknown field, a wrong type, a wrong
apiVersion/kind or a missing ``domainID`` raises :class:`OpaqueConfigError` whose message names
the offending field, so the kubelet shows the user exactly what to fix. Decoding stored state
(Unprepare, checkpoints) is lenient so that newer or older writers never block cleanup.

In both modes a non-empty ``domainID`` must be a canonical Kubernetes UID (lowercase
8-4-4-4-12 hex, what the API server writes into ``metadata.uid``): the plugin joins it into host
paths (``domains/<uid>``), so a value like ``/var/run/cdi`` or ``..`` must never get that far.
Lenient decoding still accepts an empty or missing one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pkg.api import constants as c


class OpaqueConfigError(ValueError):
    """An opaque config that cannot be used; the message names the field."""


_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def is_uid(value: str) -> bool:
    """True iff ``value`` is a canonical lowercase RFC 4122 UID string (36 characters, 8-4-4-4-12
    hex), the form Kubernetes gives ``metadata.uid``."""
    return _UID.fullmatch(value) is not None


@dataclass(frozen=True)
class ChannelConfig:
    """``ComputeDomainChannelConfig``: which CD a workload channel claim belongs to."""

    domain_id: str
    allocation_mode: str = c.ALLOCATION_MODE_SINGLE

    @property
    def channel_count(self) -> int:
        return c.IMEX_CHANNEL_COUNT if self.allocation_mode == c.ALLOCATION_MODE_ALL else 1

    def to_parameters(self) -> dict[str, Any]:
        return {
            "apiVersion": c.API_VERSION,
            "kind": c.CHANNEL_CONFIG_KIND,
            "domainID": self.domain_id,
            "allocationMode": self.allocation_mode,
        }


@dataclass(frozen=True)
class DaemonConfig:
    """``ComputeDomainDaemonConfig``: which CD an IMEX daemon claim belongs to."""

    domain_id: str

    def to_parameters(self) -> dict[str, Any]:
        return {
            "apiVersion": c.API_VERSION,
            "kind": c.DAEMON_CONFIG_KIND,
            "domainID": self.domain_id,
        }


OpaqueConfig = ChannelConfig | DaemonConfig

_FIELDS: dict[str, set[str]] = {
    c.CHANNEL_CONFIG_KIND: {"apiVersion", "kind", "domainID", "allocationMode"},
    c.DAEMON_CONFIG_KIND: {"apiVersion", "kind", "domainID"},
}


def _string_field(params: dict[str, Any], name: str, *, required: bool) -> str:
    value = params.get(name)
    if value is None:
        if required:
            raise OpaqueConfigError(f'missing required field "{name}"')
        return ""
    if not isinstance(value, str):
        raise OpaqueConfigError(
            f'field "{name}": expected a string, got {type(value).__name__} {value!r}'
        )
    return value


def decode_opaque_config(params: Any, *, strict: bool = True) -> OpaqueConfig:
    """Decode ``opaque.parameters`` of a claim config for driver compute-domain.nvidia.com."""
    if not isinstance(params, dict):
        raise OpaqueConfigError(
            f"opaque parameters must be a JSON object, got {type(params).__name__}"
        )
    api_version = _string_field(params, "apiVersion", required=True)
    kind = _string_field(params, "kind", required=True)
    if api_version != c.API_VERSION:
        raise OpaqueConfigError(
            f'field "apiVersion": unsupported value "{api_version}", expected "{c.API_VERSION}"'
        )
    if kind not in _FIELDS:
        raise OpaqueConfigError(
            f'field "kind": unsupported value "{kind}", expected one of {sorted(_FIELDS)}'
        )
    if strict:
        unknown = sorted(set(params) - _FIELDS[kind])
        if unknown:
            # Same wording as the Go strict decoder, which upstream's tests grep for.
            raise OpaqueConfigError(f'strict decoding error: unknown field "{unknown[0]}"')
    domain_id = _string_field(params, "domainID", required=strict)
    if strict and not domain_id:
        raise OpaqueConfigError('field "domainID": must not be empty')
    if domain_id and not is_uid(domain_id):
        raise OpaqueConfigError(
            f'field "domainID": {domain_id[:64]!r} is not a ComputeDomain UID '
            "(lowercase 8-4-4-4-12 hex, as in metadata.uid)"
        )
    if kind == c.DAEMON_CONFIG_KIND:
        return DaemonConfig(domain_id=domain_id)
    mode = _string_field(params, "allocationMode", required=False) or c.ALLOCATION_MODE_SINGLE
    if strict and mode not in (c.ALLOCATION_MODE_SINGLE, c.ALLOCATION_MODE_ALL):
        # Upstream silently treats unknown modes as Single; a typo should not cost a job.
        raise OpaqueConfigError(
            f'field "allocationMode": unsupported value "{mode}", expected "Single" or "All"'
        )
    return ChannelConfig(domain_id=domain_id, allocation_mode=mode)
