"""Logging of every binary, as Kubernetes components log: klog text or component-base JSON.

Owns the root handler, the line formats and the meaning of ``-v``. One setup for the
controller, the kubelet plugin and the daemon:

* **text** (default), klog's header and body::

    I1127 01:23:45.123456   12345 computedomain.py:42] Processing ComputeDomain: ns/cd
    I1127 01:23:45.123456   12345 daemon.py:88] "joined clique" cd="ns/cd" node="n1"

  A record with no structured fields prints its message as is (klog's ``Infof``); one with
  fields (``extra={...}``, or the process context) prints the message quoted, then
  ``key="value"`` pairs (klog's ``InfoS``), except a message of several lines (the start-up
  dump), which stays raw with the pairs after it. Severity letters: I, W, E, F (CRITICAL).
* **json** (``--logging-format=json``), component-base's schema: one object per line with
  ``ts`` (seconds), ``caller``, ``msg``, ``v`` on non-error lines, ``err`` on errors, then
  the fields.

Verbosity follows klog: ``log.log(V(n), ...)`` is written when ``-v`` >= ``n`` (upstream's levels:
0 start-up and config, 1 per-claim results, 2 processing, 3 list/watch, 4 details, 6 API round
trips); ``log.debug`` counts as V(4). ``--vmodule=pattern=N,...`` sets the level per source
file as klog does (``pattern`` is a glob on the file name without ``.py``).

Invariants: configuring twice replaces the handler instead of duplicating output; a record
spans lines only for a traceback or a multi-line message; every field value is quoted in text.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import PurePath
from typing import IO, Final

from pkg.base.verbosity import V

__all__ = [
    "LOG_FORMATS",
    "JsonFormatter",
    "KlogTextFormatter",
    "LoggingConfigError",
    "V",
    "VerbosityFilter",
    "parse_vmodule",
    "setup_logging",
    "validate_logging_format",
    "verbosity_to_level",
]

_DEBUG_V: Final = 4
LOG_FORMATS: Final = ("text", "json")


class LoggingConfigError(ValueError):
    """A ``--logging-format`` or ``--vmodule`` value that cannot be used."""


def _verbosity_of(level: int) -> int:
    """The klog V level of a record level below INFO (DEBUG counts as V(4))."""
    return _DEBUG_V if level <= logging.DEBUG else logging.INFO - level


def validate_logging_format(name: str) -> str:
    """``name`` if it is a supported ``--logging-format``; raises `LoggingConfigError` (its
    message names no flag: `pkg.runtime.flags` prefixes the flag and env variable)."""
    if name not in LOG_FORMATS:
        supported = ", ".join(LOG_FORMATS)
        raise LoggingConfigError(f'Unsupported log format "{name}" (supported: {supported})')
    return name


def parse_vmodule(spec: str) -> tuple[tuple[str, int], ...]:
    """Parse klog's ``--vmodule`` (``pattern=N,pattern=N``); raises `LoggingConfigError` (its
    message names no flag, as `validate_logging_format`'s)."""
    out: list[tuple[str, int]] = []
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        pattern, sep, level = item.partition("=")
        if not sep or not pattern.strip() or not level.strip().isdigit():
            raise LoggingConfigError(
                f'invalid entry "{item}", expected pattern=N (for example computedomain=4)'
            )
        out.append((pattern.strip(), int(level)))
    return tuple(out)


class VerbosityFilter(logging.Filter):
    """Passes WARNING/INFO always, ``V(n)`` when ``n`` is at most the record's file's level
    (``vmodule``'s first matching pattern, else ``verbosity``); DEBUG counts as V(4)."""

    def __init__(self, verbosity: int, vmodule: tuple[tuple[str, int], ...] = ()) -> None:
        super().__init__()
        self.verbosity = verbosity
        self.vmodule = vmodule

    def _limit(self, record: logging.LogRecord) -> int:
        if self.vmodule:
            module = PurePath(record.pathname).stem
            for pattern, level in self.vmodule:
                if fnmatch.fnmatchcase(module, pattern):
                    return level
        return self.verbosity

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.INFO:
            return True
        return _verbosity_of(record.levelno) <= self._limit(record)


_STANDARD_ATTRS: Final = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "taskName"}
)


