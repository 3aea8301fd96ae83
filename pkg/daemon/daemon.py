"""The ``run`` and ``check`` behaviour of ``compute-domain-daemon``: all parts wired together.

Owns the daemon's one control loop. Threads: a `pkg.informers` SharedInformer following the
membership object (field selector ``metadata.name=<object>``; its event handler only wakes the
loop and the membership's :class:`~pkg.daemon.membership.CacheView`; both read the object through
the informer's `Lister`, so membership writes need no GET before each attempt; no resync,
unlike upstream's 4-minute one: the loop is level-triggered, so replaying the one cached object
would only wake it), the optional metrics server, a short-lived one that labels our pod with
its clique ID (retrying until it succeeds or we stop; on an NVLink node nothing waits for it,
so the join does not queue behind it),
and the loop itself, which does everything else in order so no two actions race:
supervise IMEX (reap an exit, restart after the backoff), make sure our entry exists with our
IP, apply the membership to IMEX (:mod:`pkg.daemon.imexsync`), and publish our readiness.

The loop has no tick: after a pass it sleeps until its next deadline (a
readiness query or peer poll due, our entry's held-back Ready, the supervisor's restart or
deferred reload, the end of ``controller_join_grace``, the retry of a failed pass:
``error_retry``, ``fast_interval`` while not Ready) or until it is kicked: a membership event,
the ``nvidia-imex`` child's exit (the supervisor's exit watcher, a thread blocked in the child's
``wait()``), a readiness probe that found IMEX not ready (:class:`~pkg.daemon.check.ProbeNotices`,
a thread blocked on its socket), shutdown. With nothing due (IP mode
behind its ``numNodes`` barrier, say) it sleeps until kicked. Each pass re-reads the hosts
file (DNS mode) or ``nodes.cfg`` (IP mode) before writing it, so a block someone else removed
is put back at the next pass; nothing signals such an edit (the kubelet writes the pod's
``/etc/hosts`` only when it starts the container, which restarts us too), so no timer is spent
on it: while Ready the next pass comes at the latest with the next readiness re-check.

Readiness: Ready iff the supervised IMEX runs and ``nvidia-imex-ctl -q`` prints exactly READY.
While not ready it is polled at once after IMEX (re)starts, then after ``first_ready_poll``,
doubling up to ``fast_interval`` (a fresh IMEX is usually ready within tens of milliseconds, and
the Ready signal releases the workload's Prepare); once ready every
``ready_recheck_interval`` (60 s), at once when the process dies and, at most once per
``fast_interval``, when the pod's readiness probe (``check``, every 10 s) found IMEX not ready
and told the loop so: the probe already runs the same query, so the loop does not repeat it
every 10 s, and its own 60 s re-check is the safety net for a probe that does not run or cannot
reach the loop. A process that cannot listen for the probe (another daemon process of the
domain holds the address) re-checks every ``slow_interval`` (10 s) instead. Membership changes
wake the loop but do not add polls. The
entry's ``status`` follows it. On the node, the readiness record of :mod:`pkg.api.localready`
(``daemon-ready.json`` in the config directory, which the kubelet plugin mounts) follows it
too, written *before* ``Ready`` is published through the API server (that write waits a
random share of ``ready_write_spread``: the daemons one controller batch joined turn ready
together, and their patches of the one clique made the API server retry each of them and the
controller's next join for about a second) and withdrawn before ``NotReady`` is, at process
start and at shutdown: the plugin releases a waiting workload on
either, so on a forming domain a workload does not wait for its daemon's write to the clique
all daemons write. The first pass of every process marks the entry NotReady
*before* IMEX is started: a daemon restarted in the same pod (after a SIGKILL or an OOM kill,
same IP) finds the entry its predecessor left ``Ready``, and no workload may be released
against an IMEX daemon that is not up yet. (While no daemon runs
at all, the controller marks the entry NotReady from the pod status.)

Peer connectivity (clique mode): while Ready and the clique has peers, every ``peer_interval``
(the first time one ``peer_interval`` after IMEX turned Ready or the first peer came: a fresh
IMEX is still connecting, so an earlier poll would report a partial count and cost a forming
domain one more write per daemon, on the one object all its daemons write), doubling up to
``peer_max_interval`` (30 s) for each poll that sees exactly what the previous one saw (the
connection table and the report) with the report published, and back to ``peer_interval`` after
a poll that saw a change, one that got no answer, and whenever a peer's entry changes (joined,
left, readiness, IP, its own report: the next poll then comes within ``peer_interval``), the
loop runs ``nvidia-imex-ctl -N -j`` and writes into its
entry how many clique peers its IMEX is connected to and which it cannot reach
(:mod:`pkg.daemon.peers`; a peer only after two polls in a row that did not find it
connected; only Ready peers can be unreachable); a write happens only when that changed, and a
change of the count alone (no peer newly unreachable, no problem resolved, not all connected)
at most every ``peer_count_interval`` (30 s): the first report, a newly unreachable peer, the
last one reachable again and "all connected" are written at once.
A daemon alone in its clique writes nothing (it clears a stale list of unreachable
peers). Output IMEX cannot give (not running, unparsable) leaves the last report in place.
The controller turns the reports into the domain's ``IMEXConnected`` condition.

A full clique (``MAX_NODES_PER_IMEX_DOMAIN`` daemons already joined) cannot take our entry:
the daemon says so once at ERROR level and retries when the clique changes or every
``slow_interval``; the controller turns it into the domain's ``CapacityExceeded`` condition and
Warning Events.

Non-NVLink node (empty ``CLIQUE_ID``): label the pod, start nothing, write nothing, wait for
shutdown; ``check`` always succeeds. Shutdown (SIGTERM): remove our entry (bounded by
``leave_timeout``), then stop IMEX.

Incomplete driver root: ``nvidia-imex`` and ``nvidia-imex-ctl`` reach the container only through
the kubelet plugin's CDI spec, so before anything else :meth:`Daemon.run` checks that both can
be executed. If not, it records a Warning Event ``DriverRootIncomplete`` on its pod, writes
``DriverRootIncomplete: <detail>`` to the termination log (the kubelet copies it into the pod
status, where the controller turns it into the ComputeDomain's condition) and exits with
:data:`EXIT_DRIVER_ROOT_INCOMPLETE` -- a visible CrashLoopBackOff instead of a silent retry loop;
a fixed driver root is picked up at the next restart.

IMEX's ports: whenever IMEX does not run (from before the informers open their connections,
and after each exit until the restart) the daemon holds IMEX's server and command ports on the
pod IP (:mod:`pkg.imex.ports`), so none of the pod's own outbound connections gets one as its
ephemeral local port and keeps IMEX from listening; the reservation is released right before
each start (:class:`PortsReleasingRunner`). A port some other socket already holds is logged.

IMEX that does not get ready: once IMEX has not been ready for ``IMEX_START_TIMEOUT`` seconds
(60; since the loop began, or since IMEX was last ready; IP mode's ``numNodes`` barrier does
not count), the daemon logs a WARNING and records one Warning Event
:data:`REASON_IMEX_NOT_READY` on its pod naming the node and the last error it saw (a port
held by another socket, the supervisor's last exit or failed start, the readiness query's
answer, a failed pass, the wait for the controller's entry); once per stretch, and the loop
wakes for that deadline even when nothing else is due.

Tracing: with a ``TRACEPARENT`` from the plugin and tracing on, the run from start to the first
Ready publishes this daemon's spans of the domain's formation trace (:mod:`pkg.daemon.formation`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from opentelemetry import trace

from pkg import informers
from pkg.api import constants as c
from pkg.api import localready
from pkg.api.daemonentry import DaemonEntry
from pkg.base.clock import Clock, RealClock
from pkg.base.files import write_file_atomically
from pkg.base.types import JSON
from pkg.daemon.check import LocalReadiness, ProbeNotices, notice_address
from pkg.daemon.formation import DaemonFormation
from pkg.daemon.imexsync import ImexSync
from pkg.daemon.membership import (
    CacheView,
    CliqueFullError,
    CliqueStore,
    EntryStore,
    Identity,
    Membership,
    MembershipError,
    StatusStore,
)
from pkg.daemon.metrics import DaemonMetrics
from pkg.daemon.options import Options
from pkg.daemon.peers import clique_peers, peer_report
from pkg.daemon.podlabel import PodLabeller
from pkg.featuregates import COMPUTE_DOMAIN_CLIQUES, IMEX_DAEMONS_WITH_DNS_NAMES
from pkg.imex import nodesconfig
from pkg.imex.config import DOMAIN_ID_ENV, HOSTS_FILE_ENV, ImexConfig
from pkg.imex.ctl import CommandRunner, peer_connections
from pkg.imex.hosts import HostsFile
from pkg.imex.ports import PortReservation
from pkg.imex.supervisor import Process, ProcessRunner, Supervisor
from pkg.kube import resources as res
from pkg.kube.client import KubeClient
from pkg.kube.errors import ApiError, ConnectionFailedError
from pkg.kube.events import WARNING, EventRecorder
from pkg.kube.resources import Resource

log = logging.getLogger(__name__)


# Exit code of `Daemon.run` when the IMEX binaries are not in the container.
EXIT_DRIVER_ROOT_INCOMPLETE: Final = 3
# The kubelet keeps at most this much of a termination message.
TERMINATION_MESSAGE_LIMIT: Final = 4096
# Warning Event on the daemon's pod: IMEX not ready within ``Options.imex_start_timeout``.
REASON_IMEX_NOT_READY: Final = "IMEXNotReady"

# Failed list/watch calls of the membership informer back off 0.4 s .. 10 s (+25 % jitter).
WATCH_BACKOFF = informers.BackoffPolicy(initial=0.4, cap=10.0, jitter=0.25)


@dataclass(frozen=True)
class Timing:
    fast_interval: float = 0.5
    first_ready_poll: float = 0.05
    ready_write_spread: float = 0.3  # the entry's Ready waits uniform(0, this) after the record
    slow_interval: float = 10.0
    # While Ready and the readiness probe can notify the loop (check.ProbeNotices): the loop's
    # own readiness re-check, a safety net for a probe that does not run or cannot tell it.
    ready_recheck_interval: float = 60.0
    error_retry: float = 1.0  # a failed pass is retried after this (fast_interval if not Ready)
    leave_timeout: float = 10.0
    imex_stop_timeout: float = 10.0
    resync_seconds: int = 0  # the loop is level-triggered: a replay of the cache adds nothing
    peer_interval: float = 5.0
    peer_max_interval: float = 30.0  # peer polls double up to this while nothing changes
    peer_count_interval: float = 30.0  # least time between writes of a partial connected count
    controller_join_grace: float = 10.0  # CLIQUE_JOIN_BY_CONTROLLER: wait this long for the entry
    watch_backoff: informers.BackoffPolicy = WATCH_BACKOFF


def identity(opts: Options) -> Identity:
    return Identity(
        domain_uid=opts.domain_uid,
        domain_name=opts.domain_name,
        domain_namespace=opts.domain_namespace,
        clique_id=opts.clique_id,
        node_name=opts.node_name,
        pod_ip=opts.pod_ip,
        pod_name=opts.pod_name,
        pod_uid=opts.pod_uid,
        pod_namespace=opts.pod_namespace,
    )


def imex_child_env(opts: Options, base: dict[str, str]) -> dict[str, str]:
    """Env for IMEX: tells a simulated IMEX which hosts file we maintain and our domain."""
    return {**base, HOSTS_FILE_ENV: opts.hosts_file, DOMAIN_ID_ENV: opts.domain_uid}


def path_lookup(env: Mapping[str, str]) -> Callable[[str], str | None]:
    """Executable lookup the way ``exec`` does it: a name with a slash as is, else ``PATH``."""
    search = env.get("PATH", os.defpath)

    def locate(program: str) -> str | None:
        if "/" in program:
            return program if os.path.isfile(program) and os.access(program, os.X_OK) else None
        return shutil.which(program, path=search)

    return locate


def missing_imex_programs(opts: Options, locate: Callable[[str], str | None]) -> list[str]:
    """The IMEX programs (``argv[0]`` of ``nvidia-imex`` and ``nvidia-imex-ctl``) not found."""
    return [argv[0] for argv in (opts.imex_argv, opts.imex_ctl_argv) if locate(argv[0]) is None]


def write_termination_message(path: str, message: str) -> bool:
    """Write the container's termination message if ``path`` exists (the kubelet creates it;
    outside a pod nothing is created); True if written."""
    if not os.path.isfile(path):
        return False
    try:
        with open(path, "w", encoding="utf-8") as log_file:
            log_file.write(message[:TERMINATION_MESSAGE_LIMIT])
    except OSError as err:
        log.warning("cannot write termination message to %s: %s", path, err)
        return False
    return True


class PortsReleasingRunner:
    """A :class:`ProcessRunner` that hands IMEX its ports: the daemon's reservation of them
    (:mod:`pkg.imex.ports`) is released right before the child is started."""

    def __init__(self, runner: ProcessRunner, ports: PortReservation) -> None:
        self._runner = runner
        self._ports = ports

    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None) -> Process:
        """Release the reserved ports, then start ``argv`` with the wrapped runner."""
        self._ports.release()
        return self._runner.start(argv, env=env)


class Daemon:
    def __init__(
        self,
        opts: Options,
        *,
        client: KubeClient,
        clock: Clock,
        runner: ProcessRunner,
        commands: CommandRunner,
        metrics: DaemonMetrics,
        child_env: dict[str, str],
        timing: Timing | None = None,
        informer_clock: Clock | None = None,
        events: EventRecorder | None = None,
        locate: Callable[[str], str | None] | None = None,
        tracer: trace.Tracer | None = None,
        rng: random.Random | None = None,
        labeller: PodLabeller | None = None,
        ports: PortReservation | None = None,
    ) -> None:
        """``clock`` (`pkg.base.Clock`) paces the loop and IMEX supervision;
        ``informer_clock`` (real by default) times the membership informer;
        ``events`` records Events on the daemon's pod (none when absent); ``locate`` finds an
        executable (default: `path_lookup` over ``child_env``); ``tracer`` records this
        daemon's part of the domain's formation trace (:mod:`pkg.daemon.formation`);
        ``labeller`` labels the daemon's pod (`pkg.daemon.podlabel`; the entry point passes the
        one it started before importing this module, a new one is made when absent);
        ``ports`` holds IMEX's ports while IMEX does not run (default: the pod IP's server and
        command ports, `pkg.imex.ports`)."""
        self.opts = opts
        self.labeller = labeller or PodLabeller(
            client,
            clock,
            pod_name=opts.pod_name,
            pod_namespace=opts.pod_namespace,
            clique_id=opts.clique_id,
        )
        self._events = events
        self._locate = locate or path_lookup(child_env)
        self.me = identity(opts)
        self._client = client
        self._clock = clock
        self._metrics = metrics
        self._timing = timing or Timing()
        self._dns = opts.gates.enabled(IMEX_DAEMONS_WITH_DNS_NAMES)
        self.store: EntryStore = (
            CliqueStore(client, self.me)
            if opts.gates.enabled(COMPUTE_DOMAIN_CLIQUES)
            else StatusStore(client, self.me)
        )
        self.ports = ports or PortReservation(opts.pod_ip, (opts.server_port, opts.cmd_port))
        self._port_problem = ""  # why a port could not be reserved (another socket holds it)
        self.supervisor = Supervisor(
            [*opts.imex_argv, "-c", opts.config_path],
            runner=PortsReleasingRunner(runner, self.ports),
            clock=clock,
            env=imex_child_env(opts, child_env),
            observer=metrics,
            stop_timeout=self._timing.imex_stop_timeout,
            on_exit=self.wake,  # the loop does not poll the child: its exit wakes it
        )
        self.readiness = LocalReadiness(opts, commands)
        self._probe_notice = threading.Event()  # the readiness probe found IMEX not ready
        self.notices = ProbeNotices(notice_address(opts), self._on_probe_notice)
        self._ready_recheck = self._timing.slow_interval  # ready_recheck_interval once listening
        self.ctl = self.readiness.ctl
        self.sync = ImexSync(
            self.me,
            dns_names=self._dns,
            max_nodes=opts.max_nodes,
            hosts=HostsFile(opts.hosts_file, name_prefix=nodesconfig.NAME_PREFIX),
            nodes_config_path=opts.nodes_config_path,
            process=self.supervisor,
            peers=metrics.peers,
        )
        self._kick = threading.Event()
        watched: Resource = (
            res.COMPUTE_DOMAIN_CLIQUES
            if isinstance(self.store, CliqueStore)
            else res.COMPUTE_DOMAINS
        )
        self.informers = informers.SharedInformerFactory(
            client,
            clock=informer_clock or RealClock(),
            resync_period=float(self._timing.resync_seconds),
            backoff=self._timing.watch_backoff,
        )
        self._informer = self.informers.informer_for(
            watched, self.store.namespace, field_selector=f"metadata.name={self.store.name}"
        )
        self._lister = informers.Lister(self._informer.indexer, watched)
        self.cache = CacheView(
            lambda: self._lister.get(self.store.name, self.store.namespace),
            self._informer.wait_for_sync,
        )
        self.membership = Membership(
            self.store,
            self.me,
            max_nodes=opts.max_nodes,
            cache=self.cache,
            on_conflict=metrics.conflict,
        )
        self._informer.add_event_handler(
            on_add=lambda _obj: self._changed(),
            on_update=lambda _old, _new: self._changed(),
            on_delete=lambda _obj: self._changed(),
        )
        self._ready = False
        self._local_ready = False  # our node-local readiness record is written
        self.local = localready.Publisher(opts.config_dir)
        self._next_ready_check = 0.0
        self._ready_queried_at = float("-inf")  # monotonic time of our last readiness query
        self._ready_polls = 0  # not-ready answers since IMEX last (re)started
        self._rng = rng or random.Random()
        self._ready_write_at: float | None = None  # monotonic: when the entry may say Ready
        self._first_pass = True
        self._join_since: tuple[float, float] | None = None  # first pass: monotonic, wall
        self._last_error = ""
        self._pass_error = ""  # the error of the last failed pass ("" after a good one)
        self._ready_detail = ""  # what the last readiness query said
        self._awaiting = ""  # what the first pass waits for, while it waits
        # IMEX not ready since (monotonic; None while ready), and whether that was reported.
        self._not_ready_since: float | None = None
        self._not_ready_warned = False
        self._ever_ready = False
        self._next_peer_check = 0.0
        self._peer_active = False  # peer polls run (Ready, clique mode, peers or a stale list)
        self._peer_members: tuple[DaemonEntry, ...] = ()  # the peers' entries at the last pass
        self._peer_backoff = self._timing.peer_interval  # the next interval between peer polls
        self._peer_seen: object = None  # (connections, report) of the last peer poll
        self._peer_count_written = float("-inf")  # monotonic time of our last connectivity write
        self._peer_written: tuple[int, tuple[str, ...]] | None = None  # our last report
        self._peer_suspects: set[str] = set()
        self.formation = DaemonFormation(
            tracer or trace.NoOpTracer(),
            opts.traceparent,
            now=clock.now,
            attributes={
                "k8s.node.name": opts.node_name,
                "k8s.pod.name": opts.pod_name,
                "imex.clique.id": opts.clique_id,
            },
        )

    def wake(self) -> None:
        """Run the loop now (new object, or shutdown requested)."""
        self._kick.set()

    def _changed(self) -> None:
        self.cache.notify()
        self.wake()

    def _on_probe_notice(self) -> None:
        """A readiness probe found our IMEX not ready: re-check it now (`_check_ready`)."""
        self._probe_notice.set()
        self.wake()

    # -- pieces ----------------------------------------------------------------------------------

    def label_pod(self) -> None:
        """Label our pod with the clique ID (``""`` on non-NVLink nodes), as upstream does; one
        PATCH (`PodLabeller.label`)."""
        self.labeller.label()

    def _snapshot(self) -> tuple[list[DaemonEntry], JSON | None] | None:
        """The membership object as last observed (None until the informer's first list)."""
        if not self._informer.has_synced():
            return None
        obj = self._lister.get(self.store.name, self.store.namespace)
        return (list(self.store.decode(obj).entries) if obj else []), obj

    def _check_ready(self) -> bool:
        """Our IMEX's readiness, queried when due (module docstring): at once after a
        (re)start, then on the not-ready schedule; while Ready every ``_ready_recheck`` and
        soon after a probe said not ready (at most once per ``fast_interval``)."""
        notice = self._probe_notice.is_set()
        self._probe_notice.clear()
        if not self.supervisor.running():
            self._ready_polls, self._next_ready_check = 0, 0.0  # poll the next one at once
            return False
        now = self._clock.monotonic()
        if notice and self._ready:  # not while not Ready: then it is polled often anyway
            soonest = max(now, self._ready_queried_at + self._timing.fast_interval)
            self._next_ready_check = min(self._next_ready_check, soonest)
        if now < self._next_ready_check:
            return self._ready
        result = self.readiness.query()
        self._ready_queried_at = now
        self._ready_detail = result.detail
        if result.ready:
            interval = self._ready_recheck
        else:
            t = self._timing
            interval = min(t.fast_interval, t.first_ready_poll * 2 ** min(self._ready_polls, 16))
            self._ready_polls += 1
        self._next_ready_check = now + interval
        if result.ready != self._ready:
            log.info("local IMEX readiness: %s (%s)", result.ready, result.detail)
        return result.ready

    def step(self) -> None:
        """One pass of the control loop (public for tests): keep our entry in the membership
        object, feed the members to IMEX, then publish our readiness (and peer connectivity)."""
        self.supervisor.tick()
        if not self.supervisor.running():
            self._reserve_ports()  # no connection of ours may take IMEX's ports meanwhile
        joined = self._ensure_joined()
        if joined is None:
            return
        entries, own, obj = joined
        self._run_imex(entries, obj)
        self._publish_readiness(entries, own)

    def _ensure_joined(self) -> tuple[list[DaemonEntry], DaemonEntry | None, JSON | None] | None:
        """The members, our entry and the membership object after making sure we are in it:
        the first pass joins as NotReady (or takes back a Ready left by this pod's previous
        container); later passes rejoin if our entry is gone or carries another IP. None while
        we wait for the controller to write our entry."""
        snap = self._snapshot()
        entries, obj = snap if snap is not None else ([], None)
        own = self.membership.own_entry(entries)
        if self._first_pass:
            if self._join_since is None:
                self._join_since = (self._clock.monotonic(), self._clock.now())
            if self._awaiting_controller(own):
                self._awaiting = f"its entry in {self._where()} from the controller"
                return None
            self._awaiting = ""
            # Joins, or takes back a Ready left by this pod's previous container.
            started = self._join_since[1]
            entries = self.membership.set_status(c.STATUS_NOT_READY)
            self.formation.joined(started, self._clock.now())
            own = self.membership.own_entry(entries)
            obj = self.membership.last_object
            self._first_pass = False
        elif snap is None or own is None or own.ip_address != self.me.pod_ip:
            entries = self.membership.join()
            own = self.membership.own_entry(entries)
            obj = self.membership.last_object
        return entries, own, obj

    def _run_imex(self, entries: list[DaemonEntry], obj: JSON | None) -> None:
        """Hand the members to IMEX (started once the domain's nodes are known) and refresh
        ``self._ready`` from its readiness."""
        num_nodes = int(((obj or {}).get("spec") or {}).get("numNodes") or 0)
        was_running, started = self.supervisor.running(), self._clock.now()
        pid = self.supervisor.pid
        self.sync.apply(entries, num_nodes=num_nodes)
        # A new child (started, or restarted because our index moved) is polled at once: the
        # readiness the old one earned says nothing about it.
        if self.supervisor.running() and (not was_running or self.supervisor.pid != pid):
            if not was_running:
                self.formation.imex_started(started, self._clock.now())
            self._ready_polls, self._next_ready_check = 0, 0.0
        self._ready = self._check_ready()
        self._metrics.ready.set(1 if self._ready else 0)

    def _publish_readiness(self, entries: list[DaemonEntry], own: DaemonEntry | None) -> None:
        """Publish ``self._ready``: the node-local record first, then our entry's status (a
        Ready only once `_ready_write_due`), then, while Ready in a clique, peer connectivity."""
        self._signal_node(own)
        want = c.STATUS_READY if self._ready else c.STATUS_NOT_READY
        if not self._ready_write_due():
            want = own.status if own is not None else c.STATUS_NOT_READY  # not yet: no write
        if own is None or own.status != want:
            entries = self.membership.set_status(want)
            own = self.membership.own_entry(entries)
        if self._ready and own is not None and own.status == c.STATUS_READY:
            self.formation.ready()
        if self._ready and own is not None and isinstance(self.store, CliqueStore):
            self._report_peers(entries, own)
        else:
            self._peer_active = False  # no peer polls; they start again one interval after Ready

    def _ready_write_due(self) -> bool:
        """May our entry say what our IMEX says now? A Ready waits ``uniform(0,
        ready_write_spread)`` seconds after our node-local record went out (see the module
        docstring); without a record (nothing else releases the workload), and for NotReady,
        the answer is yes at once."""
        if not (self._ready and self._local_ready):
            self._ready_write_at = None
            return True
        now = self._clock.monotonic()
        if self._ready_write_at is None:
            self._ready_write_at = now + self._rng.uniform(0, self._timing.ready_write_spread)
        return now >= self._ready_write_at

    def _signal_node(self, own: DaemonEntry | None) -> None:
        """Keep the node-local readiness record (:mod:`pkg.api.localready`) in step with our
        IMEX: written when it turns READY while our entry carries our IP, before the entry's
        ``Ready`` goes to the API server (the plugin releases the workload on either), and
        withdrawn before anything else is published. A record that cannot be written only
        costs the shortcut (tried once per READY); one that cannot be withdrawn is disowned by
        giving up the lock, so no plugin believes it."""
        ours = own is not None and own.ip_address == self.me.pod_ip
        want = self._ready and ours and self.local.holding
        if want == self._local_ready:
            return
        self._local_ready = want
        start = self._clock.now()
        try:
            if want:
                record = localready.LocalReady(
                    self.me.domain_uid, self.me.node_name, self.me.pod_ip
                )
                self.local.publish(record)
                self.formation.ready_on_node(start, self._clock.now())
            else:
                self.local.withdraw()
        except OSError as err:
            log.warning(
                "cannot %s the node-local readiness record in %s: %s",
                "write" if want else "remove",
                self.opts.config_dir,
                err,
            )
            if not want:
                self.local.abandon()

    def _take_local_lock(self) -> None:
        """Hold the node-local record's lock for this process's life; a record a predecessor
        left is withdrawn with it, before our IMEX starts."""
        try:
            if not self.local.acquire():
                log.info(
                    "another daemon process holds %s; publishing readiness through the "
                    "API server only",
                    self.opts.config_dir,
                )
        except OSError as err:
            log.warning(
                "cannot take the node-local readiness lock in %s: %s", self.opts.config_dir, err
            )

    def _awaiting_controller(self, own: DaemonEntry | None) -> bool:
        """Our DaemonSet says the controller writes our clique entry and it is not there yet:
        wait for it (an informer event wakes the loop) for ``controller_join_grace`` seconds
        from the first pass, then join by ourselves (controller down, or busy elsewhere)."""
        if own is not None or not self.opts.join_by_controller:
            return False
        if not isinstance(self.store, CliqueStore) or self._join_since is None:
            return False
        waited = self._clock.monotonic() - self._join_since[0]
        if waited < self._timing.controller_join_grace:
            return True
        log.info(
            "no entry from the controller in %s after %.1fs: joining by ourselves",
            self._where(),
            waited,
        )
        return False

    def _report_peers(self, entries: list[DaemonEntry], own: DaemonEntry) -> None:
        """Publish our IMEX's peer connectivity when due and changed (module docstring)."""
        now = self._clock.monotonic()
        peers = clique_peers(entries, self.me)
        self._schedule_peer_polls(peers, bool(peers or own.unreachable_peers), now)
        if not self._peer_active or now < self._next_peer_check:
            return  # alone in the clique: nothing to report, no write, no poll
        self._next_peer_check = now + self._timing.peer_interval
        connections = self._peer_connections(peers)
        if connections is None:  # no answer this time: ask again at the normal pace
            self._peer_backoff, self._peer_seen = self._timing.peer_interval, None
            return
        report = self._debounced_report(peers, connections)
        if self._peer_write_due(own, report, len(peers), now):
            connected, unreachable = report
            if unreachable:
                log.warning("IMEX cannot reach clique peers: %s", ", ".join(unreachable))
            elif own.unreachable_peers:
                log.info("IMEX reaches all %d clique peers again", connected)
            self.membership.set_connectivity(connected, unreachable)
            self._peer_count_written, self._peer_written = now, report
        said = self._peer_written is None and (own.connected_peers, own.unreachable_peers) == report
        published = said or self._peer_written == report  # not: a count held back
        self._next_peer_check = now + self._next_peer_interval((connections, report), published)

    def _schedule_peer_polls(self, peers: list[DaemonEntry], active: bool, now: float) -> None:
        """Start peer polls one ``peer_interval`` after they became ``active`` (Ready, or a
        first peer: its IMEX is still connecting), and bring the next one within
        ``peer_interval`` when a peer's entry changed (joined, left, readiness, its report)."""
        t = self._timing
        members = tuple(peers)
        if active and not self._peer_active:
            self._next_peer_check = now + t.peer_interval
            self._peer_backoff, self._peer_seen = t.peer_interval, None
        elif members != self._peer_members:
            self._next_peer_check = min(self._next_peer_check, now + t.peer_interval)
            self._peer_backoff = t.peer_interval
        self._peer_members, self._peer_active = members, active

    def _next_peer_interval(self, seen: object, published: bool) -> float:
        """Seconds to the next peer poll: ``peer_interval`` after a poll that saw a change
        (which includes a peer found unreachable once, to be confirmed by the next poll) or
        left its report unpublished (a count held back by ``peer_count_interval``); doubled,
        up to ``peer_max_interval``, for each poll that saw exactly what the previous one did."""
        t = self._timing
        if published and seen == self._peer_seen:
            self._peer_backoff = min(self._peer_backoff * 2, t.peer_max_interval)
        else:
            self._peer_backoff = t.peer_interval
        self._peer_seen = seen
        return self._peer_backoff

    def _peer_connections(self, peers: list[DaemonEntry]) -> dict[str, str] | None:
        """Our IMEX's connection state per peer (``nvidia-imex-ctl -N``); empty without peers,
        None if it cannot be had this poll."""
        if not peers:
            return {}
        try:
            status = self.ctl.node_status()
            return peer_connections(status, own_address=self.me.pod_ip)
        except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as err:
            log.debug("no peer connectivity from nvidia-imex-ctl -N: %s", err)
            return None

    def _debounced_report(
        self, peers: list[DaemonEntry], connections: dict[str, str]
    ) -> tuple[int, tuple[str, ...]]:
        """``(connected, unreachable)`` for our entry: only Ready peers can be unreachable, and
        only on the second poll in a row that finds them so (updates ``self._peer_suspects``)."""
        connected, unreachable = peer_report(peers, connections)
        # Only a Ready peer can be unreachable: one whose IMEX is not Ready (yet) cannot be
        # connected, and the domain's IMEXConnected condition judges Ready members only.
        ready = {p.node_name for p in peers if p.status == c.STATUS_READY}
        unreachable = tuple(n for n in unreachable if n in ready)
        # A peer counts as unreachable only on two polls in a row: a member that just joined is
        # not connected until IMEX reloaded its node list and said hello.
        suspects, self._peer_suspects = self._peer_suspects, set(unreachable)
        unreachable = tuple(n for n in unreachable if n in suspects)
        return connected, unreachable

    def _peer_write_due(
        self, own: DaemonEntry, report: tuple[int, tuple[str, ...]], num_peers: int, now: float
    ) -> bool:
        """Whether ``report`` should be written now: not if our entry (and our last write)
        already says it, nor if only the connected count moved within ``peer_count_interval``
        of the last such write."""
        connected, unreachable = report
        if (own.connected_peers, own.unreachable_peers) == report and self._peer_written in (
            None,
            report,
        ):
            return False  # (a cache that has not seen our last write yet does not count)
        # What we wrote last (the cache may not show it yet), else what our entry says.
        last = self._peer_written
        if last is None and own.connected_peers is not None:
            last = (own.connected_peers, own.unreachable_peers or ())
        reported = None if last is None else set(last[1])
        # Only the count moved (peers still joining, none newly unreachable, no problem
        # resolved): while a large domain forms, every daemon rewriting it each poll was most of
        # the writes of the shared clique. The rest is written at once.
        return not (
            reported is not None
            and set(unreachable) <= reported
            and (unreachable or not reported)
            and connected < num_peers
            and now - self._peer_count_written < self._timing.peer_count_interval
        )

    def _write_imex_config(self) -> None:
        cfg = ImexConfig(
            bind_ip=self.opts.pod_ip,
            node_config_path=self.opts.nodes_config_path,
            server_port=self.opts.server_port,
            cmd_port=self.opts.cmd_port,
            auth=self.opts.auth,
        )
        write_file_atomically(self.opts.config_path, cfg.render())
        self.sync.prepare()

    def _leave(self) -> None:
        done = threading.Event()

        def leave() -> None:
            try:
                self.membership.leave()
                log.info("%s", self._removed_message())
            except (MembershipError, ApiError, ConnectionFailedError) as err:
                log.error("could not remove own entry from %s: %s", self._where(), err)
            finally:
                done.set()

        threading.Thread(target=leave, name="leave", daemon=True).start()
        if not done.wait(self._timing.leave_timeout):
            log.error("removing own entry timed out after %.0fs", self._timing.leave_timeout)

    def _removed_message(self) -> str:
        """Upstream's exact shutdown line: its e2e tests grep for ``Successfully removed daemon``
        and ``from ComputeDomain <namespace>/<name>`` (clique mode; the status mode differs)."""
        me = self.me
        if isinstance(self.store, CliqueStore):
            return (
                f"Successfully removed daemon with IP {me.pod_ip} from CDClique {self.store.name} "
                f"(from ComputeDomain {me.domain_namespace}/{me.domain_name})"
            )
        return (
            f"Successfully removed node with IP {me.pod_ip} from ComputeDomain "
            f"{me.domain_namespace}/{me.domain_name}"
        )

    def _where(self) -> str:
        kind = "ComputeDomainClique" if isinstance(self.store, CliqueStore) else "ComputeDomain"
        return f"{kind} {self.store.namespace}/{self.store.name}"

    # -- run ---------------------------------------------------------------------------------

    def report_incomplete_driver_root(self, missing: list[str]) -> None:
        """Tell the operator (log, pod Event, termination message) that CDI brought no IMEX."""
        detail = (
            f"{' and '.join(missing)} not found in the container on node {self.opts.node_name}: "
            "the IMEX binaries come only from the kubelet plugin's driver root "
            "(nvidiaDriverRoot) through CDI, and it has none; install the NVIDIA IMEX package "
            "there, then restart the kubelet plugin on this node"
        )
        log.error("%s: %s", c.REASON_DRIVER_ROOT_INCOMPLETE, detail)
        self._pod_event(c.REASON_DRIVER_ROOT_INCOMPLETE, detail)
        write_termination_message(
            self.opts.termination_log, f"{c.REASON_DRIVER_ROOT_INCOMPLETE}: {detail}"
        )

    def _pod_event(self, reason: str, message: str) -> None:
        """A Warning Event on our pod (none without a recorder or a pod name)."""
        if self._events is None or not self.opts.pod_name:
            return
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.opts.pod_name,
                "namespace": self.opts.pod_namespace,
                "uid": self.opts.pod_uid,
            },
        }
        self._events.event(pod, WARNING, reason, message)

    def _reserve_ports(self) -> None:
        """Hold IMEX's ports while it does not run (:mod:`pkg.imex.ports`); a port another
        socket holds is logged once and kept for the not-ready report."""
        problem = "; ".join(self.ports.reserve())
        if problem and problem != self._port_problem:
            log.warning("%s", problem)
        self._port_problem = problem

    def _imex_problem(self) -> str:
        """Why IMEX is not ready, as far as this daemon knows: what keeps it from starting or
        listening, then what its readiness query said."""
        parts = [self._port_problem] if self._port_problem else []
        if self._awaiting:
            parts.append(f"not started: waiting for {self._awaiting}")
        elif self._pass_error:
            parts.append(f"last pass failed: {self._pass_error}")
        if self.supervisor.last_problem:
            parts.append(self.supervisor.last_problem)
        if not self.supervisor.running():
            if self.supervisor.pid is None and not self.supervisor.last_problem:
                parts.append("nvidia-imex has not been started")
        elif self._ready_detail:
            parts.append(f"nvidia-imex-ctl -q: {self._ready_detail}")
        return "; ".join(parts) or "no error seen"

    def _watch_imex_ready(self) -> None:
        """Tell the user, once per stretch, that IMEX has not been ready for
        ``imex_start_timeout`` seconds since the loop began or since it was last ready: a
        WARNING and one Warning Event `REASON_IMEX_NOT_READY` on our pod, with the last
        error (`_imex_problem`). The loop wakes for that deadline (`_idle_wait`), so a loop
        with nothing else to do still reports it. A bound of 0 reports nothing; IP mode's
        ``numNodes`` barrier is a wait by design, and the bound counts from its end."""
        now = self._clock.monotonic()
        if self.sync.barrier_wait:  # IP mode's numNodes barrier: held back by design
            self._not_ready_since, self._not_ready_warned = None, False
            return
        if self._ready:
            if self._not_ready_warned and self._not_ready_since is not None:
                log.info(
                    "nvidia-imex on node %s is ready after %.0fs",
                    self.opts.node_name,
                    now - self._not_ready_since,
                )
            self._not_ready_since, self._not_ready_warned, self._ever_ready = None, False, True
            return
        if self._not_ready_since is None:
            self._not_ready_since = now
        bound = self.opts.imex_start_timeout
        if self._not_ready_warned or bound <= 0 or now - self._not_ready_since < bound:
            return
        self._not_ready_warned = True
        since = "it was last ready" if self._ever_ready else "the daemon started"
        message = (
            f"nvidia-imex on node {self.opts.node_name} (pod IP {self.opts.pod_ip}) has not "
            f"been ready for {now - self._not_ready_since:.0f}s since {since} "
            f"(IMEX_START_TIMEOUT={bound:g}s); last error: {self._imex_problem()}"
        )
        log.warning("%s: %s", REASON_IMEX_NOT_READY, message)
        self._pod_event(REASON_IMEX_NOT_READY, message)

    def run(self, stop: threading.Event) -> int:
        """Run until ``stop``; the exit code (0, or `EXIT_DRIVER_ROOT_INCOMPLETE`)."""
        # The label makes the pod a member for the controller. The entry point usually started
        # the labeller already, before importing this module (its PATCH is the first request);
        # starting it again does nothing. Nothing here waits for it, so the join (which a
        # forming domain's other daemons wait for) does not queue behind it.
        self.labeller.start(stop)
        if not self.opts.clique_id:
            self.labeller.join()
            log.info("clique ID is empty (no NVLink fabric): not starting IMEX, waiting for stop")
            stop.wait()
            return 0
        try:
            return self._run_fabric(stop)
        finally:
            self.labeller.join(self._timing.leave_timeout)

    def _run_fabric(self, stop: threading.Event) -> int:
        self.formation.begin()
        missing = missing_imex_programs(self.opts, self._locate)
        if missing:
            self.report_incomplete_driver_root(missing)
            self.formation.end(f"{c.REASON_DRIVER_ROOT_INCOMPLETE}: {' and '.join(missing)}")
            return EXIT_DRIVER_ROOT_INCOMPLETE
        self._take_local_lock()
        self._write_imex_config()
        # Before the informers and the membership writes open connections: a connection that
        # got an IMEX port as its ephemeral local port would keep IMEX from listening.
        self._reserve_ports()
        if self.opts.metrics_address:
            host, port = self._metrics.serve(self.opts.metrics_address)
            log.info("serving /metrics on %s:%d", host, port)
        self.informers.start()
        log.info(
            "daemon running (%s mode, membership in %s, max %d nodes)",
            "DNS-name" if self._dns else "IP",
            self._where(),
            self.opts.max_nodes,
        )
        if self.notices.start():  # the readiness probe tells us when IMEX is not ready
            self._ready_recheck = self._timing.ready_recheck_interval
        self._not_ready_since = self._clock.monotonic()
        try:
            while True:
                if stop.is_set():
                    break
                full = failed = False
                try:
                    self.step()
                    self._last_error = self._pass_error = ""
                except CliqueFullError as err:
                    full = True
                    self._pass_error = str(err)
                    self._report_once(f"cannot join {self._where()}: {err}; waiting for a slot")
                except (MembershipError, ApiError, ConnectionFailedError, ValueError) as err:
                    failed = True
                    self._pass_error = str(err)
                    log.error("update failed, will retry: %s", err)
                self._watch_imex_ready()
                self._clock.wait(self._kick, self._idle_wait(full=full, failed=failed))
                self._kick.clear()
        finally:
            self.notices.close()
            self.formation.end("stopped before its IMEX daemon was Ready")
            with contextlib.suppress(OSError):
                self.local.release()  # the record goes before the entry
            self._leave()  # while the informer still runs: a 409 waits for it, not for a GET
            self.informers.shutdown()
            self.cache.close()
            self.supervisor.stop()
            self.ports.release()
            self._metrics.close()
        return 0

    def _idle_wait(self, *, full: bool, failed: bool) -> float | None:
        """Seconds until the loop has something to do by itself; None: nothing until a kick
        (a membership event, the child's exit, a probe's notice, shutdown). The deadlines: a
        readiness query due, our entry's held-back Ready, a peer poll due, the supervisor's
        restart or deferred reload, the end of the wait for the controller's entry, the retry
        of a failed pass, the not-ready report (`_watch_imex_ready`). A deadline a failed pass
        left behind (it did not get to it) waits for that retry, so an outage cannot make the
        loop spin; a successful pass leaves none behind, and the wait is never shorter than
        10 ms."""
        t = self._timing
        now = self._clock.monotonic()
        due: list[float] = []
        bound = self.opts.imex_start_timeout
        if not self._not_ready_warned and self._not_ready_since is not None and bound > 0:
            due.append(self._not_ready_since + bound)  # the not-ready report (_watch_imex_ready)
        if full:  # only a change of the clique (a kick) can free a slot; retried slowly too
            return max(min([now + t.slow_interval, *due]) - now, 0.01)
        if self.supervisor.running():
            due.append(self._next_ready_check)
        if self._ready_write_at is not None and self._ready_write_at > now:
            due.append(self._ready_write_at)
        if self._peer_active:
            due.append(self._next_peer_check)
        restart = self.supervisor.next_due()
        if restart is not None:
            due.append(restart)
        if self._first_pass and self._join_since is not None:
            due.append(self._join_since[0] + t.controller_join_grace)
        if failed:  # what the failed pass did not get to is retried with it
            retry = now + (t.error_retry if self._ready else t.fast_interval)
            due = [d if d > now else retry for d in due] + [retry]
        if not due:
            return None
        return max(min(due) - now, 0.01)

    def _report_once(self, message: str) -> None:
        """ERROR the first time, DEBUG while the same problem persists."""
        if message != self._last_error:
            log.error("%s", message)
            self._last_error = message
        else:
            log.debug("%s", message)
