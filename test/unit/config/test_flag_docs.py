"""docs/operators.md's flag and feature-gate tables agree with the code's tables.

The three generated flag tables must be what `hack/gen-flag-docs.py` writes from the binaries'
flag tables; every hand-written row of the form ``| `--flag` (`ENV`) | default | ... |``
elsewhere in the file must name a real flag with that variable and that default; the
feature-gate table must list exactly the implemented gates with their defaults and stages.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pkg.daemon.options import DAEMON_FLAGS
from pkg.featuregates import ALPHA, DEFAULTS, STAGES, UPSTREAM_ONLY
from pkg.kubeletplugin.options import PLUGIN_FLAGS
from pkg.reconcilers.flags import CONTROLLER_FLAGS
from pkg.runtime.flags import Flag, FlagTable, with_doc_table

DOC = (Path(__file__).resolve().parents[3] / "docs" / "operators.md").read_text()
TABLES = {t.prog: t for t in (CONTROLLER_FLAGS, PLUGIN_FLAGS, DAEMON_FLAGS)}
HAND_ROW = re.compile(r"^\| `--([a-z0-9-]+)` \(`([A-Z0-9_]+)`\) \| ([^|]*) \|", re.MULTILINE)


def section(title: str) -> str:
    start = DOC.index(f"\n## {title}\n")
    end = DOC.find("\n## ", start + 1)
    return DOC[start : end if end > 0 else len(DOC)]


@pytest.mark.parametrize("table", TABLES.values(), ids=list(TABLES))
def test_generated_flag_tables_are_current(table: FlagTable) -> None:
    assert with_doc_table(DOC, table) == DOC, "run hack/gen-flag-docs.py"
    assert f"<!-- BEGIN FLAGS {table.prog} -->" in section("Flags and environment")


def rows_by_flag(name: str, tables: list[FlagTable] | None = None) -> list[Flag]:
    tables = list(TABLES.values()) if tables is None else tables
    return [f for t in tables for f in t.all_flags if f.cli and f.name == name]


def tables_of_section(doc: str, pos: int) -> list[FlagTable]:
    """The binary a hand-written row at ``pos`` documents: the one its ``## `` section is about
    (``Controller API client ...``: the controller), else any of the three."""
    title = doc[doc.rfind("\n## ", 0, pos) : pos].split("\n", 2)[1].lower()
    for word, prog in (
        ("controller", CONTROLLER_FLAGS.prog),
        ("plugin", PLUGIN_FLAGS.prog),
        ("daemon", DAEMON_FLAGS.prog),
    ):
        if word in title:
            return [TABLES[prog]]
    return list(TABLES.values())


def hand_row_mismatches(doc: str) -> list[str]:
    """Every hand-written ``| `--flag` (`ENV`) | default |`` row that the code contradicts."""
    problems = []
    for match in HAND_ROW.finditer(doc):
        name, env, default_cell = match.groups()
        tables = tables_of_section(doc, match.start())
        candidates = [f for f in rows_by_flag(name, tables) if env in f.env_names]
        if not candidates:
            problems.append(f"--{name} ({env}): no binary has that flag and variable")
        written = default_cell.strip().split()[0].strip("`")
        for flag in candidates:
            if flag.parse(written) != flag.default:
                problems.append(f"--{name}: docs say {written}, the code {flag.default}")
    return problems


def test_hand_written_flag_rows_name_real_flags_envs_and_defaults() -> None:
    assert len(HAND_ROW.findall(DOC)) >= 8  # the controller's client table, the clique label
    assert hand_row_mismatches(DOC) == []


def test_a_drifted_hand_row_is_caught() -> None:
    row = "| `--kube-api-burst` (`KUBE_API_BURST`) | 10 |"
    assert row in DOC
    assert hand_row_mismatches(DOC.replace(row, row.replace("10", "30"))) == [
        "--kube-api-burst: docs say 30, the code 10"
    ]
    renamed = DOC.replace(row, row.replace("KUBE_API_BURST", "API_BURST"))
    assert hand_row_mismatches(renamed) == [
        "--kube-api-burst (API_BURST): no binary has that flag and variable"
    ]


def test_feature_gate_table_matches_the_gates() -> None:
    text = section("Feature gates")
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \|", text, re.MULTILINE)
    assert [name for name, _ in rows] == list(DEFAULTS)
    for name, cell in rows:
        assert cell.strip().split()[0] == str(DEFAULTS[name]).lower(), name
        assert ("(Alpha)" in cell) is (STAGES[name] == ALPHA), name
    for name in UPSTREAM_ONLY:
        assert f"`{name}`" in text, f"upstream-only gate {name} missing from the docs"


def test_logging_section_names_each_binarys_verbosity_variable() -> None:
    """``V`` first everywhere, as upstream's; the plugin and the daemon fall back to
    ``LOG_VERBOSITY`` (what the charts set)."""
    text = " ".join(section("Logs and verbosity").split())
    assert CONTROLLER_FLAGS.flag("v").env_names == ("V",)
    assert PLUGIN_FLAGS.flag("v").env_names == DAEMON_FLAGS.flag("v").env_names
    assert PLUGIN_FLAGS.flag("v").env_names == ("V", "LOG_VERBOSITY")
    assert "env `V` in all three binaries" in text
    assert "the plugin and the daemon also read `LOG_VERBOSITY` when `V` is unset" in text
