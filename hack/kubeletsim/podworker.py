"""One pod's life on a simulated node: prepare claims, start containers, probe, terminate.

Owns the per-pod state machine the kubelet runs (``SyncPod`` / ``SyncTerminatingPod``):

1. resolve the pod's ResourceClaims and wait until they are allocated and reserved for it;
2. ``NodePrepareResources`` through the node's DRA manager; on error post a
   ``FailedPrepareDynamicResources`` Warning Event and retry with exponential backoff;
3. per container, resolve the CDI IDs it receives with the real CDI library; an unresolvable ID
   fails the container start (``CreateContainerError`` + ``Failed`` Event, retried);
4. containers whose command is in :class:`~kubeletsim.runtime.LocalCommands` run as local
   processes with the pod's env (downward API + CDI env), mounts handed over as host paths, and
   their startup/readiness/liveness exec probes; all other containers are marked running and
   their edits written to ``<node>/containers/<ns>_<pod>_<container>.json``;
5. on deletion: stop processes (SIGTERM, grace, SIGKILL), unprepare claims no other pod on the
   node uses, post the terminated status, then delete the pod with grace period 0 (the
   kubelet's final delete), in that order. Like the kubelet's pod worker, finalization never
   gives up: a step that fails (plugin not registered or failing, API server unreachable,
   5xx, timeouts, any other error) is retried with exponential backoff
   (``FINALIZE_BACKOFF`` .. ``FINALIZE_MAX_BACKOFF``) until it succeeds, across API server
   restarts; the final DELETE is sent only after every claim was unprepared. Only the pod's
   own disappearance (404, or a UID precondition failing: a new pod took the name) ends it
   early.

One thread per pod; the node's pod watch feeds it the latest object through :meth:`update`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pkg.kube.client import KubeClient
from pkg.kube.errors import TRANSIENT_ERRORS, ApiError, ConflictError, NotFoundError
from pkg.kube.events import EventRecorder
from pkg.kube.resources import PODS

from .cdi import CdiError, CdiResolver, ContainerEdits
from .claims import ClaimNotReadyError, DraManager, resolve_pod_claims
from .layout import NodeDirs
from .localrun import LocalRun
from .podspec import PodSpecError, cdi_ids_for_container, cdi_mounts, hosts_file_text
from .podstatus import ContainerState, PodState, same_status
from .registration import DraPluginError, PluginWatcher, PreparedDevice
from .runtime import LocalCommands

log = logging.getLogger(__name__)

TICK = 0.25
CLAIM_POLL = 0.2
MAX_BACKOFF = 10.0
# A failed write worth retrying: any answer but 404/409, and every outage or timeout.
RETRYABLE: tuple[type[Exception], ...] = (ApiError, *TRANSIENT_ERRORS)
FINALIZE_BACKOFF = 0.25
FINALIZE_MAX_BACKOFF = 2.0  # short: a pod's deletion must finish soon after an outage ends


@dataclass
class NodeContext:
    """Everything a pod worker needs from its node (injected, shared by all pods)."""

    node_name: str
    node_ip: str
    client: KubeClient
    events: EventRecorder
    dirs: NodeDirs
    plugins: PluginWatcher
    dra: DraManager
    cdi: CdiResolver
    commands: LocalCommands
    # The kubeconfig a local container talks to the API with (its ServiceAccount's token).
    kubeconfig_for: Callable[[dict[str, Any]], Path | None]
    max_grace: float = 30.0
    probe_period_scale: float = 1.0  # see localrun: >1 only for many-node benchmarks


class StartError(RuntimeError):
    def __init__(self, reason: str, message: str, *, event: str | None) -> None:
        super().__init__(message)
        self.reason, self.event = reason, event


class PodWorker:
    def __init__(self, ctx: NodeContext, pod: dict[str, Any]) -> None:
        self._ctx = ctx
        self._pod = pod
        self._gone = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.uid: str = pod["metadata"]["uid"]
        self.key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        self._state = PodState(node_ip=ctx.node_ip)
        self._state.containers = [
            ContainerState(name=c["name"], image=c.get("image", ""))
            for c in pod["spec"].get("containers", [])
        ]
        self._local: dict[str, LocalRun] = {}
        # (wall start, wall end, ok) of each NodePrepareResources call, for benchmarks.
        self.prepare_calls: list[tuple[float, float, bool]] = []
        self._started = False
        self._terminated = False
        self._backoff = 0.5
        self._next_try = 0.0
        self._last_status: dict[str, Any] | None = None
        self._released = False  # a finished pod's claims unprepared
        self._stopped = False  # containers stopped (termination step 1 done)
        self._final_status_posted = False
        self._finalize_backoff = FINALIZE_BACKOFF
        self._status_backoff = FINALIZE_BACKOFF
        self._next_status = 0.0
        self._next_finalize = 0.0
        self.finalize_failures = 0  # failed finalization attempts (tests, logs)
        # The final DELETE was answered (or the pod was found gone/replaced): nothing of this pod
        # is left to do. A finished worker without it only stopped because the pod looked gone.
        self.pod_removed = False
        self.last_error = ""  # the latest finalization failure (diagnostics)
        self._thread = threading.Thread(target=self._run, name=f"pod:{self.key}", daemon=True)

    # -- feeding ----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def update(self, pod: dict[str, Any]) -> None:
        self._pod = pod
        self._wake.set()

    def deleted(self) -> None:
        self._gone = True
        self._wake.set()

    def shutdown(self, *, kill: bool = True) -> None:
        """Stop the worker (node stop): processes are killed, nothing written to the API."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10)
        for run in self._local.values():
            run.stop(0.5 if kill else self._ctx.max_grace)

    def kill_processes(self) -> None:
        """SIGKILL local containers now, from any thread (interpreter exit)."""
        for run in list(self._local.values()):
            run.kill()

    def container_pids(self) -> dict[str, int]:
        """PIDs of the pod's running local containers by container name (fault injection)."""
        return {n: pid for n, run in list(self._local.items()) if (pid := run.pid) is not None}

    def container_started_at(self) -> dict[str, float]:
        """Wall-clock start of each running local container's current process, by name."""
        out = {}
        for name, run in list(self._local.items()):
            if (t := run.started_at) is not None:
                out[name] = t
        return out

    @property
    def pod(self) -> dict[str, Any]:
        """The latest pod object the watch delivered."""
        return self._pod

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    # -- loop -------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._step():
                    return
            except Exception:
                log.exception("pod %s: sync failed", self.key)
                self._delay_retry()
            self._wake.wait(TICK)
            self._wake.clear()

    def _step(self) -> bool:
        """One sync; True when the worker is finished."""
        pod = self._pod
        if self._gone:
            return self._finalize(grace=0.5, delete=False)
        if pod["metadata"].get("deletionTimestamp"):
            grace = float(pod["metadata"].get("deletionGracePeriodSeconds") or 30)
            return self._finalize(grace=min(grace, self._ctx.max_grace), delete=True)
        phase = self._state.phase(pod["spec"].get("restartPolicy", "Always"))
        if phase in ("Succeeded", "Failed"):
            if not self._terminated:
                self._terminate(grace=0)
            if not self._released and time.monotonic() >= self._next_try:
                # The kubelet unprepares a finished pod's claims (syncTerminatedPod).
                self._released = self._unprepare()
                if not self._released:
                    self._delay_retry()
            self._post_status()
            return False
        if not self._started:
            if time.monotonic() >= self._next_try:
                self._try_start(pod)
        else:
            self._supervise(pod)
        self._post_status()
        return False

    def _delay_retry(self) -> None:
        self._next_try = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, MAX_BACKOFF)

    # -- start ------------------------------------------------------------------------------

    def _try_start(self, pod: dict[str, Any]) -> None:
        try:
            prepared = self._prepare(pod)
            self._state.sandbox_ready = True
            self._create_containers(pod, prepared)
        except StartError as e:
            log.info("pod %s: %s: %s", self.key, e.reason, e)
            if e.event:
                self._ctx.events.event(pod, "Warning", e.event, str(e))
            if e.reason == "ClaimNotReady":
                # Not an error: the claim/authorizer graph is catching up; poll, don't back off.
                self._next_try = time.monotonic() + CLAIM_POLL
            else:
                self._delay_retry()
            return
        self._started = True
        self._backoff = 0.5

    def _prepare(self, pod: dict[str, Any]) -> dict[str, list[PreparedDevice]]:
        if not pod["spec"].get("resourceClaims"):
            return {}
        try:
            claims = resolve_pod_claims(self._ctx.client, pod)
        except ClaimNotReadyError as e:
            raise StartError("ClaimNotReadyError", str(e), event=None) from e
        prepared: dict[str, list[PreparedDevice]] = {}
        for driver in sorted({d for c in claims for d in c.drivers()}):
            plugin = self._ctx.plugins.plugin(driver)
            if plugin is None:
                msg = f"prepare dynamic resources: DRA driver {driver} is not registered"
                raise StartError("PrepareFailed", msg, event="FailedPrepareDynamicResources")
            called = time.time()
            try:
                prepared.update(self._ctx.dra.prepare(plugin, self.uid, claims))
                self.prepare_calls.append((called, time.time(), True))
            except DraPluginError as e:
                self.prepare_calls.append((called, time.time(), False))
                msg = f"Failed to prepare dynamic resources: {e}"
                raise StartError("PrepareFailed", msg, event="FailedPrepareDynamicResources") from e
        return prepared

    def _create_containers(
        self, pod: dict[str, Any], prepared: dict[str, list[PreparedDevice]]
    ) -> None:
        for spec, state in zip(pod["spec"]["containers"], self._state.containers, strict=True):
            if state.running_since or state.name in self._local:
                continue
            ids = cdi_ids_for_container(pod, spec, prepared)
            try:
                edits = self._ctx.cdi.resolve([self._ctx.dirs.cdi], ids)
            except CdiError as e:
                msg = f"Error: CDI device injection failed: {e}"
                state.set_waiting("CreateContainerError", msg)
                self._post_status()
                raise StartError("CreateContainerError", msg, event="Failed") from e
            argv = [*(spec.get("command") or []), *(spec.get("args") or [])]
            if self._ctx.commands.maps(argv):
                self._start_local(pod, spec, state, edits, ids)
            else:
                self._record(pod, spec, edits, ids)
                state.set_running(f"kubeletsim://{self.uid}/{state.name}")
                state.started = state.ready = True

    def _record(
        self, pod: dict[str, Any], spec: dict[str, Any], edits: ContainerEdits, ids: list[str]
    ) -> None:
        meta = pod["metadata"]
        path = self._ctx.dirs.container_record(meta["namespace"], meta["name"], spec["name"])
        doc = {
            "node": self._ctx.node_name,
            "namespace": meta["namespace"],
            "pod": meta["name"],
            "podUID": self.uid,
            "container": spec["name"],
            "cdiDevices": ids,
            **edits.to_json(),
        }
        path.write_text(json.dumps(doc, indent=1))

    def _start_local(
        self,
        pod: dict[str, Any],
        spec: dict[str, Any],
        state: ContainerState,
        edits: ContainerEdits,
        ids: list[str],
    ) -> None:
        pod_dir = self._ctx.dirs.pod_dir(self.uid)
        hosts = pod_dir / "etc-hosts"
        if not hosts.exists():
            hosts.write_text(hosts_file_text(pod, node_ip=self._ctx.node_ip))
        self._record(pod, spec, edits, ids)
        try:
            kubeconfig = self._ctx.kubeconfig_for(pod)
        except Exception as e:  # TokenRequest refused, SA missing, ...
            msg = f'MountVolume.SetUp failed for volume "kube-api-access": {e}'
            state.set_waiting("ContainerCreating", msg)
            raise StartError("FailedMount", msg, event="FailedMount") from e
        try:
            run = LocalRun.create(
                ctx_commands=self._ctx.commands,
                pod=pod,
                container=spec,
                edits=edits,
                mounts=[*cdi_mounts(edits)],
                hosts_file=hosts,
                node_ip=self._ctx.node_ip,
                kubeconfig=kubeconfig,
                log_file=self._ctx.dirs.logs / f"{pod['metadata']['name']}_{spec['name']}.log",
                cwd=pod_dir,
                probe_period_scale=self._ctx.probe_period_scale,
            )
        except PodSpecError as e:
            state.set_waiting("CreateContainerConfigError", str(e))
            raise StartError("CreateContainerConfigError", str(e), event="Failed") from e
        self._local[state.name] = run
        run.start(state)

    # -- running ----------------------------------------------------------------------------

    def _supervise(self, pod: dict[str, Any]) -> None:
        policy = pod["spec"].get("restartPolicy", "Always")
        for state in self._state.containers:
            run = self._local.get(state.name)
            if run is not None:
                run.tick(state, restart_policy=policy)

    def _post_status(self) -> bool:
        """Write the pod's status if it changed; False when the write failed (retry later)."""
        policy = self._pod["spec"].get("restartPolicy", "Always")
        status = self._state.to_status(policy)
        if same_status(self._last_status, status):
            return True
        meta = self._pod["metadata"]
        if time.monotonic() < self._next_status:
            return False
        try:
            self._ctx.client.patch(
                PODS,
                meta["name"],
                {"metadata": {"uid": self.uid}, "status": status},
                namespace=meta["namespace"],
                patch_type="strategic",
                subresource="status",
            )
            self._last_status = status
            self._status_backoff = FINALIZE_BACKOFF
        except (NotFoundError, ConflictError):
            pass  # pod gone or replaced: the watch will tell
        except RETRYABLE as e:
            log.warning("pod %s: status update failed (retrying): %s", self.key, e)
            self._next_status = time.monotonic() + self._status_backoff
            self._status_backoff = min(self._status_backoff * 2, FINALIZE_MAX_BACKOFF)
            return False
        return True

    # -- termination ------------------------------------------------------------------------

    def _finalize(self, *, grace: float, delete: bool) -> bool:
        """One attempt at the rest of the pod's termination; True once all of it is done.

        Steps, each done once: stop containers; unprepare the claims only this pod used;
        (``delete``) post the terminated status, then the final DELETE. A failing step is
        retried on a later call after a backoff; nothing is ever skipped.
        ``delete=False`` (the pod is gone from the API server) hands a claim that cannot be
        unprepared now to the node's housekeeping, which retries it until it succeeds.
        """
        if time.monotonic() < self._next_finalize:
            return False
        if not self._stopped:
            self._terminate(grace=grace)
        try:
            done = self._finalize_steps(delete=delete)
        except Exception as e:  # never give up on a pod: log and retry
            log.warning("pod %s: finalization failed (retrying): %s", self.key, e)
            self.last_error = str(e)
            done = False
        if done:
            return True
        self.finalize_failures += 1
        self._next_finalize = time.monotonic() + self._finalize_backoff
        self._finalize_backoff = min(self._finalize_backoff * 2, FINALIZE_MAX_BACKOFF)
        return False

    def _finalize_steps(self, *, delete: bool) -> bool:
        if not self._unprepare() and delete:
            return False
        if not delete:
            return True
        meta = self._pod["metadata"]
        if not self._final_status_posted:
            policy = self._pod["spec"].get("restartPolicy", "Always")
            body = {"metadata": {"uid": self.uid}, "status": self._state.to_status(policy)}
            try:
                self._ctx.client.patch(
                    PODS,
                    meta["name"],
                    body,
                    namespace=meta["namespace"],
                    patch_type="strategic",
                    subresource="status",
                )
            except (NotFoundError, ConflictError) as err:
                # Gone, or a new pod took the name: nothing to delete -- if the API server agrees.
                if not self._released_by_api():
                    raise RuntimeError(
                        f"pod {self.key}: {err}, yet the pod is still there"
                    ) from err
                self.pod_removed = True
                return True
            self._final_status_posted = True
        # NotFound: already gone; Conflict: the UID precondition failed, not our pod any more.
        with contextlib.suppress(NotFoundError, ConflictError):
            self._ctx.client.delete(
                PODS,
                meta["name"],
                namespace=meta["namespace"],
                uid=self.uid,
                grace_period_seconds=0,
            )
        # Like the kubelet's status manager, believe the API server, not the answer: a DELETE
        # answered while the apiserver was being killed has left the pod in place (a chaos
        # lifecycle saw it Terminating for good); then it is sent again after a backoff.
        if not self._released_by_api():
            raise RuntimeError(f"pod {self.key} still exists after its final DELETE")
        self.pod_removed = True
        return True

    def _released_by_api(self) -> bool:
        """Whether the API server no longer holds this pod for the kubelet: gone, replaced by
        another UID, or kept only by finalizers (another controller's business)."""
        meta = self._pod["metadata"]
        try:
            current = self._ctx.client.get(PODS, meta["name"], namespace=meta["namespace"])
        except NotFoundError:
            return True
        cur = current.get("metadata") or {}
        return cur.get("uid") != self.uid or bool(cur.get("finalizers"))

    def _terminate(self, *, grace: float) -> None:
        """Stop the pod's containers and remove their records (no API calls)."""
        for state in self._state.containers:
            run = self._local.pop(state.name, None)
            if run is not None:
                code = run.stop(grace)
                state.set_terminated(code if code is not None else 137)
            elif not state.terminated:
                state.set_terminated(0)
        self._terminated = True
        self._stopped = True
        for p in self._ctx.dirs.containers.glob(
            f"{self._pod['metadata']['namespace']}_{self._pod['metadata']['name']}_*.json"
        ):
            p.unlink(missing_ok=True)

    def _unprepare(self) -> bool:
        """Unprepare the claims only this pod used; True when none is left prepared.

        Safe to repeat: a claim stays in the DRA manager's cache until its unprepare succeeds.
        """
        ok = True
        for info in self._ctx.dra.release(self.uid):
            plugin = self._ctx.plugins.plugin(info.driver)
            if plugin is None:
                log.warning(
                    "pod %s: unprepare %s: DRA driver %s is not registered",
                    self.key,
                    info.ref.name,
                    info.driver,
                )
                ok = False
                continue
            try:
                plugin.unprepare([info.ref])
                self._ctx.dra.unprepared(info.ref.uid)
            except DraPluginError as e:
                log.warning("pod %s: unprepare %s: %s", self.key, info.ref.name, e)
                self.last_error = f"unprepare {info.ref.name}: {e}"
                ok = False
        return ok
