"""localcluster's Proc.spawn: a component dies with the Python process that started it
(PR_SET_PDEATHSIG via setpriv, no Python code between fork and exec)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from localcluster.processes import Proc, pid_alive

STARTER = """
import sys, time
from pathlib import Path
from localcluster.processes import Proc
p = Proc.spawn("sleeper", ["/bin/sleep", "60"], Path(sys.argv[1]))
print(p.pid, flush=True)
time.sleep(60)
"""


def test_a_spawned_component_dies_with_its_parent(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        deadline = time.monotonic() + 10
        while not pid_alive(pid, "/bin/sleep") and time.monotonic() < deadline:
            time.sleep(0.02)  # setpriv execs the component
        assert pid_alive(pid, "/bin/sleep")
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not pid_alive(pid), "the component outlived the process that started it"
    finally:
        parent.kill()
        parent.wait()


def test_without_die_with_parent_argv_is_run_as_given(tmp_path: Path) -> None:
    proc = Proc.spawn("echo", ["/bin/echo", "hello"], tmp_path, die_with_parent=False)
    assert proc.popen is not None and proc.popen.wait(10) == 0
    assert "hello" in proc.log_file.read_text()
