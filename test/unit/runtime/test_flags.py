"""The shared flag mechanism (`pkg.runtime.flags`) and the one boolean parser
(`pkg.base.strconv`): env fallback, empty-env override, Go's boolean spellings, error labels,
repeated flags, aliases, ``--version``, the shared logging flags and the docs table."""

from __future__ import annotations

import pytest

from pkg.base.strconv import FALSE_SPELLINGS, TRUE_SPELLINGS, parse_bool
from pkg.featuregates import FeatureGateError, FeatureGates
from pkg.runtime.buildinfo import BuildInfo
from pkg.runtime.flags import (
    Flag,
    FlagError,
    FlagTable,
    Repeat,
    choice,
    doc_default,
    parse_duration,
    parse_http_path,
    parse_int,
    with_doc_table,
)

TABLE = FlagTable(
    prog="demo",
    verbosity_env="LOG_VERBOSITY",
    verbosity_default=2,
    verbosity_aliases=("--verbosity",),
    flags=(
        Flag("name", "NAME", str, "dflt", "a text"),
        Flag("root", ("NEW_ROOT", "OLD_ROOT"), str, "/", "two env names, first non-empty wins"),
        Flag("port", "PORT", parse_int, -1, "a number"),
        Flag("enabled", "ENABLED", parse_bool, False, "a boolean"),
        Flag("period", "PERIOD", parse_duration, 0.2, "a duration"),
        Flag("mode", "MODE", choice("a", "b"), "a", "a choice", empty_env_overrides=True),
        Flag("secret-env", "ONLY_ENV", str, "", "env only", cli=False),
    ),
)
NOT_GO = ["yes", "no", "on", "off", "tRuE", " true", "true ", "", "2", "y"]


@pytest.mark.parametrize("text", TRUE_SPELLINGS + FALSE_SPELLINGS)
def test_go_boolean_spellings_are_accepted(text: str) -> None:
    assert parse_bool(text) is (text in TRUE_SPELLINGS)


@pytest.mark.parametrize("text", NOT_GO)
def test_other_boolean_spellings_are_refused_everywhere(text: str) -> None:
    """Flags, env variables and feature gates share the parser, so none accepts ``yes``."""
    with pytest.raises(ValueError, match="invalid boolean"):
        parse_bool(text)
    if text:
        with pytest.raises(FlagError, match=r"^--enabled \(or ENABLED\): invalid boolean"):
            TABLE.parse([f"--enabled={text}"], {})
        with pytest.raises(FlagError, match=r"^--enabled \(or ENABLED\): invalid boolean"):
            TABLE.parse([], {"ENABLED": text})
    if text and text == text.strip():  # the gate spec itself trims whitespace around a value
        with pytest.raises(FeatureGateError, match="invalid value"):
            FeatureGates.parse(f"MPSSupport={text}")


def test_defaults_env_fallback_and_flag_wins() -> None:
    values = TABLE.parse([], {})
    assert values.dump() == {
        "enabled": False,
        "logging_format": "text",
        "mode": "a",
        "name": "dflt",
        "period": 0.2,
        "port": -1,
        "root": "/",
        "secret_env": "",
        "v": 2,
        "vmodule": "",
    }
    env = {
        "NAME": "env",
        "PORT": "7",
        "ENABLED": "T",
        "PERIOD": "1m30s",
        "LOG_VERBOSITY": "5",
        "ONLY_ENV": "s",
        "OLD_ROOT": "/old",
        "LOGGING_FORMAT": "json",
    }
    values = TABLE.parse([], env)
    assert (values["name"], values["port"], values["enabled"], values["period"]) == (
        "env",
        7,
        True,
        90.0,
    )
    assert (values["v"], values["secret_env"], values["root"]) == (5, "s", "/old")
    assert values["logging_format"] == "json"
    assert TABLE.parse([], {**env, "NEW_ROOT": "/new"})["root"] == "/new"
    flags = TABLE.parse(
        ["-name", "flag", "--port=8", "--enabled=false", "-v", "3", "--vmodule=x=4"], env
    )
    assert (flags["name"], flags["port"], flags["enabled"], flags["v"]) == ("flag", 8, False, 3)
    assert flags["vmodule"] == "x=4"
    assert TABLE.parse(["--verbosity=6", "--v=1"], {})["v"] == 1  # aliases share one dest


def test_empty_env_counts_as_unset_unless_the_row_says_otherwise() -> None:
    assert TABLE.parse([], {"NAME": "", "PORT": ""})["name"] == "dflt"
    with pytest.raises(FlagError, match=r'^--mode \(or MODE\): invalid choice ""'):
        TABLE.parse([], {"MODE": ""})


def test_a_boolean_flag_alone_is_true_and_never_takes_the_next_argument() -> None:
    assert TABLE.parse(["--enabled"], {"ENABLED": "false"})["enabled"] is True
    assert TABLE.parse(["-enabled"], {})["enabled"] is True
    with pytest.raises(SystemExit) as exc:
        TABLE.parse(["--enabled", "false"], {})
    assert exc.value.code == 2


