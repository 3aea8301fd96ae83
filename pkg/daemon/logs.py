"""The daemon's log context: every line names the ComputeDomain and the node.

Invariant: every record -- ours, the Kubernetes client's, the supervisor's -- carries
``cd=<namespace>/<name> cdUID=<uid> node=<node>`` as structured fields, so logs of many daemons
can be merged and still be attributed. The line format itself is the one of every binary
(`pkg.runtime.logsetup`).
"""

from __future__ import annotations

import logging
from typing import TextIO

from pkg.runtime.logsetup import setup_logging


def context_fields(*, cd_namespace: str, cd_name: str, cd_uid: str, node: str) -> dict[str, str]:
    """The fields every daemon line carries (``-`` for an unknown UID or node)."""
    return {"cd": f"{cd_namespace}/{cd_name}", "cdUID": cd_uid or "-", "node": node or "-"}


def configure(
    *,
    verbosity: int,
    context: dict[str, str],
    logging_format: str = "text",
    vmodule: str = "",
    stream: TextIO | None = None,
) -> logging.Handler:
    """Install the process's log handler with ``context`` on every line; see `setup_logging`."""
    return setup_logging(
        verbosity, logging_format=logging_format, vmodule=vmodule, context=context, stream=stream
    )
