"""Host-managed IMEX on the real-node lane: each node's "host" runs its own IMEX service.

What an administrator sets up on a GPU node for ``IMEX_MODE=hostManaged``, made from the
simulators: the node's fake driver root gets the host layout (``dev/``, ``etc/nvidia-imex/
config.cfg`` naming the control socket, a statically linked ``nvidia-imex-ctl`` the plugin can
run under ``chroot``; `pkg.testing.fakedriverroot`), and the simulated ``nvidia-imex.service``
(`pkg.imex.sim.hostservice`) runs inside the node's namespaces -- outside Kubernetes, like a
systemd unit -- answering on that socket. :func:`build_static_ctl` compiles the client from
``hack/hostimex/nvidia-imex-ctl.c`` (gcc with static libc: ``hack/node-deps.sh``), cached by
the source's hash. :meth:`HostImex.hold` makes one node's service answer ``UNAVAILABLE``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from localcluster.processes import Proc
from localcluster.realnode import RealNode, RealNodes

from pkg.imex.sim.hostservice import HOLD_FILE
from pkg.testing.fakedriverroot import HOST_IMEX_CONFIG, HOST_IMEX_SOCKET, FakeDriverRoot, host_arch

REPO = Path(__file__).resolve().parents[2]
CTL_SOURCE = REPO / "hack" / "hostimex" / "nvidia-imex-ctl.c"
DRIVER_ROOT = "/var/lib/compute-domain-fake/driver-root"  # NVIDIA_DRIVER_ROOT of the overlay


def build_static_ctl() -> Path:
    """The static simulated ``nvidia-imex-ctl`` for this machine, built once per source hash."""
    digest = hashlib.sha256(CTL_SOURCE.read_bytes()).hexdigest()[:16]
    cache = Path(os.environ.get("CD_E2E_CACHE") or Path.home() / ".cache" / "compute-domain-e2e")
    out = cache / "hostimex" / f"nvidia-imex-ctl-{digest}"
    if out.is_file():
        return out
    if shutil.which("gcc") is None:
        raise AssertionError("gcc not found: run hack/node-deps.sh (the lane needs static libc)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    done = subprocess.run(
        ["gcc", "-static", "-Os", "-Wall", "-Werror", "-o", str(tmp), str(CTL_SOURCE)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if done.returncode != 0:
        raise AssertionError(f"building {CTL_SOURCE.name} failed:\n{done.stderr}")
    tmp.replace(out)
    return out


class HostImex:
    """The simulated host IMEX service of each of ``names``; :meth:`stop` undoes everything."""

    def __init__(self, nodes: RealNodes, names: tuple[str, ...]) -> None:
        self._nodes = [nodes[n] for n in names]
        self._procs: dict[str, Proc] = {}

    def _root(self, node: RealNode) -> Path:
        return node.ns.path(DRIVER_ROOT)

    def start(self) -> None:
        """Lay out each driver root as a host install and start its service; waits until
        every control socket exists."""
        ctl = build_static_ctl()
        for node in self._nodes:
            FakeDriverRoot.create(self._root(node), arch=host_arch(node.arch), host_imex_ctl=ctl)
            argv = [
                sys.executable,
                "-m",
                "pkg.imex.sim.hostservice",
                "-c",
                f"{DRIVER_ROOT}/{HOST_IMEX_CONFIG}",
                "--root",
                DRIVER_ROOT,
            ]
            self._procs[node.name] = Proc.spawn(
                f"{node.name}-host-imex",
                node.ns.argv(argv),
                node.log_dir,
                env={**os.environ, "PYTHONPATH": str(REPO)},
            )
        deadline = time.monotonic() + 30
        for node in self._nodes:
            sock = self._root(node) / HOST_IMEX_SOCKET.lstrip("/")
            while not sock.is_socket():
                proc = self._procs[node.name]
                if not proc.alive() or time.monotonic() > deadline:
                    raise AssertionError(
                        f"host IMEX service of {node.name} did not come up:\n"
                        + proc.log_file.read_text()[-2000:]
                    )
                time.sleep(0.1)

    def hold_file(self, name: str) -> Path:
        """While this file exists, ``name``'s host IMEX answers ``UNAVAILABLE``."""
        node = next(n for n in self._nodes if n.name == name)
        return (self._root(node) / HOST_IMEX_CONFIG).parent / HOLD_FILE

    def stop(self) -> None:
        """Stop every service and give the driver roots back their driver-managed layout."""
        for node in self._nodes:
            proc = self._procs.pop(node.name, None)
            if proc is not None:
                proc.stop(grace=5)
            self.hold_file(node.name).unlink(missing_ok=True)
            FakeDriverRoot.create(self._root(node), arch=host_arch(node.arch))
