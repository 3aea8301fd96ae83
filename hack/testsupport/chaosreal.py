"""One ComputeDomain lifecycle on real nodes with one fault, as an operator's nodes suffer them.

Owns the real-node chaos loop (``test_real_chaos.py``, ``make chaos-real``). A lifecycle creates
a ComputeDomain (``numNodes: 2``) and one pod on each real node (``restartPolicy: Always``, as a
Job's or StatefulSet's would be), waits until both run with ``channel0`` and the domain is
Ready, deletes the pods, then the domain, and waits until nothing is left. In one random phase
of it (``PHASES``) one random fault (``TARGETS``) hits:

* ``containerd`` / ``kubelet``: a random node's process group SIGKILLed, restarted after 1-3 s
  (as its systemd unit would);
* ``plugin`` / ``daemon`` / ``imex``: every process of that container on a random node
  SIGKILLed (the real kubelet restarts the container; the daemon restarts ``nvidia-imex``);
  ``daemon`` and ``imex`` never at domain deletion (no daemon is left then);
* ``reboot``: a random node power-cycled (``RealNode.reboot``: every process killed, mounts and
  ``/run`` gone, ``/var/lib`` kept, a new boot ID, its components started again);
* ``partition``: a random node's link down for ``PARTITION`` s, longer than the lane's
  node-monitor grace period (its Node goes NotReady), then up;
* ``plugin-rollout`` / ``controller-rollout``: the kubelet-plugin DaemonSet or the controller
  Deployment rolled to another tag of the same image (``ALT_SUFFIX``), and back the next time.

After each phase's goal, as in the simulated suite (``testsupport.chaos``): the informer caches
of the controller and of every plugin equal a fresh LIST (``cachecheck``, through the
``/debug/informers`` the overlay enables), within ``cachecheck.TIMEOUT``; after a partition
within ``PARTITION_CACHE_TIMEOUT``, the time the partitioned node's watches need to notice
(after the lane's 30 s partitions they lagged for more than 10 s). At the end: nothing of the
lifecycle is left (API objects, node labels, channel taints, checkpoint entries, CDI claim
specs), every node's containerd, kubelet and kube-proxy run, and no driver container restarted
that the fault did not hit (``restart counts``). A step that does not finish in time is a
problem; the lifecycle is then cleaned up by force so the next starts clean; nothing raises.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cachecheck import TIMEOUT as CACHE_TIMEOUT
from cachecheck import check_processes, fetch_document
from chaosreport import Lifecycle
from localcluster.processes import ClusterError
from localcluster.realnode import CONTAINERD_SOCK, RealNodes

from pkg.api import constants as c
from pkg.kube.client import WATCH_IDLE_TIMEOUT, KubeClient
from pkg.kubeletplugin.state import domain_dir
from pkg.testing.eventually import eventually
from testsupport.realsupport import (
    CD_LABEL,
    REAL_NODES,
    Kubectl,
    apply,
    channel_pod,
    container_pids,
    domain,
    prepared_claims,
)

TARGETS = (
    "containerd",
    "kubelet",
    "plugin",
    "daemon",
    "imex",
    "reboot",
    "partition",
    "plugin-rollout",
    "controller-rollout",
)
PHASES = ("before-ready", "after-ready", "pod-deletion", "cd-deletion")
STEP_TIMEOUT = 240.0  # a reboot or partition, then the kubelet's restart back-off
PARTITION = 30.0  # > the lane's --node-monitor-grace-period=20s
# How long a cache may differ from a LIST after a partition heals: the partitioned node's
# watches catch up when TCP retransmits what the API server sent meanwhile, or when the
# client drops a watch silent for WATCH_IDLE_TIMEOUT (client-go: its HTTP/2 health check).
PARTITION_CACHE_TIMEOUT = WATCH_IDLE_TIMEOUT + 30.0
LEADER_TIMEOUT = 60.0  # a Lease of 15 s, a standby's retry period, its caches' sync
ALT_SUFFIX = "-chaos"
PLUGIN_DS = "daemonset/compute-domain-kubelet-plugin"
CONTROLLER = "deployment/compute-domain-controller"
PLUGIN_LABEL = "app.kubernetes.io/name=compute-domain-kubelet-plugin"
CONTROLLER_LABEL = "app.kubernetes.io/name=compute-domain-controller"
PLUGIN_PORT, CONTROLLER_PORT = 8081, 8080
CHANNEL_CMD = "ls /dev/nvidia-caps-imex-channels; sleep 3600"


@dataclass
class Env:
    """The cluster a lifecycle acts on: kubectl, an admin API client, the real nodes, the
    driver's namespace, the workload namespace, and the image each rollout target runs now."""

    kubectl: Kubectl
    admin: KubeClient  # cachecheck's LISTs
    nodes: RealNodes
    driver: str
    namespace: str
    images: dict[str, str] = field(default_factory=dict)  # PLUGIN_DS / CONTROLLER -> image
    targets: tuple[str, ...] = TARGETS  # what faults to draw from (``CHAOS_REAL_TARGETS``)
    phases: tuple[str, ...] = PHASES  # when (``CHAOS_REAL_PHASES``)