def test_errors_name_the_flag_and_its_env_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(FlagError, match=r'^--port \(or PORT\): "x" is not an integer$'):
        TABLE.parse([], {"PORT": "x"})
    with pytest.raises(FlagError, match=r'^ONLY_ENV: "x" is not an integer$'):
        FlagTable(
            prog="p", verbosity_env="V", flags=(Flag("n", "ONLY_ENV", parse_int, 0, "", cli=False),)
        ).parse([], {"ONLY_ENV": "x"})
    with pytest.raises(FlagError, match=r"^--logging-format \(or LOGGING_FORMAT\): Unsupported"):
        TABLE.parse(["--logging-format=xml"], {})
    with pytest.raises(FlagError, match=r"^--vmodule \(or VMODULE\): invalid entry"):
        TABLE.parse([], {"VMODULE": "oops"})
    with pytest.raises(SystemExit) as exc:
        TABLE.parse_or_exit(["--period=soon"], {})
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert 'demo: error: --period (or PERIOD): invalid duration "soon"' in err
    assert err.startswith("usage: demo")
    assert str(TABLE.error("root", "gone")) == "--root (or NEW_ROOT, OLD_ROOT): gone"
    for unknown in (["--nope"], ["--secret-env=x"]):  # env-only rows have no flag
        with pytest.raises(SystemExit) as exc:
            TABLE.parse(unknown, {})
        assert exc.value.code == 2


def test_version_exits_0_before_env_or_commands(capsys: pytest.CaptureFixture[str]) -> None:
    info = BuildInfo(version="1.2.3", revision="abc", build_date="2026-11-27T00:00:00Z")
    table = FlagTable(
        prog="cmdbin",
        verbosity_env="V",
        commands=("run", "check"),
        flags=(Flag("port", "PORT", parse_int, 1, ""),),
    )
    for spelling in ("--version", "-version"):
        with pytest.raises(SystemExit) as exc:
            table.parse([spelling], {"PORT": "not even a number"}, load=lambda: info)
        assert exc.value.code == 0
        assert capsys.readouterr().out == info.version_line("cmdbin") + "\n"
    assert table.parse(["check"], {}).command == "check"
    with pytest.raises(SystemExit) as exc:
        table.parse([], {})
    assert exc.value.code == 2 and "required: command" in capsys.readouterr().err


def test_every_table_gets_the_shared_logging_flags() -> None:
    names = [f.name for f in TABLE.all_flags]
    assert names[-3:] == ["v", "logging-format", "vmodule"]
    help_text = " ".join(TABLE.parser().format_help().split())
    for spelling in ("-v", "--v", "--verbosity", "--logging-format", "--vmodule", "--version"):
        assert spelling in help_text
    assert "(env NEW_ROOT, OLD_ROOT)" in help_text


@pytest.mark.parametrize(
    "flags",
    [
        (Flag("a", "A", str, "", ""), Flag("a", "B", str, "", "")),
        (Flag("b", "B", parse_bool, "false", ""),),
        (Flag("x", "X", str, "", "", aliases=("--v",)),),
    ],
    ids=["duplicate-dest", "bool-default-not-bool", "alias-clash"],
)
def test_inconsistent_tables_are_refused(flags: tuple[Flag, ...]) -> None:
    with pytest.raises(ValueError, match="demo"):
        FlagTable(prog="demo", verbosity_env="V", flags=flags)


def test_markdown_table_lists_every_row() -> None:
    table = TABLE.markdown().splitlines()
    assert table[:2] == ["| flag | env | default | what |", "|---|---|---|---|"]
    assert len(table) == 2 + len(TABLE.all_flags)
    assert "| `--period` | `PERIOD` | 0.2s | a duration |" in table
    assert '| (env only) | `ONLY_ENV` | `""` | env only |' in table
    assert "| `-v`, `--v`, `--verbosity` | `LOG_VERBOSITY` | 2 |" in table[-3]
    assert "set but empty env variable overrides" in next(r for r in table if "`--mode`" in r)
    assert [doc_default(TABLE.flag(d)) for d in ("enabled", "port", "root")] == [
        "false",
        "-1",
        "`/`",
    ]


def test_doc_region_is_replaced_by_the_table_and_missing_markers_are_an_error() -> None:
    doc = "intro\n<!-- BEGIN FLAGS demo -->\nstale\n<!-- END FLAGS demo -->\nrest\n"
    fresh = with_doc_table(doc, TABLE)
    assert fresh == (
        "intro\n<!-- BEGIN FLAGS demo -->\n" + TABLE.markdown() + "<!-- END FLAGS demo -->\nrest\n"
    )
    assert with_doc_table(fresh, TABLE) == fresh
    with pytest.raises(ValueError, match="BEGIN FLAGS demo"):
        with_doc_table("<!-- END FLAGS demo -->\n<!-- BEGIN FLAGS demo -->\n", TABLE)


REPEATS = FlagTable(
    prog="demo",
    verbosity_env=("V", "LOG_VERBOSITY"),
    flags=(
        Flag("one", "ONE", str, "", "last wins"),
        Flag("names", "NAMES", str, "", "a list", repeat=Repeat.LIST),
        Flag("gates", "GATES", str, "", "a map", repeat=Repeat.MAP),
        Flag("root", ("NEW_ROOT", "OLD_ROOT"), str, "/", "", aliases=("--old_root",)),
    ),
)


