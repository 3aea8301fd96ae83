"""Shared machinery of the e2e suite (also used by ``hack/demo.py`` and the benchmark).

Owns: deploying the driver from ``config/`` (``kubectl kustomize config/default``, applied with
the real kubectl except the controller Deployment and the plugin DaemonSet, which run as local
processes: the controller here, the plugins inside each simulated node), the controller process
(env taken from its Deployment manifest, plus a local ``HTTP_ENDPOINT`` and ``DEBUG_ENDPOINTS``),
small API helpers over raw JSON, and the leak report every scenario ends with. Everything takes
its dependencies as arguments.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from hostsys.ports import free_ports
from kubeletsim import NodeFleet
from localcluster import Cluster

from pkg.api import constants as c
from pkg.kube.client import KubeClient
from pkg.kube.errors import NotFoundError
from pkg.kube.resourceapi import choose_version
from pkg.kube.resources import (
    COMPUTE_DOMAIN_CLIQUES,
    COMPUTE_DOMAINS,
    DAEMONSETS,
    EVENTS,
    NODES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
)
from pkg.testing.eventually import eventually

REPO = Path(__file__).resolve().parents[2]
KUBECTL = Path(sys.executable).parent / "kubectl"
CONTROLLER_SCRIPT = REPO / "cmd" / "compute-domain-controller" / "compute_domain_controller.py"
LOCAL_KINDS = {"Deployment", "DaemonSet"}  # run as local processes, not applied
# ...except that the controller Deployment is applied with no replicas: it is the parameter of
# the controller's DaemonSet admission policy (config/admission/controller-daemonsets.yaml reads
# its IMAGE_NAME and CD_DAEMON_SERVICE_ACCOUNT env), which is the env the local controller gets.
PARKED_KINDS = {"Deployment"}
T = TypeVar("T")


def wait_for(what: str, fn: Callable[[], T | None], timeout: float = 60.0, every: float = 0.2) -> T:
    """Poll ``fn`` every ``every`` s until it returns something truthy; fail with ``what`` after
    ``timeout`` (:func:`pkg.testing.eventually.eventually`)."""
    value = eventually(fn, timeout, what=what, every=every)
    assert value is not None  # truthy
    return value


def impersonated_request(
    cluster: Cluster,
    method: str,
    path: str,
    body: Any = None,
    *,
    user: str | None = None,
    groups: Iterable[str] = (),
    extra: dict[str, str] | None = None,
    content_type: str = "application/json",
) -> tuple[int, str]:
    """One raw request with the admin's credentials, impersonating ``user`` (with ``groups``
    and the user-extra ``extra``, e.g. a pod-bound token's pod-name / node-name claims) when
    given: (HTTP status, body). http.client, because each group is its own Impersonate-Group
    header."""
    headers = [
        ("Authorization", f"Bearer {cluster.token('admin')}"),
        ("Content-Type", content_type),
    ]
    if user is not None:
        headers.append(("Impersonate-User", user))
        headers += [("Impersonate-Group", g) for g in groups]
        headers += [
            (f"Impersonate-Extra-{urllib.parse.quote(k, safe='')}", v)
            for k, v in (extra or {}).items()
        ]
    data = b"" if body is None else json.dumps(body).encode()
    url = urllib.parse.urlsplit(cluster.server)
    context = ssl.create_default_context(cafile=str(cluster.ca_file))
    conn = http.client.HTTPSConnection(url.netloc, context=context, timeout=30)
    try:
        conn.putrequest(method, path)
        for key, value in [*headers, ("Content-Length", str(len(data)))]:
            conn.putheader(key, value)
        conn.endheaders(data)
        resp = conn.getresponse()
        return int(resp.status), resp.read().decode()
    finally:
        conn.close()


# The claims of a pod-bound ServiceAccount token, as the API server puts them in the user's extra.
POD_CLAIM = "authentication.kubernetes.io/pod-name"
NODE_CLAIM = "authentication.kubernetes.io/node-name"
POD_UID_CLAIM = "authentication.kubernetes.io/pod-uid"


class Api:
    """Raw requests as the admin or impersonating a ServiceAccount with token claims."""

    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        sa: str | None = None,
        claims: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, str]:
        """``sa``: impersonate that ServiceAccount (user and groups) with ``claims`` as its
        user extra."""
        ident = self._cluster.service_account_identity(sa) if sa is not None else None
        return impersonated_request(
            self._cluster,
            method,
            path,
            body,
            user=ident.user if ident else None,
            groups=ident.groups if ident else (),
            extra=claims,
            content_type=content_type,
        )


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None, check: bool = True) -> str:
    done = subprocess.run(
        [str(KUBECTL), f"--kubeconfig={kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout + (done.stderr if not check else "")


def render_config(
    kustomization: Path = REPO / "config" / "default", components: Iterable[str] = ()
) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of ``kustomization``, plus ``config/components/<name>`` for each
    of ``components`` (the way operators add one: a kustomization of both)."""
    with tempfile.TemporaryDirectory(prefix="kustomize-") as scratch:
        target = kustomization
        if components:
            (Path(scratch) / "kustomization.yaml").write_text(
                yaml.safe_dump(
                    {
                        "resources": [os.path.relpath(kustomization, scratch)],
                        "components": [
                            os.path.relpath(REPO / "config" / "components" / name, scratch)
                            for name in components
                        ],
                    }
                )
            )
            target = Path(scratch)
        out = subprocess.run(
            [str(KUBECTL), "kustomize", str(target)],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


# The kustomize component that renders the DeviceClasses in a served version older than v1
# (docs/operators.md "Kubernetes versions").
RESOURCE_API_COMPONENTS = {"v1beta2": "resource-v1beta2", "v1beta1": "resource-v1beta1"}


def served_resource_api(admin_kubeconfig: Path) -> str:
    """The resource.k8s.io version the driver's binaries will choose on this cluster."""
    doc = json.loads(kubectl(admin_kubeconfig, "get", "--raw", "/apis/resource.k8s.io"))
    return choose_version([v["version"] for v in doc.get("versions") or []])


@dataclass
class Driver:
    """The deployed driver: rendered manifests plus the local controller process."""

    kubeconfig: Path  # admin
    namespace: str
    docs: list[dict[str, Any]]
    controller: subprocess.Popen[bytes] | None = None
    controller_log: Path | None = None
    controller_http: str = ""  # host:port of the running controller's HTTP endpoint

    @classmethod
    def deploy(cls, admin_kubeconfig: Path) -> Driver:
        component = RESOURCE_API_COMPONENTS.get(served_resource_api(admin_kubeconfig))
        docs = render_config(components=[component] if component else [])
        applied = [d for d in docs if d["kind"] not in LOCAL_KINDS] + [
            {**d, "spec": {**d["spec"], "replicas": 0}} for d in docs if d["kind"] in PARKED_KINDS
        ]
        ns = next(d["metadata"]["name"] for d in docs if d["kind"] == "Namespace")
        crds = [d for d in applied if d["kind"] == "CustomResourceDefinition"]
        kubectl(
            admin_kubeconfig, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(crds)
        )
        for crd in crds:
            kubectl(
                admin_kubeconfig,
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                f"crd/{crd['metadata']['name']}",
            )
        rest = [d for d in applied if d["kind"] != "CustomResourceDefinition"]
        kubectl(
            admin_kubeconfig, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(rest)
        )
        return cls(kubeconfig=admin_kubeconfig, namespace=ns, docs=docs)

    def manifest(self, kind: str) -> dict[str, Any]:
        return next(d for d in self.docs if d["kind"] == kind)

    def controller_env(self, *, kubeconfig: Path, http_port: int) -> dict[str, str]:
        """Env of the controller container in the rendered Deployment, resolved locally."""
        deploy = self.manifest("Deployment")
        config_maps = {
            d["metadata"]["name"]: d.get("data", {}) for d in self.docs if d["kind"] == "ConfigMap"
        }
        env: dict[str, str] = {}
        container = deploy["spec"]["template"]["spec"]["containers"][0]
        for item in container.get("env", []):
            src = item.get("valueFrom", {})
            if "value" in item:
                env[item["name"]] = str(item["value"])
            elif "configMapKeyRef" in src:
                ref = src["configMapKeyRef"]
                env[item["name"]] = str(config_maps[ref["name"]].get(ref["key"], ""))
            elif "fieldRef" in src:
                fields = {
                    "metadata.name": "compute-domain-controller-local",
                    "metadata.namespace": self.namespace,
                }
                env[item["name"]] = fields.get(src["fieldRef"]["fieldPath"], "")
        env.update(
            {
                "HTTP_ENDPOINT": f"127.0.0.1:{http_port}",
                "DEBUG_ENDPOINTS": "true",  # /debug/informers, for cachecheck
                "KUBECONFIG": str(kubeconfig),
                "PYTHONPATH": str(REPO),
                "PYTHONUNBUFFERED": "1",
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            }
        )
        return env

    def controller_args(self) -> list[str]:
        deploy = self.manifest("Deployment")
        container = deploy["spec"]["template"]["spec"]["containers"][0]
        return [str(a) for a in container.get("args", [])]

    def start_controller(
        self,
        *,
        kubeconfig: Path,
        log_file: Path,
        http_port: int,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        """Run the controller locally; ``extra_env`` overrides the manifest's env."""
        env = self.controller_env(kubeconfig=kubeconfig, http_port=http_port)
        env.update(extra_env or {})
        args = [
            a.replace("$(LOG_VERBOSITY)", env.get("LOG_VERBOSITY", "1"))
            for a in self.controller_args()
        ]
        self.controller_log = log_file
        self.controller_http = env["HTTP_ENDPOINT"]
        with log_file.open("ab") as log:
            log.write(f"=== {time.strftime('%H:%M:%S')} starting controller\n".encode())
            log.flush()
            self.controller = subprocess.Popen(
                [sys.executable, str(CONTROLLER_SCRIPT), *args],
                env=env,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        atexit.register(self.kill_controller)  # own session: never orphan it

    def kill_controller(self, sig: signal.Signals = signal.SIGKILL) -> None:
        p = self.controller
        if p is not None and p.poll() is None:
            os.killpg(p.pid, sig)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)

    def controller_alive(self) -> bool:
        return self.controller is not None and self.controller.poll() is None


# -- objects ---------------------------------------------------------------------------------


def compute_domain(
    name: str,
    namespace: str,
    *,
    rct: str,
    mode: str = "Single",
    num_nodes: int | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "channel": {"resourceClaimTemplate": {"name": rct}, "allocationMode": mode}
    }
    if num_nodes is not None:
        spec["numNodes"] = num_nodes
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.COMPUTE_DOMAIN_KIND,
        "metadata": meta,
        "spec": spec,
    }


def workload_pod(
    name: str,
    namespace: str,
    *,
    rct: str | None = None,
    claim: str | None = None,
    node: str | None = None,
    labels: dict[str, str] | None = None,
    affinity: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A pod like the upstream channel-injection example (``ls /dev/nvidia-caps-imex-channels``)."""
    source = {"resourceClaimTemplateName": rct} if rct else {"resourceClaimName": claim}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "containers": [
            {
                "name": "ctr",
                "image": "ubuntu:22.04",
                "command": ["bash", "-c", "ls -la /dev/nvidia-caps-imex-channels; sleep 3600"],
                "resources": {"claims": [{"name": "compute-domain-channel"}]},
            }
        ],
        "resourceClaims": [{"name": "compute-domain-channel", **source}],
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    if affinity:
        spec["affinity"] = affinity
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": spec,
    }


def channel_claim(name: str, ns: str, params: dict[str, Any]) -> dict[str, Any]:
    """A hand-written workload claim (what the controller's RCT would produce)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "channel", "exactly": {"deviceClassName": c.CHANNEL_DEVICE_CLASS}}
                ],
                "config": [
                    {
                        "requests": ["channel"],
                        "opaque": {"driver": c.DRIVER_NAME, "parameters": params},
                    }
                ],
            }
        },
    }


