"""An interrupted real-node run leaves host state behind; the next run's sweep removes all of it:
namespaces, cgroups, links, a kernel tunable the kubelet changed and the qemu binfmt handler an
arm64 node needs (unless another process had registered it already: then it is not ours), with
the ``binfmt_misc`` mount made for it (unless it was mounted before).

Runs before the lane's nodes exist (``test_host_sweep`` sorts before the modules that use the
``nodes`` fixture; only ``own_lane`` modules, which ``conftest.py`` moves first, run earlier)
because :func:`hostnet.sweep` removes every real node on the machine.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hostsys import binfmt
from localcluster import hostnet

# A tunable the kubelet rewrites; the child changes it as the kubelet would.
TUNABLE = "vm/overcommit_memory"


def test_interrupted_run_is_swept(tmp_path: Path) -> None:
    hostnet.claim_host()  # a real-node run in another process fails this test, not that run
    if hostnet.leftovers():
        pytest.fail(
            f"host not clean before the test (another real-node run?): {hostnet.leftovers()}"
        )
    original = Path(f"/proc/sys/{TUNABLE}").read_text().strip()
    changed = "1" if original != "1" else "0"
    handler = binfmt.handler_name("arm64")
    ours = handler not in binfmt.state()  # else another process uses it: not this run's
    mounted_before = binfmt.mounted()
    child = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from localcluster import hostnet
        hostnet.record_host_state()
        arm64 = hostnet.foreign_arch("arm64")  # kept referenced: never exited (interrupted)
        arm64.__enter__()
        d = Path({str(tmp_path)!r})
        ns = hostnet.NodeNamespace.create("sweep-1", 1, d, d)
        hostnet.ensure_cgroup_root("sweep-1")
        Path("/proc/sys/{TUNABLE}").write_text("{changed}")
        print(ns.pid, flush=True)
        time.sleep(3600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        holder = int(proc.stdout.readline())
        assert holder > 0
        left = hostnet.leftovers()
        assert any("cgroup" in x for x in left) and any("link" in x for x in left), left
        proc.send_signal(signal.SIGKILL)  # interrupted: no teardown ran
        proc.wait(10)
        time.sleep(0.5)
        assert Path(f"/proc/sys/{TUNABLE}").read_text().strip() == changed
        state = json.loads(hostnet.state_file().read_text())
        assert state["sysctls"][TUNABLE] == original
        if ours:
            assert state["binfmt_registered"] == [handler], state
            assert f"binfmt handler {handler}" in hostnet.leftovers()
        if not mounted_before:
            assert state["binfmt_misc_mounted_here"] is True, state
            assert f"mount {binfmt.BINFMT_MISC}" in hostnet.leftovers()
        assert hostnet.leftovers(), "nothing left behind: the test proves nothing"
    finally:
        if proc.poll() is None:
            proc.kill()
        removed = hostnet.sweep()
    assert removed, "sweep found nothing to remove"
    assert hostnet.leftovers() == []
    assert Path(f"/proc/sys/{TUNABLE}").read_text().strip() == original
    if ours:
        assert f"binfmt handler {handler}" in removed, removed
        assert handler not in binfmt.state()
    if not mounted_before:
        assert f"mount {binfmt.BINFMT_MISC}" in removed, removed
    assert binfmt.mounted() == mounted_before
    assert not hostnet.state_file().exists()
