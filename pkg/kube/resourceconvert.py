"""Shape conversions between ``resource.k8s.io/v1`` and the older versions a cluster may serve.

The project works in v1 shapes everywhere; this module translates at the wire, and only for
the four kinds it reads or writes (DeviceClass, ResourceClaim, ResourceClaimTemplate,
ResourceSlice). The differences are those of Kubernetes' own conversion code
(``k8s.io/dynamic-resource-allocation/api/v1beta1`` and ``.../v1beta2``):

* v1beta2 is field-for-field v1: only ``apiVersion`` changes.
* v1beta1 (Kubernetes 1.32) has two structural differences. A ``DeviceRequest`` carries the
  exact-request fields (``deviceClassName``, ``selectors``, ``allocationMode``, ``count``,
  ``adminAccess``, ``tolerations``, ``capacity``) flat, where v1 nests them under ``exactly``
  (``firstAvailable`` is the same in both): this reaches ``spec.devices.requests`` of claims and
  ``spec.spec.devices.requests`` of templates. A ResourceSlice ``Device`` keeps everything but
  its ``name`` under ``basic``, where v1 has it flat. Allocation results, device configs,
  claim status and DeviceClass specs are identical.

Invariants: the functions never modify their argument (they return new dicts sharing unchanged
subtrees); ``to_served(x, v)`` then ``from_served(_, v)`` gives back ``x`` for every v1 object a
v1beta1 server can represent; an object of another kind, or a version without differences,
changes at most its ``apiVersion``.
"""

from __future__ import annotations

from collections.abc import Callable

from pkg.base.types import JSON

__all__ = ["GROUP", "from_served", "to_served"]

GROUP = "resource.k8s.io"

# ExactDeviceRequest's fields, flat in a v1beta1 DeviceRequest (k8s.io/api/resource/v1beta1).
_EXACT_FIELDS = (
    "deviceClassName",
    "selectors",
    "allocationMode",
    "count",
    "adminAccess",
    "tolerations",
    "capacity",
)


def _request_to_v1beta1(request: JSON) -> JSON:
    out = {k: v for k, v in request.items() if k != "exactly"}
    exactly = request.get("exactly")
    if isinstance(exactly, dict):
        out.update(exactly)
    return out


def _request_from_v1beta1(request: JSON) -> JSON:
    # Go's rule: "exactly" exists when any of its fields is set (a non-empty class name, any
    # other field present); a firstAvailable request serializes deviceClassName as "".
    exact = {k: request[k] for k in _EXACT_FIELDS if request.get(k) not in (None, "")}
    out: JSON = {"name": request["name"]} if "name" in request else {}
    if exact:
        out["exactly"] = exact
    out.update((k, v) for k, v in request.items() if k not in _EXACT_FIELDS and k != "name")
    return out


def _device_to_v1beta1(device: JSON) -> JSON:
    out: JSON = {"name": device["name"]} if "name" in device else {}
    out["basic"] = {k: v for k, v in device.items() if k != "name"}
    return out


def _device_from_v1beta1(device: JSON) -> JSON:
    out: JSON = {"name": device["name"]} if "name" in device else {}
    basic = device.get("basic")
    if isinstance(basic, dict):
        out.update(basic)
    out.update((k, v) for k, v in device.items() if k not in ("name", "basic"))
    return out


def _map_list(obj: JSON, path: tuple[str, ...], fn: Callable[[JSON], JSON]) -> JSON:
    """A copy of ``obj`` whose list at ``path`` has ``fn`` applied to each dict item; the
    dicts along the path are copied, everything else is shared."""
    head, rest = path[0], path[1:]
    value = obj.get(head)
    if not rest:
        if not isinstance(value, list):
            return obj
        return {**obj, head: [fn(i) if isinstance(i, dict) else i for i in value]}
    if not isinstance(value, dict):
        return obj
    return {**obj, head: _map_list(value, rest, fn)}


# kind -> (path of the list that differs, v1 -> v1beta1, v1beta1 -> v1)
_V1BETA1: dict[str, tuple[tuple[str, ...], Callable[[JSON], JSON], Callable[[JSON], JSON]]] = {
    "ResourceClaim": (("spec", "devices", "requests"), _request_to_v1beta1, _request_from_v1beta1),
    "ResourceClaimTemplate": (
        ("spec", "spec", "devices", "requests"),
        _request_to_v1beta1,
        _request_from_v1beta1,
    ),
    "ResourceSlice": (("spec", "devices"), _device_to_v1beta1, _device_from_v1beta1),
}


def _with_api_version(obj: JSON, version: str) -> JSON:
    if "apiVersion" not in obj:
        return obj
    return {**obj, "apiVersion": f"{GROUP}/{version}"}


def to_served(kind: str, obj: JSON, version: str) -> JSON:
    """The v1-shaped ``obj`` of ``kind`` as ``resource.k8s.io/<version>`` expects it."""
    out = _with_api_version(obj, version)
    rule = _V1BETA1.get(kind)
    if version == "v1beta1" and rule is not None:
        out = _map_list(out, rule[0], rule[1])
    return out


def from_served(kind: str, obj: JSON, version: str) -> JSON:
    """``obj`` of ``kind`` as ``resource.k8s.io/<version>`` returned it, in v1 shape."""
    out = _with_api_version(obj, "v1")
    rule = _V1BETA1.get(kind)
    if version == "v1beta1" and rule is not None:
        out = _map_list(out, rule[0], rule[2])
    return out
