"""Build info: the loader (image stamp, git checkout, nothing), ``--version`` and the gauge."""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from pkg.runtime.buildinfo import (
    DEFAULT_ROOT,
    BuildInfo,
    BuildInfoError,
    git_revision,
    load_build_info,
    read_build_info,
)
from pkg.runtime.buildinfometric import register_build_info
from pkg.runtime.versionflag import add_version_flag

SHA = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"
PYPROJECT = '[project]\nname = "compute-domain-driver"\nversion = "1.2.3"\n'


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    return tmp_path


def git_dir(root: Path, head: str) -> Path:
    git = root / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text(head)
    return git


def test_the_image_stamp_wins_over_a_git_directory(root: Path) -> None:
    (root / "build-info.json").write_text(
        json.dumps({"revision": SHA, "created": "2026-11-26T10:00:00Z"})
    )
    git = git_dir(root, "ref: refs/heads/main\n")
    (git / "refs" / "heads" / "main").write_text(OTHER + "\n")
    assert read_build_info(root) == BuildInfo(
        version="1.2.3", revision=SHA, build_date="2026-11-26T10:00:00Z"
    )


def test_an_image_built_outside_git_says_unknown(root: Path) -> None:
    (root / "build-info.json").write_text(
        '{"revision": "unknown", "created": "2026-11-26T10:00:00Z"}'
    )
    assert read_build_info(root).revision == "unknown"


@pytest.mark.parametrize(
    ("head", "loose", "packed", "revision"),
    [
        ("ref: refs/heads/main\n", SHA, None, SHA),
        (f"{SHA}\n", None, None, SHA),
        (
            "ref: refs/heads/main\n",
            None,
            f"# pack-refs with: peeled\n{OTHER} refs/heads/x\n{SHA} refs/heads/main\n^{OTHER}\n",
            SHA,
        ),
        ("ref: refs/heads/main\n", OTHER, f"{SHA} refs/heads/main\n", OTHER),
        ("ref: refs/heads/unborn\n", None, None, "unknown"),
        ("garbage\n", None, None, "unknown"),
    ],
    ids=["ref-loose", "detached", "ref-packed", "loose-beats-packed", "unborn", "garbage"],
)
def test_a_checkout_reads_head_without_git(
    root: Path, head: str, loose: str | None, packed: str | None, revision: str
) -> None:
    git = git_dir(root, head)
    if loose is not None:
        (git / "refs" / "heads" / "main").write_text(loose + "\n")
    if packed is not None:
        (git / "packed-refs").write_text(packed)
    assert read_build_info(root) == BuildInfo(
        version="1.2.3", revision=revision, build_date="unknown"
    )


def test_a_worktree_follows_gitdir_and_commondir(
    root: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    main = tmp_path_factory.mktemp("main") / ".git"
    worktree = main / "worktrees" / "wt"
    worktree.mkdir(parents=True)
    (worktree / "HEAD").write_text("ref: refs/heads/feature\n")
    (worktree / "commondir").write_text("../..\n")
    (main / "packed-refs").write_text(f"{SHA} refs/heads/feature\n")
    (root / ".git").write_text(f"gitdir: {worktree}\n")
    assert git_revision(root) == SHA


def test_nothing_but_the_version_is_unknown(root: Path) -> None:
    assert read_build_info(root) == BuildInfo(
        version="1.2.3", revision="unknown", build_date="unknown"
    )
    (root / "pyproject.toml").unlink()
    assert read_build_info(root).version == "unknown"


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("build-info.json", "{not json"),
        ("build-info.json", "[]"),
        ("build-info.json", '{"revision": 1, "created": "x"}'),
        ("pyproject.toml", "[project]\nname = 'x'\n"),
        ("pyproject.toml", "not = toml = at all"),
    ],
    ids=["stamp-not-json", "stamp-not-object", "stamp-not-string", "no-version", "bad-toml"],
)
def test_a_present_but_malformed_file_is_an_error_naming_it(
    root: Path, name: str, text: str
) -> None:
    (root / name).write_text(text)
    with pytest.raises(BuildInfoError, match=name):
        read_build_info(root)


def test_loaded_once_per_process(root: Path) -> None:
    first = load_build_info(root)
    (root / "pyproject.toml").write_text(PYPROJECT.replace("1.2.3", "9.9.9"))
    assert load_build_info(root) is first
    assert read_build_info(root).version == "9.9.9"


def test_this_checkout_reads_the_projects_version() -> None:
    assert (DEFAULT_ROOT / "pkg").is_dir()
    assert load_build_info().version == read_build_info(DEFAULT_ROOT).version != "unknown"


def test_renderings() -> None:
    info = BuildInfo(version="1.2.3", revision=SHA, build_date="2026-11-26T10:00:00Z")
    assert info.version_line("bin") == (
        f"bin version 1.2.3 (revision {SHA}, built 2026-11-26T10:00:00Z)"
    )
    assert info.startup_message("bin") == (
        f"starting bin version=1.2.3 revision={SHA} buildDate=2026-11-26T10:00:00Z"
    )
    assert info.log_fields() == {
        "version": "1.2.3",
        "revision": SHA,
        "buildDate": "2026-11-26T10:00:00Z",
    }


def test_version_flag_prints_one_unwrapped_line_and_exits_zero_before_required_args(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "40")  # argparse's own version action would wrap here
    info = BuildInfo(version="1.2.3", revision=SHA, build_date="2026-11-26T10:00:00Z")
    parser = argparse.ArgumentParser(prog="bin")
    add_version_flag(parser, load=lambda: info)
    parser.add_argument("command", choices=["run"])
    parser.add_argument("--port", type=int, required=True)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--version"])
    assert exit_info.value.code == 0
    out, err = capsys.readouterr()
    assert (out, err) == (info.version_line("bin") + "\n", "")


def test_version_flag_loads_nothing_unless_given() -> None:
    def boom() -> BuildInfo:
        raise AssertionError("loaded")

    parser = argparse.ArgumentParser(prog="bin")
    add_version_flag(parser, "--version", "-version", load=boom)
    assert vars(parser.parse_args([])) == {}


def test_build_info_gauge() -> None:
    registry = CollectorRegistry()
    info = BuildInfo(version="1.2.3", revision=SHA, build_date="2026-11-26T10:00:00Z")
    register_build_info(registry, name="x_build_info", info=info)
    labels = {
        "version": "1.2.3",
        "revision": SHA,
        "build_date": "2026-11-26T10:00:00Z",
        "python_version": platform.python_version(),
    }
    assert registry.get_sample_value("x_build_info", labels) == 1.0
    (family,) = [f for f in registry.collect() if f.name == "x_build_info"]
    assert family.type == "gauge" and len(family.samples) == 1
    with pytest.raises(ValueError, match="_build_info"):
        register_build_info(CollectorRegistry(), name="x_info", info=info)
