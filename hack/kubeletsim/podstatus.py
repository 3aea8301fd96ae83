"""Pod ``status`` as the kubelet reports it, computed from the stand-in's container states.

Owns the shape of ``status`` (phase, conditions, ``podIP(s)``/``hostIP(s)`` = node IP,
``containerStatuses``) and the rule that decides the phase: Pending until every container has
started, Running while any runs, Succeeded/Failed once all have terminated (restartPolicy
Never/OnFailure). Pure data; the pod worker sends it as a strategic-merge patch of
``pods/status`` (conditions and container statuses merge by ``type``/``name``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any


def now_str() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ContainerState:
    """The stand-in's view of one container (run locally or only recorded)."""

    name: str
    image: str = ""
    waiting_reason: str = "ContainerCreating"
    waiting_message: str = ""
    running_since: str | None = None
    exit_code: int | None = None
    finished_at: str | None = None
    restart_count: int = 0
    started: bool = False
    ready: bool = False
    container_id: str = ""
    message: str = ""  # termination message of the current termination
    # ``lastState.terminated`` once a terminated container was started again (kubelet keeps it
    # until the next termination).
    last_terminated: dict[str, Any] | None = None

    def set_running(self, container_id: str) -> None:
        if self.exit_code is not None:
            self.last_terminated = self._terminated()
        self.running_since = now_str()
        self.exit_code = None
        self.finished_at = None
        self.message = ""
        self.waiting_reason = ""
        self.container_id = container_id

    def set_terminated(self, code: int, message: str = "") -> None:
        """Exited with ``code``; ``message`` is its termination message (terminationMessagePath)."""
        self.exit_code = code
        self.finished_at = now_str()
        self.message = message
        self.ready = False

    def _terminated(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "exitCode": self.exit_code,
            "reason": "Completed" if self.exit_code == 0 else "Error",
            "startedAt": self.running_since,
            "finishedAt": self.finished_at,
            "containerID": self.container_id,
        }
        if self.message:
            out["message"] = self.message
        return out

    def set_waiting(self, reason: str, message: str = "") -> None:
        self.waiting_reason, self.waiting_message = reason, message
        self.running_since = None
        self.ready = False

    @property
    def terminated(self) -> bool:
        return self.exit_code is not None

    def to_status(self) -> dict[str, Any]:
        state: dict[str, Any]
        if self.exit_code is not None:
            state = {"terminated": self._terminated()}
        elif self.running_since:
            state = {"running": {"startedAt": self.running_since}}
        else:
            waiting = {"reason": self.waiting_reason or "ContainerCreating"}
            if self.waiting_message:
                waiting["message"] = self.waiting_message
            state = {"waiting": waiting}
        out: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "ready": self.ready,
            "started": bool(self.running_since) and self.started,
            "restartCount": self.restart_count,
            "state": state,
        }
        if self.container_id:
            out["containerID"] = self.container_id
        if self.last_terminated is not None:
            out["lastState"] = {"terminated": self.last_terminated}
        return out


@dataclass
class PodState:
    node_ip: str
    containers: list[ContainerState] = field(default_factory=list)
    start_time: str = field(default_factory=now_str)
    sandbox_ready: bool = False
    message: str = ""

    def phase(self, restart_policy: str) -> str:
        cs = self.containers
        if cs and all(c.terminated for c in cs) and restart_policy != "Always":
            return "Succeeded" if all(c.exit_code == 0 for c in cs) else "Failed"
        if cs and all(c.running_since or c.terminated for c in cs):
            return "Running"
        return "Pending"

    def to_status(self, restart_policy: str) -> dict[str, Any]:
        ts = now_str()
        phase = self.phase(restart_policy)
        ready = phase == "Running" and all(c.ready for c in self.containers)

        def cond(type_: str, ok: bool, reason: str = "") -> dict[str, Any]:
            c: dict[str, Any] = {
                "type": type_,
                "status": "True" if ok else "False",
                "lastProbeTime": None,
                "lastTransitionTime": ts,
            }
            if not ok and reason:
                c["reason"] = reason
            return c

        status: dict[str, Any] = {
            "phase": phase,
            "hostIP": self.node_ip,
            "hostIPs": [{"ip": self.node_ip}],
            "startTime": self.start_time,
            "conditions": [
                cond("PodReadyToStartContainers", self.sandbox_ready),
                cond("Initialized", True),
                cond("ContainersReady", ready, "ContainersNotReady"),
                cond("Ready", ready, "ContainersNotReady"),
            ],
            "containerStatuses": [c.to_status() for c in self.containers],
        }
        if self.sandbox_ready:
            status["podIP"] = self.node_ip
            status["podIPs"] = [{"ip": self.node_ip}]
        if self.message:
            status["message"] = self.message
        return status


def same_status(a: dict[str, Any] | None, b: dict[str, Any]) -> bool:
    """Equal ignoring condition transition times (to avoid needless writes)."""
    if a is None:
        return False

    def strip(s: dict[str, Any]) -> dict[str, Any]:
        out = dict(s)
        out["conditions"] = [
            {k: v for k, v in c.items() if k != "lastTransitionTime"}
            for c in s.get("conditions", [])
        ]
        return out

    return strip(a) == strip(b)
