"""The one flag mechanism of the three binaries: a declarative table in, parsed values out.

Each binary declares ONE :class:`FlagTable` of :class:`Flag` rows (name, env variables, parser,
default, help), as upstream's Go binaries declare one ``[]cli.Flag`` list with ``EnvVars`` per
flag. This module turns the table into the ``argparse`` parser, the env fallbacks, the error
messages, ``--help``, ``--version`` and the operator docs' flag tables, so the three binaries
cannot drift apart again. Every table also gets the flags component-base gives every Kubernetes
binary: ``-v``/``--v``, ``--logging-format`` and ``--vmodule`` (`pkg.runtime.logsetup`).

The rules, the same for every binary (and upstream's where it has one):

- a flag given on the command line wins; else the first of its env variables that is set and
  non-empty; else the default. A row with ``empty_env_overrides`` also takes a set-but-empty
  variable, as upstream's CLI does for ``IMEX_MODE``/``IMEX_ISOLATION`` (the IMEX validation
  then refuses the empty value with upstream's message);
- a flag given twice keeps its last value, as Go's ``flag`` package does, unless its row says
  otherwise (:class:`Repeat`): a list row (``--additional-namespaces``, urfave/cli's string
  slice) collects every occurrence, which together replace the env variable's value; a map row
  (``--feature-gates``, component-base's map flag) lays every occurrence over the env
  variable's value, later keys winning. Both hand the row's parser one comma-joined text;
- long flags take one or two dashes and ``--flag=value`` or ``--flag value``, as Go's ``flag``
  package; a boolean flag alone means true and takes a value only as ``--flag=value`` (Go's
  rule: ``--flag false`` leaves ``false`` as a stray argument, which is an error);
- every boolean, from the command line or the environment, is parsed by
  `pkg.base.strconv.parse_bool` (Go's ``strconv.ParseBool`` spellings, nothing else);
- a value no parser accepts is a :class:`FlagError` whose message starts with the row's label,
  ``--flag (or ENV): ...``; `FlagTable.parse_or_exit` prints it with the usage and exits 2,
  as argparse (and Go's ``flag``) do. Defaults are typed values and are never parsed;
- ``--version`` (or ``-version``) prints the build's line and exits 0 the moment it is met,
  before the environment is read (`pkg.runtime.versionflag`).

Rows with ``cli=False`` are env-only (the daemon's CDI and downward-API contract): they are
parsed, reported and documented like the others but have no command-line flag.
"""

from __future__ import annotations

import argparse
import enum
import posixpath
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NoReturn, TypeVar

from pkg.base.strconv import parse_bool
from pkg.runtime.buildinfo import BuildInfo, load_build_info
from pkg.runtime.logsetup import (
    LOG_FORMATS,
    LoggingConfigError,
    parse_vmodule,
    validate_logging_format,
)
from pkg.runtime.versionflag import add_version_flag

__all__ = [
    "Flag",
    "FlagError",
    "FlagTable",
    "FlagValues",
    "Parse",
    "Repeat",
    "choice",
    "doc_default",
    "parse_bool",
    "parse_duration",
    "parse_http_path",
    "parse_int",
    "parse_logging_format",
    "parse_vmodule_flag",
    "with_doc_table",
]

Parse = Callable[[str], Any]
"""A row's parser: text (flag value or env value) → typed value; raises ``ValueError``."""

_DURATION: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_INT: Final = re.compile(r"[+-]?\d+")
_T = TypeVar("_T")


class FlagError(ValueError):
    """A flag or env value that cannot be used; the message starts with the row's label
    (``--flag (or ENV): ``) so the operator sees where the value came from."""


def parse_int(text: str) -> int:
    """A decimal integer, optionally signed (Go's ``strconv.Atoi``); raises ``ValueError``."""
    if not _INT.fullmatch(text):
        raise ValueError(f'"{text}" is not an integer')
    return int(text)


