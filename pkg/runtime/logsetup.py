"""Structured ``key=value`` logging for the binaries, configured from klog-style ``-v``.

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

__all__ = ["KeyValueFormatter", "setup_logging", "verbosity_to_level"]

_STANDARD_ATTRS: Final = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "asctime"}
)


def _quote(value: object) -> str:
    text = str(value)
    if text == "" or any(ch in text for ch in ' "=\n\t'):
        escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    return text


class KeyValueFormatter(logging.Formatter):
    """Renders a record as one ``key=value`` line (exceptions follow on their own lines)."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [
            f"ts={ts}.{int(record.msecs):03d}Z",
            f"level={record.levelname.lower()}",
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
    """klog ``-v``: 0-3 → INFO, 4 and above → DEBUG (upstream logs details at V(4)+)."""
    return logging.DEBUG if verbosity >= 4 else logging.INFO


def setup_logging(verbosity: int, *, stream: IO[str] | None = None) -> None:
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_kv_handler", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    handler._kv_handler = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(verbosity_to_level(verbosity))
    # The HTTP client logs every connection at DEBUG; that is noise even at high verbosity.
    logging.getLogger("urllib3").setLevel(logging.WARNING)
