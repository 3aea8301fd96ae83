"""Aggregation of a ComputeDomain's members into ``cd.status`` (pure) and its state-change Events.

Owns the rule "who is a member of domain X and is it Ready". Inputs are cache snapshots: the
domain's ComputeDomainCliques (written by the daemons), its daemon pods and the Nodes they run
on. The controller is the only writer of ``cd.status``; daemons write their own clique
entries, and nothing here ever writes a clique. With gate ``ComputeDomainCliques`` off the
daemons write their entries into ``cd.status.nodes`` instead: that list is the input in place
of the cliques, and :func:`as_written` decides what the controller publishes back (the same
members, each live daemon's entry as it wrote it). Invariants:

* a clique entry counts only while a daemon pod of *this* domain exists on that node (a stale
  entry of a departed daemon is ignored here at once; :mod:`pkg.reconcilers.cliqueprune`
  removes it from the clique after a grace period);
* non-fabric daemons (pod label ``computeDomain.cliqueID`` present and empty) are members with
  index -1, Ready iff their pod is Ready;
* a member on a node that is NotReady, Unknown or tainted unreachable/not-ready, whose daemon
  pod is terminating, or whose daemon container is not running (crashed, OOM-killed, waiting
  to restart, not started yet, or a newer pod than the one that wrote the entry) is NotReady at
  once whatever its clique entry says, and the Ready condition names the node and why
  (upstream keeps such entries Ready until the daemon itself writes again, forever for a dead
  node);
* a node whose Ready condition has been False/Unknown for ``node_loss_grace`` seconds (by its
  ``lastTransitionTime`` on the controller's clock) is *lost*: its member leaves the domain
  (``status.nodes``), although its daemon pod stays bound to it (the daemons tolerate every
  taint, as upstream's do, and the DaemonSet controller makes them tolerate node failures
  forever in any case);
* a daemon pod whose clique already holds ``max_nodes`` other daemons can never join; it is
  named in a :class:`Shortfall` (the domain's condition becomes ``CapacityExceeded``);
* a daemon whose container got no IMEX binaries through CDI exits with a
  ``DriverRootIncomplete`` termination message (:mod:`pkg.reconcilers.daemonpods`) before it
  joins its clique: it is still a NotReady member with that problem, and the domain's
  condition becomes ``DriverRootIncomplete`` with the daemons' messages
  (:meth:`Aggregate.driver_root_problem`);
* a domain with no members is never Ready, even with ``numNodes: 0``;
* two conditions name fabric problems without changing ``Ready`` (upstream lets a domain span
  cliques, one IMEX domain per clique; a workload spread over them is what fails):
  ``SingleClique`` is False (reason ``MultipleCliques``, naming each clique and its nodes) when
  the members are in more than one NVLink clique, nodes without a clique counting as one group;
  ``IMEXConnected`` is False (reason ``PeersUnreachable``) when a Ready member's daemon reports
  (clique entry ``unreachablePeers``, from its IMEX's ``nvidia-imex-ctl -N``) that it cannot
  reach another Ready member of its clique, naming who cannot reach whom. Neither exists before
  the domain had members (resp. a report); afterwards they go ``Unknown`` when there is nothing
  to judge. :func:`condition_events` gives the Event of each of their transitions; both
  conditions, their reasons and their Events are registered in :mod:`pkg.reconcilers.conditions`;
* a malformed clique entry (:mod:`pkg.reconcilers.entrycheck`: not a canonical IP, not a node
  name, another clique's ID, an index outside the clique, ...) is skipped, as every daemon
  skips it: it makes no member and never reaches ``status.nodes`` (whose schema would refuse
  the whole status write); :attr:`Aggregate.bad_entries` names it for the condition
  ``CliqueEntriesValid`` (``False``, reason ``InvalidCliqueEntry``), which turns ``True`` once
  it is gone or fixed;
* :func:`render_status` is deterministic, so re-aggregating unchanged inputs yields an equal
  status and no write.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from pkg.api import constants as c
from pkg.api.computedomain import (
    CONDITION_READY,
    ComputeDomain,
    find_condition,
    global_status,
    required_nodes,
    set_condition,
)
from pkg.api.daemonentry import (
    STATUS_NODES,
    DaemonEntry,
    encode_status_nodes,
    status_nodes,
)
from pkg.base.types import JSON
from pkg.reconcilers.conditions import (
    FABRIC_CONDITIONS,
    PROBLEM_DAEMON_NOT_RUNNING,
    PROBLEM_DAEMON_TERMINATING,
    PROBLEM_NODE_NOT_READY,
    PROBLEM_NODE_UNREACHABLE,
    REASON_ALL_NODES_READY,
    REASON_CAPACITY_EXCEEDED,
    REASON_DAEMONS_NOT_READY,
    REASON_NODES_NOT_READY,
    REASON_WAITING_FOR_NODES,
)
from pkg.reconcilers.daemonpods import driver_root_incomplete, driver_root_message
from pkg.reconcilers.entrycheck import BadEntry, check_clique
from pkg.reconcilers.member import Member
from pkg.reconcilers.metrics import parse_timestamp

__all__ = [
    "Aggregate",
    "Member",
    "Problem",
    "Shortfall",
    "aggregate",
    "as_written",
    "collect_members",
    "condition_events",
    "daemon_not_running",
    "node_loss_in",
    "node_problem",
    "render_status",
    "status_events",
]


UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


@dataclass(frozen=True)
class Problem:
    """A reason the domain cannot be Ready that the user must fix (becomes the condition)."""

    reason: str
    message: str


def _pod_ready(pod: JSON) -> bool:
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def _epoch(value: object) -> float | None:
    return parse_timestamp(value) if isinstance(value, str) and value else None


def _node_health(node: JSON | None) -> tuple[str, float | None]:
    """(why the node cannot host a healthy daemon, since when in epoch seconds or None)."""
    if node is None:
        return "", None
    problem, since = "", None
    for cond in node.get("status", {}).get("conditions") or []:
        if cond.get("type") == "Ready" and cond.get("status") != "True":
            unknown = cond.get("status") == "Unknown"
            problem = PROBLEM_NODE_UNREACHABLE if unknown else PROBLEM_NODE_NOT_READY
            since = _epoch(cond.get("lastTransitionTime"))
    for taint in node.get("spec", {}).get("taints") or []:
        key = taint.get("key")
        if key == UNREACHABLE_TAINT:
            problem = PROBLEM_NODE_UNREACHABLE
        elif key == NOT_READY_TAINT:
            problem = problem or PROBLEM_NODE_NOT_READY
        else:
            continue
        if since is None:
            since = _epoch(taint.get("timeAdded"))
    return problem, since


def node_problem(node: JSON | None) -> str:
    """Why a node cannot host a healthy daemon (``""`` if it can or is unknown to us)."""
    return _node_health(node)[0]


def node_loss_in(node: JSON | None, *, now: float, grace: float) -> float | None:
    """Seconds until the node counts as lost (``<= 0``: lost now); None if it is healthy or
    unknown, or we cannot tell since when it is not (then it is never judged lost)."""
    problem, since = _node_health(node)
    if not problem or since is None:
        return None
    return since + grace - now


def daemon_not_running(pod: JSON, entry: DaemonEntry | None = None) -> bool:
    """The daemon of ``pod`` cannot be serving: its pod has not started all containers, its
    daemon container is not in state ``running`` (crashed, OOM-killed, waiting to restart),
    or ``entry`` was written by an earlier pod (another IP). No container status at all
    (nothing reported yet) is not evidence."""
    status = pod.get("status") or {}
    if status.get("phase") == "Pending":
        return True
    pod_ip = status.get("podIP")
    if entry is not None and entry.ip_address and pod_ip and entry.ip_address != pod_ip:
        return True
    statuses = [s for s in status.get("containerStatuses") or [] if isinstance(s, dict)]
    mine = [s for s in statuses if s.get("name") == c.DAEMON_CONTAINER_NAME]
    if not mine and len(statuses) == 1:
        mine = statuses
    return bool(mine) and "running" not in (mine[0].get("state") or {})


@dataclass(frozen=True)
class Shortfall:
    """Daemons of the domain that cannot join their clique: it holds ``max_nodes`` already."""

    clique_id: str
    max_nodes: int
    left_out: tuple[str, ...]
    pods: tuple[JSON, ...] = field(compare=False)

    def message(self) -> str:
        return (
            f"clique {self.clique_id} is full: it already holds {self.max_nodes} IMEX daemons "
            f"(MAX_NODES_PER_IMEX_DOMAIN={self.max_nodes}); nodes left out: "
            + ", ".join(self.left_out)
        )


@dataclass(frozen=True)
class Aggregate:
    """Everything one domain's status is made of."""

    members: list[Member]
    lost: dict[str, str]
    """Nodes that left the domain because they are lost: name -> why (NodeUnreachable...)."""
    recheck: float | None
    """Seconds until the next not-yet-lost unhealthy node is lost (requeue then)."""
    shortfalls: list[Shortfall]
    driver_root: str = ""
    """The messages of daemons whose node's driver root lacks IMEX (``""``: none)."""
    bad_entries: tuple[BadEntry, ...] = ()
    """The malformed entries of the domain's cliques, by clique name and position."""

    def capacity_problem(self) -> Problem | None:
        """``CapacityExceeded`` naming every full clique and the nodes it leaves out."""
        if not self.shortfalls:
            return None
        return Problem(REASON_CAPACITY_EXCEEDED, "; ".join(s.message() for s in self.shortfalls))

    def driver_root_problem(self) -> Problem | None:
        """``DriverRootIncomplete`` with what each affected daemon reported, if any."""
        if not self.driver_root:
            return None
        return Problem(c.REASON_DRIVER_ROOT_INCOMPLETE, self.driver_root)


