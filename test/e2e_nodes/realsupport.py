"""Helpers of the real-node lane: ``kubectl`` as a user runs it, and polling with a deadline."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[2]
REAL_NODES = ("real-1", "real-2")
KUBECTL = REPO / ".venv" / "bin" / "kubectl"
T = TypeVar("T")


class Kubectl:
    """``kubectl --kubeconfig=<admin>``; raises with stderr when a command fails."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig

    def __call__(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 240
    ) -> str:
        """Run kubectl; returns stdout (plus stderr when ``check`` is False)."""
        done = subprocess.run(
            [str(KUBECTL), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout + ("" if check else done.stderr)

    def json(self, *args: str) -> dict[str, Any]:
        """``kubectl <args> -o json`` decoded."""
        out: dict[str, Any] = json.loads(self(*args, "-o", "json"))
        return out

    def items(self, *args: str) -> list[dict[str, Any]]:
        """``kubectl get <args> -o json`` items."""
        items: list[dict[str, Any]] = self.json("get", *args)["items"]
        return items


def wait_for(what: str, fn: Callable[[], T | None], timeout: float = 60, every: float = 0.5) -> T:
    """Poll ``fn`` until it returns a truthy value; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = fn()
            if value:
                return value
        except AssertionError as e:  # a failing kubectl: keep polling, report the last one
            last = e
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last error: {last}")
