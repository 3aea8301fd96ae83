"""Label and field selector parsing and matching for the fake API server.

Owns the selector grammar the real API server accepts: label requirements `k=v`, `k==v`,
`k!=v`, `k in (a,b)`, `k notin (a,b)`, `k` (exists) and `!k` (does not exist), joined by commas;
field requirements `path=v`, `path==v`, `path!=v` on dotted paths (metadata.name,
metadata.namespace, spec.nodeName, ...). Invariant: a malformed selector raises
`BadRequestError` at parse time, never a wrong match later.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pkg.kube.errors import BadRequestError

__all__ = ["Matcher", "parse_field_selector", "parse_label_selector"]

Matcher = Callable[[dict[str, Any]], bool]

_SET_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")
_EQ_RE = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|!=|=)\s*([A-Za-z0-9_.-]*)\s*$")


def _split(selector: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in parts if p.strip()]


def _bad(kind: str, selector: str) -> BadRequestError:
    return BadRequestError(400, "BadRequest", f"unable to parse {kind} selector {selector!r}")


def _label_requirement(req: str, selector: str) -> Callable[[dict[str, str]], bool]:
    eq = _EQ_RE.fullmatch(req)
    if eq:
        key, op, val = eq.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != val
        return lambda labels: labels.get(key) == val
    m = _SET_RE.fullmatch(req)
    if not m:
        raise _bad("label", selector)
    neg, key, op, values = m.groups()
    if op is None:
        return (lambda labels: key not in labels) if neg else (lambda labels: key in labels)
    if neg:
        raise _bad("label", selector)
    allowed = {v.strip() for v in values.split(",") if v.strip()}
    if op == "in":
        return lambda labels: labels.get(key) in allowed
    return lambda labels: labels.get(key) not in allowed


def parse_label_selector(selector: str | None) -> Matcher:
    """Compile a label selector into a predicate over whole objects."""
    if not selector or not selector.strip():
        return lambda _obj: True
    reqs = [_label_requirement(r, selector) for r in _split(selector)]

    def match(obj: dict[str, Any]) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(r(labels) for r in reqs)

    return match


def _lookup(obj: dict[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def parse_field_selector(selector: str | None) -> Matcher:
    """Compile a field selector (equality-based only, as the API server supports)."""
    if not selector or not selector.strip():
        return lambda _obj: True
    reqs: list[tuple[str, bool, str]] = []
    for req in _split(selector):
        m = _EQ_RE.fullmatch(req)
        if not m:
            raise _bad("field", selector)
        path, op, val = m.groups()
        reqs.append((path, op != "!=", val))

    def match(obj: dict[str, Any]) -> bool:
        return all((_lookup(obj, p) == v) == want for p, want, v in reqs)

    return match
