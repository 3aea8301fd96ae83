"""The shape rules of the ``resource.k8s.io`` versions, as the fake API server enforces them.

Owns the few checks that tell a v1-shaped DRA object from a v1beta1-shaped one, so a test of a
cluster serving v1beta1 fails when a client sends the wrong shape (kube-apiserver would drop the
unknown field and then reject the object, e.g. a request without ``deviceClassName``).
Invariant: only the version differences of `pkg.kube.resourceconvert` are checked; anything
else is accepted as the fake always has.
"""

from __future__ import annotations

from typing import Any

from pkg.kube.errors import InvalidError
from pkg.kube.resources import Resource

__all__ = ["check_shape"]

_GROUP = "resource.k8s.io"


def _requests(resource: Resource, body: dict[str, Any]) -> list[Any]:
    spec = body.get("spec") or {}
    if resource.kind == "ResourceClaimTemplate":
        spec = spec.get("spec") or {}
    return list((spec.get("devices") or {}).get("requests") or [])


def _invalid(resource: Resource, message: str) -> InvalidError:
    return InvalidError(422, "Invalid", f"{resource.kind} ({_GROUP}/{resource.version}): {message}")


def check_shape(resource: Resource, body: Any) -> None:
    """Raise `InvalidError` (422) when ``body``, written to ``resource``, has a field layout
    its version does not have: ``exactly`` or a flat device in v1beta1, a flat request or a
    ``basic`` device in v1/v1beta2."""
    if resource.group != _GROUP or not isinstance(body, dict):
        return
    beta1 = resource.version == "v1beta1"
    if resource.kind in ("ResourceClaim", "ResourceClaimTemplate"):
        for req in _requests(resource, body):
            if beta1 and "exactly" in req:
                raise _invalid(resource, f"requests[{req.get('name')}]: unknown field 'exactly'")
            if beta1 and not req.get("deviceClassName") and not req.get("firstAvailable"):
                raise _invalid(resource, f"requests[{req.get('name')}]: deviceClassName required")
            if not beta1 and "deviceClassName" in req:
                raise _invalid(
                    resource, f"requests[{req.get('name')}]: unknown field 'deviceClassName'"
                )
    if resource.kind == "ResourceSlice":
        for dev in (body.get("spec") or {}).get("devices") or []:
            flat = [k for k in dev if k not in ("name", "basic")]
            if beta1 and flat:
                raise _invalid(resource, f"devices[{dev.get('name')}]: unknown fields {flat}")
            if not beta1 and "basic" in dev:
                raise _invalid(resource, f"devices[{dev.get('name')}]: unknown field 'basic'")
