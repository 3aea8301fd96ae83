"""Free TCP ports on 127.0.0.1 for test components, picked where no client will take them."""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path


class PortsError(RuntimeError):
    """Not enough free ports were found."""


_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct TCP ports on 127.0.0.1 that are free now.

    Picked at random *outside* the kernel's ephemeral range, which every outgoing connection
    of every process on the machine draws from: a port from it (``bind(0)``) can be taken by
    some client's connection between the moment it is picked and the moment the component
    listens on it (seconds later for a plugin starting among 18 others) - seen as
    ``Address already in use``. Never the same port twice in one process.
    """
    lo, hi = _ephemeral_range()
    ranges = [(r0, r1) for r0, r1 in ((10000, lo - 1), (hi + 1, 65535)) if r1 - r0 > 1000]
    rng = random.Random()
    picked: list[int] = []
    with _handed_out_lock:
        for _ in range(count * 200):
            if len(picked) == count:
                break
            r0, r1 = rng.choice(ranges)
            port = rng.randint(r0, r1)
            if port in _handed_out or port in picked:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            picked.append(port)
        if len(picked) < count:
            raise PortsError(f"found only {len(picked)} of {count} free ports")
        _handed_out.update(picked)
    return picked
