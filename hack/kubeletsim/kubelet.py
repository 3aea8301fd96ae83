"""The kubelet stand-in of one node: pod watch, pod workers, DRA housekeeping.

Owns the node's pod loop: list+watch pods with ``fieldSelector=spec.nodeName=<node>`` (with the
node's own identity), one :class:`~kubeletsim.podworker.PodWorker` per pod UID fed with the
latest object, and a housekeeping pass that retries ``NodeUnprepareResources`` for claims whose
pods are gone (e.g. while the plugin was down) — the kubelet never forgets a prepared claim.
Everything node-specific arrives in a :class:`~kubeletsim.podworker.NodeContext`, so a real
kubelet can replace this class node by node without touching the tests' view of a node.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from pkg.kube.errors import TRANSIENT_ERRORS, ApiError, GoneError
from pkg.kube.resources import PODS

from .podworker import NodeContext, PodWorker
from .registration import DraPluginError

log = logging.getLogger(__name__)

WATCH_TIMEOUT = 300
HOUSEKEEPING_PERIOD = 2.0
_WATCH_ERRORS: tuple[type[Exception], ...] = (ApiError, OSError, *TRANSIENT_ERRORS)


class Kubelet:
    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self._lock = threading.Lock()
        self._workers: dict[str, PodWorker] = {}
        self._stop = threading.Event()
        self._stream: Any = None
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        self._stop.clear()
        for target, name in ((self._watch_loop, "pods"), (self._housekeeping, "housekeeping")):
            t = threading.Thread(target=target, name=f"{name}:{self.ctx.node_name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Stop watching and kill the node's local containers (no API writes)."""
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.stop()
        for t in self._threads:
            t.join(timeout=10)
        self._threads.clear()
        with self._lock:
            workers = list(self._workers.values())
            self._workers.clear()
        for w in workers:
            w.shutdown()

    def workers(self) -> dict[str, PodWorker]:
        with self._lock:
            return dict(self._workers)

    # -- pod watch --------------------------------------------------------------------------

    def _dispatch(self, type_: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        with self._lock:
            worker = self._workers.get(uid)
            if worker is not None and worker.done:
                if type_ == "DELETED":
                    del self._workers[uid]
                    return
                if worker.pod_removed:
                    return  # a late event of a pod whose final DELETE was answered
                # The worker stopped because the pod looked gone (a relist without it), yet the
                # API server still has it: like the kubelet's status manager, finish it again.
                log.info(
                    "node %s: pod %s still exists after its worker finished; finalizing it again",
                    self.ctx.node_name,
                    worker.key,
                )
                worker = None
            if type_ == "DELETED":
                if worker is not None:
                    worker.deleted()
                    del self._workers[uid]
                return
            if worker is None:
                worker = PodWorker(self.ctx, pod)
                self._workers[uid] = worker
                worker.start()
                return
        worker.update(pod)

    def _watch_loop(self) -> None:
        selector = f"spec.nodeName={self.ctx.node_name}"
        rv = ""
        while not self._stop.is_set():
            try:
                if not rv:
                    listed = self.ctx.client.list(
                        PODS, field_selector=selector, resource_version="0"
                    )
                    seen = set()
                    for pod in listed.get("items", []):
                        pod.setdefault("apiVersion", "v1")
                        pod.setdefault("kind", "Pod")
                        seen.add(pod["metadata"]["uid"])
                        self._dispatch("MODIFIED", pod)
                    for uid, w in self.workers().items():
                        if uid not in seen:
                            w.deleted()
                    rv = listed["metadata"]["resourceVersion"]
                self._stream = self.ctx.client.watch(
                    PODS,
                    field_selector=selector,
                    resource_version=rv,
                    timeout_seconds=WATCH_TIMEOUT,
                )
                for ev in self._stream:
                    if self._stop.is_set():
                        break
                    rv = ev.object.get("metadata", {}).get("resourceVersion", rv)
                    if ev.type in ("ADDED", "MODIFIED", "DELETED"):
                        self._dispatch(ev.type, ev.object)
            except GoneError:
                rv = ""
            except _WATCH_ERRORS as e:
                if not self._stop.is_set():
                    log.warning("node %s: pod watch failed: %s", self.ctx.node_name, e)
                    rv = ""
                    self._stop.wait(1.0)
            except Exception:
                log.exception("node %s: pod watch crashed", self.ctx.node_name)
                rv = ""
                self._stop.wait(1.0)
        self._stream = None

    # -- housekeeping -----------------------------------------------------------------------

    def _housekeeping(self) -> None:
        while not self._stop.wait(HOUSEKEEPING_PERIOD):
            live = set(self.workers())
            for uid, info in self.ctx.dra.prepared().items():
                if info.pods & live:
                    continue
                for pod_uid in list(info.pods):
                    # A pod that is gone without a worker (e.g. after a node restart).
                    self.ctx.dra.release(pod_uid)
                plugin = self.ctx.plugins.plugin(info.driver)
                if plugin is None:
                    continue
                try:
                    plugin.unprepare([info.ref])
                    self.ctx.dra.unprepared(uid)
                    log.info("node %s: unprepared leftover claim %s", self.ctx.node_name, uid)
                except DraPluginError as e:
                    log.warning("node %s: unprepare leftover %s: %s", self.ctx.node_name, uid, e)
