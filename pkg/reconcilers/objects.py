"""Pure renderers of the objects the controller owns for one ComputeDomain.

Owns the exact shape of the workload ResourceClaimTemplate (CD namespace), the daemon
ResourceClaimTemplate and the per-domain IMEX daemon DaemonSet (driver namespace). Names,
labels and the daemon contract (command, env, claims, probes) follow upstream so either
implementation can adopt the other's objects. Invariants:

* every function is deterministic and side-effect free: same CD + config → same dict;
* every rendered object carries ``resource.nvidia.com/computeDomain=<uid>``, which is how the
  controller finds, adopts and garbage-collects its dependents (no cross-namespace owner
  references are possible);
* dependents carry no finalizer (unlike upstream): the controller deletes them in order itself,
  and a crashed or uninstalled controller can never leave them stuck terminating;
* the DaemonSet carries a hash of its own rendered spec so a changed config (new image, new
  gates) is detected by comparison, not by diffing server-defaulted fields; its update
  strategy is ``OnDelete`` so such a change never restarts a running daemon;
* the daemon pods tolerate every taint, exactly upstream's three ``Exists`` tolerations
  (NoSchedule, NoExecute, PreferNoSchedule), so a daemon follows its workload onto any node,
  including one with a custom taint the workload tolerates. A daemon is never evicted: the
  DaemonSet controller adds infinite ``not-ready``/``unreachable`` tolerations to every daemon
  pod whatever the template says, so how a dead node leaves the domain is decided by the
  controller (``node_loss_grace_period``), not by eviction;
* the daemon container runs with least privilege (:data:`DAEMON_SECURITY_CONTEXT`): root (uid 0
  owns every file it must write: the kubelet's ``/etc/hosts``, the plugin's root-owned domain
  directory at ``/imexd``, and opens the root-only ``fabric-imex-mgmt`` capability device) but
  with no capability at all, no privilege escalation, the runtime's default seccomp profile and
  a read-only root filesystem; what it and ``nvidia-imex`` write outside the CDI and kubelet
  mounts goes to the emptyDirs of :data:`DAEMON_SCRATCH_DIRS`.
"""

from __future__ import annotations

import copy
import hashlib
import json

from pkg.api import constants as c
from pkg.api import daemoncontract as dc
from pkg.api.channelshare import channel_toleration
from pkg.api.computedomain import ComputeDomain
from pkg.api.placement import PINNED_CLIQUE_ANNOTATION, clique_selector
from pkg.base.types import JSON
from pkg.imex.config import DEFAULT_CMD_PORT, DEFAULT_SERVER_PORT
from pkg.reconcilers.config import ControllerConfig

__all__ = [
    "DAEMON_SCRATCH_DIRS",
    "DAEMON_SECURITY_CONTEXT",
    "DAEMON_TOLERATIONS",
    "SPEC_HASH_ANNOTATION",
    "render_daemon_rct",
    "render_daemonset",
    "render_workload_rct",
    "spec_hash",
]


SPEC_HASH_ANNOTATION = "resource.nvidia.com/spec-hash"
_RCT_API_VERSION = "resource.k8s.io/v1"


def _rct(
    *,
    name: str,
    namespace: str,
    uid: str,
    target: str,
    request: str,
    device_class: str,
    parameters: JSON,
) -> JSON:
    return {
        "apiVersion": _RCT_API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {c.COMPUTE_DOMAIN_LABEL: uid, c.TARGET_LABEL: target},
        },
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": request, "exactly": {"deviceClassName": device_class}}],
                    "config": [
                        {
                            "requests": [request],
                            "opaque": {"driver": c.DRIVER_NAME, "parameters": parameters},
                        }
                    ],
                }
            }
        },
    }


def render_workload_rct(cd: ComputeDomain, *, owner: JSON | None = None, clique: str = "") -> JSON:
    """The channel RCT the user's pods reference, in the CD's namespace.

    Upstream's shape plus one toleration on the request (`pkg.api.channelshare`): its claims
    may share a node's ``channel-0`` with claims of the same domain, never of another. With
    ``clique`` (a ``SingleClique`` domain, `pkg.api.placement`) the request also selects only a
    ``channel-0`` of that NVLink clique, and the template records the clique in its
    ``resource.nvidia.com/clique`` annotation.
    ``owner`` (the CD object) adds a controller ownerReference so the garbage collector removes
    the template even if the controller never runs again; same namespace, so it is legal.
    """
    obj = _rct(
        name=cd.resource_claim_template_name,
        namespace=cd.namespace,
        uid=cd.uid,
        target=c.TARGET_WORKLOAD,
        request=c.CHANNEL_REQUEST_NAME,
        device_class=c.CHANNEL_DEVICE_CLASS,
        parameters={
            "apiVersion": c.API_VERSION,
            "kind": c.CHANNEL_CONFIG_KIND,
            "domainID": cd.uid,
            "allocationMode": cd.allocation_mode,
        },
    )
    (request,) = obj["spec"]["spec"]["devices"]["requests"]
    request["exactly"]["tolerations"] = [channel_toleration(cd.uid)]
    if clique:
        request["exactly"]["selectors"] = [clique_selector(clique)]
        obj["metadata"]["annotations"] = {PINNED_CLIQUE_ANNOTATION: clique}
    if owner is not None:
        obj["metadata"]["ownerReferences"] = [
            {
                "apiVersion": c.API_VERSION,
                "kind": c.COMPUTE_DOMAIN_KIND,
                "name": cd.name,
                "uid": cd.uid,
                "controller": True,
            }
        ]
    return obj


