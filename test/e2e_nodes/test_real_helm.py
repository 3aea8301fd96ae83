"""``helm install`` of our chart with an upstream operator's values file, on real nodes.

The lane's driver comes from ``kubectl apply -k config/overlays/e2e-real-nodes``. With a workload
running, ``hack/helm-handover.py adopt`` replaces those objects by the chart's rendering (the
chart, ``ci/upstream-operator-values.yaml`` and the lane's settings as a second values file),
marked as the release's, and ``helm install`` takes them over in place. Checked: upstream's values
reach the objects, the controller and every plugin roll to the chart's pods, the running workload
keeps its pods and its channel, the Helm-installed plugins unprepare it cleanly, and a new
workload forms (after the old one: a node serves one domain at a time). ``hack/helm-handover.py
release`` then hands the objects back to the overlay (Helm forgets the release, nothing is
deleted) and the same checks run the other way, leaving the lane's driver as the session made it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from localcluster.realnode import RealNodes
from nodeimages import driver_image_refs
from testsupport.realsupport import (
    FAKE_GPUS,
    KUBECTL,
    OVERLAY,
    REAL_NODES,
    REPO,
    Kubectl,
    apply,
    channel_pod,
    deploy_driver,
    domain,
    prepared_claims,
    wait_for,
)

RELEASE = "compute-domain-driver"
CHART = REPO / "deployments" / "helm" / "compute-domain-driver"
UPSTREAM_VALUES = CHART / "ci" / "upstream-operator-values.yaml"
HANDOVER = REPO / "hack" / "helm-handover.py"
FAKE_ROOT = "/var/lib/compute-domain-fake"  # realsupport.prepare_node's files on each node
HOLD = "sleep 3600"
# Three workloads, two rollouts of the driver, helm install --wait (up to 4 minutes).
pytestmark = pytest.mark.timeout(900)


def helm_binary() -> str:
    done = subprocess.run(
        [str(REPO / "hack" / "helm.sh")], capture_output=True, text=True, check=False, timeout=1800
    )
    assert done.returncode == 0, f"hack/helm.sh failed:\n{done.stderr}"
    return done.stdout.strip().splitlines()[-1]


def lane_values() -> dict[str, Any]:
    """The lane's own settings, in upstream's value names: our images as the nodes hold them,
    the fake driver root and /proc/devices copy, fake GPU discovery."""
    refs = {
        ref.rsplit(":", 1)[0].rsplit("/", 1)[0]: ref.rsplit(":", 1)[1]
        for ref in driver_image_refs().values()
    }
    assert len(refs) == 1, f"the chart takes one repository and tag for all images: {refs}"
    [(repository, tag)] = refs.items()
    return {
        "image": {"repository": repository, "tag": tag},
        "nvidiaDriverRoot": f"{FAKE_ROOT}/driver-root",
        "altProcDevices": f"{FAKE_ROOT}/proc-devices",
        "kubeletPlugin": {
            "containers": {
                "computeDomains": {
                    "env": [
                        {"name": "DEVICE_DISCOVERY", "value": "fake"},
                        {"name": "FAKE_GPU_CONFIG", "value": json.dumps(FAKE_GPUS)},
                    ]
                }
            }
        },
    }


class Helm:
    """``helm`` and ``hack/helm-handover.py`` against the lane's API server."""

    def __init__(self, kubectl: Kubectl, driver: str, values_dir: Path) -> None:
        self.kubectl = kubectl
        self.driver = driver
        self.binary = helm_binary()
        lane = values_dir / "lane-values.yaml"
        lane.write_text(yaml.safe_dump(lane_values()))
        self.values = ["-f", str(UPSTREAM_VALUES), "-f", str(lane)]

    def _run(self, argv: list[str], timeout: float = 300) -> str:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
        assert done.returncode == 0, f"{' '.join(argv[:4])} ...:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def __call__(self, *args: str) -> str:
        kubeconfig = f"--kubeconfig={self.kubectl.kubeconfig}"
        return self._run([self.binary, kubeconfig, *args])

    def handover(self, action: str, *args: str) -> str:
        return self._run(
            [
                sys.executable,
                str(HANDOVER),
                action,
                "--release",
                RELEASE,
                "-n",
                self.driver,
                f"--kubeconfig={self.kubectl.kubeconfig}",
                f"--kubectl={KUBECTL}",
                f"--helm={self.binary}",
                *args,
            ]
        )

    def installed(self) -> bool:
        out = self("list", "-n", self.driver, "-q", "--filter", f"^{RELEASE}$")
        return RELEASE in out.split()