def _fields(record: logging.LogRecord) -> dict[str, object]:
    """The record's structured fields: the process context first, then ``extra={...}``."""
    fields: dict[str, object] = dict(getattr(record, "_log_context", {}))
    for key, value in record.__dict__.items():
        if key not in _STANDARD_ATTRS and not key.startswith("_"):
            fields[key] = value
    return fields


def _severity(level: int) -> str:
    if level >= logging.CRITICAL:
        return "F"
    if level >= logging.ERROR:
        return "E"
    if level >= logging.WARNING:
        return "W"
    return "I"


def _go_quote(value: object) -> str:
    """Go's ``%q`` of ``str(value)`` for the printable-ASCII-and-UTF-8 cases klog meets."""
    return json.dumps(str(value), ensure_ascii=False)


class KlogTextFormatter(logging.Formatter):
    """klog's text line: ``Lmmdd hh:mm:ss.uuuuuu pid file:line] msg`` (see the module doc)."""

    def format(self, record: logging.LogRecord) -> str:
        """One klog line for ``record``; an exception's traceback follows on its own lines."""
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(record.created))
        micros = int((record.created % 1) * 1_000_000)
        header = (
            f"{_severity(record.levelno)}{stamp}.{micros:06d} {record.process or os.getpid():7d} "
            f"{record.filename}:{record.lineno}] "
        )
        message = record.getMessage()
        fields = _fields(record)
        pairs = [f"{k}={_go_quote(v)}" for k, v in fields.items()]
        if "\n" in message:
            # A dump (the start-up configuration): as klog's Infof prints it, so it stays
            # greppable line by line; the fields close its last line.
            body = " ".join([message, *pairs])
        elif pairs:
            body = " ".join([_go_quote(message), *pairs])
        else:
            body = message
        line = header + body
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """component-base's JSON line: ``{"ts":..,"caller":..,"msg":..,"v":N|"err":..,...}``."""

    def format(self, record: logging.LogRecord) -> str:
        """One JSON object for ``record``; a traceback goes into ``err`` (errors) or ``stack``."""
        obj: dict[str, object] = {
            "ts": round(record.created, 6),
            "caller": f"{record.filename}:{record.lineno}",
            "msg": record.getMessage(),
        }
        if record.levelno >= logging.ERROR:
            obj["err"] = self.formatException(record.exc_info) if record.exc_info else None
        else:
            obj["v"] = 0 if record.levelno >= logging.INFO else _verbosity_of(record.levelno)
            if record.exc_info:
                obj["stack"] = self.formatException(record.exc_info)
        for key, value in _fields(record).items():
            obj.setdefault(key, value if isinstance(value, int | float | bool) else str(value))
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


class _ContextFilter(logging.Filter):
    def __init__(self, context: Mapping[str, str]) -> None:
        super().__init__()
        self._context = dict(context)

    def filter(self, record: logging.LogRecord) -> bool:
        record._log_context = self._context
        return True


def verbosity_to_level(verbosity: int) -> int:
    """The root logger's threshold for klog ``-v``: the lowest level `VerbosityFilter` may pass.

    0 → INFO; 1..3 → V(1..3); 4 and above → DEBUG (V(n) above ``-v`` is then dropped by the
    filter, so ``log.isEnabledFor`` stays cheap at the default verbosity).
    """
    if verbosity >= _DEBUG_V:
        return logging.DEBUG
    return V(max(0, verbosity))


def setup_logging(
    verbosity: int,
    *,
    logging_format: str = "text",
    vmodule: str = "",
    context: Mapping[str, str] | None = None,
    stream: IO[str] | None = None,
) -> logging.Handler:
    """Install one handler on the root logger honouring klog ``-v`` and ``--vmodule``; returns
    it. ``context`` fields (the daemon's domain and node) are added to every line. Idempotent:
    a second call replaces the first handler. Raises `LoggingConfigError` for a bad format or
    vmodule."""
    formatter: logging.Formatter = (
        JsonFormatter()
        if validate_logging_format(logging_format) == "json"
        else KlogTextFormatter()
    )
    modules = parse_vmodule(vmodule)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_klog_handler", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter)
    if context:
        handler.addFilter(_ContextFilter(context))
    handler.addFilter(VerbosityFilter(verbosity, modules))
    handler._klog_handler = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(verbosity_to_level(max([verbosity, *(level for _p, level in modules)])))
    # The HTTP client logs every connection at DEBUG; that is noise even at high verbosity.
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    return handler
