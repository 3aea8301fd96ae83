"""The node's NVLink clique ID while the plugin runs; the opt-in ``nvidia.com/gpu.clique`` label.

Owns two things:

* the current clique ID (`CliqueRefresher.clique_id`, the one accessor every reader uses: the
  daemon claim's ``CLIQUE_ID``, the readiness lookup of clique ``<cdUID>.<cliqueID>``, whether a
  channel claim gets channel device nodes, the fabric-imex-mgmt node of a daemon claim, the
  ``cliqueID`` slice attribute). Start-up detection decides the first value (and may stop the
  plugin); then, every ``interval`` seconds on the injected `pkg.base.Clock` (the first run one
  interval after `CliqueRefresher.start`), full detection runs again -- fabric partitioning can
  move a node to another clique. A new value is adopted only when it is non-empty and different:
  the ID never goes back to ``""`` (a GPU that stops answering does not take the node out of its
  clique). A failed refresh, strict-mode fabric errors included, is only logged; only start-up
  detection can stop the plugin;
* with ``--gpu-clique-label-enabled`` (`NodeCliqueLabel`), the node label
  ``nvidia.com/gpu.clique=<clusterUUID>.<cliqueId>`` (GPU feature discovery's key and format):
  a JSON merge patch of this node at start (an error fails start-up), again on every refresh
  (an error is logged), and a merge patch with ``null`` on graceful shutdown, bounded by a
  timeout and only logged on failure. A clique ID of ``""`` writes nothing at start or on a
  tick (the removal at shutdown is unconditional, as upstream's). Each patch also sets (or
  removes) the annotation ``resource.nvidia.com/gpu.clique-managed=kubelet-plugin``: the
  controller, which otherwise mirrors the clique onto the same label, leaves a node so marked
  alone (`pkg.api.constants`).

Adopting a change affects what is prepared from then on; claims already prepared keep the
devices and env they were given (upstream's behaviour).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Final

from pkg.api.constants import (
    GPU_CLIQUE_MANAGED_ANNOTATION,
    GPU_CLIQUE_MANAGED_BY_PLUGIN,
    GPU_CLIQUE_NODE_LABEL,
)
from pkg.base.clock import Clock
from pkg.base.types import JSON
from pkg.kube.client import KubeClient
from pkg.kube.resources import NODES
from pkg.kubeletplugin.discovery import DeviceDiscovery

__all__ = [
    "LABEL_REMOVAL_TIMEOUT",
    "REFRESH_INTERVAL",
    "CliqueLabelError",
    "CliqueRefresher",
    "NodeCliqueLabel",
]

log = logging.getLogger(__name__)

# Upstream's gpuCliqueLabelRefreshInterval.
REFRESH_INTERVAL: Final = 600.0
# How long graceful shutdown waits for the label's removal.
LABEL_REMOVAL_TIMEOUT: Final = 5.0


class CliqueLabelError(Exception):
    """Writing the ``nvidia.com/gpu.clique`` label failed; the message says how."""


class NodeCliqueLabel:
    """Merge-patches ``nvidia.com/gpu.clique`` on one node; safe to call from any thread."""

    def __init__(self, *, client: KubeClient, node_name: str, clock: Clock) -> None:
        self._client = client
        self._node = node_name
        self._clock = clock

    def set(self, clique_id: str) -> None:
        """Label the node with ``clique_id``; ``""`` writes nothing. Raises `CliqueLabelError`
        (message ``error patching node with label ...: <cause>``) if the patch fails."""
        if not clique_id:
            return
        try:
            self._client.patch(NODES, self._node, _patch(clique_id), patch_type="merge")
        except Exception as err:
            raise CliqueLabelError(
                f"error patching node with label {GPU_CLIQUE_NODE_LABEL}={clique_id}: {err}"
            ) from err

    def remove(self, *, timeout: float = LABEL_REMOVAL_TIMEOUT) -> None:
        """Remove the label (merge patch ``null``), waiting at most ``timeout`` clock-seconds;
        never raises: a failure or a timeout is logged (the patch may still land later)."""
        done = threading.Event()
        failure: list[BaseException] = []

        def patch() -> None:
            try:
                self._client.patch(NODES, self._node, _patch(None), patch_type="merge")
            except Exception as err:
                failure.append(err)
            finally:
                done.set()

        threading.Thread(target=patch, name="gpu-clique-label-removal", daemon=True).start()
        if not self._clock.wait(done, timeout):
            log.error(
                "error removing %s node label: no answer from the API server within %.0fs",
                GPU_CLIQUE_NODE_LABEL,
                timeout,
            )
        elif failure:
            log.error("error removing %s node label: %s", GPU_CLIQUE_NODE_LABEL, failure[0])


def _patch(clique_id: str | None) -> JSON:
    """Merge patch setting (or, for None, removing) the label and its owner annotation."""
    owner = None if clique_id is None else GPU_CLIQUE_MANAGED_BY_PLUGIN
    return {
        "metadata": {
            "labels": {GPU_CLIQUE_NODE_LABEL: clique_id},
            "annotations": {GPU_CLIQUE_MANAGED_ANNOTATION: owner},
        }
    }


class CliqueRefresher:
    """The node's current clique ID and its periodic re-detection (module docstring).

    `clique_id` may be called from any thread at any time. `start` is called once and `stop`
    after it (again: no-op), from one thread; `refresh` is the body of one tick (the refresh
    thread's, or a test's).
    """

    def __init__(
        self,
        *,
        initial: str,
        discovery: DeviceDiscovery | None,
        clock: Clock,
        label: NodeCliqueLabel | None = None,
        interval: float = REFRESH_INTERVAL,
        on_change: Callable[[str], None] = lambda _clique: None,
        label_removal_timeout: float = LABEL_REMOVAL_TIMEOUT,
    ) -> None:
        """``initial``: start-up detection's result. ``discovery``: what each tick runs again
        (None: the ID keeps its initial value; the label is still refreshed). ``label``: the
        node label to maintain (None: flag off). ``on_change(new)`` runs on the refresh thread
        after a change is adopted and must not block for long."""
        self._lock = threading.Lock()
        self._clique_id = initial
        self._discovery = discovery
        self._clock = clock
        self._label = label
        self._interval = interval
        self._on_change = on_change
        self._removal_timeout = label_removal_timeout
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def clique_id(self) -> str:
        """The node's clique ID now (``""`` on a node without an NVLink clique)."""
        with self._lock:
            return self._clique_id

    def start(self) -> None:
        """Label the node (flag on) and start the refresh thread. Raises `CliqueLabelError`
        (message ``error setting nvidia.com/gpu.clique node label: ...``) before starting
        anything if the label cannot be written."""
        if self._label is not None:
            try:
                self._label.set(self.clique_id())
            except CliqueLabelError as err:
                raise CliqueLabelError(
                    f"error setting {GPU_CLIQUE_NODE_LABEL} node label: {err}"
                ) from err
        self._thread = threading.Thread(target=self._run, name="clique-refresh", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the refresh thread, then remove the label (flag on; bounded, only logged)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._label is not None:
            self._label.remove(timeout=self._removal_timeout)

    def _run(self) -> None:
        while not self._clock.wait(self._stop, self._interval):
            self.refresh()

    def refresh(self) -> None:
        """One tick: re-detect, adopt a non-empty changed ID, re-label (flag on). Never raises."""
        try:
            self._refresh()
        except Exception as err:
            log.error("error refreshing %s node label: %s", GPU_CLIQUE_NODE_LABEL, err)

    def _refresh(self) -> None:
        if self._discovery is not None:
            detected = self._discovery.discover().clique_id
            with self._lock:
                old = self._clique_id
                changed = bool(detected) and detected != old
                if changed:
                    self._clique_id = detected
            if changed:
                log.info(
                    'GPU clique ID changed from "%s" to "%s", updating %s node label',
                    old,
                    detected,
                    GPU_CLIQUE_NODE_LABEL,
                )
                try:
                    self._on_change(detected)
                except Exception:
                    log.exception("applying the new clique ID %s failed", detected)
        if self._label is not None:
            self._label.set(self.clique_id())
