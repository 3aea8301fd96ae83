"""This node's IMEX readiness, the one rule behind the daemon's probe and its loop, kept light.

Owns :class:`LocalReadiness` and the ``check`` command (:func:`run_check`), the daemon pod's
startup/readiness/liveness exec probe. The control loop (:meth:`pkg.daemon.daemon.Daemon.step`)
asks the same object whether its entry may say ``Ready``, so the probe and the entry cannot
disagree about what ready means: without a clique there is nothing to serve (ready, noop); with
one, ready iff the local IMEX answers ``READY`` to ``nvidia-imex-ctl -q``
(:meth:`pkg.imex.ctl.ImexCtl.query_ready`). How often the loop asks is the loop's business.

The kubelet runs the probe every second until the daemon's pod is started and every 10 s after
that, once per node, so this module imports only the options and ``nvidia-imex-ctl`` query
modules -- not the API client, informers or tracing that ``run`` needs (importing those costs
~0.5 s of CPU per probe in Python).
"""

from __future__ import annotations

from pkg.daemon.options import Options
from pkg.imex.ctl import CommandRunner, ImexCtl, ReadinessResult


class LocalReadiness:
    """Whether this node's IMEX serves the domain (see the module docstring).

    ``ctl`` is the ``nvidia-imex-ctl`` bound to the daemon's config, also used for the peer
    report. :meth:`query` runs at most one command, never raises for an IMEX that is down and
    is safe to call from one thread at a time."""

    def __init__(self, opts: Options, commands: CommandRunner) -> None:
        self.has_clique = bool(opts.clique_id)
        """False: a node without an NVLink clique, where no IMEX runs and ready is a noop."""
        self.ctl = ImexCtl(opts.imex_ctl_argv, config_path=opts.config_path, runner=commands)

    def query(self) -> ReadinessResult:
        """Ready, and what ``nvidia-imex-ctl`` said (for logs and the probe's message)."""
        if not self.has_clique:
            return ReadinessResult(True, "no clique")
        return self.ctl.query_ready()


def run_check(opts: Options, commands: CommandRunner) -> tuple[bool, str]:
    """(ok, message) of one probe: :meth:`LocalReadiness.query` in the probe's words."""
    readiness = LocalReadiness(opts, commands)
    result = readiness.query()
    if not result.ready:
        return False, f"check failed: IMEX daemon not ready: {result.detail}"
    if not readiness.has_clique:
        return True, "check succeeded (noop, clique ID is empty)"
    return True, "check succeeded (IMEX daemon is READY)"
