"""One ComputeDomain lifecycle with one random SIGKILL, and the figures of many of them.

Owns the chaos loop's steps (used by ``test_chaos.py`` and ``make chaos``): a lifecycle creates
a ComputeDomain (``numNodes: 2``) and two pods on two random nodes of clique 0, waits until the
pods run with their channel and the domain is Ready, deletes the pods, then the domain, and
waits until nothing is left (``leak_report``). In one random phase of it (``PHASES``) one random
target (``TARGETS``) is SIGKILLed:

* ``controller``: the controller process; restarted after ``RESTART_DELAY`` (its Deployment);
* ``plugin``: a random node's kubelet plugin; restarted after ``RESTART_DELAY`` (DaemonSet);
* ``daemon``: one of the domain's IMEX daemon containers (the kubelet stand-in restarts it);
* ``imex``: an ``nvidia-imex`` (simulator) process under a daemon (the daemon restarts it);
  these two never at domain deletion (the pods' deletion already removed the daemons);
* ``apiserver``: the kube-apiserver, down 1-3 s, then started again (``restart_apiserver``).

Every other binary must keep its PID (``faults.exited``). Once the goal of the phase the fault hit
is reached, the informer caches of the controller and of every plugin must equal a fresh LIST
(``cachecheck``, within ``cachecheck.TIMEOUT``). A step that does not finish in time
is recorded as a problem (stuck pods, a domain never Ready, leaks) and the lifecycle is cleaned
up by force so the next one starts clean; nothing raises. :func:`report` renders the figures
(lifecycles, faults by target and phase, stuck pods, leaks, crashes, caches equal to a LIST,
recovery p50/p99) through ``chaosreport``.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from cachecheck import check_processes
from chaosreport import Lifecycle
from kubeletsim import NodeFleet
from localcluster import Cluster

from pkg.api import constants as c
from pkg.kube.client import KubeClient
from pkg.kube.errors import NotFoundError
from pkg.kube.resources import COMPUTE_DOMAINS, NODES, PODS
from pkg.testing.eventually import eventually
from testsupport.e2e_support import (
    Driver,
    channels_seen,
    free_port,
    leak_report,
    pod_ready,
    teardown_namespace,
)
from testsupport.faults import (
    DaemonProc,
    daemon_procs,
    driver_pids,
    exited,
    imex_pids,
    kill_group,
    kill_pid,
)
from testsupport.workloads import Workload, cd_status, create_cd, daemon_pods, start_pods

TARGETS = ("controller", "plugin", "daemon", "imex", "apiserver")
PHASES = ("before-ready", "after-ready", "pod-deletion", "cd-deletion")
CLIQUE0 = ["gpu-node-1", "gpu-node-2", "gpu-node-3", "gpu-node-4"]
RESTART_DELAY = 1.0
STEP_TIMEOUT = 90.0
# What waits for kube-controller-manager (its garbage collector and DaemonSet controller): after
# repeated API server restarts its informers took up to ~80 s to catch up in a targeted run.
GC_TIMEOUT = 180.0


@dataclass
class Env:
    """The running cluster, driver and fleet a lifecycle acts on."""

    cluster: Cluster
    admin: KubeClient
    fleet: NodeFleet
    driver: Driver
    namespace: str


def _poll(fn: Callable[[], bool], timeout: float = STEP_TIMEOUT, every: float = 0.1) -> bool:
    """``fn`` became true within ``timeout``; its errors are ignored (an API outage is what we
    are testing)."""
    try:
        return eventually(fn, timeout, every=every, ignore=(Exception,))
    except AssertionError:
        return False


def _gone(admin: KubeClient, res: object, name: str, ns: str) -> bool:
    try:
        admin.get(res, name, namespace=ns)  # type: ignore[arg-type]
    except NotFoundError:
        return True
    return False


def describe_pods(env: Env, namespace: str, names: list[str]) -> dict[str, str]:
    """What a stuck pod looks like to the API server and to its node's kubelet stand-in."""
    out: dict[str, str] = {}
    for name in names:
        try:
            pod = env.admin.get(PODS, name, namespace=namespace)
        except Exception as e:  # a diagnostic never raises
            out[name] = f"<{type(e).__name__}>"
            continue
        meta, node = pod["metadata"], pod["spec"].get("nodeName", "")
        text = (
            f"phase={pod.get('status', {}).get('phase')} node={node} "
            f"deletionTimestamp={meta.get('deletionTimestamp')}"
        )
        worker = (
            env.fleet[node].kubelet.workers().get(meta["uid"]) if node in env.fleet.nodes else None
        )
        if worker is None:
            text += " worker=none"
        else:
            text += (
                f" worker(done={worker.done} podRemoved={worker.pod_removed} "
                f"finalizeFailures={worker.finalize_failures} "
                f"lastError={worker.last_error[:200]!r})"
            )
        out[name] = text
    return out


