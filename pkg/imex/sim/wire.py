"""Line protocol of the simulated IMEX (peer port and command port).

Peer port (``SERVER_PORT``): the connecting daemon sends ``HELLO <json>`` with its domain
identity and address; the server answers ``WELCOME <json>`` or ``REFUSE <reason>``. A daemon
refuses a different domain and an address that is not one of its configured peers, which is how
two ComputeDomains sharing a clique -- or a reused pod IP -- stay apart.

Command port (``IMEX_CMD_PORT``): ``READY?`` -> ``READY`` or ``NOT_READY``; ``STATUS`` -> one
line of JSON. One request per connection; every line is UTF-8 and ends with ``\\n``.
"""

from __future__ import annotations

import json
import socket
from typing import Any, Final

HELLO: Final = "HELLO"
WELCOME: Final = "WELCOME"
REFUSE: Final = "REFUSE"
CMD_READY: Final = "READY?"
CMD_STATUS: Final = "STATUS"
MAX_LINE: Final = 1 << 20


def send_line(sock: socket.socket, line: str) -> None:
    sock.sendall(line.encode() + b"\n")


def recv_line(sock: socket.socket) -> str:
    """One line without its newline; raises ConnectionError if the peer closed first."""
    buf = bytearray()
    while not buf.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("connection closed before end of line")
        buf += chunk
        if len(buf) > MAX_LINE:
            raise ConnectionError("line too long")
    return buf[:-1].decode(errors="replace")


def encode(verb: str, payload: dict[str, Any]) -> str:
    return f"{verb} {json.dumps(payload, sort_keys=True)}"


def decode(line: str) -> tuple[str, dict[str, Any]]:
    verb, _, rest = line.partition(" ")
    if verb in (HELLO, WELCOME):
        payload = json.loads(rest)
        if not isinstance(payload, dict):
            raise ValueError(f"{verb}: payload is not an object")
        return verb, payload
    return verb, {"reason": rest}