def render_daemon_rct(cd: ComputeDomain, config: ControllerConfig) -> JSON:
    """The RCT each daemon pod's claim is made from, in the driver namespace."""
    return _rct(
        name=c.daemon_object_name(cd.uid),
        namespace=config.namespace,
        uid=cd.uid,
        target=c.TARGET_DAEMON,
        request=c.DAEMON_REQUEST_NAME,
        device_class=c.DAEMON_DEVICE_CLASS,
        parameters={"apiVersion": c.API_VERSION, "kind": c.DAEMON_CONFIG_KIND, "domainID": cd.uid},
    )


def _field_env(name: str, path: str) -> JSON:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _probe(*, period: int, failure_threshold: int) -> JSON:
    return {
        "exec": {"command": ["compute-domain-daemon", "-v", f"$({dc.LOG_VERBOSITY})", "check"]},
        "periodSeconds": period,
        "timeoutSeconds": 10,
        "failureThreshold": failure_threshold,
    }


# Upstream's daemon tolerations (its issue #305): repel no taint at all.
DAEMON_TOLERATIONS: tuple[JSON, ...] = (
    {"operator": "Exists", "effect": "NoSchedule"},
    {"operator": "Exists", "effect": "NoExecute"},
    {"operator": "Exists", "effect": "PreferNoSchedule"},
)


# Least privilege for the daemon container. Why each setting holds:
# * root (uid/gid 0, as the image's USER): the files the daemon writes are root-owned -- the
#   kubelet's /etc/hosts (0644), the plugin's domain directory mounted at /imexd (0755) -- and
#   nvidia-imex opens /dev/nvidia-caps/nvidia-cap<N> (fabric-imex-mgmt), which the CDI spec
#   creates root-owned with the driver's DeviceFileMode 0400. As the *owner* uid 0 needs no
#   capability for any of them (no CAP_DAC_OVERRIDE), so all are dropped: the IMEX ports
#   (50000/50005) and the metrics port are >= 1024 (no NET_BIND_SERVICE), the daemon signals
#   only its own child (no KILL), chmods only its own temp files (no FOWNER/CHOWN), never
#   changes identity (no SETUID/SETGID) and uses no raw sockets (no NET_RAW);
# * no privilege escalation: nothing it runs is setuid;
# * RuntimeDefault seccomp: the daemon needs files, processes, signals and TCP; nvidia-imex
#   ioctls on its device nodes -- nothing the default profile blocks (mount, bpf, ptrace of
#   others, ...). Real nvidia-imex is not run by any test here (no NVLink hardware): with its
#   Kerberos (GSSAPI) authentication a keyring credential cache would need keyctl, which the
#   default profile blocks;
# * read-only root filesystem: every path written is a mount: /imexd (CDI, host), /etc/hosts and
#   /dev/termination-log (kubelet), and DAEMON_SCRATCH_DIRS.
DAEMON_SECURITY_CONTEXT: JSON = {
    "runAsUser": 0,
    "runAsGroup": 0,
    "privileged": False,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}

# (volume name, mount path) of the daemon container's emptyDirs: the only writable places of its
# root filesystem. /var/log: nvidia-imex's STATS_FILE_NAME (pkg.imex.config); /tmp: the
# conventional scratch directory (Python's tempfile, the driver's libraries), empty but kept
# writable so nothing fails on a read-only /tmp.
DAEMON_SCRATCH_DIRS: tuple[tuple[str, str], ...] = (("tmp", "/tmp"), ("var-log", "/var/log"))