def _labelled_nodes(env: Env, cd_uid: str) -> str:
    """Which nodes still carry the domain's label (the plugins remove it at Unprepare)."""
    try:
        nodes = env.admin.list(NODES, label_selector=f"{c.COMPUTE_DOMAIN_LABEL}={cd_uid}")
    except Exception as e:  # a diagnostic never raises
        return f"nodes: <{type(e).__name__}>"
    return f"nodes still labelled: {[n['metadata']['name'] for n in nodes.get('items', [])]}"


def _restart_controller(env: Env) -> None:
    env.driver.start_controller(
        kubeconfig=env.cluster.kubeconfig("compute-domain-controller"),
        log_file=env.cluster.log_path("controller"),
        http_port=free_port(),
    )


def cache_endpoints(env: Env) -> dict[str, str]:
    """``controller`` and ``plugin/<node>`` -> the ``host:port`` serving ``/debug/informers``."""
    out = {"controller": env.driver.controller_http}
    out.update({f"plugin/{node.name}": node.http_endpoint for node in env.fleet})
    return out


def inject(
    env: Env, target: str, w: Workload, rng: random.Random, lc_phase: str
) -> tuple[str, set[str], float]:
    """SIGKILL ``target``; returns (what was killed, PID keys allowed to change, t0).

    ``t0`` is when recovery starts: the kill, or the apiserver's return."""
    if target == "controller":
        env.driver.kill_controller()
        t0 = time.monotonic()
        time.sleep(RESTART_DELAY)
        _restart_controller(env)
        return "controller", {"controller"}, t0
    if target == "plugin":
        node = env.fleet[rng.choice(CLIQUE0)]
        node.kill_plugin()
        t0 = time.monotonic()
        time.sleep(RESTART_DELAY)
        node.start_plugin()
        return f"plugin/{node.name}", {f"plugin/{node.name}"}, t0
    if target == "apiserver":
        down = rng.uniform(1.0, 3.0)
        back = env.cluster.restart_apiserver(down)
        return f"apiserver (down {down:.1f}s)", set(), back
    wait = 30.0 if lc_phase == "before-ready" else 3.0  # deleting: the daemons may be gone

    def ours() -> list[DaemonProc]:
        names = {
            p["metadata"]["name"] for p in daemon_pods(env.admin, env.driver.namespace, w.cd_uid)
        }
        return [d for d in daemon_procs(env.fleet, env.driver.namespace) if d.pod in names]

    procs: list[DaemonProc] = []
    found: list[int] = []

    def daemons() -> bool:
        procs[:] = ours()
        return bool(procs)

    def imex() -> bool:
        found[:] = [p for d in ours() for p in imex_pids(d.pid)]
        return bool(found)

    if target == "daemon":
        if not _poll(daemons, timeout=wait):
            return "", set(), time.monotonic()
        d = rng.choice(procs)
        kill_group(d.pid)
        return f"daemon/{d.pod}", {f"daemon/{d.pod}"}, time.monotonic()
    if not _poll(imex, timeout=wait):
        return "", set(), time.monotonic()
    pid = rng.choice(found)
    kill_pid(pid)
    return f"nvidia-imex pid {pid}", set(), time.monotonic()


