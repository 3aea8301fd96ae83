"""hack/complexity.py (run by ``make check``) flags functions above the complexity bar."""

from __future__ import annotations

import pathlib

import complexity
import pytest


def _branchy(n: int) -> str:
    """Source of a function with ``n`` if-statements: cyclomatic complexity ``n + 1``."""
    body = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(n))
    return f"def branchy(x):\n{body}    return -1\n"


SIMPLE = "def simple(x):\n    return x + 1\n\n\nclass C:\n    def m(self):\n        return 1\n"


def _tree(tmp_path: pathlib.Path, source: str) -> pathlib.Path:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "mod.py").write_text(source)
    (tmp_path / "cmd").mkdir()
    return tmp_path


def test_flags_an_over_complex_function(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _tree(tmp_path, SIMPLE + "\n\n" + _branchy(complexity.MAX_COMPLEXITY))
    assert complexity.main(["--root", str(root)]) == 1
    out = capsys.readouterr().out
    assert f"pkg/mod.py:10 branchy {complexity.MAX_COMPLEXITY + 1}" in out
    assert "simple" not in out


def test_passes_simple_code_and_the_bar_is_inclusive(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _tree(tmp_path, SIMPLE + "\n\n" + _branchy(complexity.MAX_COMPLEXITY - 1))
    assert complexity.main(["--root", str(root)]) == 0
    assert capsys.readouterr().out == ""


def test_max_overrides_the_bar_and_methods_and_closures_count(tmp_path: pathlib.Path) -> None:
    nested = (
        "class K:\n    def meth(self, x):\n        if x:\n            return 1\n        return 0\n"
    )
    closure = (
        "def outer():\n    def inner(x):\n        if x:\n            return 1\n        return 0\n"
    )
    source = nested + "\n\n" + closure + "    return inner\n"
    assert complexity.offenders(source, 1) == [(2, "K.meth", 2), (9, "outer.inner", 2)]
    root = _tree(tmp_path, source)
    assert complexity.main(["--root", str(root), "--max", "2", "pkg"]) == 0
    assert complexity.main(["--root", str(root), "--max", "1", "pkg"]) == 1


def test_an_unknown_path_is_an_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(SystemExit):
        complexity.main(["--root", str(tmp_path), "nope"])
