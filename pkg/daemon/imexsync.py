"""Apply the membership list to the local IMEX: config files and the supervised process.

Owns the update-loop policy of both modes (gate ``IMEXDaemonsWithDNSNames``):

DNS names (default)
    ``nodes.cfg`` is written once with the domain's static names. Each membership change
    rewrites only the hosts-file mapping (members at their index, sentinel elsewhere). IMEX is
    started as soon as we hold an index -- peers are not awaited -- and gets SIGUSR1 only when
    the mapping changed and it was already running. If *our own* index changes while IMEX runs
    (entry pruned and re-added elsewhere), IMEX is restarted instead: it reads its node ID from
    ``nodes.cfg`` only at start (upstream #1418).
IPs (legacy)
    Nothing starts until the domain holds ``numNodes`` entries (the barrier); then
    ``nodes.cfg`` lists the clique's IPs in index order and every change restarts IMEX.

Invariant: only entries of our own clique are ever written into IMEX's view, and IMEX never
starts before our own entry (and thus our name -> IP mapping) exists. An entry whose
``ipAddress`` is not a canonical IP literal (:func:`pkg.imex.nodesconfig.is_canonical_ip`) or
is the empty-slot sentinel is left out with one warning per entry: every daemon of the clique
can write entries, so one bad entry must neither reach IMEX's files nor stop the others from
being written.
"""

from __future__ import annotations

import logging
from typing import Protocol

from pkg.api.daemonentry import DaemonEntry
from pkg.base.files import write_file_atomically
from pkg.daemon.membership import Identity
from pkg.imex import nodesconfig
from pkg.imex.hosts import HostsFile

log = logging.getLogger(__name__)


class ImexProcess(Protocol):
    """What the update loop needs from :class:`pkg.imex.supervisor.Supervisor`."""

    def ensure_started(self) -> bool: ...

    def reload(self) -> bool: ...

    def restart(self) -> None: ...

    def running(self) -> bool: ...


class PeersGauge(Protocol):
    def set(self, value: float) -> None: ...


class ImexSync:
    def __init__(
        self,
        me: Identity,
        *,
        dns_names: bool,
        max_nodes: int,
        hosts: HostsFile,
        nodes_config_path: str,
        process: ImexProcess,
        peers: PeersGauge | None = None,
    ) -> None:
        self._me = me
        self._dns = dns_names
        self._max = max_nodes
        self._hosts = hosts
        self._nodes_path = nodes_config_path
        self._process = process
        self._peers = peers
        self._imex_index: int | None = None  # our index when IMEX last (re)started
        self._skipped: set[tuple[str, int, str]] = set()  # (node, index, IP) warned about
        self._waiting_logged = -1
        self.barrier_wait = False
        """IP mode: the last :meth:`apply` held IMEX back for the ``numNodes`` barrier (a wait
        by design, not a failure to start)."""

    def prepare(self) -> None:
        """Write the static DNS nodes config (IP mode writes it once the barrier is met)."""
        if self._dns:
            content = nodesconfig.render_dns_nodes_config(self._me.domain_uid, max_nodes=self._max)
            write_file_atomically(self._nodes_path, content)

    def clique_members(self, entries: list[DaemonEntry]) -> list[DaemonEntry]:
        """Our clique's entries with a usable index and a canonical IP literal, by index (our own
        entry first on a tie); others are skipped, each bad one logged once."""
        same = [
            e for e in entries if e.clique_id == self._me.clique_id and 0 <= e.index < self._max
        ]
        usable = [
            e
            for e in same
            if nodesconfig.is_canonical_ip(e.ip_address)
            and e.ip_address != nodesconfig.SENTINEL_ADDRESS
        ]
        for bad in same:
            key = (bad.node_name, bad.index, bad.ip_address)
            if bad in usable or key in self._skipped:
                continue
            log.warning(
                "skipping clique entry of node %r (index %d): ipAddress %r is not a canonical "
                "IP literal or is the empty-slot sentinel",
                bad.node_name,
                bad.index,
                bad.ip_address,
            )
            self._skipped.add(key)
        return sorted(usable, key=lambda e: (e.index, e.node_name != self._me.node_name))

    def apply(self, entries: list[DaemonEntry], *, num_nodes: int = 0) -> None:
        """Feed ``entries`` to IMEX by the mode's policy (module docstring); nothing happens
        until our own entry is among them."""
        self.barrier_wait = False
        members = self.clique_members(entries)
        own = next((e for e in members if e.node_name == self._me.node_name), None)
        if self._peers is not None:
            self._peers.set(sum(1 for e in members if e.node_name != self._me.node_name))
        if own is None:
            return
        if self._dns:
            self._apply_dns(members, own)
        else:
            self._apply_ips(entries, members, num_nodes=num_nodes)

    def _apply_dns(self, members: list[DaemonEntry], own: DaemonEntry) -> None:
        by_index: dict[int, str] = {}
        for e in members:
            by_index.setdefault(e.index, e.ip_address)  # own entry sorts first on a tie
        mapping = nodesconfig.dns_mapping(self._me.domain_uid, by_index, max_nodes=self._max)
        changed = self._hosts.update(mapping)
        if changed:
            log.info(
                "hosts mapping updated: %s",
                ", ".join(f"{i}={ip}" for i, ip in sorted(by_index.items())),
            )
        if self._imex_index is not None and own.index != self._imex_index:
            log.warning(
                "own index changed %d -> %d; restarting IMEX so its node ID follows",
                self._imex_index,
                own.index,
            )
            self._imex_index = own.index
            self._process.restart()
            return
        if self._process.ensure_started():
            self._imex_index = own.index
        elif changed and self._process.reload():
            log.info("asked IMEX to reload its peers (SIGUSR1)")

    def _apply_ips(
        self, entries: list[DaemonEntry], members: list[DaemonEntry], *, num_nodes: int
    ) -> None:
        if len(entries) < num_nodes:
            self.barrier_wait = True
            if self._waiting_logged != len(entries):
                log.info(
                    "numNodes barrier: %d of %d daemons registered; IMEX not started yet",
                    len(entries),
                    num_nodes,
                )
                self._waiting_logged = len(entries)
            return
        content = nodesconfig.render_ip_nodes_config(e.ip_address for e in members)
        changed = write_file_atomically(self._nodes_path, content)
        if changed and self._process.running():
            log.info("peer IPs changed; restarting IMEX: %s", content.strip().replace("\n", ","))
            self._process.restart()
        else:
            self._process.ensure_started()
