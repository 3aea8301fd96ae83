"""Keeping IMEX's listening ports free for ``nvidia-imex`` while it does not run.

``nvidia-imex`` listens on ``SERVER_PORT`` (50000) and ``IMEX_CMD_PORT`` (50005) of the pod IP.
Both lie inside Linux's default ephemeral port range (``net.ipv4.ip_local_port_range``,
32768-60999), from which the kernel picks the local port of every outbound TCP connection of
the pod: the daemon's API connections, the readiness probe's ``nvidia-imex-ctl``, IMEX's own
connections to its peers. A connection that got 50000 or 50005 as its local port -- open, or
in TIME_WAIT for a minute after the pod closed it -- makes IMEX's ``bind()`` fail with
``EADDRINUSE`` even with ``SO_REUSEADDR`` (a connected or TIME_WAIT socket without that option
conflicts with every listener of its address and port), so IMEX exits at once after every
restart for as long as that connection lives. The readiness probe then answers "not
reachable: Connection refused" and the node's daemon never turns Ready.

:class:`PortReservation` holds one socket per port, bound to the pod IP with ``SO_REUSEADDR``
and never listening, whenever IMEX is not running. A port that has an explicitly bound socket
is never handed out as an ephemeral port, and a bound socket that does not listen keeps no
``SO_REUSEADDR`` listener from binding beside it; the daemon still releases the reservation
right before it starts IMEX (:meth:`release`), so an IMEX that binds without ``SO_REUSEADDR``
finds the port free as well. Closing a socket that never connected leaves no TIME_WAIT.

Invariants: at most one socket per port is held; :meth:`reserve` never raises (a port it
cannot take is returned as a problem: ``EADDRINUSE`` means another socket of this network
namespace holds it, the cause above); an address that is not this host's (``EADDRNOTAVAIL``,
the daemon run outside its pod, as in unit tests) reserves nothing and is no problem here --
IMEX reports that one itself.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

SocketFactory = Callable[[int], socket.socket]
"""Makes a TCP socket of the given address family (tests inject one)."""


def _tcp_socket(family: int) -> socket.socket:
    return socket.socket(family, socket.SOCK_STREAM)


def address_family(address: str) -> int:
    """``AF_INET6`` for an IPv6 literal, else ``AF_INET``."""
    return socket.AF_INET6 if ":" in address else socket.AF_INET


class PortReservation:
    """The IMEX ports of ``address`` held by this process while IMEX does not run."""

    def __init__(
        self,
        address: str,
        ports: Sequence[int],
        *,
        make_socket: SocketFactory = _tcp_socket,
    ) -> None:
        self._address = address
        self._ports = tuple(dict.fromkeys(ports))
        self._make_socket = make_socket
        self._held: dict[int, socket.socket] = {}

    @property
    def held(self) -> tuple[int, ...]:
        """The ports reserved now, in the order given."""
        return tuple(p for p in self._ports if p in self._held)

    def reserve(self) -> list[str]:
        """Take every port not held yet; the problems of those that could not be taken because
        another socket holds them (one sentence each, for logs and Events). Idempotent."""
        problems: list[str] = []
        if not self._address:
            return problems
        for port in self._ports:
            if port in self._held:
                continue
            sock = self._make_socket(address_family(self._address))
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((self._address, port))
            except OSError as err:
                sock.close()
                if err.errno == errno.EADDRNOTAVAIL:
                    log.debug(
                        "not reserving %s:%d: not an address of this host", self._address, port
                    )
                    continue
                problems.append(
                    f"port {port} of {self._address} is held by another socket of this pod "
                    f"({err.strerror or err}), e.g. an outbound connection that got it as its "
                    "ephemeral local port: nvidia-imex cannot listen there until it is closed"
                )
                continue
            self._held[port] = sock
        return problems

    def release(self) -> None:
        """Close every reservation (right before IMEX starts, and at shutdown)."""
        held, self._held = self._held, {}
        for sock in held.values():
            sock.close()