def _poll(fn: Callable[[], bool], timeout: float = STEP_TIMEOUT, every: float = 0.5) -> bool:
    """``fn`` became true within ``timeout``; its errors are ignored (faults make them)."""
    try:
        return eventually(fn, timeout, every=every, ignore=(Exception,))
    except AssertionError:
        return False


# ------------------------------------------------------------------------------ images


def tag_alternates(env: Env) -> None:
    """Give every node the driver's images under a second tag (``<ref>-chaos``) too, so a
    rollout can switch between two tags of one build; records the images running now."""
    for obj in (PLUGIN_DS, CONTROLLER):
        tpl = env.kubectl.json("-n", env.driver, "get", obj)["spec"]["template"]["spec"]
        env.images[obj] = tpl["containers"][0]["image"]
    ctr = str(env.nodes.cluster.bin_dir / "ctr")
    for node in env.nodes.nodes:
        for image in env.images.values():
            ref = _full(image.removesuffix(ALT_SUFFIX))
            base = [ctr, f"--address={CONTAINERD_SOCK}", "-n", "k8s.io", "images"]
            node.ns.run([*base, "tag", "--force", ref, ref + ALT_SUFFIX])
            node.ns.run([*base, "label", ref + ALT_SUFFIX, "io.cri-containerd.image=managed"])


def _full(image: str) -> str:
    """containerd's fully qualified form of an image reference (``docker.io/library/...``)."""
    name = image
    if "/" not in name.split(":")[0]:
        name = "library/" + name
    first = name.split("/")[0]
    if "." not in first and ":" not in first and first != "localhost":
        name = "docker.io/" + name
    return name


def rollout(env: Env, obj: str) -> str:
    """Roll ``obj`` to the other tag of its image (without waiting); returns the new image."""
    now = env.images[obj]
    new = now.removesuffix(ALT_SUFFIX) if now.endswith(ALT_SUFFIX) else now + ALT_SUFFIX
    container = env.kubectl.json("-n", env.driver, "get", obj)["spec"]["template"]["spec"][
        "containers"
    ][0]["name"]
    env.kubectl("-n", env.driver, "set", "image", obj, f"{container}={new}")
    env.images[obj] = new
    return new


def restore_images(env: Env, original: dict[str, str]) -> None:
    """Roll every object back to the image it ran before the suite; wait until rolled out."""
    for obj, image in original.items():
        if env.images.get(obj) != image:
            rollout(env, obj)
        env.kubectl("-n", env.driver, "rollout", "status", obj, "--timeout=300s")


