"""Entry point of ``compute-domain-daemon`` (``run`` | ``check``); see pkg.daemon.options.

Thin by design: parse flags and env, configure logging, build the real dependencies (API
client, clocks, process runner, tracing from the standard ``OTEL_*`` env) and hand over to
:class:`pkg.daemon.daemon.Daemon`. Runnable as
``python cmd/compute-domain-daemon/compute_domain_daemon.py run`` from any directory.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from pkg.base.clock import RealClock  # noqa: E402
from pkg.daemon import logs  # noqa: E402
from pkg.daemon.daemon import Daemon, run_check  # noqa: E402
from pkg.daemon.metrics import DaemonMetrics  # noqa: E402
from pkg.daemon.options import OptionsError, parse  # noqa: E402
from pkg.imex.ctl import SubprocessCommandRunner  # noqa: E402
from pkg.imex.supervisor import SubprocessRunner  # noqa: E402
from pkg.kube.client import RestClient  # noqa: E402
from pkg.kube.config import load_api_client  # noqa: E402
from pkg.kube.events import EventRecorder  # noqa: E402
from pkg.runtime.tracing import setup_tracing  # noqa: E402


def main(argv: list[str]) -> int:
    try:
        opts = parse(argv, os.environ)
        if opts.command == "run":
            opts.validate_run()
    except OptionsError as err:
        sys.stderr.write(f"compute-domain-daemon: error: {err}\n")
        return 1
    context = logs.context_string(cd_namespace=opts.domain_namespace, cd_name=opts.domain_name,
                                  cd_uid=opts.domain_uid, node=opts.node_name)  # fmt: skip
    logs.configure(verbosity=opts.verbosity, context=context)

    if opts.command == "check":
        ok, message = run_check(opts, SubprocessCommandRunner())
        (sys.stdout if ok else sys.stderr).write(message + "\n")
        return 0 if ok else 1

    client = RestClient(load_api_client(opts.kubeconfig), qps=5, burst=10)
    child_env = dict(os.environ)
    tracing = setup_tracing("compute-domain-daemon", env=os.environ)
    clock = RealClock()
    daemon = Daemon(opts, client=client, clock=clock, runner=SubprocessRunner(),
                    commands=SubprocessCommandRunner(), metrics=DaemonMetrics(),
                    child_env=child_env, informer_clock=RealClock(),
                    events=EventRecorder(client, "compute-domain-daemon", clock),
                    tracer=tracing.tracer)  # fmt: skip
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        del signum
        stop.set()
        daemon.wake()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        return daemon.run(stop)
    finally:
        tracing.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