def free_port() -> int:
    """A free port on 127.0.0.1 outside the ephemeral range (``localcluster.free_ports``)."""
    return free_ports(1)[0]


def teardown_namespace(client: KubeClient, name: str, timeout: float = 90) -> None:
    """Delete the namespace's ComputeDomains and pods and wait until the pods are gone."""
    for cd in client.list(COMPUTE_DOMAINS, namespace=name).get("items", []):
        with contextlib.suppress(NotFoundError):
            client.delete(COMPUTE_DOMAINS, cd["metadata"]["name"], namespace=name)
    for pod in client.list(PODS, namespace=name).get("items", []):
        with contextlib.suppress(NotFoundError):
            client.delete(PODS, pod["metadata"]["name"], namespace=name)

    def gone() -> bool:
        return not client.list(PODS, namespace=name).get("items")

    wait_for(f"pods of {name} gone", gone, timeout=timeout)


def spread_affinity(label: dict[str, str]) -> dict[str, Any]:
    """One pod per node (hostname anti-affinity among pods with ``label``)."""
    return {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": label}}
            ]
        }
    }


def channels_seen(fleet: NodeFleet, namespace: str, pod: str, container: str = "ctr") -> list[str]:
    rec = fleet.container_record(namespace, pod, container)
    if rec is None:
        return []
    prefix = "/dev/nvidia-caps-imex-channels/"
    return [
        p.removeprefix(prefix)
        for p in (d["path"] for d in rec["deviceNodes"])
        if p.startswith(prefix)
    ]