def driver_settled(env: Env) -> bool:
    """Every node Ready, the plugin DaemonSet and the controller Deployment fully rolled out
    (every pod of the current template, Ready, none left of the old)."""
    k = env.kubectl
    for n in k.items("nodes"):
        if n["metadata"]["name"] in REAL_NODES and not any(
            cond["type"] == "Ready" and cond["status"] == "True"
            for cond in n["status"].get("conditions", [])
        ):
            return False
    ds = k.json("-n", env.driver, "get", PLUGIN_DS)
    st = ds.get("status", {})
    want = st.get("desiredNumberScheduled", -1)
    if st.get("observedGeneration") != ds["metadata"]["generation"] or not (
        want
        == st.get("updatedNumberScheduled")
        == st.get("numberReady")
        == st.get("currentNumberScheduled")
    ):
        return False
    dep = k.json("-n", env.driver, "get", CONTROLLER)
    st = dep.get("status", {})
    replicas = dep["spec"].get("replicas", 1)
    return bool(
        st.get("observedGeneration") == dep["metadata"]["generation"]
        and st.get("updatedReplicas") == replicas
        and st.get("readyReplicas") == replicas
        and st.get("replicas") == replicas
    )


# ------------------------------------------------------------------------------ invariants


# How a container's previous instance ended when it failed by itself (not the runtime's doing).
FAILED_REASONS = frozenset({"Error", "OOMKilled", "ContainerCannotRun", "StartError"})

Restarts = dict[str, tuple[str, str, int, str]]  # uid -> (pod, node, restarts, last ending)


def restart_counts(env: Env) -> Restarts:
    """Every driver pod's uid -> (name, node, restarts of all its containers, how the last
    restarted container's previous instance ended: ``reason/exitCode``, "" if none)."""
    out = {}
    for p in env.kubectl.items("pods", "-n", env.driver):
        statuses = p["status"].get("containerStatuses", [])
        n = sum(s.get("restartCount", 0) for s in statuses)
        last = ""
        for st in statuses:
            ended = (st.get("lastState") or {}).get("terminated")
            if ended:
                last = f"{ended.get('reason', '')}/{ended.get('exitCode', '')}"
        out[p["metadata"]["uid"]] = (p["metadata"]["name"], p["spec"].get("nodeName", ""), n, last)
    return out


def unexpected_restarts(
    snapshots: list[Restarts], allowed: Callable[[str, str, str], bool]
) -> list[str]:
    """Driver containers that restarted across ``snapshots`` (the first is the baseline; a pod
    first seen later starts from 0) and whose (pod name, node, last ending) the fault does not
    excuse."""
    base = snapshots[0]
    worst: Restarts = {}
    for snap in snapshots:
        for uid, (name, node, n, last) in snap.items():
            if n > worst.get(uid, (name, node, -1, ""))[2]:
                worst[uid] = (name, node, n, last)
    out = []
    for uid, (name, node, n, last) in worst.items():
        before = base[uid][2] if uid in base else 0
        if n > before and not allowed(name, node, last):
            out.append(f"{name} on {node}: {n - before} container restart(s) (last: {last or '-'})")
    return out


def node_leftovers(env: Env, uid: str) -> list[str]:
    """What the nodes still hold of domain ``uid``: its per-domain plugin directory, claim
    entries in a plugin checkpoint, per-claim CDI specs."""
    left = []
    for node in env.nodes.nodes:
        plugin_dir = node.ns.path(f"/var/lib/kubelet/plugins/{c.DRIVER_NAME}")
        if domain_dir(plugin_dir, uid).exists():
            left.append(f"{node.name}: {domain_dir(plugin_dir, uid)}")
        claims, specs = prepared_claims(node)
        if claims:
            left.append(f"{node.name}: checkpoint claims {sorted(claims)}")
        if specs:
            left.append(f"{node.name}: CDI claim specs {specs}")
    return left