# The kernel hands out outbound local ports from 32768-60999, which holds IMEX's 50000 and 50005:
# a connection of the daemon pod (its API requests, a watch) that got one of them kept IMEX from
# listening for as long as it lived, and the daemon's domain never became Ready on that node.
# Reserved ports are never picked for outbound connections but can still be bound. A namespaced
# sysctl the kubelet allows by default (Kubernetes 1.27+), set in the daemon pod's own netns.
RESERVED_PORTS_SYSCTL = "net.ipv4.ip_local_reserved_ports"


def imex_ports(config: ControllerConfig) -> tuple[int, int]:
    """IMEX's server and command ports in the daemons (``IMEX_SERVER_PORT`` / ``IMEX_CMD_PORT``
    of `ControllerConfig.daemon_extra_env` where set and valid, else IMEX's defaults)."""
    ports = {dc.IMEX_SERVER_PORT: DEFAULT_SERVER_PORT, dc.IMEX_CMD_PORT: DEFAULT_CMD_PORT}
    for name, value in config.daemon_extra_env:
        if name in ports and value.isdigit() and 0 < int(value) < 65536:
            ports[name] = int(value)
    return ports[dc.IMEX_SERVER_PORT], ports[dc.IMEX_CMD_PORT]


def _pod_spec(cd: ComputeDomain, config: ControllerConfig) -> JSON:
    name = c.daemon_object_name(cd.uid)
    env: list[JSON] = [
        {"name": dc.LOG_VERBOSITY, "value": str(config.log_verbosity_cd_daemon)},
        {"name": dc.MAX_NODES_PER_IMEX_DOMAIN, "value": str(config.max_nodes_per_imex_domain)},
        *(_field_env(env, path) for env, path in dc.DOWNWARD_API),
        {"name": dc.NVIDIA_VISIBLE_DEVICES, "value": "void"},
        {"name": dc.FEATURE_GATES, "value": config.feature_gates},
        {"name": dc.CLIQUE_JOIN_BY_CONTROLLER, "value": "true"},
        *({"name": name, "value": value} for name, value in config.daemon_extra_env),
    ]
    spec: JSON = {
        "serviceAccountName": config.daemon_service_account,
        "nodeSelector": {c.COMPUTE_DOMAIN_LABEL: cd.uid},
        "tolerations": [dict(t) for t in DAEMON_TOLERATIONS],
        "containers": [
            {
                "name": c.DAEMON_CONTAINER_NAME,
                "image": config.image_name,
                "command": ["compute-domain-daemon", "-v", f"$({dc.LOG_VERBOSITY})", "run"],
                "env": env,
                "resources": {"claims": [{"name": c.DAEMON_CLAIM_NAME}]},
                "securityContext": copy.deepcopy(DAEMON_SECURITY_CONTEXT),
                "volumeMounts": [
                    {"name": vol, "mountPath": path} for vol, path in DAEMON_SCRATCH_DIRS
                ],
                "startupProbe": _probe(period=1, failure_threshold=1200),
                "livenessProbe": _probe(period=60, failure_threshold=20),
                "readinessProbe": _probe(period=10, failure_threshold=1),
            }
        ],
        "resourceClaims": [{"name": c.DAEMON_CLAIM_NAME, "resourceClaimTemplateName": name}],
        "volumes": [{"name": vol, "emptyDir": {}} for vol, _ in DAEMON_SCRATCH_DIRS],
        "securityContext": {
            "sysctls": [
                {
                    "name": RESERVED_PORTS_SYSCTL,
                    "value": ",".join(str(port) for port in sorted(set(imex_ports(config)))),
                }
            ]
        },
    }
    if config.image_pull_secret_names:
        spec["imagePullSecrets"] = [{"name": s} for s in config.image_pull_secret_names]
    return spec


def spec_hash(spec: JSON) -> str:
    """Stable short digest of a rendered spec (key order independent)."""
    data = json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(data).hexdigest()[:16]


def render_daemonset(cd: ComputeDomain, config: ControllerConfig) -> JSON:
    """The per-domain IMEX daemon DaemonSet, in the driver namespace."""
    labels = {**config.extra_daemon_labels, c.COMPUTE_DOMAIN_LABEL: cd.uid}
    spec: JSON = {
        "selector": {"matchLabels": {c.COMPUTE_DOMAIN_LABEL: cd.uid}},
        # A new template (controller upgrade) reaches a node only when its daemon pod is
        # recreated; rolling running IMEX daemons would break the workloads using them.
        "updateStrategy": {"type": "OnDelete"},
        "template": {"metadata": {"labels": labels}, "spec": _pod_spec(cd, config)},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": c.daemon_object_name(cd.uid),
            "namespace": config.namespace,
            "labels": {c.COMPUTE_DOMAIN_LABEL: cd.uid},
            "annotations": {SPEC_HASH_ANNOTATION: spec_hash(spec)},
        },
        "spec": spec,
    }
