"""Entry point of ``compute-domain-daemon`` (``run`` | ``check`` | ``--version``); see
pkg.daemon.options.

Thin by design: parse flags and env (``--version`` prints the build and exits before either is
needed), configure logging, log the build as ``run``'s first line, build the real dependencies
(API client, clocks, process runner, tracing from the standard ``OTEL_*`` env) and hand over to
:class:`pkg.daemon.daemon.Daemon`. Runnable as
``python cmd/compute-domain-daemon/compute_domain_daemon.py run`` from any directory.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

# Only what both commands need at module level. ``check`` (the pod's exec probe, started every
# second until the daemon is up) imports its own part; ``run`` sends its first API request (the
# pod label) before it imports the informers, IMEX supervision, metrics and tracing.
from pkg.daemon import logs  # noqa: E402
from pkg.daemon.options import Options, OptionsError, parse  # noqa: E402

PROG = "compute-domain-daemon"


def main(argv: list[str]) -> int:
    try:
        opts = parse(argv, os.environ)
        if opts.command == "run":
            opts.validate_run()
    except OptionsError as err:
        sys.stderr.write(f"{PROG}: error: {err}\n")
        return 1
    context = logs.context_fields(
        cd_namespace=opts.domain_namespace,
        cd_name=opts.domain_name,
        cd_uid=opts.domain_uid,
        node=opts.node_name,
    )
    logs.configure(
        verbosity=opts.verbosity,
        context=context,
        logging_format=opts.logging_format,
        vmodule=opts.vmodule,
    )

    if opts.command == "check":
        from pkg.daemon.check import run_check  # noqa: PLC0415
        from pkg.imex.ctl import SubprocessCommandRunner  # noqa: PLC0415

        ok, message = run_check(opts, SubprocessCommandRunner())
        (sys.stdout if ok else sys.stderr).write(message + "\n")
        return 0 if ok else 1
    return _run(opts)


def _run(opts: Options) -> int:
    """``run``: wire the real dependencies and run the daemon until SIGTERM/SIGINT.

    Order matters for start-up latency (every formation waits for its daemons): the API client
    and the pod labeller come first and the label's PATCH goes out on its own thread while the
    rest of the daemon is imported."""
    from pkg.base.clock import RealClock  # noqa: PLC0415
    from pkg.daemon.podlabel import PodLabeller  # noqa: PLC0415
    from pkg.kube.client import RestClient  # noqa: PLC0415
    from pkg.kube.config import KubeConfigError, load_api_client  # noqa: PLC0415
    from pkg.runtime.buildinfo import load_build_info  # noqa: PLC0415
    from pkg.runtime.startupconfig import startup_config  # noqa: PLC0415

    build_info = load_build_info()
    logging.getLogger(PROG).info("%s", build_info.startup_message(PROG))
    flags = {"command": opts.command, **dict(opts.flag_values)}
    logging.getLogger(PROG).info(
        "%s",
        startup_config(
            revision=build_info.revision,
            gates=opts.gates.all_values(),
            flags=flags,
            type_name="*main.Flags",
        ),
    )
    try:
        connection = load_api_client(opts.kubeconfig)
    except KubeConfigError as err:
        logging.getLogger(PROG).error("cannot start: %s", err)
        return 1
    client = RestClient(connection, qps=5, burst=10)
    clock = RealClock()
    stop = threading.Event()
    labeller = PodLabeller(
        client,
        clock,
        pod_name=opts.pod_name,
        pod_namespace=opts.pod_namespace,
        clique_id=opts.clique_id,
    )
    labeller.start(stop)

    from pkg.daemon.daemon import Daemon  # noqa: PLC0415
    from pkg.daemon.metrics import DaemonMetrics  # noqa: PLC0415
    from pkg.imex.ctl import SubprocessCommandRunner  # noqa: PLC0415
    from pkg.imex.supervisor import SubprocessRunner  # noqa: PLC0415
    from pkg.kube.events import EventRecorder  # noqa: PLC0415
    from pkg.runtime.tracing import setup_tracing  # noqa: PLC0415

    child_env = dict(os.environ)
    tracing = setup_tracing(PROG, env=os.environ)
    daemon = Daemon(
        opts,
        client=client,
        clock=clock,
        runner=SubprocessRunner(),
        commands=SubprocessCommandRunner(),
        metrics=DaemonMetrics(build_info=build_info),
        child_env=child_env,
        informer_clock=RealClock(),
        events=EventRecorder(client, PROG, clock),
        tracer=tracing.tracer,
        labeller=labeller,
    )

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
