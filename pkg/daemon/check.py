"""This node's IMEX readiness, the one rule behind the daemon's probe and its loop, kept light.

Owns :class:`LocalReadiness` and the ``check`` command (:func:`run_check`), the daemon pod's
startup/readiness/liveness exec probe. The control loop (:meth:`pkg.daemon.daemon.Daemon.step`)
asks the same object whether its entry may say ``Ready``, so the probe and the entry cannot
disagree about what ready means: without a clique there is nothing to serve (ready, noop); with
one, ready iff the local IMEX answers ``READY`` to ``nvidia-imex-ctl -q``
(:meth:`pkg.imex.ctl.ImexCtl.query_ready`). How often the loop asks is the loop's business.

The probe and the loop share the work of noticing an IMEX that stops being ready: the kubelet
runs the readiness probe every 10 s anyway, so a probe that finds IMEX not ready tells the loop
at once (:func:`notify_not_ready`, one datagram to the :class:`ProbeNotices` the loop listens
on), and the loop, which re-checks by itself, need not run ``nvidia-imex-ctl -q`` every 10 s
too while Ready. The notice is a hint, never a verdict: it carries nothing, the loop answers it
with its own query (so a stray datagram costs at most one rate-limited query), and the probe's
own answer is the same with or without a listener. The address is an abstract Unix socket
(:func:`notice_address`; no file, so no path length limit and nothing left behind), named after
the domain, node and config directory; the probe runs in the daemon container's network
namespace, where only that container's processes reach it.

The kubelet runs the probe every second until the daemon's pod is started and every 10 s after
that, once per node, so this module imports only the options and ``nvidia-imex-ctl`` query
modules -- not the API client, informers or tracing that ``run`` needs (importing those costs
~0.5 s of CPU per probe in Python).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Final

from pkg.daemon.options import Options
from pkg.imex.ctl import CommandRunner, ImexCtl, ReadinessResult

log = logging.getLogger(__name__)

# What a notice says (the loop ignores the content; it only helps someone reading strace).
NOT_READY_NOTICE: Final = b"not-ready"


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


def notice_address(opts: Options) -> bytes:
    """The abstract Unix socket address (leading NUL) on which this daemon's loop hears from
    its probe: one per domain, node and config directory, the same in both processes."""
    key = "\0".join((opts.domain_uid, opts.node_name, os.path.realpath(opts.config_dir)))
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return b"\0compute-domain-daemon/probe/" + digest.encode()


def notify_not_ready(opts: Options) -> bool:
    """Tell the daemon loop of ``opts`` that a probe found its IMEX not ready; True if the
    datagram was handed over. Never blocks and never raises: no listener (no daemon, or it
    could not listen) or a full queue only means the loop finds out by its own poll."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            sock.sendto(NOT_READY_NOTICE, notice_address(opts))
    except OSError as err:
        log.debug("could not notify the daemon loop: %s", err)
        return False
    return True


class ProbeNotices:
    """The loop's end of :func:`notify_not_ready`: a thread blocked on the notice socket calls
    ``on_notice`` for every datagram, until :meth:`close`. Nothing runs between notices."""

    def __init__(self, address: bytes, on_notice: Callable[[], None]) -> None:
        self._address = address
        self._on_notice = on_notice
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()

    def start(self) -> bool:
        """Listen; False (and nothing runs) if the address cannot be bound, e.g. another
        process of the same daemon still holds it. Call at most once."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(self._address)
        except OSError as err:
            sock.close()
            log.info("not listening for readiness probe notices: %s", err)
            return False
        self._sock = sock
        self._thread = threading.Thread(
            target=self._receive, args=(sock,), name="probe-notices", daemon=True
        )
        self._thread.start()
        return True

    def close(self) -> None:
        """Stop listening and wait for the thread; idempotent, safe without :meth:`start`."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        self._closing.set()
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked recv with b""
        if self._thread is not None:
            self._thread.join(5.0)
        sock.close()

    def _receive(self, sock: socket.socket) -> None:
        while True:
            try:
                sock.recv(64)
            except OSError:
                return
            if self._closing.is_set():
                return
            self._on_notice()  # an empty datagram is a notice too; only close ends the loop


def run_check(opts: Options, commands: CommandRunner) -> tuple[bool, str]:
    """(ok, message) of one probe: :meth:`LocalReadiness.query` in the probe's words. A failed
    probe also tells the daemon loop (:func:`notify_not_ready`); its answer does not depend on
    whether anyone listens."""
    readiness = LocalReadiness(opts, commands)
    result = readiness.query()
    if not result.ready:
        notify_not_ready(opts)
        return False, f"check failed: IMEX daemon not ready: {result.detail}"
    if not readiness.has_clique:
        return True, "check succeeded (noop, clique ID is empty)"
    return True, "check succeeded (IMEX daemon is READY)"
