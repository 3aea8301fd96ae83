"""A container of the driver's own pods running as a local process, with the kubelet's probes.

Owns, for one container: building its process (translated command, environment = runtime
defaults + service-account kubeconfig + pod env with downward API + CDI env + host paths of its
mounts, ``PATH`` remapped into its emulated root filesystem -- see ``runtime``), its
termination message (``terminationMessagePath``, a per-container file read on exit into
``terminated.message``), starting and restarting it (``restartPolicy``, capped exponential
back-off like CrashLoopBackOff), and the startup -> readiness / liveness exec-probe sequence
that sets the container's ``started``/``ready`` flags. Probe commands are translated like the
main command.

Deviations from the kubelet and a container runtime, on purpose: a restart reuses the
container's CDI edits and emulated filesystem (a runtime re-reads the CDI specs when it
re-creates the container; here a new pod does); exec-probe timeouts are at least
``MIN_PROBE_TIMEOUT`` seconds, because a local Python probe process can need more than the 1 s
default to start on a loaded 2-core machine, and the first readiness probe runs right after the
startup probe passes.
``probe_period_scale`` stretches readiness/liveness periods (benchmarks with many nodes on one
small machine, where every exec probe is a Python start-up); the default 1.0 keeps the spec's.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .cdi import ContainerEdits
from .podspec import Mount, PodSpecError, command_line, container_env, expand
from .podstatus import ContainerState
from .runtime import (
    REPO_ROOT,
    TERMINATION_MESSAGE_PATH,
    LocalCommands,
    LocalContainer,
    Probe,
    ProcessSpec,
    build_rootfs,
    read_termination_message,
)

MIN_PROBE_TIMEOUT = 10.0
MAX_RESTART_BACKOFF = 10.0


class LocalRun:
    def __init__(
        self,
        *,
        spec: ProcessSpec,
        startup: Probe | None,
        readiness: Probe | None,
        liveness: Probe | None,
        termination_log: Path | None = None,
    ) -> None:
        self._spec = spec
        self._termination_log = termination_log
        self._startup, self._readiness, self._liveness = startup, readiness, liveness
        self._proc: LocalContainer | None = None
        self._next_probe: dict[str, float] = {}
        self._fails: dict[str, int] = {}
        self._restart_at: float | None = None
        self._restart_backoff = 1.0
        self._started_ok = False

    @classmethod
    def create(
        cls,
        *,
        ctx_commands: LocalCommands,
        pod: dict[str, Any],
        container: dict[str, Any],
        edits: ContainerEdits,
        mounts: Sequence[Mount],
        hosts_file: Path,
        node_ip: str,
        kubeconfig: Path | None,
        log_file: Path,
        cwd: Path,
        probe_period_scale: float = 1.0,
    ) -> LocalRun:
        base = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(cwd),
            "PYTHONPATH": str(REPO_ROOT),
            "HOSTNAME": pod["metadata"]["name"],
            **ctx_commands.env,
        }
        if kubeconfig is not None:
            base["KUBECONFIG"] = str(kubeconfig)
        env = container_env(pod, container, node_ip=node_ip, edits=edits, extra=base)
        termination_log = cwd / f"{container['name']}.termination-log"
        all_mounts = [
            *mounts,
            Mount(container_path="/etc/hosts", host_path=str(hosts_file)),
            Mount(
                container_path=container.get("terminationMessagePath") or TERMINATION_MESSAGE_PATH,
                host_path=str(termination_log),
            ),
        ]
        env.update(ctx_commands.path_vars(all_mounts))
        rootfs = cwd / "rootfs" / container["name"]
        build_rootfs(rootfs, all_mounts)
        search_path = ctx_commands.search_path(rootfs)
        if search_path is not None:
            env["PATH"] = search_path
        argv = command_line(container, env)
        if not ctx_commands.maps(argv):
            raise PodSpecError(f"container {container['name']}: {argv[0]} is not runnable here")

        def probe(key: str) -> Probe | None:
            p = container.get(key)
            if not p:
                return None
            if "exec" not in p:
                raise PodSpecError(f"{key}: only exec probes are supported")
            # Like the kubelet: $(VAR) in exec probe commands expands from the container env.
            cmd = [expand(str(a), env) for a in p["exec"].get("command") or []]
            if ctx_commands.maps(cmd):
                cmd = ctx_commands.translate(cmd)
            probe = Probe.from_spec(p, cmd)
            probe.timeout = max(probe.timeout, MIN_PROBE_TIMEOUT)
            if key != "startupProbe":
                probe.period *= probe_period_scale
            return probe

        return cls(
            spec=ProcessSpec(
                ctx_commands.translate(argv), env, cwd, log_file, zygote=ctx_commands.zygote
            ),
            startup=probe("startupProbe"),
            readiness=probe("readinessProbe"),
            liveness=probe("livenessProbe"),
            termination_log=termination_log,
        )

    @property
    def argv(self) -> list[str]:
        return self._spec.argv

    @property
    def env(self) -> dict[str, str]:
        return self._spec.env

    @property
    def started_at(self) -> float | None:
        """Wall-clock time the current process was started (None when none runs)."""
        return self._proc.started_at if self._proc else None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self, state: ContainerState) -> None:
        if self._termination_log is not None:
            self._termination_log.write_bytes(
                b""
            )  # a fresh, empty file per start, like the kubelet
        self._proc = LocalContainer(self._spec)
        state.set_running(f"kubeletsim://pid/{self._proc.pid}")
        state.started = state.ready = False
        self._started_ok = self._startup is None
        state.started = self._started_ok
        now = time.monotonic()
        self._fails.clear()
        self._next_probe = {
            k: now + p.initial_delay
            for k, p in (
                ("startup", self._startup),
                ("readiness", self._readiness),
                ("liveness", self._liveness),
            )
            if p is not None
        }
        if self._started_ok and self._readiness is None:
            state.ready = True

    def stop(self, grace: float) -> int | None:
        if self._proc is None:
            return None
        code = self._proc.stop(grace)
        self._proc = None
        return code

    def kill(self) -> None:
        if self._proc is not None:
            self._proc.signal(signal.SIGKILL)

    def tick(self, state: ContainerState, *, restart_policy: str) -> None:
        """Called every worker tick: reap, restart, probe."""
        if self._proc is None:
            if self._restart_at is not None and time.monotonic() >= self._restart_at:
                self._restart_at = None
                state.restart_count += 1
                self.start(state)
            return
        code = self._proc.exit_code()
        if code is not None:
            self._proc = None
            message = (
                read_termination_message(self._termination_log) if self._termination_log else ""
            )
            state.set_terminated(code, message)
            if restart_policy == "Always" or (restart_policy == "OnFailure" and code != 0):
                self._restart_at = time.monotonic() + self._restart_backoff
                self._restart_backoff = min(self._restart_backoff * 2, MAX_RESTART_BACKOFF)
            return
        if not self._started_ok:
            ok = self._run_probe("startup", self._startup)
            if ok:
                self._started_ok = state.started = True
                if self._readiness is None:
                    state.ready = True
                else:
                    self._next_probe["readiness"] = time.monotonic()
            elif ok is False and self._failed_out("startup", self._startup):
                self._kill_for_restart(state, "startup probe failed")
            return
        ready = self._run_probe("readiness", self._readiness)
        if ready is not None:
            if ready:
                self._restart_backoff = 1.0
            state.ready = ready or (
                state.ready and not self._failed_out("readiness", self._readiness)
            )
        alive = self._run_probe("liveness", self._liveness)
        if alive is False and self._failed_out("liveness", self._liveness):
            self._kill_for_restart(state, "liveness probe failed")

    def _run_probe(self, key: str, probe: Probe | None) -> bool | None:
        """Run ``probe`` if due; None when not due (or absent)."""
        if probe is None or self._proc is None:
            return None
        now = time.monotonic()
        if now < self._next_probe.get(key, 0.0):
            return None
        self._next_probe[key] = now + probe.period
        ok, output = self._proc.exec_probe(probe.argv, timeout=probe.timeout)
        if ok:
            self._fails[key] = 0
        else:
            self._fails[key] = self._fails.get(key, 0) + 1
            with self._spec.log_file.open("a") as f:
                f.write(f"=== kubeletsim: {key} probe failed: {output[-500:]}\n")
        return ok

    def _failed_out(self, key: str, probe: Probe | None) -> bool:
        return probe is not None and self._fails.get(key, 0) >= probe.failure_threshold

    def _kill_for_restart(self, state: ContainerState, why: str) -> None:
        with self._spec.log_file.open("a") as f:
            f.write(f"=== kubeletsim: {why}, restarting container\n")
        if self._proc is not None:
            self._proc.stop(2.0)
            self._proc = None
        state.set_terminated(137)
        self._restart_at = time.monotonic() + self._restart_backoff
