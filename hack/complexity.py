"""Fail if any function or method is more complex than the project allows.

Walks the given paths (default ``pkg`` and ``cmd`` under the repository root, or under
``--root``) for ``*.py`` files, scores every function, method and nested function with radon's
cyclomatic complexity, and prints each one above ``--max`` (default `MAX_COMPLEXITY`) as
``path:line name complexity``. Exits 1 if it printed any, 0 otherwise. Run by hack/check.sh
(``make check``). When a function trips it, split it along its phases into named helpers rather
than raising the bar.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from radon.complexity import add_inner_blocks, cc_visit  # type: ignore[import-untyped]

MAX_COMPLEXITY = 25
DEFAULT_PATHS = ("pkg", "cmd")
# Generated code is not ours to split.
SKIP_PARTS = frozenset({"gen", "__pycache__"})

ROOT = pathlib.Path(__file__).resolve().parent.parent


def python_files(root: pathlib.Path, paths: Iterable[str]) -> Iterator[pathlib.Path]:
    """Every ``*.py`` file under ``paths`` (relative to ``root``), sorted, minus generated code."""
    for name in paths:
        base = root / name
        if base.is_file():
            yield base
            continue
        for path in sorted(base.rglob("*.py")):
            if not SKIP_PARTS.intersection(path.relative_to(root).parts):
                yield path


def _name(block: Any) -> str:
    """``Class.method`` for methods, the bare name for functions (as ``radon cc`` prints them)."""
    classname = getattr(block, "classname", None)
    return f"{classname}.{block.name}" if classname else str(block.name)


def offenders(source: str, limit: int) -> list[tuple[int, str, int]]:
    """``(line, name, complexity)`` of each function, method or closure in ``source`` above
    ``limit``, by line."""
    found: list[tuple[int, str, int]] = []
    for block in add_inner_blocks(cc_visit(source)):
        if hasattr(block, "methods"):  # a class: its methods are separate blocks
            continue
        if int(block.complexity) > limit:
            found.append((int(block.lineno), _name(block), int(block.complexity)))
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=list(DEFAULT_PATHS))
    parser.add_argument("--root", type=pathlib.Path, default=ROOT)
    parser.add_argument("--max", type=int, default=MAX_COMPLEXITY, dest="limit")
    args = parser.parse_args(argv)
    missing = [p for p in args.paths if not (args.root / p).exists()]
    if missing:
        parser.error(f"no such path under {args.root}: {', '.join(missing)}")
    failed = False
    for path in python_files(args.root, args.paths):
        rel = path.relative_to(args.root)
        for line, name, score in offenders(path.read_text(), args.limit):
            print(f"{rel}:{line} {name} {score}")
            failed = True
    if failed:
        print(f"complexity: functions above {args.limit}; split them into named helpers")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
