"""What an IMEX daemon pod's status says about why its daemon cannot run (pure functions).

Owns reading the daemon's termination message, the one channel a daemon has to tell the
controller something about itself besides its clique entry: a daemon whose container received
no ``nvidia-imex``/``nvidia-imex-ctl`` through CDI exits with the message
``DriverRootIncomplete: <detail>`` (``pkg.daemon.daemon``), the kubelet copies it into
``containerStatuses[].state.terminated.message`` and, once the container is waiting to restart,
``lastState.terminated.message``. Invariant: a container that runs again counts as healthy
whatever its last termination said (a fixed driver root is picked up at the restart).
"""

from __future__ import annotations

from collections.abc import Iterable

from pkg.api import constants as c
from pkg.base.types import JSON

__all__ = ["driver_root_incomplete", "driver_root_message"]

_PREFIX = f"{c.REASON_DRIVER_ROOT_INCOMPLETE}:"


def _daemon_status(pod: JSON) -> JSON | None:
    statuses = [s for s in (pod.get("status") or {}).get("containerStatuses") or [] if s]
    mine = [s for s in statuses if s.get("name") == c.DAEMON_CONTAINER_NAME]
    if not mine and len(statuses) == 1:
        mine = statuses
    return mine[0] if mine else None


def driver_root_incomplete(pod: JSON) -> str:
    """The detail of the daemon's ``DriverRootIncomplete`` exit, or ``""``."""
    status = _daemon_status(pod)
    if status is None or "running" in (status.get("state") or {}):
        return ""
    for key in ("state", "lastState"):
        terminated = (status.get(key) or {}).get("terminated") or {}
        message = str(terminated.get("message") or "")
        if message.startswith(_PREFIX):
            return message[len(_PREFIX) :].strip()
    return ""


def driver_root_message(pods: Iterable[JSON]) -> str:
    """The Ready condition's message for the daemon pods with an incomplete driver root
    (``""`` if none): their details (each names its node), sorted, ``; ``-separated."""
    return "; ".join(sorted({d for d in map(driver_root_incomplete, pods) if d}))