def leftovers(env: Env, uid: str, cd_name: str) -> list[str]:
    """Everything of the lifecycle's domain still there, in the API or on a node."""
    k, ns = env.kubectl, env.namespace
    left = [f"pod/{p['metadata']['name']}" for p in k.items("pods", "-n", ns)]
    left += [f"claim/{x['metadata']['name']}" for x in k.items("resourceclaims", "-n", ns)]
    left += [f"cd/{x['metadata']['name']}" for x in k.items("computedomains", "-n", ns)]
    left += [f"rct/{x['metadata']['name']}" for x in k.items("resourceclaimtemplates", "-n", ns)]
    for kind in ("daemonsets", "resourceclaimtemplates", "pods", "resourceclaims"):
        for o in k.items(kind, "-n", env.driver, "-l", f"{CD_LABEL}={uid}"):
            left.append(f"{kind}/{o['metadata']['name']}")
    for n in k.items("nodes"):
        if n["metadata"].get("labels", {}).get(CD_LABEL) == uid:
            left.append(f"node label on {n['metadata']['name']}")
    for cl in k.items("computedomaincliques.resource.nvidia.com", "-n", env.driver):
        if cl["metadata"]["name"].startswith(uid):
            left.append(f"clique/{cl['metadata']['name']}")
    for s in k.items("resourceslices"):
        if s["spec"].get("driver") != c.DRIVER_NAME:
            continue
        for d in s["spec"].get("devices") or []:
            if d.get("taints"):
                left.append(f"taint on {s['spec'].get('nodeName')}/{d['name']}: {d['taints']}")
    return left + node_leftovers(env, uid)


def cache_endpoints(env: Env) -> dict[str, str]:
    """``controller`` (the replica holding the leader Lease: the others cache nothing) and
    ``plugin/<node>`` -> the ``podIP:port`` serving ``/debug/informers``."""
    out = {}
    lease = env.kubectl.json("-n", env.driver, "get", "lease", CONTROLLER.split("/")[1])
    holder = str(lease.get("spec", {}).get("holderIdentity") or "")
    for label, port in ((CONTROLLER_LABEL, CONTROLLER_PORT), (PLUGIN_LABEL, PLUGIN_PORT)):
        for p in env.kubectl.items("pods", "-n", env.driver, "-l", label):
            ip, name = p.get("status", {}).get("podIP"), p["metadata"]["name"]
            if not ip or p["metadata"].get("deletionTimestamp"):
                continue
            if port == PLUGIN_PORT:
                out[f"plugin/{p['spec']['nodeName']}"] = f"{ip}:{port}"
            elif holder.startswith(name + "-") or holder == name:
                out["controller"] = f"{ip}:{port}"
    return out


# ------------------------------------------------------------------------------ faults


@dataclass
class Fault:
    """What a fault hit, which driver pods may restart for it, and when recovery starts."""

    what: str = ""
    # (pod, node, how its container's previous instance ended) -> the restart is the fault's
    excused: Callable[[str, str, str], bool] = lambda _pod, _node, _last: False
    t0: float = 0.0


def _kill_container(node: str, needle: str) -> int:
    """SIGKILL every process of ``node``'s pods whose command line holds ``needle``."""
    killed = 0
    for pid in container_pids(node, needle):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed


def _is_daemon(pod: str) -> bool:
    """Whether a driver pod is an IMEX daemon (neither the controller nor a plugin)."""
    return "kubelet-plugin" not in pod and "controller" not in pod


