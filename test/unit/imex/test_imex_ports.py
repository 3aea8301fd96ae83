"""IMEX's ports and the pod's own outbound connections (`pkg.imex.ports`), on real sockets.

The IMEX ports (50000, 50005) lie inside Linux's ephemeral port range, so an outbound
connection of the daemon's pod can get one as its local port; then IMEX cannot listen. The
first test shows that failure on the simulator; the rest show the reservation that keeps the
ports free. Every socket is on 127.0.0.1; the kernel's bind rules decide, not timing.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from pkg.imex.ports import PortReservation, address_family
from pkg.imex.sim import imexd

LOOPBACK = "127.0.0.1"


@contextmanager
def outbound_connection() -> Iterator[int]:
    """An established connection from 127.0.0.1; yields its ephemeral local port (what a pod's
    API connection holds when the kernel gave it an IMEX port)."""
    with socket.socket() as server:
        server.bind((LOOPBACK, 0))
        server.listen(1)
        with socket.create_connection(server.getsockname()) as client:
            accepted, _ = server.accept()
            with accepted:
                yield client.getsockname()[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        port: int = probe.getsockname()[1]
    return port


def test_a_connection_holding_an_imex_port_keeps_imex_from_listening() -> None:
    """The failure: IMEX binds with SO_REUSEADDR, and still a connection whose local port is
    IMEX's port makes its bind fail, so the simulator exits 1 on every restart."""
    with (
        outbound_connection() as port,
        pytest.raises(imexd.SimError, match="Address already in use"),
    ):
        imexd._listen(LOOPBACK, port, "IMEX server")


def test_a_reserved_port_is_taken_by_no_other_socket_and_stays_free_for_imex() -> None:
    """While reserved, a socket without SO_REUSEADDR (what an outbound connection's implicit
    bind is) cannot get the port; IMEX's listener binds beside the reservation, and after
    the release as well."""
    port = free_port()
    ports = PortReservation(LOOPBACK, [port, port])
    assert ports.reserve() == [] and list(ports.held) == [port]
    with socket.socket() as other, pytest.raises(OSError) as refused:
        other.bind((LOOPBACK, port))
    assert refused.value.errno == errno.EADDRINUSE
    imexd._listen(LOOPBACK, port, "IMEX server").close()
    assert ports.reserve() == [] and list(ports.held) == [port]  # idempotent: still one socket
    ports.release()
    assert not ports.held
    imexd._listen(LOOPBACK, port, "IMEX server").close()
    ports.release()  # nothing held: nothing to do


def test_a_port_another_socket_holds_is_reported_and_retried() -> None:
    with outbound_connection() as port:
        ports = PortReservation(LOOPBACK, [port])
        (problem,) = ports.reserve()
        assert not ports.held
        assert f"port {port} of {LOOPBACK} is held by another socket" in problem
        assert "nvidia-imex cannot listen there" in problem
    assert ports.reserve() == [] and list(ports.held) == [port]  # the connection is gone
    ports.release()


def test_an_address_that_is_not_this_hosts_reserves_nothing_quietly() -> None:
    """Outside its pod (unit tests, a wrong POD_IP) the daemon reserves nothing; IMEX reports
    a foreign address itself."""
    ports = PortReservation("192.0.2.1", [free_port()])
    assert ports.reserve() == [] and not ports.held
    assert PortReservation("", [1]).reserve() == []


def test_address_family() -> None:
    assert address_family("10.0.0.1") == socket.AF_INET
    assert address_family("fd00::1") == socket.AF_INET6
