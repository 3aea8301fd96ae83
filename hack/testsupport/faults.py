"""Fault injection on the simulated-node lane: which driver processes run, and SIGKILLs.

Owns the view "which binary runs under which PID" that the reliability tests compare before and
after a fault (the controller, every node's kubelet plugin, every IMEX daemon container and the
``nvidia-imex`` processes it supervises) and the kills themselves: a SIGKILL of a daemon goes to
its container's process group (a container crash), one of ``nvidia-imex`` to that process only
(the daemon restarts it by design). Reads ``/proc``; knows nothing about ComputeDomains.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from kubeletsim import NodeFleet

from testsupport.e2e_support import Driver


@dataclass(frozen=True)
class DaemonProc:
    """One running IMEX daemon container: its node, pod name and PID."""

    node: str
    pod: str
    pid: int


def daemon_procs(fleet: NodeFleet, driver_ns: str) -> list[DaemonProc]:
    """Every running local container of a pod in the driver namespace (the IMEX daemons)."""
    out = []
    for node in fleet:
        for worker in node.kubelet.workers().values():
            meta = worker.pod["metadata"]
            if meta.get("namespace") != driver_ns or worker.done:
                continue
            for pid in worker.container_pids().values():
                out.append(DaemonProc(node.name, str(meta["name"]), pid))
    return out


def driver_pids(driver: Driver, fleet: NodeFleet) -> dict[str, int]:
    """``controller``, ``plugin/<node>`` and ``daemon/<pod>`` -> PID, for the running ones."""
    pids: dict[str, int] = {}
    if driver.controller is not None and driver.controller_alive():
        pids["controller"] = driver.controller.pid
    for node in fleet:
        if node.plugin_pid is not None:
            pids[f"plugin/{node.name}"] = node.plugin_pid
    for d in daemon_procs(fleet, driver.namespace):
        pids[f"daemon/{d.pod}"] = d.pid
    return pids


def exited(before: dict[str, int], after: dict[str, int], *, allowed: set[str]) -> list[str]:
    """Binaries of ``before`` that exited or were replaced, except ``allowed`` keys.

    A daemon missing from ``after`` is fine (its pod was deleted on purpose); the controller or
    a plugin missing is not.
    """
    bad = []
    for key, pid in before.items():
        if key in allowed:
            continue
        now = after.get(key)
        if now is None and key.startswith("daemon/"):
            continue
        if now != pid:
            bad.append(f"{key}: pid {pid} -> {now}")
    return bad


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (from ``/proc/*/stat``)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def imex_pids(daemon_pid: int) -> list[int]:
    """The ``nvidia-imex`` processes under a daemon (simulated IMEX: its argv names the binary)."""
    out = []
    for pid in descendants(daemon_pid):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if any(a.endswith(b"nvidia-imex") for a in argv[:3]):
                out.append(pid)
    return out


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (a container or a binary in its own session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def kill_pid(pid: int) -> None:
    """SIGKILL one process."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
