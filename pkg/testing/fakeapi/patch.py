"""Patch application for the fake API server: JSON merge patch and JSON patch.

Owns RFC 7386 merge patch (also used as the approximation of strategic merge and server-side
apply, which replace lists wholesale here) and RFC 6902 JSON patch. Invariant: inputs are never
mutated; a patch that cannot apply raises `InvalidError`/`BadRequestError` like the server.
"""

from __future__ import annotations

import copy
from typing import Any

from pkg.kube.errors import BadRequestError, InvalidError

__all__ = ["apply_json_patch", "apply_merge_patch"]


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, `null` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out: dict[str, Any] = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = apply_merge_patch(out.get(key), value)
    return out


def _tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise BadRequestError(400, "BadRequest", f"invalid JSON pointer {pointer!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def _parent(doc: Any, pointer: str) -> tuple[Any, str]:
    tokens = _tokens(pointer)
    if not tokens:
        raise InvalidError(422, "Invalid", "cannot operate on the document root")
    cur = doc
    for tok in tokens[:-1]:
        cur = _child(cur, tok, pointer)
    return cur, tokens[-1]


def _child(cur: Any, tok: str, pointer: str) -> Any:
    try:
        if isinstance(cur, list):
            return cur[int(tok)]
        if isinstance(cur, dict):
            return cur[tok]
    except (KeyError, IndexError, ValueError):
        pass
    raise InvalidError(422, "Invalid", f"path {pointer!r} does not exist")


def _get(doc: Any, pointer: str) -> Any:
    cur = doc
    for tok in _tokens(pointer):
        cur = _child(cur, tok, pointer)
    return cur


def _add(doc: Any, pointer: str, value: Any) -> None:
    parent, tok = _parent(doc, pointer)
    if isinstance(parent, list):
        idx = len(parent) if tok == "-" else int(tok)
        if not 0 <= idx <= len(parent):
            raise InvalidError(422, "Invalid", f"index out of range at {pointer!r}")
        parent.insert(idx, value)
    elif isinstance(parent, dict):
        parent[tok] = value
    else:
        raise InvalidError(422, "Invalid", f"cannot add at {pointer!r}")


def _remove(doc: Any, pointer: str) -> Any:
    parent, tok = _parent(doc, pointer)
    try:
        if isinstance(parent, list):
            return parent.pop(int(tok))
        if isinstance(parent, dict):
            return parent.pop(tok)
    except (KeyError, IndexError, ValueError):
        pass
    raise InvalidError(422, "Invalid", f"path {pointer!r} does not exist")


def apply_json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 on a deep copy of `target`: add/remove/replace/move/copy/test."""
    if not isinstance(ops, list):
        raise BadRequestError(400, "BadRequest", "a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "path" not in op:
            raise BadRequestError(400, "BadRequest", f"malformed JSON patch operation {op!r}")
        kind, path = op.get("op"), op["path"]
        if kind == "add":
            _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "replace":
            _remove(doc, path)
            _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "move":
            _add(doc, path, _remove(doc, op["from"]))
        elif kind == "copy":
            _add(doc, path, copy.deepcopy(_get(doc, op["from"])))
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise InvalidError(422, "Invalid", f"test operation failed at {path!r}")
        else:
            raise BadRequestError(400, "BadRequest", f"unknown JSON patch op {kind!r}")
    return doc