def inject(env: Env, target: str, rng: random.Random, phase: str) -> Fault:
    """Hit ``target`` (see the module docstring); never raises for a missing process."""
    name = rng.choice(REAL_NODES)
    node = env.nodes[name]
    on_node: Callable[[str, str, str], bool] = lambda _pod, n, _last: n == name  # noqa: E731

    def runtime_redid(_pod: str, n: str, last: str) -> bool:
        """A kubelet or containerd that died while starting a container leaves an instance
        the restarted one replaces (the restart count goes up); the driver did not fail."""
        return n == name and last.partition("/")[0] not in FAILED_REASONS

    if target in ("containerd", "kubelet"):
        node.kill(target)
        t0 = time.monotonic()
        time.sleep(rng.uniform(1.0, 3.0))
        node.restart(target)
        return Fault(f"{target}/{name}", runtime_redid, t0)
    if target == "reboot":
        node.reboot()
        return Fault(f"reboot/{name}", on_node, time.monotonic())
    if target == "partition":
        node.partition()
        try:
            time.sleep(PARTITION)
        finally:
            node.heal()
        return Fault(f"partition/{name} ({PARTITION:.0f}s)", t0=time.monotonic())
    if target in ("plugin-rollout", "controller-rollout"):
        obj = PLUGIN_DS if target == "plugin-rollout" else CONTROLLER
        image = rollout(env, obj)
        return Fault(f"{obj} -> {image}", t0=time.monotonic())
    needle = {
        "plugin": "compute-domain-kubelet-plugin",
        "daemon": "compute-domain-daemon",
        "imex": "nvidia-imex",
    }[target]
    wait = 30.0 if phase == "before-ready" else 3.0
    killed = 0

    def hit() -> bool:
        nonlocal killed
        killed = _kill_container(name, needle)
        return killed > 0

    if not _poll(hit, timeout=wait, every=0.1):
        return Fault(t0=time.monotonic())
    t0 = time.monotonic()
    if target == "plugin":
        return Fault(
            f"plugin/{name} ({killed} pids)", lambda p, n, _last: n == name and "plugin" in p, t0
        )
    if target == "daemon":
        return Fault(
            f"daemon/{name} ({killed} pids)", lambda p, n, _last: n == name and _is_daemon(p), t0
        )
    return Fault(f"nvidia-imex/{name} ({killed} pids)", t0=t0)


# ------------------------------------------------------------------------------ lifecycle


