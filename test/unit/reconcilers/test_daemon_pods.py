"""Reading a daemon pod's termination message: DriverRootIncomplete (pkg.reconcilers.daemonpods)."""

from __future__ import annotations

from typing import Any

from pkg.api import constants as c
from pkg.reconcilers.daemonpods import driver_root_incomplete, driver_root_message

DETAIL = "nvidia-imex not found in the container on node n1: install it"


def pod(node: str, state: dict[str, Any], last: dict[str, Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"name": c.DAEMON_CONTAINER_NAME, "state": state}
    if last is not None:
        status["lastState"] = last
    return {"spec": {"nodeName": node}, "status": {"containerStatuses": [status]}}


def terminated(message: str) -> dict[str, Any]:
    return {"terminated": {"exitCode": 3, "reason": "Error", "message": message}}


def test_terminated_with_the_message() -> None:
    assert driver_root_incomplete(pod("n1", terminated(f"DriverRootIncomplete: {DETAIL}"))) == (
        DETAIL
    )


def test_crash_loop_back_off_reads_the_last_state() -> None:
    waiting = {"waiting": {"reason": "CrashLoopBackOff"}}
    p = pod("n1", waiting, terminated(f"DriverRootIncomplete: {DETAIL}"))
    assert driver_root_incomplete(p) == DETAIL


def test_running_again_is_healthy_whatever_the_last_exit_said() -> None:
    p = pod("n1", {"running": {}}, terminated(f"DriverRootIncomplete: {DETAIL}"))
    assert driver_root_incomplete(p) == ""


def test_other_exits_and_missing_statuses_are_not_driver_root_problems() -> None:
    assert driver_root_incomplete(pod("n1", terminated("OOMKilled"))) == ""
    assert driver_root_incomplete({"status": {}}) == ""


def test_message_lists_every_node() -> None:
    pods = [
        pod("n2", terminated("DriverRootIncomplete: b on n2")),
        pod("n1", terminated("DriverRootIncomplete: a on n1")),
        pod("n3", {"running": {}}),
    ]
    assert driver_root_message(pods) == "a on n1; b on n2"
    assert driver_root_message([]) == ""