def _shortfalls(
    daemons: list[DaemonEntry], pods_by_node: Mapping[str, JSON], joined: set[str], max_nodes: int
) -> list[Shortfall]:
    sizes: dict[str, int] = {}
    for daemon in daemons:
        if daemon.clique_id:
            sizes[daemon.clique_id] = sizes.get(daemon.clique_id, 0) + 1
    waiting: dict[str, list[tuple[str, JSON]]] = {}
    for node_name, pod in sorted(pods_by_node.items()):
        meta = pod.get("metadata", {})
        clique_id = (meta.get("labels") or {}).get(c.CLIQUE_ID_LABEL)
        if not clique_id or node_name in joined or meta.get("deletionTimestamp"):
            continue
        if sizes.get(str(clique_id), 0) >= max_nodes:
            waiting.setdefault(str(clique_id), []).append((node_name, pod))
    return [
        Shortfall(cid, max_nodes, tuple(n for n, _ in left), tuple(p for _, p in left))
        for cid, left in sorted(waiting.items())
    ]


def aggregate(
    *,
    cliques: list[JSON],
    pods: list[JSON],
    nodes: Mapping[str, JSON],
    now: float | None = None,
    node_loss_grace: float | None = None,
    max_nodes: int | None = None,
    entries: list[DaemonEntry] | None = None,
) -> Aggregate:
    """Members of one domain from its cliques, its daemon pods and the nodes (by name).

    With ``now`` and ``node_loss_grace`` lost nodes leave; with ``max_nodes`` daemons that a
    full clique leaves out are reported. ``entries`` (gate ``ComputeDomainCliques`` off: the
    domain's ``status.nodes`` as the daemons wrote it) replaces the cliques' ``daemons[]``;
    entries without a ``cliqueID`` there are the controller's own non-fabric entries and are
    rebuilt from the pods, as with cliques.
    """
    bad: list[BadEntry] = []
    if entries is None:
        daemons = []
        for clique in cliques:
            checked = check_clique(clique, max_nodes=max_nodes)
            daemons += checked.entries
            bad += checked.bad
    else:
        daemons = [e for e in entries if e.clique_id]
    pods_by_node = _daemon_pods_by_node(pods)
    found = _member_entries(daemons, pods_by_node)
    judged = _judge_members(found, pods_by_node, nodes, now=now, node_loss_grace=node_loss_grace)
    live_pods = {n: p for n, p in pods_by_node.items() if n not in judged.lost}
    in_clique = {d.node_name for d in daemons}
    shortfalls = (
        _shortfalls(daemons, live_pods, in_clique, max_nodes) if max_nodes is not None else []
    )
    incomplete = [
        pods_by_node[m.entry.node_name]
        for m in judged.members
        if m.problem == c.REASON_DRIVER_ROOT_INCOMPLETE
    ]
    return Aggregate(
        members=judged.members,
        lost=judged.lost,
        recheck=judged.recheck,
        shortfalls=shortfalls,
        driver_root=driver_root_message(incomplete),
        bad_entries=tuple(sorted(bad, key=lambda b: (b.clique, b.position))),
    )