@pytest.fixture
def helm(kubectl: Kubectl, driver: str, tmp_path: Path) -> Iterator[Helm]:
    """The lane's driver as the session made it, before and after (a failure half-way hands a
    release back to the overlay, then re-applies the overlay and waits for it)."""
    h = Helm(kubectl, driver, tmp_path)
    yield h
    if h.installed():
        h.handover("release", "-k", str(OVERLAY))
    deploy_driver(kubectl)


def workload(kubectl: Kubectl, ns: str) -> dict[str, Any]:
    """A domain and a pod holding its channel on each real node; once every pod runs with
    ``channel0``: ``{"uid": domain UID, "pods": {name: pod UID}, "claims": [claim UIDs]}``."""
    pods = [channel_pod(ns, f"w-{i}", node, HOLD) for i, node in enumerate(REAL_NODES)]
    apply(kubectl, domain(ns), *pods)
    names = [p["metadata"]["name"] for p in pods]

    def all_running() -> bool:
        return all(running(kubectl, ns, n) for n in names)

    wait_for(f"{ns}: every pod Running", all_running, timeout=180)
    for name in names:
        assert_channel(kubectl, ns, name)
    cd = kubectl.json("-n", ns, "get", "computedomain/cd")
    live = kubectl.items("pods", "-n", ns)
    return {
        "uid": cd["metadata"]["uid"],
        "pods": {p["metadata"]["name"]: p["metadata"]["uid"] for p in live},
        "claims": [c["metadata"]["uid"] for c in kubectl.items("resourceclaims", "-n", ns)],
    }


def running(kubectl: Kubectl, ns: str, pod: str) -> bool:
    phase = kubectl.json("-n", ns, "get", "pod", pod).get("status", {}).get("phase")
    return bool(phase == "Running")


def assert_channel(kubectl: Kubectl, ns: str, pod: str) -> None:
    out = kubectl("-n", ns, "exec", pod, "--", "ls", "/dev/nvidia-caps-imex-channels")
    assert "channel0" in out.split(), f"{ns}/{pod} has no channel0: {out!r}"


def assert_survived(kubectl: Kubectl, ns: str, before: dict[str, Any]) -> None:
    """The workload's pods are the same pods, never restarted, and still hold their channel."""
    for p in kubectl.items("pods", "-n", ns):
        name = p["metadata"]["name"]
        assert before["pods"][name] == p["metadata"]["uid"], f"{ns}/{name} was recreated"
        assert p["status"]["phase"] == "Running", (name, p["status"])
        [st] = p["status"]["containerStatuses"]
        assert st["restartCount"] == 0, (name, st)
        assert_channel(kubectl, ns, name)


def remove_workload(kubectl: Kubectl, nodes: RealNodes, ns: str, w: dict[str, Any]) -> None:
    """Delete the pods, then the domain: every claim must be unprepared on its node (checkpoint
    entry and CDI spec gone) and the domain's finalizer released."""
    kubectl("-n", ns, "delete", "pods", "--all", "--wait=true", "--timeout=120s")

    def still_prepared() -> list[str]:
        left = []
        for node in REAL_NODES:
            claims, specs = prepared_claims(nodes[node])
            left += [f"{node}: checkpoint {u}" for u in w["claims"] if u in claims]
            left += [f"{node}: CDI spec {s}" for s in specs for u in w["claims"] if u in s]
        return left

    wait_for("the workload's claims unprepared", lambda: not still_prepared(), timeout=120)
    kubectl("-n", ns, "delete", "computedomain/cd", "--wait=true", "--timeout=120s")


def driver_rolled(kubectl: Kubectl, driver: str) -> None:
    """The controller and every plugin run the current templates and are Ready."""
    for obj in ("deployment/compute-domain-controller", "daemonset/compute-domain-kubelet-plugin"):
        kubectl("-n", driver, "rollout", "status", obj, "--timeout=180s")

    def plugins_ready() -> bool:
        st = kubectl.json("-n", driver, "get", "daemonset/compute-domain-kubelet-plugin")["status"]
        want = len(REAL_NODES)
        return bool(st.get("numberReady") == want and st.get("updatedNumberScheduled") == want)

    wait_for("a Ready plugin of the current template per node", plugins_ready, timeout=120)


