"""End-to-end self-check of the local control plane (no pytest needed).

Brings a cluster up and proves the pieces a DRA driver relies on work for real: a fake Node is
schedulable; the real scheduler allocates a ResourceClaim (created by the resourceclaim-controller
from a ResourceClaimTemplate) against a hand-made ResourceSlice and binds the pod; the
garbage collector removes the generated claim after the pod is gone; a DaemonSet places a pod on
a labeled node; static-token node and service-account identities authenticate as expected; and
stopping the cluster leaves no processes behind.

    .venv/bin/python hack/localcluster/smoke.py [--bin-dir B] [--dir D] [--keep]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # run as a file: re-enter as localcluster.smoke
    import runpy

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    runpy.run_module("localcluster.smoke", run_name="__main__", alter_sys=True)
    sys.exit(0)

import kubernetes

from . import Cluster, bin_dir, fake_node
from .processes import pid_alive

DRIVER = "smoke.example.com"
NS = "smoke"


class ApiError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status


class Api:
    """Minimal raw-JSON access through the official client's transport and auth."""

    def __init__(self, kubeconfig: Path) -> None:
        self.client = kubernetes.config.new_client_from_config(str(kubeconfig))  # type: ignore[no-untyped-call]

    def call(self, method: str, path: str, body: Any = None, ok404: bool = False) -> Any:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        m, url, hdrs, data, post = self.client.param_serialize(
            method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        resp = self.client.call_api(m, url, header_params=hdrs, body=data, post_params=post)
        raw = resp.read()
        if resp.status == 404 and ok404:
            return None
        if resp.status >= 300:
            raise ApiError(resp.status, raw.decode(errors="replace"))
        return json.loads(raw) if raw else None

    def status(self, method: str, path: str, body: Any = None) -> int:
        try:
            self.call(method, path, body)
        except ApiError as e:
            return e.status
        return 200


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def run(c: Cluster) -> None:
    api = Api(c.kubeconfig("admin"))
    t0 = time.monotonic()

    def step(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.2f}s] {msg}", flush=True)

    api.call("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
    api.call("POST", "/api/v1/nodes", fake_node("node-1"))
    api.call("POST", "/api/v1/nodes", fake_node("node-2", {"smoke/daemon": "yes"}))
    step("created namespace and nodes node-1, node-2 (node-2 labeled smoke/daemon=yes)")

    api.call(
        "POST",
        "/apis/resource.k8s.io/v1/deviceclasses",
        {
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        },
    )
    api.call(
        "POST",
        "/apis/resource.k8s.io/v1/resourceslices",
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
    api.call(
        "POST",
        f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaimtemplates",
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
    )
    api.call(
        "POST",
        f"/api/v1/namespaces/{NS}/pods",
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
    )
    step("created DeviceClass, ResourceSlice (2 devices on node-1), ResourceClaimTemplate, pod")

    pod_path = f"/api/v1/namespaces/{NS}/pods/dra-pod"
    pod = wait_for(
        "pod bound", lambda: (p := api.call("GET", pod_path))["spec"].get("nodeName") and p
    )
    assert pod["spec"]["nodeName"] == "node-1", pod["spec"]["nodeName"]
    claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    claim_path = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/{claim_name}"
    claim = api.call("GET", claim_path)
    results = claim["status"]["allocation"]["devices"]["results"]
    reserved = [r["name"] for r in claim["status"].get("reservedFor", [])]
    assert results[0]["driver"] == DRIVER and results[0]["pool"] == "node-1", results
    assert reserved == ["dra-pod"], reserved
    step(
        f"scheduler bound dra-pod to node-1; claim {claim_name} allocated "
        f"{results[0]['device']}, reservedFor={reserved}"
    )

    api.call("DELETE", pod_path + "?gracePeriodSeconds=0")  # no kubelet: force delete
    wait_for("generated claim deleted", lambda: api.call("GET", claim_path, ok404=True) is None)
    step("pod force-deleted; generated claim removed by the controllers")

    api.call(
        "POST",
        f"/apis/apps/v1/namespaces/{NS}/daemonsets",
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
    )

    def ds_pods() -> list[str]:
        items = api.call("GET", f"/api/v1/namespaces/{NS}/pods?labelSelector=app%3Dds")["items"]
        return [p["spec"].get("nodeName") for p in items if p["spec"].get("nodeName")]

    assert wait_for("daemonset pod bound", ds_pods) == ["node-2"], ds_pods()
    step("DaemonSet pod created and bound to node-2 only")

    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    path = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
    node = Api(c.kubeconfig("node-1"))
    who = node.call("POST", path, review)["status"]["userInfo"]
    assert who["username"] == "system:node:node-1", who
    assert node.status("GET", "/api/v1/nodes/node-1") == 200
    assert node.status("GET", f"/api/v1/namespaces/{NS}/secrets") == 403
    late = c.add_node_identity("late-node")  # client certificate, minted after start
    who = Api(c.kubeconfig(late.name)).call("POST", path, review)["status"]["userInfo"]
    assert who["username"] == "system:node:late-node", who
    sa = Api(c.kubeconfig("compute-domain-controller"))
    who = sa.call("POST", path, review)["status"]["userInfo"]
    assert (
        who["username"] == f"system:serviceaccount:{c.driver_namespace}:compute-domain-controller"
    )
    assert f"system:serviceaccounts:{c.driver_namespace}" in who["groups"], who
    assert sa.status("GET", "/api/v1/pods") == 403  # authenticated, but no RBAC yet
    step("node (token and late client-cert) and service-account identities authenticate")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bin-dir", type=Path)
    ap.add_argument("--dir", type=Path, help="cluster dir (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="leave the cluster dir (logs) behind")
    args = ap.parse_args()
    bins = args.bin_dir or bin_dir()
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="localcluster-smoke-"))
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
        c.stop()
        stray = [pid for pid in pids if pid_alive(pid)]
        print(f"cluster stopped in {time.monotonic() - t:.1f}s; stray processes: {stray or 'none'}")
        if not args.keep and args.dir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    if stray:
        return 1
    print("SMOKE OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
