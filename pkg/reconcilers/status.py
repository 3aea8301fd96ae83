"""Aggregation of a ComputeDomain's members into ``cd.status`` (pure) and its state-change Events.

Owns the rule "who is a member of domain X and is it Ready". Inputs are cache snapshots: the
domain's ComputeDomainCliques (written by the daemons), its daemon pods and the Nodes they run
on. The controller is the only writer of ``cd.status``; daemons write their own clique
entries, and nothing here ever writes a clique. Invariants:

* a clique entry counts only while a daemon pod of *this* domain exists on that node (a stale
  entry of a departed daemon is ignored here at once; :mod:`pkg.reconcilers.cliqueprune`
  removes it from the clique after a grace period);
* non-fabric daemons (pod label ``computeDomain.cliqueID`` present and empty) are members with
  index -1, Ready iff their pod is Ready;
* a member on a node that is NotReady, Unknown or tainted unreachable, or whose daemon pod is
  terminating, is NotReady at once whatever its clique entry says, and the Ready condition
  names the node and why (upstream keeps such a dead node's entry Ready forever);
* a domain with no members is never Ready, even with ``numNodes: 0``;
* :func:`render_status` is deterministic, so re-aggregating unchanged inputs yields an equal
  status and no write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pkg.api import constants as c
from pkg.api.computedomain import (
    CONDITION_READY,
    ComputeDomain,
    NodeEntry,
    clique_daemons,
    global_status,
    required_nodes,
    set_condition,
    status_nodes,
)

__all__ = ["Member", "Problem", "collect_members", "render_status", "status_events"]

JSON = dict[str, Any]

UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"


@dataclass(frozen=True)
class Problem:
    """A reason the domain cannot be Ready that the user must fix (becomes the condition)."""

    reason: str
    message: str


@dataclass(frozen=True)
class Member:
    """One node of the domain and, when it cannot be Ready, why (``""`` when healthy)."""

    entry: NodeEntry
    problem: str = ""


def _pod_ready(pod: JSON) -> bool:
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def node_problem(node: JSON | None) -> str:
    """Why a node cannot host a healthy daemon (``""`` if it can or is unknown to us)."""
    if node is None:
        return ""
    for taint in node.get("spec", {}).get("taints") or []:
        if taint.get("key") == UNREACHABLE_TAINT:
            return "NodeUnreachable"
    for cond in node.get("status", {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            if cond.get("status") == "Unknown":
                return "NodeUnreachable"
            if cond.get("status") != "True":
                return "NodeNotReady"
    return ""


def collect_members(
    *, cliques: list[JSON], pods: list[JSON], nodes: dict[str, JSON]
) -> list[Member]:
    """Members of one domain from its cliques, its daemon pods and the nodes (by name)."""
    pods_by_node: dict[str, JSON] = {}
    for pod in pods:
        node_name = pod.get("spec", {}).get("nodeName")
        if node_name and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            pods_by_node[node_name] = pod
    entries: dict[str, NodeEntry] = {}
    for clique in cliques:
        for daemon in clique_daemons(clique):
            if daemon.name in pods_by_node:
                entries[daemon.name] = daemon
    for node_name, pod in pods_by_node.items():
        labels = pod.get("metadata", {}).get("labels") or {}
        ip = pod.get("status", {}).get("podIP")
        if labels.get(c.CLIQUE_ID_LABEL) == "" and ip and node_name not in entries:
            ready = c.STATUS_READY if _pod_ready(pod) else c.STATUS_NOT_READY
            entries[node_name] = NodeEntry(node_name, str(ip), "", -1, ready)
    members = []
    for name in sorted(entries):
        entry = entries[name]
        problem = node_problem(nodes.get(name))
        if not problem and pods_by_node[name].get("metadata", {}).get("deletionTimestamp"):
            problem = "DaemonTerminating"
        if problem and entry.status != c.STATUS_NOT_READY:
            entry = NodeEntry(
                entry.name, entry.ip_address, entry.clique_id, entry.index, c.STATUS_NOT_READY
            )
        members.append(Member(entry, problem))
    return members


def _ready_condition(
    cd: ComputeDomain, members: list[Member], problem: Problem | None
) -> tuple[bool, str, str]:
    if problem is not None:
        return False, problem.reason, problem.message
    total = len(members)
    ready = sum(1 for m in members if m.entry.status == c.STATUS_READY)
    lost = [m for m in members if m.problem]
    if lost:
        reason = lost[0].problem if len({m.problem for m in lost}) == 1 else "NodesNotReady"
        detail = ", ".join(f"{m.entry.name} ({m.problem})" for m in lost)
        return False, reason, f"{ready}/{total} nodes ready; lost: {detail}"
    if total == 0:
        return (
            False,
            "WaitingForNodes",
            (
                "no node has joined yet; the domain forms on the nodes of pods that use "
                f"ResourceClaimTemplate {cd.resource_claim_template_name}"
            ),
        )
    if ready < total:
        waiting = ", ".join(m.entry.name for m in members if m.entry.status != c.STATUS_READY)
        return False, "DaemonsNotReady", f"{ready}/{total} nodes ready; waiting for: {waiting}"
    if total < required_nodes(cd.num_nodes):
        return False, "WaitingForNodes", f"{total}/{cd.num_nodes} nodes joined (spec.numNodes)"
    return True, "AllNodesReady", f"{ready}/{total} nodes ready"


def render_status(
    cd: ComputeDomain,
    *,
    members: list[Member],
    previous: JSON | None,
    problem: Problem | None,
    now: str,
) -> JSON:
    """The complete ``status`` for ``cd``; equal to ``previous`` when nothing changed."""
    entries = [m.entry for m in members]
    ready, reason, message = _ready_condition(cd, members, problem)
    status = global_status(entries, num_nodes=cd.num_nodes)
    if problem is not None:
        status = c.STATUS_NOT_READY
    conditions = set_condition(
        list((previous or {}).get("conditions") or []),
        type_=CONDITION_READY,
        status=ready and status == c.STATUS_READY,
        reason=reason,
        message=message,
        observed_generation=cd.generation,
        now=now,
    )
    return {
        "status": status,
        "nodes": [e.to_status_node() for e in entries],
        "readyNodes": sum(1 for e in entries if e.status == c.STATUS_READY),
        "nodeCount": len(entries),
        "conditions": conditions,
    }


@dataclass(frozen=True)
class StatusEvent:
    """An Event to record on the ComputeDomain for a change between two statuses."""

    type: str
    reason: str
    message: str


def status_events(old: JSON | None, new: JSON, *, members: list[Member]) -> list[StatusEvent]:
    """Events for every membership and readiness change from ``old`` to ``new``."""
    out: list[StatusEvent] = []
    before = {e.name: e for e in status_nodes(old)}
    after = {e.name: e for e in status_nodes(new)}
    problems = {m.entry.name: m.problem for m in members}
    for name in sorted(after.keys() - before.keys()):
        out.append(StatusEvent("Normal", "NodeJoined", f"node {name} joined the domain"))
    for name in sorted(before.keys() - after.keys()):
        out.append(StatusEvent("Normal", "NodeLeft", f"node {name} left the domain"))
    for name in sorted(after.keys() & before.keys()):
        was, now = before[name].status, after[name].status
        if was == now:
            continue
        if now == c.STATUS_READY:
            out.append(StatusEvent("Normal", "NodeReady", f"IMEX daemon on {name} is ready"))
        else:
            why = problems.get(name) or "DaemonNotReady"
            out.append(StatusEvent("Warning", why, f"IMEX daemon on {name} is not ready ({why})"))
    old_status = (old or {}).get("status")
    cond = next(x for x in new["conditions"] if x["type"] == CONDITION_READY)
    if new["status"] != old_status:
        if new["status"] == c.STATUS_READY:
            out.append(StatusEvent("Normal", "Ready", cond["message"]))
        elif old_status == c.STATUS_READY:
            out.append(StatusEvent("Warning", "NotReady", f"{cond['reason']}: {cond['message']}"))
    return out
