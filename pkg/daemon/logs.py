"""Logging setup for the daemon: ``key=value`` lines that always name the CD and the node.

Owns the root handler of the daemon process. Invariant: every record -- ours, the Kubernetes
client's, the supervisor's -- carries ``cd=<namespace>/<name> cdUID=<uid> node=<node>``, so
logs of many daemons can be merged and still be attributed.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

from pkg.runtime.logsetup import VerbosityFilter, verbosity_to_level


class _ContextFilter(logging.Filter):
    def __init__(self, context: str) -> None:
        super().__init__()
        self._context = context

    def filter(self, record: logging.LogRecord) -> bool:
        record.context = self._context
        return True


def context_string(*, cd_namespace: str, cd_name: str, cd_uid: str, node: str) -> str:
    return f"cd={cd_namespace}/{cd_name} cdUID={cd_uid or '-'} node={node or '-'}"


def configure(*, verbosity: int, context: str, stream: TextIO | None = None) -> logging.Handler:
    """Install one stderr handler on the root logger honouring klog ``-v`` (`VerbosityFilter`)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(_ContextFilter(context))
    handler.addFilter(VerbosityFilter(verbosity))
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s level=%(levelname)s logger=%(name)s %(context)s msg=%(message)s"
        )
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(verbosity_to_level(verbosity))
    # The HTTP stack is chatty at debug and says nothing the daemon does not log itself.
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    return handler