def run_lifecycle(env: Env, index: int, rng: random.Random) -> Lifecycle:
    """One lifecycle with one fault (see the module docstring); never raises on a problem."""
    k, ns = env.kubectl, env.namespace
    target = rng.choice(env.targets)
    phases = [p for p in env.phases if target not in ("daemon", "imex") or p != "cd-deletion"]
    lc = Lifecycle(index=index, target=target, phase=rng.choice(phases or ["pod-deletion"]))
    start = time.monotonic()
    cd_name = f"chaos-{index}"
    pods = [f"{cd_name}-{n.rsplit('-', 1)[-1]}" for n in REAL_NODES]
    snapshots = [restart_counts(env)]
    fault = Fault()

    def hit(phase: str) -> None:
        nonlocal fault
        if lc.phase == phase:
            fault = inject(env, lc.target, rng, phase)
            lc.fault = fault.what

    def running() -> bool:
        listed = {p["metadata"]["name"]: p for p in k.items("pods", "-n", ns)}
        for name in pods:
            p = listed.get(name, {})
            conds = p.get("status", {}).get("conditions", [])
            if not any(x["type"] == "Ready" and x["status"] == "True" for x in conds):
                return False
            if "channel0" not in k("-n", ns, "logs", name, check=False):
                return False
        return True

    def ready() -> bool:
        st = k.json("-n", ns, "get", f"computedomain/{cd_name}").get("status", {})
        good = [n for n in st.get("nodes") or [] if n.get("status") == "Ready"]
        return st.get("status") == "Ready" and len(good) == 2

    def recovered(phase: str) -> None:
        """After the fault's phase reached its goal: recovery time, driver settled, caches."""
        if lc.phase != phase:
            return
        if lc.fault and lc.recovery is None:
            lc.recovery = time.monotonic() - fault.t0
        if not _poll(lambda: driver_settled(env)):
            lc.problems.append("driver not settled (nodes Ready, rollouts done)")
        lc.caches_checked = True
        began = time.monotonic()
        endpoints: dict[str, str] = {}

        def leader_known() -> bool:
            """The Lease names a replica that says it leads (after its holder died, the Lease
            names the dead one until the standby takes it over: up to its 15 s duration)."""
            endpoints.clear()
            endpoints.update(cache_endpoints(env))
            ep = endpoints.get("controller")
            return ep is not None and bool(fetch_document(ep).get("leading"))

        if not _poll(leader_known, timeout=LEADER_TIMEOUT):
            lc.problems.append(f"no controller replica leads {LEADER_TIMEOUT:.0f} s after the goal")
        timeout = PARTITION_CACHE_TIMEOUT if lc.target == "partition" else CACHE_TIMEOUT
        lc.cache_diffs = check_processes(
            env.admin, endpoints, timeout=timeout, resolve=lambda: cache_endpoints(env)
        )
        lc.cache_seconds = time.monotonic() - began
        if lc.cache_diffs:
            lc.problems.append(f"caches differ from a fresh LIST: {lc.cache_diffs}")

    cd = domain(ns, cd_name)
    cd["spec"]["numNodes"] = 2
    apply(
        k,
        cd,
        *(
            channel_pod(ns, p, n, CHANNEL_CMD, f"{cd_name}-rct", restart="Always")
            for p, n in zip(pods, REAL_NODES, strict=True)
        ),
    )
    uid = str(k.json("-n", ns, "get", f"computedomain/{cd_name}")["metadata"]["uid"])
    try:
        if lc.phase == "before-ready":
            _poll(
                lambda: bool(k.items("pods", "-n", env.driver, "-l", f"{CD_LABEL}={uid}")),
                timeout=60,
                every=0.2,
            )
            time.sleep(rng.uniform(0.0, 2.0))
        hit("before-ready")
        if not _poll(lambda: running() and ready()):
            lc.stuck_pods += pods
            lc.problems.append("not Running with channel0 + Ready")
        recovered("before-ready")
        snapshots.append(restart_counts(env))
        hit("after-ready")
        if lc.phase == "after-ready":
            time.sleep(1.0)
            if not _poll(lambda: running() and ready()):
                lc.stuck_pods += pods
                lc.problems.append("not Running with channel0 + Ready again after the fault")
            recovered("after-ready")
            snapshots.append(restart_counts(env))
        k("-n", ns, "delete", "pod", *pods, "--wait=false", check=False)
        hit("pod-deletion")
        if not _poll(lambda: not k.items("pods", "-n", ns)):
            lc.stuck_pods += [p["metadata"]["name"] for p in k.items("pods", "-n", ns)]
            lc.problems.append("workload pods not gone after deletion")
        if not _poll(lambda: not k.items("pods", "-n", env.driver, "-l", f"{CD_LABEL}={uid}")):
            lc.problems.append("daemon pods not gone after the workload's deletion")
        recovered("pod-deletion")
        snapshots.append(restart_counts(env))
        k("-n", ns, "delete", f"computedomain/{cd_name}", "--wait=false", check=False)
        hit("cd-deletion")
        if not _poll(lambda: not leftovers(env, uid, cd_name)):
            lc.leaks = {"left": leftovers(env, uid, cd_name)}
            lc.problems.append(f"leaked: {lc.leaks['left']}")
        recovered("cd-deletion")
    except (AssertionError, ClusterError, OSError) as err:  # a harness step failed
        lc.problems.append(f"harness: {type(err).__name__}: {str(err)[:400]}")
    _poll(lambda: driver_settled(env), timeout=120)
    snapshots.append(restart_counts(env))
    lc.crashes += unexpected_restarts(snapshots, fault.excused)
    for node in env.nodes.nodes:
        for comp in ("containerd", "kubelet", "kube-proxy"):
            proc = node.procs.get(comp)
            if proc is None or not proc.alive():
                lc.crashes.append(f"{node.name}/{comp} not running")
                with contextlib.suppress(ClusterError):
                    node.restart(comp)
    if lc.crashes:
        lc.problems.append(f"unexpected exits: {lc.crashes}")
    if lc.problems:
        cleanup(env)
    lc.seconds = time.monotonic() - start
    return lc


def cleanup(env: Env) -> None:
    """Force the workload namespace empty, so the next lifecycle starts clean."""
    k, ns = env.kubectl, env.namespace
    k("-n", ns, "delete", "pods", "--all", "--grace-period=0", "--force", check=False)
    k("-n", ns, "delete", "computedomains", "--all", "--wait=false", check=False)
    _poll(lambda: not k.items("pods", "-n", ns) and not k.items("computedomains", "-n", ns), 180)
