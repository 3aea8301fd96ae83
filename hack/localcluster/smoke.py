"""End-to-end self-check of the local control plane (no pytest needed; the e2e suite runs it:
``test/e2e/test_localcluster_smoke.py``).

Brings a cluster up and proves the pieces a DRA driver relies on work for real: a fake Node is
schedulable; the real scheduler allocates a ResourceClaim (created by the resourceclaim-controller
from a ResourceClaimTemplate) against a hand-made ResourceSlice and binds the pod; the
garbage collector removes the generated claim after the pod is gone; a DaemonSet places a pod on
a labeled node; static-token node and service-account identities authenticate as expected; and
stopping the cluster leaves no processes behind.

    .venv/bin/python hack/localcluster/smoke.py [--bin-dir B] [--dir D] [--keep]

It talks to the API server through the project's own client (``pkg.kube.client.RestClient``)
and waits with ``pkg.testing.eventually``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # run as a file: re-enter as localcluster.smoke
    import runpy

    runpy.run_module("localcluster.smoke", run_name="__main__", alter_sys=True)
    sys.exit(0)

from pkg.kube.client import RestClient
from pkg.kube.config import load_api_client
from pkg.kube.errors import ForbiddenError, NotFoundError
from pkg.kube.resourceapi import discover_resource_api
from pkg.kube.resources import (
    DAEMONSETS,
    DEVICE_CLASSES,
    NAMESPACES,
    NODES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    SECRETS,
    SELF_SUBJECT_REVIEWS,
    Resource,
)
from pkg.testing.eventually import eventually

from . import Cluster, bin_dir, fake_node
from .processes import pid_alive

DRIVER = "smoke.example.com"
NS = "smoke"
TIMEOUT = 60.0


def client(c: Cluster, identity: str) -> RestClient:
    """The project's client with ``identity``'s credentials, speaking the served
    resource.k8s.io version (v1 shapes here; converted on Kubernetes 1.32/1.33)."""
    api = RestClient(load_api_client(str(c.kubeconfig(identity))), user_agent="localcluster-smoke")
    api.use_resource_api(discover_resource_api(api))
    return api


def wait_for(what: str, fn: Callable[[], Any]) -> Any:
    return eventually(fn, TIMEOUT, what=what, every=0.2)


def gone(api: RestClient, resource: Resource, name: str, namespace: str | None = None) -> bool:
    try:
        api.get(resource, name, namespace=namespace)
    except NotFoundError:
        return True
    return False


def forbidden(call: Callable[[], object]) -> bool:
    """True when ``call`` is answered 403 (authenticated, but RBAC denies it)."""
    try:
        call()
    except ForbiddenError:
        return True
    return False


def whoami(api: RestClient) -> dict[str, Any]:
    review = {"apiVersion": SELF_SUBJECT_REVIEWS.api_version, "kind": SELF_SUBJECT_REVIEWS.kind}
    info: dict[str, Any] = api.create(SELF_SUBJECT_REVIEWS, review)["status"]["userInfo"]
    return info


def run(c: Cluster) -> None:
    api = client(c, "admin")
    t0 = time.monotonic()

    def step(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.2f}s] {msg}", flush=True)

    api.create(NAMESPACES, {"metadata": {"name": NS}})
    api.create(NODES, fake_node("node-1"))
    api.create(NODES, fake_node("node-2", {"smoke/daemon": "yes"}))
    step("created namespace and nodes node-1, node-2 (node-2 labeled smoke/daemon=yes)")

    api.create(
        DEVICE_CLASSES,
        {
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        },
    )
    api.create(
        RESOURCE_SLICES,
        {
            "metadata": {"name": "node-1-smoke"},
            "spec": {
                "driver": DRIVER,
                "nodeName": "node-1",
                "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {"name": "dev-0", "attributes": {"index": {"int": 0}}},
                    {"name": "dev-1", "attributes": {"index": {"int": 1}}},
                ],
            },
        },
    )
    api.create(
        RESOURCE_CLAIM_TEMPLATES,
        {
            "metadata": {"name": "one-dev"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "dev", "exactly": {"deviceClassName": DRIVER}}]
                    }
                }
            },
        },
        namespace=NS,
    )
    api.create(
        PODS,
        {
            "metadata": {"name": "dra-pod"},
            "spec": {
                "automountServiceAccountToken": False,
                "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": "one-dev"}],
                "containers": [
                    {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "dev"}]}}
                ],
            },
        },
        namespace=NS,
    )
    step("created DeviceClass, ResourceSlice (2 devices on node-1), ResourceClaimTemplate, pod")

    pod = wait_for(
        "pod bound",
        lambda: (p := api.get(PODS, "dra-pod", namespace=NS))["spec"].get("nodeName") and p,
    )
    assert pod["spec"]["nodeName"] == "node-1", pod["spec"]["nodeName"]
    claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    claim = api.get(RESOURCE_CLAIMS, claim_name, namespace=NS)
    results = claim["status"]["allocation"]["devices"]["results"]
    reserved = [r["name"] for r in claim["status"].get("reservedFor", [])]
    assert results[0]["driver"] == DRIVER and results[0]["pool"] == "node-1", results
    assert reserved == ["dra-pod"], reserved
    step(
        f"scheduler bound dra-pod to node-1; claim {claim_name} allocated "
        f"{results[0]['device']}, reservedFor={reserved}"
    )

    api.delete(PODS, "dra-pod", namespace=NS, grace_period_seconds=0)  # no kubelet: force delete
    wait_for("generated claim deleted", lambda: gone(api, RESOURCE_CLAIMS, claim_name, NS))
    step("pod force-deleted; generated claim removed by the controllers")

    api.create(
        DAEMONSETS,
        {
            "metadata": {"name": "ds"},
            "spec": {
                "selector": {"matchLabels": {"app": "ds"}},
                "template": {
                    "metadata": {"labels": {"app": "ds"}},
                    "spec": {
                        "nodeSelector": {"smoke/daemon": "yes"},
                        "automountServiceAccountToken": False,
                        "containers": [{"name": "c", "image": "busybox"}],
                    },
                },
            },
        },
        namespace=NS,
    )

    def ds_pods() -> list[str]:
        items = api.list(PODS, namespace=NS, label_selector="app=ds")["items"]
        return [p["spec"].get("nodeName") for p in items if p["spec"].get("nodeName")]

    assert wait_for("daemonset pod bound", ds_pods) == ["node-2"], ds_pods()
    step("DaemonSet pod created and bound to node-2 only")

    node = client(c, "node-1")
    who = whoami(node)
    assert who["username"] == "system:node:node-1", who
    assert node.get(NODES, "node-1")["metadata"]["name"] == "node-1"
    assert forbidden(lambda: node.list(SECRETS, namespace=NS))
    late = c.add_node_identity("late-node")  # client certificate, minted after start
    who = whoami(client(c, late.name))
    assert who["username"] == "system:node:late-node", who
    sa = client(c, "compute-domain-controller")
    who = whoami(sa)
    assert (
        who["username"] == f"system:serviceaccount:{c.driver_namespace}:compute-domain-controller"
    )
    assert f"system:serviceaccounts:{c.driver_namespace}" in who["groups"], who
    assert forbidden(lambda: sa.list(PODS))  # authenticated, but no RBAC yet
    step("node (token and late client-cert) and service-account identities authenticate")

    old = {n: c.procs[n].pid for n in ("kube-scheduler", "kube-controller-manager")}
    c.restart_apiserver(1.0)
    c.restart_controllers()
    assert c.apiserver_restarts == 1
    assert all(c.procs[n].pid != pid and c.procs[n].alive() for n, pid in old.items()), old
    api.create(
        PODS,
        {
            "metadata": {"name": "after-restart"},
            "spec": {
                "automountServiceAccountToken": False,
                "nodeSelector": {"smoke/daemon": "yes"},
                "containers": [{"name": "c", "image": "busybox"}],
            },
        },
        namespace=NS,
    )
    bound = lambda: api.get(PODS, "after-restart", namespace=NS)["spec"].get("nodeName")  # noqa: E731
    assert wait_for("pod bound after restarts", bound) == "node-2"
    step("apiserver restarted, then scheduler and controller-manager: a new pod is bound")


def smoke(bins: Path, workdir: Path) -> list[int]:
    """Start a cluster in ``workdir``, `run` the checks, stop it; returns the PIDs of its
    processes still alive after `Cluster.stop` (none is the pass). A failed check raises, after
    printing the tails of the component logs."""
    t = time.monotonic()
    c = Cluster.start(bins, workdir, node_count=4)
    print(f"cluster up in {time.monotonic() - t:.1f}s at {c.server} (dir {workdir})", flush=True)
    pids = [p.pid for p in c.procs.values()]
    ok = False
    try:
        run(c)
        ok = True
    finally:
        if not ok:
            print(c.dump_logs(30), file=sys.stderr)
        t = time.monotonic()
        pids += [p.pid for p in c.procs.values() if p.pid not in pids]  # restarted ones
        c.stop()
        stray = [pid for pid in pids if pid_alive(pid)]
        print(f"cluster stopped in {time.monotonic() - t:.1f}s; stray processes: {stray or 'none'}")
    return stray


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bin-dir", type=Path)
    ap.add_argument("--dir", type=Path, help="cluster dir (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="leave the cluster dir (logs) behind")
    args = ap.parse_args()
    bins = args.bin_dir or bin_dir()
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="localcluster-smoke-"))
    try:
        stray = smoke(bins, workdir)
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    if stray:
        return 1
    print("SMOKE OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
