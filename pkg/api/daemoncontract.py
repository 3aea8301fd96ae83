"""The IMEX daemon's process contract: what its two producers hand to ``compute-domain-daemon``.

A daemon pod gets its inputs from two places, neither of which is the daemon's own code:

* the controller's per-domain DaemonSet (:mod:`pkg.reconcilers.objects`) sets
  :data:`DAEMONSET_ENV`: the downward API (node, pod IP/UID/name/namespace) and the controller's
  settings for its daemons (verbosity, clique size, feature gates, controller-written joins);
* the kubelet plugin's CDI spec for the daemon's claim (:mod:`pkg.kubeletplugin.state`) sets
  :data:`CDI_ENV` (the domain's identity, the node's clique, the domain's formation trace) and
  mounts the domain's directory at :data:`CONFIG_DIR`, where the daemon writes IMEX's config
  files and its node-local readiness record.

The daemon (:mod:`pkg.daemon.options`) parses every name here; a unit test
(``test/unit/api/test_daemoncontract.py``) renders a DaemonSet and a CDI spec, feeds their env to
the daemon's parser and checks every value arrives where the daemon reads it, so renaming one side
alone fails. Names are upstream's (its DaemonSet template and CDI edits) except
``CLIQUE_JOIN_BY_CONTROLLER`` and ``TRACEPARENT``, ours. IMEX's own facts (its default ports and
the names of its config files inside :data:`CONFIG_DIR`) belong to :mod:`pkg.imex.config`, which
knows nothing about Kubernetes; the daemon's other, operator-facing flags and env fallbacks are
its own (:mod:`pkg.daemon.options`).
"""

from __future__ import annotations

from typing import Final

# -- set by the controller's DaemonSet ------------------------------------------------------------

LOG_VERBOSITY: Final = "LOG_VERBOSITY"
"""The daemon's ``-v`` (also substituted into its command line and probes)."""
MAX_NODES_PER_IMEX_DOMAIN: Final = "MAX_NODES_PER_IMEX_DOMAIN"
NODE_NAME: Final = "NODE_NAME"
POD_IP: Final = "POD_IP"
POD_UID: Final = "POD_UID"
POD_NAME: Final = "POD_NAME"
POD_NAMESPACE: Final = "POD_NAMESPACE"
NVIDIA_VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"
"""``void``: the NVIDIA container runtime injects no GPU; the daemon needs none."""
FEATURE_GATES: Final = "FEATURE_GATES"
CLIQUE_JOIN_BY_CONTROLLER: Final = "CLIQUE_JOIN_BY_CONTROLLER"
IMEX_SERVER_PORT: Final = "IMEX_SERVER_PORT"
"""IMEX's ports, set only by an operator through ``CD_DAEMON_EXTRA_ENV``; the controller reads
them there too, to reserve them in the daemon pod (``net.ipv4.ip_local_reserved_ports``)."""
IMEX_CMD_PORT: Final = "IMEX_CMD_PORT"
"""``true`` in our DaemonSets: the controller writes the daemon's clique entry
(:mod:`pkg.reconcilers.cliquejoin`); the daemon waits a bounded while for it before joining by
itself. Absent (upstream's DaemonSets): the daemon joins by itself at once."""

DOWNWARD_API: Final[tuple[tuple[str, str], ...]] = (
    (NODE_NAME, "spec.nodeName"),
    (POD_IP, "status.podIP"),
    (POD_UID, "metadata.uid"),
    (POD_NAME, "metadata.name"),
    (POD_NAMESPACE, "metadata.namespace"),
)
"""(env, pod field path) of every downward-API variable of a daemon pod, in template order."""

DAEMONSET_ENV: Final = frozenset(
    {
        LOG_VERBOSITY,
        MAX_NODES_PER_IMEX_DOMAIN,
        *(name for name, _ in DOWNWARD_API),
        NVIDIA_VISIBLE_DEVICES,
        FEATURE_GATES,
        CLIQUE_JOIN_BY_CONTROLLER,
    }
)

# -- set by the kubelet plugin's CDI spec for the daemon claim ------------------------------------

CLIQUE_ID: Final = "CLIQUE_ID"
"""The node's NVLink clique (``<clusterUUID>.<cliqueId>``); empty on nodes without a fabric."""
COMPUTE_DOMAIN_UUID: Final = "COMPUTE_DOMAIN_UUID"
COMPUTE_DOMAIN_NAME: Final = "COMPUTE_DOMAIN_NAME"
COMPUTE_DOMAIN_NAMESPACE: Final = "COMPUTE_DOMAIN_NAMESPACE"
TRACEPARENT: Final = "TRACEPARENT"
"""The domain's formation trace (W3C ``traceparent``, OpenTelemetry's env carrier); only when
the domain carries one."""

CDI_ENV: Final = frozenset(
    {CLIQUE_ID, COMPUTE_DOMAIN_UUID, COMPUTE_DOMAIN_NAME, COMPUTE_DOMAIN_NAMESPACE, TRACEPARENT}
)

CONFIG_DIR: Final = "/imexd"
"""Where the CDI spec mounts the domain's directory in the daemon container; the daemon's
default config directory (``--config-dir`` / ``IMEX_CONFIG_DIR``)."""
