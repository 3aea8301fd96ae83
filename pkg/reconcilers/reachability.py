"""Whether a ComputeDomain's ``numNodes`` can ever be met by the nodes of this cluster.

Owns the rule "which nodes could ever join a domain". A node joins only through an IMEX daemon,
and a daemon runs only on a node the controller labelled because a workload claim was allocated
a channel device there; channel devices exist only where the kubelet plugin runs and publishes
this driver's ResourceSlices. So the nodes that could ever join are:

* the distinct ``spec.nodeName`` of ResourceSlices with ``spec.driver`` = our driver whose Node
  exists and is not being deleted (a node whose plugin is momentarily down keeps its slices, so
  plugin restarts do not count as nodes going away), plus
* the nodes that already host a member of the domain (even if their slices are gone).

Node readiness does not matter (a NotReady node can come back), nor do GPUs, cliques or the
allocation mode: those decide *where* members go, not whether ``numNodes`` nodes exist at all.
When ``numNodes`` exceeds that count the domain can never be Ready; the reconciler reports it as
``Ready=False`` with reason ``NumNodesUnreachable`` and a Warning Event, and re-checks whenever
a ResourceSlice or a Node changes, so the condition clears as soon as enough nodes join the
cluster.
"""

from __future__ import annotations

from collections.abc import Iterable

from pkg.api import constants as c
from pkg.reconcilers.cache import ObjectCache
from pkg.reconcilers.conditions import REASON_NUM_NODES_UNREACHABLE
from pkg.reconcilers.status import Problem

__all__ = ["candidate_nodes", "num_nodes_problem"]


def candidate_nodes(slice_nodes: Iterable[str], nodes: ObjectCache) -> set[str]:
    """Of ``slice_nodes`` (the nodes this driver's ResourceSlices name: the slice cache's
    BY_NODE index values, `cache.index_by_slice_node`), those whose Node exists and is not
    being deleted."""
    out: set[str] = set()
    for name in slice_nodes:
        node = nodes.get_by_key(name)
        if node is not None and not node.get("metadata", {}).get("deletionTimestamp"):
            out.add(name)
    return out


def num_nodes_problem(
    num_nodes: int, candidates: set[str], members: Iterable[str]
) -> Problem | None:
    """``NumNodesUnreachable`` when fewer than ``num_nodes`` nodes could ever join, else None."""
    reachable = candidates | set(members)
    if num_nodes <= len(reachable):
        return None
    return Problem(
        REASON_NUM_NODES_UNREACHABLE,
        f"numNodes is {num_nodes} but only {len(reachable)} node(s) in the cluster can ever "
        f"join this ComputeDomain (nodes that run the {c.DRIVER_NAME} kubelet plugin and "
        f"publish its ResourceSlices); add nodes or lower numNodes",
    )
