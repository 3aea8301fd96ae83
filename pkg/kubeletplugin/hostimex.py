"""Channel claims in host-managed IMEX mode: ask the node's own IMEX service, hand out channel 0.

In host-managed mode (``IMEX_MODE=hostManaged``, upstream v0.5 #1236) the node's
``nvidia-imex.service`` -- configured by the administrator, outside Kubernetes -- runs the IMEX
domain; the driver starts no daemon, sets no node label and waits for no ComputeDomain
readiness. What Prepare of a channel claim does instead (:class:`HostManagedChannels`), after
`pkg.kubeletplugin.state.DeviceState` has done the common steps (domain exists, channel 0 not
held by another PrepareCompleted claim):

1. the allocated device must be an allocatable channel (``channel-<N>``, N in range);
2. the claim and its ComputeDomain must share a namespace (permanent error otherwise);
3. on a node without a clique (no NVLink fabric) succeed with no device and ask nobody;
4. otherwise the host IMEX must answer ``READY`` (:class:`HostImexCtl`): a failure is the
   retryable ``host nvidia-imex daemon readiness check failed: ...``, so the kubelet retries and
   the workload pod waits in ``ContainerCreating``;
5. inject exactly one channel device node, ``/dev/nvidia-caps-imex-channels/channel<N>``;
   ``allocationMode: All`` is ignored (a host IMEX domain is shared by every ComputeDomain on
   it: handing out all 2048 channels would give one workload every other's channels).

Daemon claims are refused permanently (:data:`DAEMON_CLAIMS_REFUSED`) and Unprepare removes no
node label; both are dispatched by ``DeviceState``.

:class:`HostImexCtl` owns the readiness query: ``nvidia-imex-ctl`` is looked up at each query
(the host may install it after the plugin started) under the plugin's dev root in upstream's
directories (``/``, ``/opt/bin``, ``/usr/bin``, ``/usr/sbin``, ``/bin``, ``/sbin``; symlinks
resolved inside the root; a regular executable file), then run as ``chroot <devRoot>
nvidia-imex-ctl -q --u=<socket>`` through an injected
:class:`pkg.imex.ctl.CommandRunner`, so the socket path is the one the host's
``/etc/nvidia-imex/config.cfg`` names (``IMEX_CMD_UNIX_DOMAIN_PATH``), resolved inside the
driver root. Its output must *contain* ``READY``. The error strings are upstream's, because
operators grep the kubelet events for them. Unlike upstream, the query is bounded
(:data:`CTL_TIMEOUT`), so a hung host daemon fails one attempt instead of wedging Prepare.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Final

from pkg.api.opaque import ChannelConfig
from pkg.base.types import JSON
from pkg.draplugin.claims import ClaimRef
from pkg.draplugin.errors import PermanentError, RetryableError
from pkg.imex.ctl import CommandRunner
from pkg.kubeletplugin.cdi import ContainerEdits
from pkg.kubeletplugin.driverroot import DriverRoot
from pkg.kubeletplugin.procdevices import DeviceNode
from pkg.runtime.logsetup import V

__all__ = [
    "CTL_NAME",
    "CTL_SEARCH_DIRS",
    "CTL_TIMEOUT",
    "DAEMON_CLAIMS_REFUSED",
    "HostImexCtl",
    "HostImexError",
    "HostManagedChannels",
]

log = logging.getLogger(__name__)

CTL_NAME: Final = "nvidia-imex-ctl"
CTL_SEARCH_DIRS: Final = ("/", "/opt/bin", "/usr/bin", "/usr/sbin", "/bin", "/sbin")
CTL_TIMEOUT: Final = 30.0
READY_OUTPUT: Final = "READY"  # what the output must contain
DAEMON_CLAIMS_REFUSED: Final = (
    "ComputeDomain daemon claims are not supported when imex.mode=hostManaged"
)
_CHANNEL_DEVICE = re.compile(r"channel-(0|[1-9][0-9]*)")


class HostImexError(Exception):
    """The host IMEX service cannot be asked, or did not say ``READY``; the text is upstream's."""


def _quote(text: str) -> str:
    """Go's ``%q`` for the strings that occur here (paths, device names)."""
    return json.dumps(text, ensure_ascii=False)


