"""compute-domain-controller: turns ComputeDomains into IMEX daemons, labels and status.

Thin entry point: makes ``pkg`` importable from any working directory, parses upstream-
compatible flags/env into :class:`pkg.reconcilers.flags.Options` (``--version`` prints the build
and exits 0 first), configures key=value logging (the first line names the build),
maps SIGTERM/SIGINT to a clean stop (workers stop, the lease is released, exit 0) and exits
non-zero when leadership is lost. Everything else lives in :mod:`pkg.reconcilers.app`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

_REPO_ROOT = Path(__file__).resolve().parents[2]
if str(_REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(_REPO_ROOT))

from pkg.reconcilers.app import run  # noqa: E402
from pkg.reconcilers.flags import parse_options  # noqa: E402
from pkg.runtime.logsetup import setup_logging  # noqa: E402


def main(argv: list[str]) -> int:
    options = parse_options(argv, os.environ)
    setup_logging(options.verbosity, logging_format=options.logging_format, vmodule=options.vmodule)
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return run(options, stop=stop)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