def _daemon_pods_by_node(pods: list[JSON]) -> dict[str, JSON]:
    """Phase 1: the domain's daemon pod on each node (bound, not finished)."""
    pods_by_node: dict[str, JSON] = {}
    for pod in pods:
        node_name = pod.get("spec", {}).get("nodeName")
        if node_name and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            pods_by_node[node_name] = pod
    return pods_by_node


def _member_entries(
    daemons: list[DaemonEntry], pods_by_node: Mapping[str, JSON]
) -> dict[str, DaemonEntry]:
    """Phase 2: each member's entry, by node: its daemon's (while a daemon pod runs there),
    else one the controller makes from the pod (a non-fabric daemon; a daemon that exited
    with ``DriverRootIncomplete`` before it could join)."""
    found: dict[str, DaemonEntry] = {}
    for daemon in daemons:
        if daemon.node_name in pods_by_node:
            found[daemon.node_name] = daemon
    for node_name, pod in pods_by_node.items():
        if node_name in found:
            continue
        labels = pod.get("metadata", {}).get("labels") or {}
        ip = pod.get("status", {}).get("podIP")
        if labels.get(c.CLIQUE_ID_LABEL) == "" and ip:
            ready = c.STATUS_READY if _pod_ready(pod) else c.STATUS_NOT_READY
            found[node_name] = DaemonEntry(node_name, str(ip), "", -1, ready)
        elif driver_root_incomplete(pod):
            # It exited before joining its clique; a member all the same, so the domain says why.
            clique_id = str(labels.get(c.CLIQUE_ID_LABEL) or "")
            found[node_name] = DaemonEntry(
                node_name, str(ip or ""), clique_id, -1, c.STATUS_NOT_READY
            )
    return found


