"""A pattern meant to match a whole string is applied with ``fullmatch``.

``re.match`` (or ``Pattern.match``) with a ``$``-anchored pattern accepts a trailing newline:
``$`` also matches just before a final ``\\n``, so ``"abc.1\\n"`` passes a clique-ID check and
reaches a CEL selector or an object name. This check reads every module of pkg/, cmd/ and hack/
and fails on such a call; it resolves patterns given as literals, as module-level string
constants and as module-level ``re.compile`` results.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("pkg", "cmd", "hack")


def _literal(node: ast.expr | None, constants: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    return None


def _ends_anchored(pattern: str) -> bool:
    return pattern.endswith("$") and not pattern.endswith("\\$")


def _is_re_call(node: ast.expr, name: str) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == name
        and isinstance(node.value, ast.Name)
        and node.value.id == "re"
    )


def anchored_matches(source: str) -> list[int]:
    """Line numbers of ``match`` calls with a ``$``-anchored pattern in ``source``."""
    tree = ast.parse(source)
    constants: dict[str, str] = {}
    compiled: set[str] = set()
    for stmt in tree.body:
        target, value = None, None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign):
            target, value = stmt.target, stmt.value
        if not isinstance(target, ast.Name) or value is None:
            continue
        text = _literal(value, constants)
        if text is not None:
            constants[target.id] = text
        elif isinstance(value, ast.Call) and _is_re_call(value.func, "compile") and value.args:
            pattern = _literal(value.args[0], constants)
            if pattern is not None and _ends_anchored(pattern):
                compiled.add(target.id)
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        if node.func.attr != "match":
            continue
        if _is_re_call(node.func, "match"):
            pattern = _literal(node.args[0], constants) if node.args else None
            if pattern is not None and _ends_anchored(pattern):
                lines.append(node.lineno)
        elif isinstance(node.func.value, ast.Name) and node.func.value.id in compiled:
            lines.append(node.lineno)
    return lines


def test_no_whole_string_pattern_is_applied_with_match() -> None:
    found = []
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            for line in anchored_matches(path.read_text()):
                found.append(f"{path.relative_to(REPO)}:{line}")
    assert found == [], "use fullmatch (match's $ accepts a trailing newline): " + ", ".join(found)


def test_the_check_sees_each_shape() -> None:
    source = """
import re
P = r"^a+$"
COMPILED = re.compile(P)
INLINE: re.Pattern[str] = re.compile(r"b+$")
ESCAPED = re.compile(r"c\\\\$")
def f(v):
    re.match(r"^x$", v)
    COMPILED.match(v)
    INLINE.match(v)
    ESCAPED.match(v)
    COMPILED.fullmatch(v)
    re.match(r"^x", v)
"""
    assert anchored_matches(source) == [8, 9, 10]
