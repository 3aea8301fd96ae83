"""Installing and removing either driver on the real nodes, as ``docs/migration.md`` says.

* Upstream: ``helm install`` of the checkout's own chart (:func:`install_upstream`) with values
  pointing at the local image (``pullPolicy: Never``), the fake driver root, the fake
  ``/proc/devices`` (``altProcDevices``, where the chart has it) and the no-op CDI hook of
  ``nodeprep``; GPU resources off (only ComputeDomains); a controller node affinity that
  requires a control-plane node (v25.12.0) dropped. ``helm uninstall`` keeps the CRDs (they
  live in the chart's ``crds/``, which Helm never deletes) and also leaves each domain's IMEX
  daemon DaemonSet and daemon claim template behind, with upstream's finalizer.
* Ours: ``kubectl apply --server-side -k config/overlays/e2e-real-nodes`` (the real-node lane's
  overlay, plus the Prometheus Operator CRDs its monitoring component needs). The CRDs were
  created by Helm's client-side apply, so server-side apply may report field conflicts: the
  first try is without ``--force-conflicts`` and :class:`Step` records whether it was needed.
  Removing ours: ``CHECKPOINT_COMPATIBILITY`` set on the plugin DaemonSet and rolled out first,
  then ``kubectl delete -k config/overlays/without-crds``.
* Between the two (:func:`release_leftovers`): the removed driver's per-domain DaemonSets and
  daemon claim templates lose their finalizers and are deleted. Without it a domain formed by
  upstream cannot be deleted under ours: our controller strips upstream's finalizer, but our
  admission policy ``compute-domain-daemon-device-claims`` refuses that UPDATE outside our
  namespace (anyone's, the admin's too).

Every function returns :class:`Step` records (what ran, how long, notes) for the summary.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from testsupport.realsupport import (
    CD_LABEL,
    DRIVER_NAMESPACE,
    OVERLAY,
    REAL_NODES,
    REPO,
    Kubectl,
    install_monitoring_crds,
    wait_for,
)

from switch.nodeprep import CDI_HOOK, DRIVER_ROOT, PROC_DEVICES
from switch.upstream import Upstream

UPSTREAM_NAMESPACE = "nvidia-dra-driver-gpu"
UPSTREAM_RELEASE = "nvidia-dra-driver-gpu"
WITHOUT_CRDS = REPO / "config" / "overlays" / "without-crds"
PLUGIN_DS = "daemonset/compute-domain-kubelet-plugin"


@dataclass
class Step:
    """One timed step of a switch run."""

    name: str
    seconds: float
    ok: bool = True
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        """``name: 12.3s ok (notes)`` for the summary."""
        extra = f" ({'; '.join(self.notes)})" if self.notes else ""
        return f"{self.name}: {self.seconds:.1f}s {'ok' if self.ok else 'FAILED'}{extra}"


def helm_binary() -> Path:
    """helm built (or cached) by ``hack/helm.sh``."""
    out = subprocess.run(
        [str(REPO / "hack" / "helm.sh")], capture_output=True, text=True, check=True
    ).stdout
    return Path(out.strip().splitlines()[-1])


def _helm(kubectl: Kubectl, *args: str, timeout: float = 300) -> str:
    done = subprocess.run(
        [str(helm_binary()), f"--kubeconfig={kubectl.kubeconfig}", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args[:2])} failed: {done.stderr.strip()}")
    return done.stdout


def upstream_values(up: Upstream) -> list[str]:
    """``--set`` arguments for the local nodes (see the module docstring)."""
    repo, tag = up.image_ref.rsplit(":", 1)
    sets = {
        "image.repository": repo,
        "image.tag": tag,
        "image.pullPolicy": "Never",
        "resources.gpus.enabled": "false",
        "nvidiaDriverRoot": DRIVER_ROOT,
        "nvidiaCDIHookPath": CDI_HOOK,
        "logVerbosity": "4",
    }
    values = (up.chart / "values.yaml").read_text()
    if "altProcDevices" in values:
        sets["altProcDevices"] = PROC_DEVICES
    affinity = (yaml.safe_load(values).get("controller") or {}).get("affinity") or {}
    if "requiredDuringSchedulingIgnoredDuringExecution" in (affinity.get("nodeAffinity") or {}):
        sets["controller.affinity"] = "null"  # v25.12.0: control-plane nodes only; none here
    return [arg for k, v in sets.items() for arg in ("--set", f"{k}={v}")]


class DriverCrashError(RuntimeError):
    """A driver container restarts over and over: waiting longer will not help."""


def _crashing(kubectl: Kubectl, ns: str) -> None:
    for p in kubectl.items("pods", "-n", ns):
        for st in p.get("status", {}).get("containerStatuses") or []:
            if int(st.get("restartCount", 0)) >= 3:
                raise DriverCrashError(f"{p['metadata']['name']}/{st['name']} restarted 3 times")


def _ready_plugins(kubectl: Kubectl, ns: str, nodes: int) -> bool:
    _crashing(kubectl, ns)
    for ds in kubectl.items("daemonsets", "-n", ns):
        if "kubelet-plugin" in ds["metadata"]["name"]:
            return int(ds.get("status", {}).get("numberReady", 0)) == nodes
    return False


def _workloads(kubectl: Kubectl, ns: str) -> list[str]:
    return [f"deployment/{d['metadata']['name']}" for d in kubectl.items("deployments", "-n", ns)]


def install_upstream(kubectl: Kubectl, up: Upstream, nodes: int = len(REAL_NODES)) -> Step:
    """``helm install`` upstream; wait for its controller and a Ready plugin on every node."""
    t0 = time.monotonic()
    step = Step(f"install upstream {up.describe} (helm)", 0.0)
    args = ["install", UPSTREAM_RELEASE, str(up.chart), "-n", UPSTREAM_NAMESPACE]
    _helm(kubectl, *args, "--create-namespace", *upstream_values(up))
    for obj in _workloads(kubectl, UPSTREAM_NAMESPACE):
        kubectl("-n", UPSTREAM_NAMESPACE, "rollout", "status", obj, "--timeout=180s")
    wait_for(
        "a Ready upstream plugin pod per node",
        lambda: _ready_plugins(kubectl, UPSTREAM_NAMESPACE, nodes),
        timeout=180,
    )
    step.seconds = time.monotonic() - t0
    return step


def _driver_pods(kubectl: Kubectl, ns: str) -> list[str]:
    """Pods of the driver itself in ``ns`` (not IMEX daemons of a domain)."""
    out = []
    for p in kubectl.items("pods", "-n", ns):
        labels = p["metadata"].get("labels") or {}
        if "resource.nvidia.com/computeDomain" not in labels:
            out.append(p["metadata"]["name"])
    return out


def uninstall_upstream(kubectl: Kubectl) -> Step:
    """``helm uninstall`` (CRDs stay); wait until its controller and plugin pods are gone."""
    t0 = time.monotonic()
    step = Step("uninstall upstream (helm uninstall, CRDs kept)", 0.0)
    _helm(kubectl, "uninstall", UPSTREAM_RELEASE, "-n", UPSTREAM_NAMESPACE, "--wait")
    wait_for(
        "upstream's controller and plugin pods gone",
        lambda: not _driver_pods(kubectl, UPSTREAM_NAMESPACE),
        timeout=120,
    )
    left = kubectl.items("daemonsets", "-n", UPSTREAM_NAMESPACE)
    if left:
        step.notes.append(
            "left behind: " + ", ".join(f"daemonset/{d['metadata']['name']}" for d in left)
        )
    step.seconds = time.monotonic() - t0
    return step


def install_ours(kubectl: Kubectl, nodes: int = len(REAL_NODES)) -> Step:
    """``kubectl apply --server-side -k config/overlays/e2e-real-nodes``; wait until Ready."""
    t0 = time.monotonic()
    step = Step("install ours (kubectl apply --server-side -k e2e-real-nodes)", 0.0)
    install_monitoring_crds(kubectl)
    out = kubectl("apply", "--server-side", "-k", str(OVERLAY), check=False)
    if "conflict" in out.lower():
        step.notes.append("server-side apply conflicted with Helm's fields: --force-conflicts")
        kubectl("apply", "--server-side", "--force-conflicts", "-k", str(OVERLAY))
    elif "error" in out.lower():
        raise AssertionError(f"kubectl apply -k {OVERLAY} failed: {out[-2000:]}")
    ns = DRIVER_NAMESPACE
    for obj in ("deployment/compute-domain-controller", PLUGIN_DS):
        kubectl("-n", ns, "rollout", "status", obj, "--timeout=180s")
    wait_for("a Ready plugin pod per node", lambda: _ready_plugins(kubectl, ns, nodes), 180)
    step.seconds = time.monotonic() - t0
    return step


def set_checkpoint_level(kubectl: Kubectl, level: str) -> Step:
    """``CHECKPOINT_COMPATIBILITY=<level>`` on our plugin DaemonSet, rolled out."""
    t0 = time.monotonic()
    ns = DRIVER_NAMESPACE
    kubectl("-n", ns, "set", "env", PLUGIN_DS, "-c", "plugin", f"CHECKPOINT_COMPATIBILITY={level}")
    kubectl("-n", ns, "rollout", "status", PLUGIN_DS, "--timeout=180s")
    return Step(
        f"CHECKPOINT_COMPATIBILITY={level} on our plugin, rolled out", time.monotonic() - t0
    )


def uninstall_ours(kubectl: Kubectl) -> Step:
    """``kubectl delete -k config/overlays/without-crds`` without waiting for the namespace
    (its IMEX daemons' claims are unprepared by whichever plugin runs next); returns at once."""
    t0 = time.monotonic()
    kubectl("delete", "-k", str(WITHOUT_CRDS), "--wait=false", "--ignore-not-found")
    wait_for(
        "our controller and plugin pods gone",
        lambda: not _driver_pods(kubectl, DRIVER_NAMESPACE),
        timeout=120,
    )
    return Step("uninstall ours (kubectl delete -k without-crds)", time.monotonic() - t0)


def namespace_gone(kubectl: Kubectl, ns: str) -> bool:
    """True once ``ns`` no longer exists."""
    out = kubectl("get", "namespace", ns, "--ignore-not-found", "-o", "name")
    return not out.strip()


def describe_leftovers(kubectl: Kubectl, ns: str) -> list[dict[str, Any]]:
    """Pods still in ``ns`` (name, node, phase), for notes."""
    return [
        {
            "pod": p["metadata"]["name"],
            "node": p["spec"].get("nodeName"),
            "phase": p.get("status", {}).get("phase"),
            "deleting": bool(p["metadata"].get("deletionTimestamp")),
        }
        for p in kubectl.items("pods", "-n", ns)
    ]


def strip_finalizers(kubectl: Kubectl, uid: str = "", ns: str = "") -> list[str]:
    """Remove the finalizers of every DaemonSet and ResourceClaimTemplate labeled for domain
    ``uid`` (any domain if ""), in namespace ``ns`` (all if ""), as the cluster admin; returns
    ``kind/ns/name`` of those patched."""
    patched = []
    where = ["-n", ns] if ns else ["-A"]
    for kind in ("daemonsets", "resourceclaimtemplates"):
        for obj in kubectl.items(kind, *where, "-l", f"{CD_LABEL}={uid}" if uid else CD_LABEL):
            meta = obj["metadata"]
            if not meta.get("finalizers"):
                continue
            kubectl(
                "-n",
                meta["namespace"],
                "patch",
                kind,
                meta["name"],
                "--type=merge",
                "-p",
                '{"metadata":{"finalizers":null}}',
            )
            patched.append(f"{kind}/{meta['namespace']}/{meta['name']}")
    return patched


def last_error(kubectl: Kubectl, needle: str) -> str:
    """The last log line of a controller pod (either driver) that mentions ``needle`` and says
    ``fail`` or ``error`` ("" if none)."""
    found = ""
    for ns in (DRIVER_NAMESPACE, UPSTREAM_NAMESPACE):
        for p in kubectl.items("pods", "-n", ns):
            if "controller" not in p["metadata"]["name"]:
                continue
            logs = kubectl("-n", ns, "logs", p["metadata"]["name"], "--tail=300", check=False)
            for line in logs.splitlines():
                low = line.lower()
                if needle in line and ("fail" in low or "error" in low):
                    found = line.strip()[:600]
    return found


def release_leftovers(kubectl: Kubectl, ns: str) -> Step:
    """The removed driver's per-domain DaemonSets and daemon claim templates in ``ns``: their
    finalizers stripped (no controller of that driver is left to do it) and deleted, before
    the other driver's admission policies exist (ours refuse any UPDATE of a daemon claim
    template outside our namespace, the cluster admin's included)."""
    t0 = time.monotonic()
    stripped = strip_finalizers(kubectl, ns=ns)
    for kind in ("daemonsets", "resourceclaimtemplates"):
        kubectl("-n", ns, "delete", kind, "-l", CD_LABEL, "--wait=false", "--ignore-not-found")
    step = Step(f"release the removed driver's daemon objects in {ns}", time.monotonic() - t0)
    step.notes.append(f"finalizers stripped: {stripped}" if stripped else "none left")
    return step
