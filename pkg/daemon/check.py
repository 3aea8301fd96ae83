"""The daemon's ``check`` command (its startup/readiness/liveness exec probe), kept light.

Owns :func:`run_check`. The kubelet runs this probe every second until the daemon's pod is
started and every 10 s after that, once per node, so this module imports only the options and
``nvidia-imex-ctl`` query modules -- not the API client, informers or tracing that ``run`` needs
(importing those costs ~0.5 s of CPU per probe in Python).
"""

from __future__ import annotations

from pkg.daemon.options import Options
from pkg.imex.ctl import CommandRunner, ImexCtl


def run_check(opts: Options, commands: CommandRunner) -> tuple[bool, str]:
    """(ok, message) of one probe: ok iff no clique (noop) or the local IMEX answers READY.

    Runs ``nvidia-imex-ctl -q`` once through ``commands``; never raises for an IMEX that is
    down (that is a failed check, with the reason in the message)."""
    if not opts.clique_id:
        return True, "check succeeded (noop, clique ID is empty)"
    result = ImexCtl(
        opts.imex_ctl_argv, config_path=opts.config_path, runner=commands
    ).query_ready()
    if result.ready:
        return True, "check succeeded (IMEX daemon is READY)"
    return False, f"check failed: IMEX daemon not ready: {result.detail}"