def assert_as_rendered(kubectl: Kubectl, driver: str) -> None:
    """The controller Deployment and plugin DaemonSet are the overlay's again: its replicas and
    containers (env, image, mounts), none of the chart's labels."""
    rendered = {
        (o["kind"], o["metadata"]["name"]): o
        for o in yaml.safe_load_all(kubectl("kustomize", str(OVERLAY)))
        if o
    }
    for kind, name in (
        ("Deployment", "compute-domain-controller"),
        ("DaemonSet", "compute-domain-kubelet-plugin"),
    ):
        live = kubectl.json("-n", driver, "get", f"{kind.lower()}/{name}")
        want = rendered[(kind, name)]
        assert "helm.sh/chart" not in live["metadata"].get("labels", {}), live["metadata"]
        assert live["spec"].get("replicas") == want["spec"].get("replicas"), kind
        got_ctrs = live["spec"]["template"]["spec"]["containers"]
        for got, exp in zip(got_ctrs, want["spec"]["template"]["spec"]["containers"], strict=True):
            for field in ("image", "env", "volumeMounts", "securityContext"):
                have, want_ = undefaulted(got.get(field)), exp.get(field)
                assert have == want_, (kind, field, have)


def undefaulted(value: Any) -> Any:
    """``value`` without the API server's default ``fieldRef.apiVersion`` (``v1``)."""
    if isinstance(value, list):
        return [undefaulted(v) for v in value]
    if isinstance(value, dict):
        out = {k: undefaulted(v) for k, v in value.items()}
        if "fieldPath" in out and out.get("apiVersion") == "v1":
            del out["apiVersion"]
        return out
    return value


def env_of(obj: dict[str, Any]) -> dict[str, str]:
    [ctr] = obj["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in ctr.get("env", [])}


def test_helm_takes_over_and_hands_back_with_a_workload_running(
    kubectl: Kubectl, nodes: RealNodes, driver: str, ns: str, helm: Helm
) -> None:
    first = workload(kubectl, ns)

    # kubectl apply -k -> helm install, in place.
    helm.handover("adopt", *helm.values)
    helm("install", RELEASE, str(CHART), "-n", driver, *helm.values, "--wait", "--timeout=4m")
    driver_rolled(kubectl, driver)
    ctrl = kubectl.json("-n", driver, "get", "deployment/compute-domain-controller")
    assert ctrl["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
    # Upstream's values reached the objects: one replica without leader election, verbosity 4.
    assert ctrl["spec"]["replicas"] == 1
    assert env_of(ctrl)["LEADER_ELECTION_ENABLED"] == "false"
    config = kubectl.json("-n", driver, "get", "configmap", env_of_ref(ctrl, "LOG_VERBOSITY"))
    assert config["data"]["LOG_VERBOSITY"] == "4"
    plugin = kubectl.json("-n", driver, "get", "daemonset/compute-domain-kubelet-plugin")
    assert env_of(plugin)["DEVICE_DISCOVERY"] == "fake"
    assert_survived(kubectl, ns, first)

    # The Helm-installed plugins unprepare what the kustomize-installed ones prepared; a new
    # workload forms (a node serves one domain at a time, so not while the first one runs).
    remove_workload(kubectl, nodes, ns, first)
    second = workload(kubectl, ns)

    # helm -> kubectl apply -k, in place: Helm forgets the release, nothing is deleted.
    helm.handover("release", "-k", str(OVERLAY))
    assert not helm.installed()
    assert not kubectl.items("secrets", "-n", driver, "-l", f"owner=helm,name={RELEASE}")
    driver_rolled(kubectl, driver)
    assert_as_rendered(kubectl, driver)
    assert_survived(kubectl, ns, second)
    remove_workload(kubectl, nodes, ns, second)
    third = workload(kubectl, ns)
    remove_workload(kubectl, nodes, ns, third)


def env_of_ref(obj: dict[str, Any], name: str) -> str:
    """The ConfigMap that the container's env entry ``name`` is read from."""
    [ctr] = obj["spec"]["template"]["spec"]["containers"]
    for e in ctr.get("env", []):
        if e["name"] == name:
            return str(e["valueFrom"]["configMapKeyRef"]["name"])
    for src in ctr.get("envFrom", []):
        if "configMapRef" in src:
            return str(src["configMapRef"]["name"])
    raise AssertionError(f"no ConfigMap source for {name}")
