"""The daemon's own pod label: the clique ID on the IMEX daemon's pod, as upstream's daemon sets
it (``resource.nvidia.com/computeDomain.cliqueID``; ``""`` on a node without NVLink fabric).

The label is what makes the pod a member for the controller (its daemon-pod index), and nothing
in the daemon waits for it, so it is the daemon's first API request: the entry point starts a
`PodLabeller` right after the API client exists, before it imports the informers, IMEX
supervision, metrics and tracing, and the PATCH is on the wire while those load (exec
to first API request). This module therefore imports only the API client's types and constants.

Invariant: one labeller PATCHes at most until the first success (or a 404: the pod is gone, so
there is nothing to label); API and connection failures are retried with a doubling delay
(0.2 s up to 10 s) until then or until ``stop`` is set.
"""

from __future__ import annotations

import logging
import threading
from typing import Final

from pkg.api.constants import CLIQUE_ID_LABEL
from pkg.base.clock import Clock
from pkg.kube.client import KubeClient
from pkg.kube.errors import ApiError, ConnectionFailedError, NotFoundError
from pkg.kube.resources import PODS

log = logging.getLogger(__name__)

FIRST_RETRY_DELAY: Final = 0.2
MAX_RETRY_DELAY: Final = 10.0


class PodLabeller:
    """Labels one pod with its clique ID, in a thread of its own or inline."""

    def __init__(
        self,
        client: KubeClient,
        clock: Clock,
        *,
        pod_name: str,
        pod_namespace: str,
        clique_id: str,
    ) -> None:
        """``pod_name`` empty means the pod is unknown (``POD_NAME`` unset): nothing is sent."""
        self._client = client
        self._clock = clock
        self._pod = pod_name
        self._namespace = pod_namespace
        self._clique_id = clique_id
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def label(self) -> None:
        """One PATCH of the label; a missing pod is logged, not raised. Raises `ApiError` /
        `ConnectionFailedError` for anything else."""
        if not self._pod:
            log.warning("POD_NAME not set; not labelling the daemon pod")
            return
        body = {"metadata": {"labels": {CLIQUE_ID_LABEL: self._clique_id}}}
        try:
            self._client.patch(PODS, self._pod, body, namespace=self._namespace)
        except NotFoundError:
            log.warning("daemon pod %s/%s not found; not labelled", self._namespace, self._pod)

    def run(self, stop: threading.Event) -> bool:
        """`label` until it succeeds or ``stop`` is set (then False), retrying with backoff."""
        delay = FIRST_RETRY_DELAY
        while True:
            try:
                self.label()
                return True
            except (ApiError, ConnectionFailedError) as err:
                if stop.is_set():
                    log.warning("label own pod failed: %s; giving up, shutting down", err)
                    return False
                log.warning("label own pod failed: %s; retrying in %.1fs", err, delay)
                self._clock.wait(stop, delay)
                delay = min(delay * 2, MAX_RETRY_DELAY)

    def start(self, stop: threading.Event) -> None:
        """`run` in a daemon thread named ``label-pod``; a second call does nothing."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self.run, args=(stop,), name="label-pod", daemon=True
            )
            self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` for the started thread; True once it has finished (or was
        never started)."""
        with self._lock:
            thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()
