"""A kubelet stand-in for simulated GPU nodes (e2e tests, demo, benchmark).

Per simulated node: a Node object kept Ready with a heartbeat Lease, a loopback IP, fake GPU
inventory and ``/proc/devices``, the **real** ``compute-domain-kubelet-plugin`` process, and a
kubelet stand-in that honours the kubelet's DRA contract (plugin registration, NodePrepare /
NodeUnprepareResources, CDI resolution with the real CDI library) and runs the driver's own
containers as local processes. Importable by name in the development venv (its editable
install maps the ``hack/`` packages, ``pyproject.toml``)::

    from kubeletsim import NodeFleet, config_from_cluster, layout
    fleet = NodeFleet(config_from_cluster(cluster, workdir / "nodes"))
    fleet.add(layout([0, 0, 1, 1]))

Modules: ``layout`` (node specs, folders), ``nodestatus`` (Node + Lease), ``registration``
(plugin watcher, DRA gRPC client), ``claims`` (claim resolution, prepared-claim cache),
``cdi`` (cdi-resolve), ``podspec``/``podstatus`` (env, CDI selection, status shape),
``runtime``/``localrun`` (local containers, probes), ``zygote`` (fork server for them),
``podworker`` (one pod), ``kubelet``
(one node's pod loop), ``node`` (SimulatedNode), ``fleet`` (NodeFleet).
"""

from __future__ import annotations

from .cdi import CdiError, ContainerEdits, GoCdiResolver
from .fleet import NodeFleet, config_from_cluster
from .layout import Clique, NodeDirs, NodeSpec, layout, node_ip
from .node import FleetConfig, SimulatedNode
from .runtime import LocalCommands, driver_commands

__all__ = [
    "CdiError",
    "Clique",
    "ContainerEdits",
    "FleetConfig",
    "GoCdiResolver",
    "LocalCommands",
    "NodeDirs",
    "NodeFleet",
    "NodeSpec",
    "SimulatedNode",
    "config_from_cluster",
    "driver_commands",
    "layout",
    "node_ip",
]
