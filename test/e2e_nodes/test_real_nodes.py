"""The driver on real kubelets and containerd: workloads run, receive their channel, finish.

Every component runs as a container from our images; the workload is busybox. What is checked
is what a user sees: ``kubectl logs`` of the workload, Job completion, ComputeDomain status,
and that deleting the workload and the domain removes everything the driver created.
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from localcluster.realnode import RealNodes
from testsupport.realsupport import REAL_NODES, Kubectl, sample_workload, wait_for

# Long enough to see the domain Ready while the workload runs: once the Job's pods finish, their
# claims are released and the domain shrinks back to no nodes.
WORKLOAD_CMD = "ls -l /dev/nvidia-caps-imex-channels && sleep 10"


def _cd(kubectl: Kubectl, ns: str) -> dict[str, Any] | None:
    items = kubectl.items("computedomains.resource.nvidia.com", "-n", ns)
    return items[0] if items else None


def _driver_objects(kubectl: Kubectl, driver_ns: str, cd_uid: str) -> list[str]:
    left = []
    for kind in ("daemonsets", "resourceclaimtemplates", "pods"):
        for o in kubectl.items(kind, "-n", driver_ns):
            if cd_uid in yaml.safe_dump(o.get("metadata", {}).get("labels", {})):
                left.append(f"{kind}/{o['metadata']['name']}")
    for n in kubectl.items("nodes"):
        if n["metadata"].get("labels", {}).get("resource.nvidia.com/computeDomain") == cd_uid:
            left.append(f"node label on {n['metadata']['name']}")
    for c in kubectl.items("computedomaincliques.resource.nvidia.com", "-n", driver_ns):
        if cd_uid in c["metadata"]["name"]:
            left.append(f"clique/{c['metadata']['name']}")
    return left


# Run inside each IMEX daemon container while its domain is Ready: what the kernel says about the
# daemon process (PID 1 of the container, the shell-less entry point's python) and what its
# filesystem allows. runc applies the pod's securityContext to `kubectl exec` processes too.
_PROBE = r"""
import errno, json, os
def status(pid):
    fields = dict(l.split(":", 1) for l in open(f"/proc/{pid}/status") if ":" in l)
    return {k: fields[k].strip() for k in ("Uid", "CapEff", "CapPrm", "CapBnd", "NoNewPrivs",
                                          "Seccomp")}
def writable(path):
    try:
        with open(path, "w") as f:
            f.write("x")
        os.unlink(path)
        return "ok"
    except OSError as err:
        return errno.errorcode[err.errno]
hosts = open("/etc/hosts").read()
print(json.dumps({
    "daemon": status(1), "probe": status("self"),
    "write": {p: writable(p) for p in ("/opt/probe", "/etc/probe", "/tmp/probe",
                                       "/var/log/probe", "/imexd/.probe")},
    "hostsBlock": "BEGIN compute-domain-daemon" in hosts,
    "imexCfg": os.path.isfile("/imexd/imexd.cfg"),
}))
"""


def _check_daemons_hardened(kubectl: Kubectl, driver: str, uid: str) -> None:
    """The formed domain's daemons run with no capability, no_new_privs, seccomp
    filtering and a read-only root filesystem, enforced by containerd/runc (not only rendered),
    and still wrote everything IMEX needs (/imexd/imexd.cfg, the /etc/hosts block)."""
    pods = kubectl.items("pods", "-n", driver, "-l", f"resource.nvidia.com/computeDomain={uid}")
    assert pods, "no daemon pods of the domain"
    for pod in pods:
        name = pod["metadata"]["name"]
        out = kubectl("-n", driver, "exec", name, "--", "python3", "-c", _PROBE)
        seen = json.loads(out.strip().splitlines()[-1])
        for proc in ("daemon", "probe"):
            st = seen[proc]
            assert st["Uid"].split()[:2] == ["0", "0"], (name, proc, st)
            assert int(st["CapEff"], 16) == 0 and int(st["CapPrm"], 16) == 0, (name, proc, st)
            assert int(st["CapBnd"], 16) == 0, (name, proc, st)
            assert st["NoNewPrivs"] == "1", (name, proc, st)
            assert st["Seccomp"] == "2", (name, proc, st)  # SECCOMP_MODE_FILTER: RuntimeDefault
        assert seen["write"] == {
            "/opt/probe": "EROFS",
            "/etc/probe": "EROFS",
            "/tmp/probe": "ok",
            "/var/log/probe": "ok",
            "/imexd/.probe": "ok",
        }, (name, seen)
        assert seen["hostsBlock"] and seen["imexCfg"], (name, seen)


def _run_job(kubectl: Kubectl, ns: str, driver: str, *, mode: str) -> None:
    kubectl("apply", "-f", "-", stdin=sample_workload(ns, WORKLOAD_CMD, mode=mode))

    def ready() -> dict[str, Any] | None:
        cd = _cd(kubectl, ns)
        return cd if cd and cd.get("status", {}).get("status") == "Ready" else None

    cd = wait_for("the ComputeDomain Ready with both nodes", ready, timeout=180, every=0.3)
    assert sorted(n["name"] for n in cd["status"]["nodes"]) == sorted(REAL_NODES)
    uid = cd["metadata"]["uid"]
    _check_daemons_hardened(kubectl, driver, uid)

    def complete() -> bool:
        job = kubectl.json("-n", ns, "get", "job/training-job")
        return int(job.get("status", {}).get("succeeded", 0)) == 2

    wait_for("the Job to complete", complete, timeout=240, every=1)
    pods = kubectl.items("pods", "-n", ns, "-l", "job=training-job")
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(REAL_NODES)
    for p in pods:
        logs = kubectl("-n", ns, "logs", p["metadata"]["name"])
        assert "channel0" in logs, f"{p['metadata']['name']} saw no channel0:\n{logs}"
        line = next(ln for ln in logs.splitlines() if ln.rstrip().endswith("channel0"))
        assert line.startswith("c"), f"channel0 is not a character device: {line}"

    kubectl("-n", ns, "delete", "job/training-job", "--cascade=foreground", "--wait=true")
    kubectl("-n", ns, "delete", "computedomain/training-domain", "--wait=true", "--timeout=120s")
    wait_for(
        "every object of the domain to be gone",
        lambda: not _driver_objects(kubectl, driver, uid),
        timeout=120,
    )


def test_job_completes_with_its_channel(
    kubectl: Kubectl, nodes: RealNodes, driver: str, ns: str
) -> None:
    _run_job(kubectl, ns, driver, mode="Single")


def test_allocation_mode_all(kubectl: Kubectl, nodes: RealNodes, driver: str, ns: str) -> None:
    _run_job(kubectl, ns, driver, mode="All")