def run_lifecycle(env: Env, index: int, rng: random.Random) -> Lifecycle:
    """One lifecycle with one fault (see the module docstring); never raises on a problem."""
    admin, ns, dns = env.admin, env.namespace, env.driver.namespace
    target = rng.choice(TARGETS)
    # Daemons exist until the pods' deletion has run its course: no daemon at domain deletion.
    phases = PHASES[:3] if target in ("daemon", "imex") else PHASES
    lc = Lifecycle(index=index, target=target, phase=rng.choice(phases))
    start = time.monotonic()
    nodes = rng.sample(CLIQUE0, 2)
    before = driver_pids(env.driver, env.fleet)
    allowed: set[str] = set()
    t0 = 0.0

    def fault(phase: str) -> None:
        nonlocal allowed, t0
        if lc.phase == phase:
            lc.fault, allowed, t0 = inject(env, lc.target, w, rng, phase)

    def running() -> bool:
        return all(
            pod_ready(admin, ns, p) and channels_seen(env.fleet, ns, p) == ["channel0"]
            for p in w.pods
        )

    def ready() -> bool:
        st = cd_status(admin, w)
        return st.get("status") == c.STATUS_READY and st.get("readyNodes") == 2

    def recovered(phase: str) -> None:
        """The goal of ``phase`` was reached (or timed out): after the fault's phase, record
        the recovery time and compare every cache with a fresh LIST."""
        if lc.phase != phase:
            return
        if lc.fault and lc.recovery is None:
            lc.recovery = time.monotonic() - t0
        lc.caches_checked = True
        started = time.monotonic()
        lc.cache_diffs = check_processes(admin, cache_endpoints(env))
        lc.cache_seconds = time.monotonic() - started
        if lc.cache_diffs:
            lc.problems.append(f"caches differ from a fresh LIST: {lc.cache_diffs}")

    w = create_cd(admin, ns, f"chaos-{index}", num_nodes=2)
    start_pods(admin, w, 2, nodes)
    if lc.phase == "before-ready":
        _poll(lambda: bool(daemon_pods(admin, dns, w.cd_uid)), timeout=30, every=0.05)
        time.sleep(rng.uniform(0.0, 1.0))
    fault("before-ready")
    if not _poll(lambda: running() and ready()):
        lc.stuck_pods += [p for p in w.pods if not pod_ready(admin, ns, p)]
        lc.problems.append(f"not Running+Ready: CD status {cd_status(admin, w)}")
    recovered("before-ready")
    fault("after-ready")
    if lc.phase == "after-ready":
        time.sleep(1.0)  # let the fault show before judging recovery
        if not _poll(lambda: running() and ready()):
            lc.stuck_pods += [p for p in w.pods if not pod_ready(admin, ns, p)]
            lc.problems.append(f"not Ready again after the fault: {cd_status(admin, w)}")
        recovered("after-ready")
    for p in w.pods:
        with contextlib.suppress(NotFoundError):
            admin.delete(PODS, p, namespace=ns)
    fault("pod-deletion")
    if not _poll(lambda: all(_gone(admin, PODS, p, ns) for p in w.pods)):
        lc.stuck_pods += [p for p in w.pods if not _gone(admin, PODS, p, ns)]
        lc.problems.append(
            f"workload pods not gone after deletion: {describe_pods(env, ns, lc.stuck_pods)}"
        )
    # The daemon pods go when kube-controller-manager's DaemonSet controller sees the node labels
    # the plugins removed. After an API server restart it first waits until its own informer has
    # seen its last write ("read version ... is not as new as written version"), and that
    # informer's reconnect back-off (client-go's, up to a minute after repeated restarts) is
    # Kubernetes', not the driver's: the same allowance as its garbage collector gets below.
    if not _poll(lambda: not daemon_pods(admin, dns, w.cd_uid), timeout=GC_TIMEOUT):
        left = [p["metadata"]["name"] for p in daemon_pods(admin, dns, w.cd_uid)]
        lc.problems.append(
            f"daemon pods not gone after the workload's deletion: "
            f"{describe_pods(env, dns, left)}; {_labelled_nodes(env, w.cd_uid)}"
        )
    recovered("pod-deletion")
    with contextlib.suppress(NotFoundError):
        admin.delete(COMPUTE_DOMAINS, w.cd_name, namespace=ns)
    fault("cd-deletion")
    # Clique objects are owned by daemon pods and removed by kube-controller-manager's garbage
    # collector, whose client-go reconnect back-off after an API server restart can exceed a
    # minute (it did once in a 200-lifecycle soak): the allowance of test_apiserver_restart.
    if not _poll(
        lambda: (
            _gone(admin, COMPUTE_DOMAINS, w.cd_name, ns)
            and not leak_report(admin, env.fleet, dns, [ns])
        ),
        timeout=GC_TIMEOUT,
    ):
        with contextlib.suppress(Exception):
            lc.leaks = leak_report(admin, env.fleet, dns, [ns])
        lc.problems.append(f"leaked: {lc.leaks}")
    recovered("cd-deletion")
    if not env.driver.controller_alive():
        lc.crashes.append("controller not running")
        _restart_controller(env)
    lc.crashes += exited(before, driver_pids(env.driver, env.fleet), allowed=allowed)
    for node in env.fleet:
        if not node.plugin_alive():
            lc.crashes.append(f"plugin/{node.name} not running")
            node.start_plugin()
    if lc.crashes:
        lc.problems.append(f"unexpected exits: {lc.crashes}")
    if lc.problems:
        with contextlib.suppress(Exception):
            teardown_namespace(admin, ns)
    lc.seconds = time.monotonic() - start
    return lc
