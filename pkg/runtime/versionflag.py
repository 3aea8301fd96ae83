"""The ``--version`` flag every binary shares, as an ``argparse`` action.

Owns what ``--version`` does: print :meth:`BuildInfo.version_line` for the parser's ``prog`` as
one line on stdout and exit 0, the moment ``argparse`` meets the flag, so it needs no other
flag, no environment, no kubeconfig and no API server. Unlike ``argparse``'s own ``version``
action it never re-wraps the line to the terminal width (a full revision would not fit in 80
columns) and writes nothing else.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from pkg.runtime.buildinfo import BuildInfo, load_build_info

__all__ = ["add_version_flag"]


class _VersionAction(argparse.Action):
    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        *,
        load: Callable[[], BuildInfo],
        **kwargs: Any,
    ) -> None:
        kwargs.update(nargs=0, default=argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self._load = load

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        sys.stdout.write(self._load().version_line(parser.prog) + "\n")
        sys.stdout.flush()
        parser.exit(0)


def add_version_flag(
    parser: argparse.ArgumentParser,
    *option_strings: str,
    load: Callable[[], BuildInfo] = load_build_info,
) -> None:
    """Add ``--version`` (or the given spellings) to ``parser``; ``load`` is called only when
    the flag is given. The line names ``parser.prog``, so set ``prog`` to the binary's name."""
    parser.add_argument(
        *(option_strings or ("--version",)),
        action=_VersionAction,
        load=load,
        help="print the version, git revision and build date, then exit",
    )
