"""Names shared by every component: API group, driver, labels, finalizer, device classes.

These strings are part of the upstream contract (NVIDIA's Go driver): manifests, node labels and
CDI IDs written by either implementation must be understood by the other, so none of them may
change.
"""

from __future__ import annotations

from typing import Final

from pkg.api import daemoncontract as _daemoncontract

GROUP: Final = "resource.nvidia.com"
VERSION: Final = "v1beta1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

DRIVER_NAME: Final = "compute-domain.nvidia.com"
CDI_VENDOR: Final = f"k8s.{DRIVER_NAME}"

COMPUTE_DOMAIN_KIND: Final = "ComputeDomain"
COMPUTE_DOMAIN_CLIQUE_KIND: Final = "ComputeDomainClique"
CHANNEL_CONFIG_KIND: Final = "ComputeDomainChannelConfig"
DAEMON_CONFIG_KIND: Final = "ComputeDomainDaemonConfig"

# Upstream uses one string as node label, object label and finalizer.
COMPUTE_DOMAIN_LABEL: Final = "resource.nvidia.com/computeDomain"
FINALIZER: Final = COMPUTE_DOMAIN_LABEL
CLIQUE_ID_LABEL: Final = "resource.nvidia.com/computeDomain.cliqueID"
TARGET_LABEL: Final = "resource.nvidia.com/computeDomainTarget"
TARGET_DAEMON: Final = "Daemon"
TARGET_WORKLOAD: Final = "Workload"
# W3C traceparent of the domain's formation trace (root span: creation -> first Ready), written by
# the controller with its finalizer when tracing is on; plugins hand it on to the daemons in the
# CDI env TRACEPARENT. Our addition: the Go driver neither writes nor reads it.
TRACEPARENT_ANNOTATION: Final = "resource.nvidia.com/traceparent"
# Node label users put in podAffinity topologyKey (GFD's name, so existing manifests work).
GPU_CLIQUE_NODE_LABEL: Final = "nvidia.com/gpu.clique"
# Who keeps that label on a node, written with it: "true" = the controller (mirrors the node's
# ResourceSlices), GPU_CLIQUE_MANAGED_BY_PLUGIN = the node's kubelet plugin
# (--gpu-clique-label-enabled), which the controller then leaves alone. Absent: someone else's.
GPU_CLIQUE_MANAGED_ANNOTATION: Final = "resource.nvidia.com/gpu.clique-managed"
GPU_CLIQUE_MANAGED_BY_PLUGIN: Final = "kubelet-plugin"

CHANNEL_DEVICE_CLASS: Final = "compute-domain-default-channel.nvidia.com"
DAEMON_DEVICE_CLASS: Final = "compute-domain-daemon.nvidia.com"
CHANNEL_REQUEST_NAME: Final = "channel"
DAEMON_REQUEST_NAME: Final = "daemon"
CHANNEL_DEVICE_NAME: Final = "channel-0"
DAEMON_DEVICE_NAME: Final = "daemon-0"
DAEMON_CLAIM_NAME: Final = "compute-domain-daemon"
DAEMON_CONTAINER_NAME: Final = "compute-domain-daemon"

STATUS_READY: Final = "Ready"
STATUS_NOT_READY: Final = "NotReady"
ALLOCATION_MODE_SINGLE: Final = "Single"
ALLOCATION_MODE_ALL: Final = "All"

# An IMEX daemon whose container received no nvidia-imex/nvidia-imex-ctl through CDI (the kubelet
# plugin's driver root lacks them): reason of its pod's Event and of the ComputeDomain's Ready
# condition, and the prefix "DriverRootIncomplete: <detail>" of its termination message, which
# is how the controller learns it from the pod status.
REASON_DRIVER_ROOT_INCOMPLETE: Final = "DriverRootIncomplete"

DEFAULT_MAX_NODES_PER_IMEX_DOMAIN: Final = 18
CLIQUE_JOIN_BY_CONTROLLER_ENV: Final = _daemoncontract.CLIQUE_JOIN_BY_CONTROLLER
"""Not a second definition: the daemon's process contract names the variable; this older
spelling only stays importable until its last callers (the daemon's tests) use
``daemoncontract.CLIQUE_JOIN_BY_CONTROLLER``."""
IMEX_CHANNEL_COUNT: Final = 2048
DEFAULT_DRIVER_NAMESPACE: Final = "nvidia-dra-driver"


def daemon_object_name(cd_uid: str) -> str:
    """Name of the per-CD DaemonSet and daemon ResourceClaimTemplate (driver namespace)."""
    return f"computedomain-daemon-{cd_uid}"


def clique_object_name(cd_uid: str, clique_id: str) -> str:
    """Name of the ComputeDomainClique of one CD on one NVLink clique (driver namespace)."""
    return f"{cd_uid}.{clique_id}"