@dataclass(frozen=True)
class _Judged:
    """What phase 3 decided: the members, the lost nodes (name -> why), the next recheck."""

    members: list[Member]
    lost: dict[str, str]
    recheck: float | None


def _judge_members(
    found: Mapping[str, DaemonEntry],
    pods_by_node: Mapping[str, JSON],
    nodes: Mapping[str, JSON],
    *,
    now: float | None,
    node_loss_grace: float | None,
) -> _Judged:
    """Phase 3: each member's problem (by node name order); members on lost nodes leave."""
    members = []
    lost: dict[str, str] = {}
    recheck: float | None = None
    for name in sorted(found):
        node = nodes.get(name)
        problem = node_problem(node)
        if problem and now is not None and node_loss_grace is not None:
            left = node_loss_in(node, now=now, grace=node_loss_grace)
            if left is not None and left <= 0:
                lost[name] = problem
                continue
            if left is not None:
                recheck = left if recheck is None else min(recheck, left)
        entry = found[name]
        problem = problem or _daemon_problem(pods_by_node[name], entry)
        if problem and entry.status != c.STATUS_NOT_READY:
            entry = replace(entry, status=c.STATUS_NOT_READY)
        members.append(Member(entry, problem))
    return _Judged(members, lost, recheck)


def _daemon_problem(pod: JSON, entry: DaemonEntry) -> str:
    """Why the daemon of a member on a healthy node cannot be Ready (``""``: nothing known)."""
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return PROBLEM_DAEMON_TERMINATING
    if driver_root_incomplete(pod):
        return c.REASON_DRIVER_ROOT_INCOMPLETE
    if daemon_not_running(pod, entry if entry.clique_id else None):
        return PROBLEM_DAEMON_NOT_RUNNING
    return ""