def pod_phase(client: KubeClient, ns: str, name: str) -> str:
    try:
        return str(client.get(PODS, name, namespace=ns).get("status", {}).get("phase", ""))
    except NotFoundError:
        return "<gone>"


def pod_ready(client: KubeClient, ns: str, name: str) -> bool:
    try:
        pod = client.get(PODS, name, namespace=ns)
    except NotFoundError:
        return False
    conds = {x["type"]: x["status"] for x in pod.get("status", {}).get("conditions", [])}
    return conds.get("Ready") == "True"


def events_for(client: KubeClient, ns: str, name: str) -> list[dict[str, Any]]:
    items = client.list(EVENTS, namespace=ns, field_selector=f"involvedObject.name={name}")
    return list(items.get("items", []))


# -- leaks -----------------------------------------------------------------------------------


def leak_report(
    client: KubeClient, fleet: NodeFleet, driver_ns: str, namespaces: Iterable[str] = ()
) -> dict[str, Any]:
    """Everything a finished scenario must not leave behind (empty dict = clean)."""
    leaks: dict[str, Any] = {}

    def names(items: dict[str, Any]) -> list[str]:
        return [i["metadata"]["name"] for i in items.get("items", [])]

    ds = names(client.list(DAEMONSETS, namespace=driver_ns, label_selector=c.COMPUTE_DOMAIN_LABEL))
    rcts = names(client.list(RESOURCE_CLAIM_TEMPLATES, namespace=driver_ns))
    claims = names(client.list(RESOURCE_CLAIMS, namespace=driver_ns))
    cliques = names(client.list(COMPUTE_DOMAIN_CLIQUES, namespace=driver_ns))
    labeled = names(client.list(NODES, label_selector=c.COMPUTE_DOMAIN_LABEL))
    for ns in namespaces:
        for key, res in (("rcts", RESOURCE_CLAIM_TEMPLATES), ("cds", COMPUTE_DOMAINS)):
            left = names(client.list(res, namespace=ns))
            if left:
                leaks[f"{key}[{ns}]"] = left
    for key, value in (
        ("daemonsets", ds),
        ("driver-rcts", rcts),
        ("driver-claims", claims),
        ("cliques", cliques),
        ("labeled-nodes", labeled),
        ("cdi-claim-specs", fleet.cdi_claim_specs()),
        ("checkpoints", fleet.checkpoint_claims()),
    ):
        if value:
            leaks[key] = value
    return leaks


def dump_json(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)