def parse_duration(text: str) -> float:
    """Go duration (``1m30s``, ``500ms``) or plain seconds → seconds; raises ``ValueError``."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f'invalid duration "{text}"')
    return sum(float(n) * _UNITS[u] for n, u in parts)


def parse_http_path(text: str) -> str:
    """An HTTP path as upstream serves it (Go's ``path.Join("/", text)``): rooted and cleaned,
    ``metrics`` and ``/metrics/`` are ``/metrics``; empty stays empty (nothing served there)."""
    return posixpath.normpath("/" + text.lstrip("/")) if text else ""


def choice(*allowed: str) -> Parse:
    """A parser accepting exactly one of ``allowed`` (returned as is)."""

    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(f'invalid choice "{text}" (choose from {", ".join(allowed)})')
        return text

    return parse


def parse_logging_format(text: str) -> str:
    """``--logging-format``: ``text`` or ``json`` (`validate_logging_format`)."""
    try:
        return validate_logging_format(text)
    except LoggingConfigError as err:
        raise ValueError(str(err)) from err


def parse_vmodule_flag(text: str) -> str:
    """``--vmodule``: the spec as given, once `parse_vmodule` accepted it."""
    try:
        parse_vmodule(text)
    except LoggingConfigError as err:
        raise ValueError(str(err)) from err
    return text


class Repeat(enum.Enum):
    """What a row makes of a flag given more than once on the command line."""

    LAST = "last"
    """The last occurrence wins (Go's ``flag`` package for strings, numbers and booleans)."""
    LIST = "list"
    """Every occurrence counts, comma-joined in order, and together they replace the env
    variable's value (urfave/cli's ``StringSliceFlag``: ``--x=a --x=b,c`` is ``a,b,c``)."""
    MAP = "map"
    """The env variable's value first, then every occurrence, comma-joined in order, for a
    parser whose later ``key=value`` wins (component-base's ``--feature-gates``: each
    occurrence and the env variable set keys of one map)."""


@dataclass(frozen=True)
class Flag:
    """One row of a binary's flag table.

    ``name`` is the command-line name without dashes (and, dashes as underscores, the value's
    key); ``env`` the variable(s) read when the flag is absent, first non-empty wins;
    ``default`` the typed value used when neither is given (never parsed); ``cli=False`` makes
    the row env-only; ``aliases`` are extra option strings (``--verbosity``, each also
    accepted with one dash); ``repeat`` what a repeated flag means (:class:`Repeat`)."""

    name: str
    env: str | tuple[str, ...] | None
    parse: Parse
    default: object
    help: str
    empty_env_overrides: bool = False
    cli: bool = True
    aliases: tuple[str, ...] = ()
    repeat: Repeat = Repeat.LAST

    @property
    def dest(self) -> str:
        """The key of this row's value in :class:`FlagValues`."""
        return self.name.replace("-", "_")

    @property
    def env_names(self) -> tuple[str, ...]:
        """The env variables, in the order they are tried."""
        if self.env is None:
            return ()
        return (self.env,) if isinstance(self.env, str) else self.env

    @property
    def is_bool(self) -> bool:
        """Whether the flag alone means true (its parser is `parse_bool`)."""
        return self.parse is parse_bool

    @property
    def option_strings(self) -> tuple[str, ...]:
        """Every command-line spelling: ``--name``, ``-name`` and the aliases with one or two
        dashes, as Go accepts (none if env-only)."""
        if not self.cli:
            return ()
        short = tuple(a[1:] for a in self.aliases if a.startswith("--"))
        return (f"--{self.name}", f"-{self.name}", *self.aliases, *short)

    @property
    def label(self) -> str:
        """How errors name the row: ``--name (or ENV)``, ``--name`` or, env-only, ``ENV``."""
        envs = ", ".join(self.env_names)
        if not self.cli:
            return envs
        return f"--{self.name} (or {envs})" if envs else f"--{self.name}"


@dataclass(frozen=True)
class FlagValues:
    """A table's parsed values by :attr:`Flag.dest`, plus the positional command if any.

    Immutable; the typed getters raise ``TypeError`` when a row's parser made another type
    (a table bug, not a user error)."""

    values: Mapping[str, object]
    command: str | None = None

    def __getitem__(self, dest: str) -> object:
        return self.values[dest]

    def get_str(self, dest: str) -> str:
        """The value of a text row."""
        return _typed(self.values[dest], str, dest)

    def get_optional_str(self, dest: str) -> str | None:
        """The value of a text row whose default is ``None``."""
        value = self.values[dest]
        return None if value is None else _typed(value, str, dest)

    def get_int(self, dest: str) -> int:
        """The value of an integer row."""
        return _typed(self.values[dest], int, dest)

    def get_float(self, dest: str) -> float:
        """The value of a number or duration row (seconds)."""
        value = self.values[dest]
        if isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        return _typed(value, float, dest)

    def get_bool(self, dest: str) -> bool:
        """The value of a boolean row."""
        return _typed(self.values[dest], bool, dest)

    def dump(self) -> dict[str, object]:
        """Every row's effective value by dest, sorted: the start-up dump's ``Flags:``
        (`pkg.runtime.startupconfig` prints ``v`` as ``klogVerbosity``)."""
        return dict(sorted(self.values.items()))


def _typed(value: object, kind: type[_T], dest: str) -> _T:
    if not isinstance(value, kind):
        raise TypeError(f"flag value {dest} is {type(value).__name__}, not {kind.__name__}")
    return value


@dataclass(frozen=True)
class FlagTable:
    """A binary's flags: its own rows, then ``-v``, ``--logging-format`` and ``--vmodule``.

    ``verbosity_env`` is the env variable of ``-v`` (component-base's is ``V``), or several,
    tried in order (the first set and non-empty wins, as for any row). Invariants (checked at
    construction): dests and option strings are unique; every row's default is of the type its
    parser returns for a boolean row. ``commands`` adds a required positional ``command`` (the
    daemon's ``run``/``check``)."""

    prog: str
    flags: tuple[Flag, ...]
    verbosity_env: str | tuple[str, ...]
    verbosity_default: int = 0
    verbosity_aliases: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()
    description: str = ""
    command_help: tuple[tuple[str, str], ...] = ()
    """(command, what it does) for ``--help``; every command should have one."""

    def __post_init__(self) -> None:
        dests = [f.dest for f in self.all_flags]
        spellings = [s for f in self.all_flags for s in f.option_strings]
        for what, seen in (("dest", dests), ("option string", spellings)):
            duplicates = sorted({s for s in seen if seen.count(s) > 1})
            if duplicates:
                raise ValueError(f"{self.prog}: duplicate flag {what}s: {duplicates}")
        for f in self.all_flags:
            if f.is_bool and not isinstance(f.default, bool):
                raise ValueError(f"{self.prog}: boolean flag {f.name} needs a bool default")

    @property
    def all_flags(self) -> tuple[Flag, ...]:
        """The binary's rows, then the three logging rows every binary shares."""
        return (
            *self.flags,
            Flag(
                "v",
                self.verbosity_env,
                parse_int,
                self.verbosity_default,
                "log verbosity: a line logged at level N is written when -v >= N (klog)",
                aliases=self.verbosity_aliases,
            ),
            Flag(
                "logging-format",
                "LOGGING_FORMAT",
                parse_logging_format,
                "text",
                f"log format: {' or '.join(LOG_FORMATS)} (klog text or component-base JSON)",
            ),
            Flag(
                "vmodule",
                "VMODULE",
                parse_vmodule_flag,
                "",
                "per-file log verbosity, pattern=N,... (klog)",
            ),
        )

    def flag(self, dest: str) -> Flag:
        """The row whose value is stored under ``dest``; ``KeyError`` if none."""
        for f in self.all_flags:
            if f.dest == dest:
                return f
        raise KeyError(dest)

    def error(self, dest: str, message: str) -> FlagError:
        """A :class:`FlagError` naming row ``dest``, for a binary's own checks of a value."""
        return FlagError(f"{self.flag(dest).label}: {message}")

    def parser(self, *, load: Callable[[], BuildInfo] = load_build_info) -> argparse.ArgumentParser:
        """The ``argparse`` parser: every row as a text option (values are converted by
        :meth:`parse`, so command line and env share one parser and one message), ``--version``,
        and the positional command if the table has commands."""
        p = argparse.ArgumentParser(
            prog=self.prog, description=self.description, allow_abbrev=False
        )
        add_version_flag(p, "--version", "-version", load=load)
        for f in self.all_flags:
            if not f.cli:
                continue
            names = ("-v", "--v", *f.option_strings[2:]) if f.name == "v" else f.option_strings
            env = f" (env {', '.join(f.env_names)})" if f.env_names else ""
            default = doc_default(f).strip("`")
            shown = f"; default {default}" if default and default != '""' else ""
            p.add_argument(
                *names,
                dest=f.dest,
                default=None,
                action="store" if f.repeat is Repeat.LAST else "append",
                metavar="BOOL" if f.is_bool else None,
                help=f"{f.help}{env}{shown}{_REPEAT_HELP.get(f.repeat, '')}",
            )
        if self.commands:
            described = dict(self.command_help)
            p.add_argument(
                "command",
                choices=self.commands,
                help="; ".join(f"{c}: {described[c]}" for c in self.commands if c in described)
                or None,
            )
        return p

    def parse(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        load: Callable[[], BuildInfo] = load_build_info,
    ) -> FlagValues:
        """Parse ``argv`` (without the program name) with ``env`` as fallback.

        Raises :class:`FlagError` for a value no parser accepts; argparse's own errors (unknown
        flag, missing command) print the usage and raise ``SystemExit(2)``; ``--version`` and
        ``--help`` print to stdout and raise ``SystemExit(0)`` before ``env`` is read."""
        return self._parse(self.parser(load=load), argv, env)

    def parse_or_exit(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        load: Callable[[], BuildInfo] = load_build_info,
    ) -> FlagValues:
        """:meth:`parse`, a :class:`FlagError` printed with the usage as ``SystemExit(2)``."""
        parser = self.parser(load=load)
        try:
            return self._parse(parser, argv, env)
        except FlagError as err:
            parser.error(str(err))

    def exit_with(self, err: FlagError) -> NoReturn:
        """Print ``err`` with the usage and exit 2, for a binary's own checks after parsing."""
        self.parser().error(str(err))

    def _parse(
        self, parser: argparse.ArgumentParser, argv: Sequence[str], env: Mapping[str, str]
    ) -> FlagValues:
        ns = vars(parser.parse_args(list(self._go_booleans(argv))))
        values: dict[str, object] = {}
        for f in self.all_flags:
            raw = _from_command_line(f, ns.get(f.dest) if f.cli else None, env)
            if raw is None:
                raw = _from_env(f, env)
            if raw is None:
                values[f.dest] = f.default
                continue
            try:
                values[f.dest] = f.parse(raw)
            except (ValueError, argparse.ArgumentTypeError) as err:
                raise FlagError(f"{f.label}: {err}") from err
        return FlagValues(values=values, command=ns.get("command"))

    def _go_booleans(self, argv: Sequence[str]) -> Iterator[str]:
        """A boolean flag alone becomes ``--flag=true`` (Go's rule: it never takes the next
        argument as its value); everything after ``--`` is left alone."""
        bools = {s for f in self.all_flags if f.is_bool for s in f.option_strings}
        args = iter(argv)
        for arg in args:
            if arg == "--":
                yield arg
                yield from args
                return
            yield f"{arg}=true" if arg in bools else arg

    def markdown(self) -> str:
        """The docs' table of this binary's flags (docs/operators.md, ``hack/gen-flag-docs.py``):
        one row per flag with its env variables, default and help."""
        lines = ["| flag | env | default | what |", "|---|---|---|---|"]
        for f in self.all_flags:
            names = ("-v", "--v") if f.name == "v" else (f"--{f.name}",)
            flag_cell = ", ".join(f"`{n}`" for n in (*names, *f.aliases)) if f.cli else "(env only)"
            env_cell = ", ".join(f"`{e}`" for e in f.env_names)
            help_ = f.help.replace("|", "\\|")
            if f.empty_env_overrides:
                help_ += " (a set but empty env variable overrides the default)"
            help_ += _REPEAT_HELP.get(f.repeat, "")
            lines.append(f"| {flag_cell} | {env_cell} | {doc_default(f)} | {help_} |")
        return "\n".join(lines) + "\n"


_REPEAT_HELP: Final = {
    Repeat.LIST: " (repeatable; the flags' values together replace the env variable's)",
    Repeat.MAP: " (repeatable; each flag's keys are laid over the env variable's, last wins)",
}


def _from_command_line(f: Flag, given: object, env: Mapping[str, str]) -> str | None:
    """The row's text from the command line: argparse's one value, or for a repeatable row its
    list of occurrences comma-joined (a map row's env value first); ``None`` if not given."""
    if given is None or isinstance(given, str):
        return given
    occurrences = [str(v) for v in given] if isinstance(given, list) else [str(given)]
    if f.repeat is Repeat.MAP:
        base = _from_env(f, env)
        occurrences = [base, *occurrences] if base else occurrences
    return ",".join(occurrences)


def _from_env(f: Flag, env: Mapping[str, str]) -> str | None:
    for name in f.env_names:
        if env.get(name, "") != "" or (f.empty_env_overrides and name in env):
            return env[name]
    return None


def doc_default(f: Flag) -> str:
    """A row's default as the docs print it: ``false``, ``5``, ``60s``, ``` `text` ```, empty
    for ``None``, ``""`` for the empty string."""
    value = f.default
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if f.parse is parse_duration and isinstance(value, int | float):
        return f"{value:g}s"
    if isinstance(value, int | float):
        return f"{value:g}"
    return f"`{value}`" if value != "" else '`""`'


def with_doc_table(doc: str, table: FlagTable) -> str:
    """``doc`` (Markdown) with the region between ``<!-- BEGIN FLAGS <prog> -->`` and
    ``<!-- END FLAGS <prog> -->`` replaced by ``table``'s :meth:`FlagTable.markdown`.

    ``hack/gen-flag-docs.py`` writes docs/operators.md with it, and a unit test checks that the
    file is a fixed point, so the docs' tables cannot drift from the code's. Raises
    ``ValueError`` if the markers are missing or out of order."""
    begin, end = f"<!-- BEGIN FLAGS {table.prog} -->\n", f"<!-- END FLAGS {table.prog} -->"
    start, stop = doc.find(begin), doc.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"no {begin.strip()} ... {end} region")
    return doc[: start + len(begin)] + table.markdown() + doc[stop:]