def collect_members(
    *, cliques: list[JSON], pods: list[JSON], nodes: Mapping[str, JSON]
) -> list[Member]:
    """The members alone (:func:`aggregate` without node loss and capacity judgement)."""
    return aggregate(cliques=cliques, pods=pods, nodes=nodes).members


def _ready_condition(
    cd: ComputeDomain, members: list[Member], problem: Problem | None
) -> tuple[bool, str, str]:
    if problem is not None:
        return False, problem.reason, problem.message
    total = len(members)
    ready = sum(1 for m in members if m.entry.status == c.STATUS_READY)
    lost = [m for m in members if m.problem]
    if lost:
        reason = lost[0].problem if len({m.problem for m in lost}) == 1 else REASON_NODES_NOT_READY
        detail = ", ".join(f"{m.entry.node_name} ({m.problem})" for m in lost)
        return False, reason, f"{ready}/{total} nodes ready; lost: {detail}"
    if total == 0:
        return (
            False,
            REASON_WAITING_FOR_NODES,
            (
                "no node has joined yet; the domain forms on the node of each pod that uses "
                f"ResourceClaimTemplate {cd.resource_claim_template_name}"
            ),
        )
    if ready < total:
        waiting = ", ".join(m.entry.node_name for m in members if m.entry.status != c.STATUS_READY)
        return (
            False,
            REASON_DAEMONS_NOT_READY,
            f"{ready}/{total} nodes ready; waiting for: {waiting}",
        )
    if total < required_nodes(cd.num_nodes):
        return (
            False,
            REASON_WAITING_FOR_NODES,
            f"{total}/{cd.num_nodes} nodes joined (spec.numNodes)",
        )
    return True, REASON_ALL_NODES_READY, f"{ready}/{total} nodes ready"


def _fabric_conditions(
    conditions: list[JSON],
    members: list[Member],
    *,
    bad: tuple[BadEntry, ...],
    generation: int,
    now: str,
) -> list[JSON]:
    for fabric in FABRIC_CONDITIONS:
        exists = find_condition(conditions, fabric.type) is not None
        cond = fabric.current(members, exists=exists, bad=bad)
        if cond is None:
            continue
        conditions = set_condition(
            conditions,
            type_=fabric.type,
            status=cond[0],
            reason=cond[1],
            message=cond[2],
            observed_generation=generation,
            now=now,
        )
    return conditions


DAEMON_SILENT_PROBLEMS = frozenset({PROBLEM_DAEMON_NOT_RUNNING, c.REASON_DRIVER_ROOT_INCOMPLETE})
"""Member problems under which the daemon cannot be writing its own entry (it is not running)."""


