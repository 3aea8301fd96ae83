"""Which build is running: the version, git revision and build date of this installation.

Owns reading them, once per process, from the installation root (the directory that holds the
``pkg`` package, on ``PYTHONPATH``):

* ``version``: ``[project] version`` of ``<root>/pyproject.toml``, the one place the version is
  written (the image copies that file next to ``pkg/``);
* ``revision`` and ``build_date``: ``"revision"`` and ``"created"`` of
  ``<root>/build-info.json``, which the image build writes
  (``{"revision": "<40-hex sha or unknown>", "created": "<RFC 3339 UTC>"}``, the same values as
  its OCI labels ``org.opencontainers.image.revision`` / ``.created``); without that file (a
  development checkout) the revision is the commit ``<root>/.git`` points at, read from
  ``HEAD`` and the ref it names (loose ref file or ``packed-refs``) without running ``git``,
  and the build date is ``unknown``.

Invariants: a value that cannot be known is the string ``unknown`` (never guessed: a checkout
with uncommitted changes still reports its ``HEAD`` commit, with no ``-dirty``); a file that is
absent is not an error, one that is present but unreadable or malformed is
(:class:`BuildInfoError`, naming the file), so a broken image fails at start instead of
reporting a wrong build. Rendering for ``--version`` and for the first log line lives here too,
so the three binaries print the same words. Imports only the standard library: the daemon's
exec probe imports this module.
"""

from __future__ import annotations

import functools
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "BUILD_INFO_FILE",
    "DEFAULT_ROOT",
    "PYPROJECT_FILE",
    "UNKNOWN",
    "BuildInfo",
    "BuildInfoError",
    "git_revision",
    "load_build_info",
    "read_build_info",
]

UNKNOWN: Final = "unknown"
PYPROJECT_FILE: Final = "pyproject.toml"
BUILD_INFO_FILE: Final = "build-info.json"
# pkg/runtime/buildinfo.py -> the directory holding pkg/ (the repository root in a checkout,
# /opt/compute-domain-driver in the images).
DEFAULT_ROOT: Final = Path(__file__).resolve().parents[2]

_SHA: Final = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # SHA-1 or SHA-256 object names


class BuildInfoError(ValueError):
    """A build metadata file exists but cannot be read or has the wrong shape."""


@dataclass(frozen=True)
class BuildInfo:
    """What build this process runs; each field is a plain string, ``unknown`` when unknown."""

    version: str
    revision: str
    build_date: str

    def version_line(self, program: str) -> str:
        """The one line ``--version`` prints (no newline):
        ``<program> version <v> (revision <sha>, built <date>)``."""
        return (
            f"{program} version {self.version} (revision {self.revision}, built {self.build_date})"
        )

    def log_fields(self) -> dict[str, str]:
        """``version``, ``revision`` and ``buildDate``, for ``key=value`` log lines."""
        return {"version": self.version, "revision": self.revision, "buildDate": self.build_date}

    def startup_message(self, program: str) -> str:
        """``starting <program> version=<v> revision=<sha> buildDate=<date>``: the first line a
        binary logs, for log formats without structured fields."""
        pairs = " ".join(f"{key}={value}" for key, value in self.log_fields().items())
        return f"starting {program} {pairs}"


def _read_text(path: Path) -> str | None:
    """The file's text; ``None`` when it does not exist; `BuildInfoError` when unreadable."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise BuildInfoError(f"{path}: {err}") from err


def _version(root: Path) -> str:
    path = root / PYPROJECT_FILE
    text = _read_text(path)
    if text is None:
        return UNKNOWN
    try:
        version = tomllib.loads(text)["project"]["version"]
    except (tomllib.TOMLDecodeError, KeyError, TypeError) as err:
        raise BuildInfoError(f"{path}: no [project] version ({err})") from err
    if not isinstance(version, str) or not version:
        raise BuildInfoError(f"{path}: [project] version is not a non-empty string")
    return version


def _stamp(root: Path) -> tuple[str, str] | None:
    """``(revision, created)`` from ``build-info.json``; ``None`` when there is none."""
    path = root / BUILD_INFO_FILE
    text = _read_text(path)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise BuildInfoError(f"{path}: {err}") from err
    if not isinstance(data, dict):
        raise BuildInfoError(f"{path}: not a JSON object")
    values = (data.get("revision") or UNKNOWN, data.get("created") or UNKNOWN)
    if not all(isinstance(value, str) for value in values):
        raise BuildInfoError(f'{path}: "revision" and "created" must be strings')
    return values


def _git_dir(root: Path) -> Path | None:
    """``<root>/.git``, following a ``gitdir:`` file (worktrees, submodules)."""
    dot_git = root / ".git"
    if dot_git.is_dir():
        return dot_git
    text = _read_text(dot_git) if dot_git.is_file() else None
    if text is None or not text.startswith("gitdir:"):
        return None
    target = Path(text[len("gitdir:") :].strip())
    return target if target.is_absolute() else (root / target).resolve()


def _resolve_ref(git_dir: Path, ref: str) -> str | None:
    """The object name a ref points at: its loose file, else its line in ``packed-refs``.

    A worktree's ``HEAD`` lives in its own git dir; branch refs live in the common one."""
    dirs = [git_dir]
    common = _read_text(git_dir / "commondir")
    if common is not None:
        dirs.append((git_dir / common.strip()).resolve())
    for directory in dirs:
        loose = _read_text(directory / ref)
        if loose is not None:
            return loose.strip()
    for directory in dirs:
        packed = _read_text(directory / "packed-refs")
        for line in (packed or "").splitlines():
            sha, _, name = line.partition(" ")
            if name.strip() == ref:
                return sha
    return None


def git_revision(root: Path) -> str:
    """The commit ``<root>/.git``'s ``HEAD`` names, without running ``git``; ``unknown`` when
    there is no git directory or ``HEAD`` does not resolve (for example an unborn branch)."""
    git_dir = _git_dir(root)
    head = _read_text(git_dir / "HEAD") if git_dir is not None else None
    if git_dir is None or head is None:
        return UNKNOWN
    head = head.strip()
    if head.startswith("ref:"):
        head = _resolve_ref(git_dir, head[len("ref:") :].strip()) or ""
    return head if _SHA.fullmatch(head) else UNKNOWN


def read_build_info(root: Path) -> BuildInfo:
    """Read the build of the installation at ``root`` now (no cache); see the module docstring.

    Raises `BuildInfoError` for a present but unreadable or malformed ``pyproject.toml`` or
    ``build-info.json``."""
    version = _version(root)
    stamp = _stamp(root)
    if stamp is None:
        return BuildInfo(version=version, revision=git_revision(root), build_date=UNKNOWN)
    revision, created = stamp
    return BuildInfo(version=version, revision=revision, build_date=created)


@functools.cache
def load_build_info(root: Path = DEFAULT_ROOT) -> BuildInfo:
    """`read_build_info` once per process and root: every later call returns the same value.

    Thread-safe in effect (a race reads the files twice and keeps one equal result)."""
    return read_build_info(root)
