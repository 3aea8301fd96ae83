"""A set of simulated nodes on one local cluster, and what tests ask of them.

Owns building a :class:`~kubeletsim.node.FleetConfig` from a ``localcluster.Cluster`` (node
identities, the plugin's and daemon's service-account kubeconfigs, the ``cdi-resolve`` binary,
the cluster log dir), starting/stopping N nodes in parallel, and the node-local questions tests
ask: what a container received, which CDI spec files and checkpoint entries are left.
"""

from __future__ import annotations

import atexit
import json
import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from .cdi import GoCdiResolver
from .layout import NodeSpec
from .node import FleetConfig, SimulatedNode

log = logging.getLogger(__name__)

PLUGIN_SA = "compute-domain-kubelet-plugin"
DAEMON_SA = "compute-domain-daemon"


class ClusterLike(Protocol):
    """What the fleet needs from ``localcluster.Cluster``."""

    bin_dir: Path
    log_dir: Path
    driver_namespace: str

    def kubeconfig(self, identity: str = "admin") -> Path: ...

    def add_node_identity(self, name: str) -> Any: ...


def config_from_cluster(
    cluster: ClusterLike, root: Path, *, node_identity: bool = True, **kw: Any
) -> FleetConfig:
    """Fleet config for ``cluster``: nodes act as ``system:node:<name>`` unless told otherwise."""

    def node_kubeconfig(name: str) -> Path:
        if not node_identity:
            return cluster.kubeconfig("admin")
        cluster.add_node_identity(name)
        return cluster.kubeconfig(name)

    return FleetConfig(
        root=root,
        log_dir=cluster.log_dir,
        driver_namespace=cluster.driver_namespace,
        node_kubeconfig=node_kubeconfig,
        admin_kubeconfig=cluster.kubeconfig("admin"),
        static_kubeconfigs={sa: cluster.kubeconfig(sa) for sa in (PLUGIN_SA, DAEMON_SA)},
        cdi_resolver=GoCdiResolver(cluster.bin_dir / "cdi-resolve"),
        **kw,
    )


class NodeFleet:
    def __init__(self, config: FleetConfig, *, log_file: Path | None = None) -> None:
        """``log_file`` (default ``<log_dir>/kubeletsim.log``) receives the stand-ins' logs."""
        self.config = config
        self.nodes: dict[str, SimulatedNode] = {}
        self._log_handler = logging.FileHandler(log_file or config.log_dir / "kubeletsim.log")
        self._log_handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s")
        )
        pkg_logger = logging.getLogger(__package__)
        pkg_logger.addHandler(self._log_handler)
        pkg_logger.setLevel(logging.INFO)
        # Processes run in their own sessions: never leave them behind if stop() is skipped.
        atexit.register(self._kill_leftovers)

    def _kill_leftovers(self) -> None:
        for node in list(self.nodes.values()):
            try:
                node.kill_processes()
            except Exception as e:  # interpreter exit: best effort
                log.warning("node %s: kill at exit failed: %s", node.name, e)

    def add(self, specs: Sequence[NodeSpec], *, wait: bool = True) -> list[SimulatedNode]:
        """Start nodes (in parallel) and, with ``wait``, wait for their plugins to register."""
        new = [SimulatedNode(s, self.config) for s in specs if s.name not in self.nodes]
        workers = min(8, max(1, len(new)))
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda n: n.start(), new))
        for n in new:
            self.nodes[n.name] = n
        if wait:
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(lambda n: n.wait_plugin_registered(), new))
        return new

    def remove(self, names: Sequence[str], *, delete_node: bool = True) -> None:
        for name in names:
            node = self.nodes.pop(name, None)
            if node is not None:
                node.stop(delete_node=delete_node)

    def stop(self, *, delete_nodes: bool = False) -> None:
        nodes = list(self.nodes.values())

        def stop(node: SimulatedNode) -> None:
            try:
                node.stop(delete_node=delete_nodes)
            except Exception:
                log.exception("node %s: stop failed; killing its processes", node.name)
                node.kill_processes()

        with ThreadPoolExecutor(min(8, max(1, len(nodes)))) as pool:
            list(pool.map(stop, nodes))
        self.nodes.clear()
        logging.getLogger(__package__).removeHandler(self._log_handler)
        self._log_handler.close()

    def __iter__(self) -> Iterator[SimulatedNode]:
        return iter(list(self.nodes.values()))

    def __getitem__(self, name: str) -> SimulatedNode:
        return self.nodes[name]

    # -- questions tests ask ----------------------------------------------------------------

    def container_record(self, namespace: str, pod: str, container: str) -> dict[str, Any] | None:
        """The edits a (non-local) container received, or None if it was not started."""
        for node in self:
            path = node.dirs.container_record(namespace, pod, container)
            if path.exists():
                doc: dict[str, Any] = json.loads(path.read_text())
                return doc
        return None

    def cdi_claim_specs(self) -> dict[str, list[Path]]:
        """Per-claim CDI spec files left on each node (the base spec is not a leak)."""
        out = {}
        for node in self:
            files = [p for p in node.dirs.cdi_files() if "claim" in p.name]
            if files:
                out[node.name] = files
        return out

    def checkpoint_claims(self) -> dict[str, list[str]]:
        """Claim UIDs still in each plugin checkpoint and in each kubelet DRA state."""
        out: dict[str, list[str]] = {}
        for node in self:
            uids = sorted(_checkpoint_uids(node.plugin_checkpoint()))
            uids += [f"kubelet:{u}" for u in sorted(node.dra.prepared())]
            if uids:
                out[node.name] = uids
        return out

    def logs(self) -> dict[str, Path]:
        out = {}
        for node in self:
            out[f"plugin-{node.name}"] = node.plugin_log
            for p in sorted(node.dirs.logs.glob("*.log")):
                out[f"{node.name}/{p.stem}"] = p
        return out


def _checkpoint_uids(path: Path) -> set[str]:
    """Claim UIDs in a plugin checkpoint (upstream v1/v2 layout or a flat map).

    ``PrepareAborted`` entries are left out: they are tombstones of claims already unprepared
    (no devices, label or CDI spec), kept until a cleanup pass at least 90 s later.
    """
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return set()
    uids: set[str] = set()

    def collect(d: Any) -> None:
        if isinstance(d, dict):
            for key in ("preparedClaims", "prepared_claims", "claims"):
                v = d.get(key)
                if isinstance(v, dict):
                    uids.update(
                        uid
                        for uid, entry in v.items()
                        if not (
                            isinstance(entry, dict)
                            and entry.get("checkpointState") == "PrepareAborted"
                        )
                    )
            for k in ("v1", "v2", "V1", "V2", "data"):
                collect(d.get(k))

    collect(doc)
    return uids
