"""hack/ never reaches into test/, and nothing in either edits the import path.

What the tests and the scripts share lives in ``hack/testsupport``; the editable install makes
every hack/ package importable by name (``pyproject.toml``). A module of test/ is importable
only inside a pytest run (pytest puts a test's folder on its path), so a script or package of
hack/ that imported one would work under pytest and nowhere else. The import contracts
(``hack/.importlinter``) see only the packages; this test reads every Python file of hack/,
scripts included.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HACK, TEST = REPO / "hack", REPO / "test"
# The zygote's forked child does what `python <script>.py` does before running the script.
PATH_EDITS_ALLOWED = {HACK / "kubeletsim" / "zygote.py"}
PATH_ATTRIBUTE = "sys." + "path"  # spelt in two parts so this file does not match itself


def _python_files(root: Path) -> list[Path]:
    files = [p for p in root.rglob("*.py") if "gen" not in p.parts]
    # Executable scripts without the suffix (hack/local-cluster).
    files += [p for p in root.iterdir() if p.is_file() and not p.suffix and _is_python(p)]
    return sorted(files)


def _is_python(path: Path) -> bool:
    with path.open("rb") as f:
        first = f.readline()
    return first.startswith(b"#!") and b"python" in first


def _imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_file_of_hack_imports_a_module_of_test() -> None:
    test_modules = {p.stem for p in TEST.rglob("*.py")} | {"test"}
    offenders = {
        str(path.relative_to(REPO)): sorted(_imported_top_levels(path) & test_modules)
        for path in _python_files(HACK)
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_nothing_in_hack_or_test_edits_the_import_path() -> None:
    files = [p for root in (HACK, TEST) for p in _python_files(root)]
    assert len(files) > 100
    edits = [
        f"{path.relative_to(REPO)}:{n}"
        for path in files
        if path not in PATH_EDITS_ALLOWED
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if PATH_ATTRIBUTE in line
    ]
    assert edits == []
