"""Structured ``key=value`` logging for the binaries, configured from klog-style ``-v``.

Verbosity follows klog: ``log.log(V(n), ...)`` is written when ``-v`` >= ``n`` (upstream's
levels: 0 start-up, 2 processing, 4 details, 6 API round trips); ``log.debug`` counts as V(4).

Owns the root handler and the line format
``ts=<RFC3339> level=<lvl> logger=<name> msg="<text>" key=value ...``. Fields passed as
``extra={...}`` (for example ``extra={"key": "ns/name"}``) are appended as ``key=value`` pairs,
so every line of a reconcile carries its object key. Invariants: values containing spaces,
quotes or ``=`` are quoted so a line always splits unambiguously; configuring twice replaces
the handler instead of duplicating output.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import IO, Final

__all__ = ["KeyValueFormatter", "V", "VerbosityFilter", "setup_logging", "verbosity_to_level"]

MAX_V: Final = 9
_DEBUG_V: Final = 4


def V(n: int) -> int:  # noqa: N802 - klog's name
    """The logging level of klog's ``V(n)``: INFO for 0, between DEBUG and INFO for 1..9."""
    if not 0 <= n <= MAX_V:
        raise ValueError(f"klog verbosity must be 0..{MAX_V}, got {n}")
    return logging.INFO - n


for _n in range(1, MAX_V + 1):
    logging.addLevelName(V(_n), f"V{_n}")


class VerbosityFilter(logging.Filter):
    """Passes WARNING/INFO always, ``V(n)`` when ``n <= verbosity``, DEBUG when verbosity >= 4."""

    def __init__(self, verbosity: int) -> None:
        super().__init__()
        self.verbosity = verbosity

    def filter(self, record: logging.LogRecord) -> bool:
        level = record.levelno
        if level >= logging.INFO:
            return True
        if level > logging.DEBUG:
            return logging.INFO - level <= self.verbosity
        return level == logging.DEBUG and self.verbosity >= _DEBUG_V


_STANDARD_ATTRS: Final = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "asctime"}
)


def _quote(value: object) -> str:
    text = str(value)
    if text == "" or any(ch in text for ch in ' "=\n\t'):
        escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    return text


def _level_name(level: int) -> str:
    if logging.DEBUG < level < logging.INFO:
        return "info"  # klog prints every V(n) line as info
    return logging.getLevelName(level).lower()


class KeyValueFormatter(logging.Formatter):
    """Renders a record as one ``key=value`` line (exceptions follow on their own lines)."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [
            f"ts={ts}.{int(record.msecs):03d}Z",
            f"level={_level_name(record.levelno)}",
            f"logger={record.name}",
            f"msg={_quote(record.getMessage())}",
        ]
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                parts.append(f"{key}={_quote(value)}")
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def verbosity_to_level(verbosity: int) -> int:
    """The root logger's threshold for klog ``-v``: the lowest level `VerbosityFilter` may pass.

    0 → INFO; 1..3 → V(1..3); 4 and above → DEBUG (V(n) above ``-v`` is then dropped by the
    filter, so ``log.isEnabledFor`` stays cheap at the default verbosity).
    """
    if verbosity >= _DEBUG_V:
        return logging.DEBUG
    return V(max(0, verbosity))


def setup_logging(verbosity: int, *, stream: IO[str] | None = None) -> None:
    """Install one ``key=value`` handler on the root logger honouring klog ``-v``; idempotent."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_kv_handler", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    handler.addFilter(VerbosityFilter(verbosity))
    handler._kv_handler = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(verbosity_to_level(verbosity))
    # The HTTP client logs every connection at DEBUG; that is noise even at high verbosity.
    logging.getLogger("urllib3").setLevel(logging.WARNING)
