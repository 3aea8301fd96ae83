"""Write verbs of the fake API server: POST, PUT, PATCH and DELETE on objects and `/status`.

Owns the mapping from an HTTP write to `ObjectStore` operations, including how each patch type
is applied and the status-subresource rules. Invariants: the main resource never changes status
for kinds with a status subresource, `/status` never changes anything but status; strategic
merge is refused for custom resources (415), as on a real server; apply needs apiVersion, kind
and a fieldManager, and creates the object when missing; a DELETE that removed the object
answers it or a Status, per kind, as kube-apiserver does.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import yaml

from pkg.base.types import JSON
from pkg.kube.errors import ApiError, BadRequestError, NotFoundError
from pkg.kube.resources import Resource
from pkg.testing.fakeapi.patch import apply_json_patch, apply_merge_patch
from pkg.testing.fakeapi.store import ObjectStore

__all__ = ["handle_write"]


_PATCH_TYPES = {
    "application/merge-patch+json": "merge",
    "application/json-patch+json": "json",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
}


# Kinds whose kube-apiserver storage answers a DELETE that removed the object with the object
# (`ReturnDeletedObject`); every other kind, custom resources included, answers a Status.
# A DELETE that only marked the object (finalizers left) answers the object for every kind.
_RETURN_DELETED_OBJECT = {
    ("", "pods"),
    ("", "namespaces"),
    ("", "services"),
    ("", "serviceaccounts"),
    ("", "persistentvolumes"),
    ("", "persistentvolumeclaims"),
    ("", "podtemplates"),
    ("", "resourcequotas"),
    ("resource.k8s.io", "resourceclaims"),
    ("resource.k8s.io", "resourceclaimtemplates"),
    ("resource.k8s.io", "resourceslices"),
    ("resource.k8s.io", "deviceclasses"),
}


def _deleted_status(resource: Resource, obj: JSON) -> JSON:
    meta = obj["metadata"]
    details = {
        "name": meta["name"],
        "group": resource.group,
        "kind": resource.plural,
        "uid": meta.get("uid"),
    }
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    }


def _require_name(name: str | None) -> str:
    if name is None:
        raise ApiError(405, "MethodNotAllowed", "this verb needs an object name")
    return name


def decode_body(raw: bytes, content_type: str | None) -> Any:
    """Apply bodies may be YAML; everything else is JSON (also valid YAML, so one path)."""
    if not raw:
        return None
    try:
        return yaml.safe_load(raw) if content_type and "yaml" in content_type else _json(raw)
    except (ValueError, yaml.YAMLError) as exc:
        raise BadRequestError(400, "BadRequest", f"cannot decode body: {exc}") from exc


def _json(raw: bytes) -> Any:
    return json.loads(raw)


def handle_write(
    store: ObjectStore,
    verb: str,
    *,
    resource: Resource,
    namespace: str | None,
    name: str | None,
    subresource: str | None,
    body: Any,
    query: dict[str, str],
    content_type: str | None,
) -> tuple[int, Any]:
    """Perform one write; returns (HTTP status, response body)."""
    if verb == "POST":
        if name is not None or not isinstance(body, dict):
            raise BadRequestError(400, "BadRequest", "POST needs an object body on a collection")
        return 201, store.create(resource, namespace, body)
    if verb == "PUT":
        if not isinstance(body, dict):
            raise BadRequestError(400, "BadRequest", "PUT needs an object body")
        body_name = (body.get("metadata") or {}).get("name")
        if body_name and body_name != name:
            raise BadRequestError(400, "BadRequest", "name in body does not match the URL")
        return 200, store.replace(
            resource, namespace, _require_name(name), body, subresource=subresource
        )
    if verb == "PATCH":
        return _patch(
            store,
            resource=resource,
            namespace=namespace,
            name=_require_name(name),
            subresource=subresource,
            body=body,
            query=query,
            content_type=content_type,
        )
    if verb == "DELETE":
        opts = body if isinstance(body, dict) else {}
        pre = opts.get("preconditions") or {}
        out = store.delete(
            resource,
            namespace,
            _require_name(name),
            uid=pre.get("uid"),
            resource_version=pre.get("resourceVersion"),
        )
        if out["metadata"].get("finalizers") or (resource.group, resource.plural) in (
            _RETURN_DELETED_OBJECT
        ):
            return 200, out
        return 200, _deleted_status(resource, out)
    raise ApiError(405, "MethodNotAllowed", f"verb {verb} not supported")


def _patch(
    store: ObjectStore,
    *,
    resource: Resource,
    namespace: str | None,
    name: str,
    subresource: str | None,
    body: Any,
    query: dict[str, str],
    content_type: str | None,
) -> tuple[int, Any]:
    kind = _PATCH_TYPES.get((content_type or "").split(";")[0].strip())
    if kind is None:
        raise ApiError(415, "UnsupportedMediaType", f"unsupported patch type {content_type!r}")
    if kind == "strategic" and resource.group.endswith("nvidia.com"):
        raise ApiError(
            415, "UnsupportedMediaType", "strategic merge patch is not supported for CRs"
        )
    if kind == "apply":
        if not query.get("fieldManager"):
            raise BadRequestError(400, "BadRequest", "fieldManager is required for apply patch")
        if not isinstance(body, dict) or not body.get("apiVersion") or not body.get("kind"):
            raise BadRequestError(400, "BadRequest", "apply patch needs apiVersion and kind")
    with store.cond:
        try:
            current = store.get(resource, namespace, name)
        except NotFoundError:
            if kind != "apply" or subresource is not None:
                raise
            obj = copy.deepcopy(body)
            obj.setdefault("metadata", {})["name"] = name
            return 201, store.create(resource, namespace, obj)
        if kind == "json":
            patched = apply_json_patch(current, body)
        else:
            if not isinstance(body, dict):
                raise BadRequestError(400, "BadRequest", "a merge patch must be an object")
            patched = apply_merge_patch(current, body)
        if not isinstance(patched, dict):
            raise BadRequestError(400, "BadRequest", "patch result is not an object")
        # Only a resourceVersion the patch itself carries is a precondition.
        patch_rv = (
            (body.get("metadata") or {}).get("resourceVersion") if isinstance(body, dict) else None
        )
        meta = patched.setdefault("metadata", {})
        meta["resourceVersion"] = patch_rv or current["metadata"]["resourceVersion"]
        return 200, store.replace(resource, namespace, name, patched, subresource=subresource)