@pytest.mark.parametrize(
    ("argv", "env", "names"),
    [
        (["--names=a", "--names", "b,c", "-names=d"], {}, "a,b,c,d"),
        (["--names=a", "--names=b"], {"NAMES": "env1,env2"}, "a,b"),
        ([], {"NAMES": "env1,env2"}, "env1,env2"),
        (["--names=a"], {}, "a"),
    ],
    ids=["repeats-collect", "flags-replace-env", "env-alone", "once"],
)
def test_a_list_row_collects_every_occurrence_and_replaces_the_env(
    argv: list[str], env: dict[str, str], names: str
) -> None:
    """urfave/cli's string slice: ``--x=a --x=b,c`` is a, b, c; given flags drop the env's."""
    assert REPEATS.parse(argv, env)["names"] == names


@pytest.mark.parametrize(
    ("argv", "env", "gates", "merged"),
    [
        (
            ["--gates=MPSSupport=true", "--gates", "DynamicMIG=true"],
            {},
            "MPSSupport=true,DynamicMIG=true",
            {"MPSSupport": True, "DynamicMIG": True},
        ),
        (
            ["--gates=MPSSupport=false"],
            {"GATES": "MPSSupport=true,DynamicMIG=true"},
            "MPSSupport=true,DynamicMIG=true,MPSSupport=false",
            {"MPSSupport": False, "DynamicMIG": True},
        ),
        ([], {"GATES": "DynamicMIG=true"}, "DynamicMIG=true", {"DynamicMIG": True}),
        (["--gates=MPSSupport=true"], {"GATES": ""}, "MPSSupport=true", {"MPSSupport": True}),
    ],
    ids=["repeats-merge", "env-first-then-flags", "env-alone", "empty-env-is-unset"],
)
def test_a_map_row_lays_each_occurrence_over_the_env(
    argv: list[str], env: dict[str, str], gates: str, merged: dict[str, bool]
) -> None:
    """component-base's ``--feature-gates``: the env's keys, then each flag's, later wins."""
    spec = REPEATS.parse(argv, env)["gates"]
    assert spec == gates
    assert FeatureGates.parse(str(spec)).overrides == merged


def test_other_rows_keep_the_last_occurrence() -> None:
    assert REPEATS.parse(["--one=a", "--one=b"], {"ONE": "e"})["one"] == "b"


def test_several_verbosity_variables_are_tried_in_order() -> None:
    assert REPEATS.parse([], {"V": "3", "LOG_VERBOSITY": "5"})["v"] == 3
    assert REPEATS.parse([], {"V": "", "LOG_VERBOSITY": "5"})["v"] == 5
    assert REPEATS.parse(["-v=1"], {"V": "3", "LOG_VERBOSITY": "5"})["v"] == 1
    with pytest.raises(FlagError, match=r"^--v \(or V, LOG_VERBOSITY\): "):
        REPEATS.parse([], {"V": "x"})


def test_an_alias_takes_one_or_two_dashes_like_the_name() -> None:
    for spelling in ("--old_root=/a", "-old_root=/a", "--root=/a"):
        assert REPEATS.parse([spelling], {"NEW_ROOT": "/env"})["root"] == "/a"


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("/metrics", "/metrics"),
        ("metrics", "/metrics"),
        ("/metrics/", "/metrics"),
        ("//a//b/../c", "/a/c"),
        ("/", "/"),
        ("", ""),
    ],
)
def test_http_paths_are_rooted_and_cleaned_as_gos_path_join(text: str, path: str) -> None:
    assert parse_http_path(text) == path


def test_markdown_names_aliases_and_repeat_rules() -> None:
    rows = {r.split(" | ")[0]: r for r in REPEATS.markdown().splitlines()[2:]}
    assert "| `--root`, `--old_root`" in rows
    assert "the flags' values together replace the env variable's" in rows["| `--names`"]
    assert "each flag's keys are laid over the env variable's" in rows["| `--gates`"]
    assert "repeatable" not in rows["| `--one`"]
    assert rows["| `-v`, `--v`"].split(" | ")[1] == "`V`, `LOG_VERBOSITY`"


def test_help_shows_each_default_and_what_each_command_does() -> None:
    table = FlagTable(
        prog="cmdbin",
        verbosity_env="V",
        commands=("run", "check"),
        command_help=(("run", "run the thing"), ("check", "ask the thing")),
        flags=(
            Flag("port", "PORT", parse_int, 50000, "a port"),
            Flag("period", "PERIOD", parse_duration, 0.5, "a duration"),
            Flag("on", "ON", parse_bool, False, "a switch"),
            Flag("name", "NAME", str, "", "a text without default"),
        ),
    )
    text = " ".join(table.parser().format_help().split())
    assert "a port (env PORT); default 50000" in text
    assert "a duration (env PERIOD); default 0.5s" in text
    assert "a switch (env ON); default false" in text
    assert "a text without default (env NAME) " in text
    assert "run: run the thing; check: ask the thing" in text