class HostImexCtl:
    """``nvidia-imex-ctl -q --u=<socket>`` of the host IMEX, run chrooted into the dev root.

    Thread-safe: every query looks the binary up afresh and runs one process; nothing is cached.
    """

    def __init__(
        self,
        *,
        dev_root: Path,
        socket_path: str,
        runner: CommandRunner,
        timeout: float = CTL_TIMEOUT,
    ) -> None:
        """``dev_root``: the driver root as mounted here if it has ``dev/``, else ``/``
        (`pkg.kubeletplugin.discovery.fabric.select_dev_root`); ``socket_path``: the control
        socket as seen inside ``dev_root``."""
        self.dev_root = dev_root
        self.socket_path = socket_path
        self._runner = runner
        self._timeout = timeout
        self._root = DriverRoot(host=dev_root, container=dev_root)

    def find_ctl(self) -> str:
        """Root-relative path of ``nvidia-imex-ctl`` (the first search directory that has it as
        a regular executable file); :class:`HostImexError` with upstream's text otherwise."""
        for directory in CTL_SEARCH_DIRS:
            candidate = f"{directory.rstrip('/')}/{CTL_NAME}"
            resolved = self._root.resolve(candidate)
            if resolved is None:
                log.log(
                    V(4),
                    "Skipping candidate %s: not found or not a regular file",
                    _quote(str(self.dev_root / candidate.lstrip("/"))),
                )
                continue
            if os.access(self.dev_root / resolved.lstrip("/"), os.X_OK):
                return candidate
        raise HostImexError(
            f"{CTL_NAME} not found under driver root {_quote(str(self.dev_root))}: error "
            f"locating {_quote(CTL_NAME)} (is nvidia-imex installed on this node?)"
        )

    def check_ready(self) -> None:
        """Return if the host IMEX says ``READY``; :class:`HostImexError` (upstream's text)
        if the binary is missing, cannot run, exits non-zero, or says anything else."""
        self.find_ctl()
        argv = ["chroot", str(self.dev_root), CTL_NAME, "-q", f"--u={self.socket_path}"]
        where = f"{CTL_NAME} (socket {_quote(self.socket_path)})"
        try:
            result = self._runner.run(argv, timeout=self._timeout)
        except subprocess.TimeoutExpired as err:
            raise HostImexError(
                f"error running {where}: no answer within {self._timeout:.0f}s, output: "
            ) from err
        except OSError as err:
            raise HostImexError(f"error running {where}: {err}, output: ") from err
        if result.returncode != 0:
            raise HostImexError(
                f"error running {where}: exit status {result.returncode}, output: {result.output}"
            )
        if READY_OUTPUT not in result.output:
            raise HostImexError(f"host nvidia-imex daemon not ready: {result.output}")


class HostManagedChannels:
    """Prepare of a channel config group in host-managed mode (steps 1-5 of the module doc)."""

    def __init__(
        self,
        *,
        ctl: HostImexCtl,
        clique_id: Callable[[], str],
        channel_nodes: tuple[DeviceNode, ...],
    ) -> None:
        """``clique_id`` is read at each Prepare (a refresh may change it); ``channel_nodes``
        are the node's ``nvidia-caps-imex-channels`` device nodes, channel N at index N."""
        self._ctl = ctl
        self._clique_id = clique_id
        self._channel_nodes = channel_nodes

    def prepare_channel(
        self, ref: ClaimRef, config: ChannelConfig, domain: JSON, *, device: str
    ) -> ContainerEdits:
        """The CDI edits of the channel group allocated as ``device`` of claim ``ref``, whose
        ComputeDomain object is ``domain``; raises `PermanentError` (not a channel, other
        namespace) or `RetryableError` (host IMEX not ready). ``config.allocation_mode`` is
        deliberately not read."""
        match = _CHANNEL_DEVICE.fullmatch(device)
        channel = int(match.group(1)) if match else -1
        if not 0 <= channel < len(self._channel_nodes):
            raise PermanentError(
                f"requested device {_quote(device)} is not an allocatable IMEX channel device"
            )
        cd_ns = (domain.get("metadata") or {}).get("namespace")
        if cd_ns != ref.namespace:
            # Same wording as driver-managed mode (state.py): the domain's namespace is not named.
            raise PermanentError(
                "the ResourceClaim's namespace is different than the ComputeDomain's namespace "
                f"(claim namespace {ref.namespace})"
            )
        if not self._clique_id():
            return ContainerEdits()  # no NVLink fabric here: nothing to ask, no channel
        try:
            self._ctl.check_ready()
        except HostImexError as err:
            raise RetryableError(f"host nvidia-imex daemon readiness check failed: {err}") from err
        return ContainerEdits(device_nodes=(self._channel_nodes[channel].to_cdi(),))