def as_written(members: list[Member], written: list[DaemonEntry]) -> list[DaemonEntry]:
    """The ``status.nodes`` to publish when the daemons write it (gate ``ComputeDomainCliques``
    off): each member's entry as its daemon wrote it, in the order written (members the
    controller adds, the non-fabric ones, after them by name). Only a member whose daemon is not
    running (:data:`DAEMON_SILENT_PROBLEMS`) is published NotReady over its own word: a daemon
    that still runs (on a NotReady node, or terminating) would write its status back at once,
    so there its problem shows in ``status.status`` and the Ready condition instead."""
    position = {e.node_name: i for i, e in enumerate(written)}
    by_name = {e.node_name: e for e in written}
    out = []
    for m in members:
        own = by_name.get(m.entry.node_name)
        keep = own is not None and own.clique_id and m.problem not in DAEMON_SILENT_PROBLEMS
        out.append(own if keep and own is not None else m.entry)
    return sorted(out, key=lambda e: (position.get(e.node_name, len(position)), e.node_name))


def render_status(
    cd: ComputeDomain,
    *,
    members: list[Member],
    previous: JSON | None,
    problem: Problem | None,
    now: str,
    listed: list[DaemonEntry] | None = None,
    bad_entries: tuple[BadEntry, ...] = (),
) -> JSON:
    """The complete ``status`` for ``cd``; equal to ``previous`` when nothing changed.

    ``listed`` (default: the members' entries) is what ``status.nodes`` shows; ``status``,
    the counts and the conditions always follow the members; ``bad_entries`` (the cliques'
    malformed entries, :attr:`Aggregate.bad_entries`) make ``CliqueEntriesValid``."""
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
    conditions = _fabric_conditions(
        conditions, members, bad=bad_entries, generation=cd.generation, now=now
    )
    out: JSON = {"status": status}
    shown = entries if listed is None else listed
    if shown:  # upstream omits an empty list (omitempty); its e2e tests check for that
        out[STATUS_NODES] = encode_status_nodes(shown)
    out["readyNodes"] = sum(1 for e in entries if e.status == c.STATUS_READY)
    out["nodeCount"] = len(entries)
    out["conditions"] = conditions
    return out


@dataclass(frozen=True)
class StatusEvent:
    """An Event to record on the ComputeDomain for a change between two statuses."""

    type: str
    reason: str
    message: str


def status_events(
    old: JSON | None,
    new: JSON,
    *,
    members: list[Member],
    lost: Mapping[str, str] | None = None,
    node_loss_grace: float = 0.0,
) -> list[StatusEvent]:
    """Events for every membership and readiness change from ``old`` to ``new``; a node in
    ``lost`` (name -> why) that left gets a ``NodeLost`` Warning instead of ``NodeLeft``."""
    out: list[StatusEvent] = []
    before = {e.node_name: e for e in status_nodes(old)}
    after = {e.node_name: e for e in status_nodes(new)}
    problems = {m.entry.node_name: m.problem for m in members}
    lost = lost or {}
    for name in sorted(after.keys() - before.keys()):
        out.append(StatusEvent("Normal", "NodeJoined", f"node {name} joined the domain"))
    for name in sorted(before.keys() - after.keys()):
        if name in lost:
            out.append(
                StatusEvent(
                    "Warning",
                    "NodeLost",
                    f"node {name} left the domain: {lost[name]} for more than "
                    f"{node_loss_grace:.0f}s (its daemon pod stays bound to the node)",
                )
            )
        else:
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


def condition_events(old: JSON | None, new: JSON) -> list[StatusEvent]:
    """Events for the transitions of the fabric conditions (:data:`FABRIC_CONDITIONS`) from
    ``old`` to ``new``, as :meth:`FabricCondition.transition_event` decides."""
    out: list[StatusEvent] = []
    before = list((old or {}).get("conditions") or [])
    after = list(new.get("conditions") or [])
    for fabric in FABRIC_CONDITIONS:
        was, now = find_condition(before, fabric.type), find_condition(after, fabric.type)
        event = fabric.transition_event(was, now)
        if event is not None:
            out.append(StatusEvent(*event))
    return out
