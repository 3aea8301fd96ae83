"""The ComputeDomain's conditions: every type the controller writes, its reasons, and which
transitions are recorded as Events.

The one registry of conditions (client-go keeps a condition's type and reasons next to each
other in the same way): :data:`FABRIC_CONDITIONS` lists the conditions that describe the NVLink
fabric without changing ``Ready``; :func:`pkg.reconcilers.status.render_status` writes each of
them from its :attr:`FabricCondition.judge`, and :func:`pkg.reconcilers.status.condition_events`
records an Event for each transition :meth:`FabricCondition.transition_event` names, so a
condition added here gets both, and one left out gets neither. The reasons of ``Ready``
(:data:`READY_REASONS`) are the constants below; the reconcilers that find a problem use them,
never a literal.

Invariants:

* a fabric condition does not exist before its judge had something to judge (no members, no
  peer report); afterwards it is ``Unknown`` with :attr:`FabricCondition.unknown_reason` when
  there is nothing to judge;
* a fabric condition's transition to ``False`` (or, while ``False``, to another message) is a
  Warning with the condition's reason; a transition to ``True`` or ``Unknown`` from something
  else is a Normal Event; a condition that first appears as ``True`` records nothing;
* ``CliqueEntriesValid`` judges the malformed clique entries the members were
  aggregated without (:mod:`pkg.reconcilers.entrycheck`), not the members: it appears only once
  an entry is bad (``False``, reason ``InvalidCliqueEntry``, naming the clique, the entry's
  position and node, and why) and turns ``True`` (``AllCliqueEntriesValid``) once the entry is
  gone or fixed, so a domain that never had one has no such condition. Its Events are the
  transitions', so a bad entry left in place records one Warning, not one per reconcile.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pkg.api import constants as c
from pkg.api.computedomain import (
    CONDITION_CLIQUE_ENTRIES_VALID,
    CONDITION_IMEX_CONNECTED,
    CONDITION_SINGLE_CLIQUE,
)
from pkg.base.types import JSON
from pkg.reconcilers.entrycheck import BadEntry, describe
from pkg.reconcilers.member import Member

__all__ = [
    "FABRIC_CONDITIONS",
    "READY_REASONS",
    "Condition",
    "FabricCondition",
    "clique_condition",
    "connectivity_condition",
    "entries_condition",
]

# -- Ready: the domain's reasons ----------------------------------------------------------------

REASON_ALL_NODES_READY = "AllNodesReady"
REASON_WAITING_FOR_NODES = "WaitingForNodes"
REASON_DAEMONS_NOT_READY = "DaemonsNotReady"
REASON_NODES_NOT_READY = "NodesNotReady"
"""Members have different problems (one problem: that problem is the reason)."""
REASON_INVALID_SPEC = "InvalidSpec"
"""The spec cannot be reconciled; the message names the field (also a Warning Event)."""
REASON_CAPACITY_EXCEEDED = "CapacityExceeded"
REASON_DRIVER_ROOT_INCOMPLETE = c.REASON_DRIVER_ROOT_INCOMPLETE
REASON_NUM_NODES_UNREACHABLE = "NumNodesUnreachable"
REASON_DRIVER_NAMESPACE_UNAVAILABLE = "DriverNamespaceUnavailable"
REASON_RCT_CONFLICT = "ResourceClaimTemplateConflict"
REASON_DAEMONSET_CONFLICT = "DaemonSetConflict"
REASON_HOST_MANAGED = "HostManagedIMEX"
"""Ready=True of a domain whose IMEX the hosts run (no daemons, no members)."""
REASON_NO_CLIQUE_FITS = "NoCliqueFits"
"""A ``SingleClique`` domain waits for one NVLink clique with room for it (pkg.api.placement)."""

# A member's problem (also the reason when every member that has one has the same).
PROBLEM_NODE_UNREACHABLE = "NodeUnreachable"
PROBLEM_NODE_NOT_READY = "NodeNotReady"
PROBLEM_DAEMON_TERMINATING = "DaemonTerminating"
PROBLEM_DAEMON_NOT_RUNNING = "DaemonNotRunning"

READY_REASONS = frozenset(
    {
        REASON_ALL_NODES_READY,
        REASON_WAITING_FOR_NODES,
        REASON_DAEMONS_NOT_READY,
        REASON_NODES_NOT_READY,
        REASON_INVALID_SPEC,
        REASON_CAPACITY_EXCEEDED,
        REASON_DRIVER_ROOT_INCOMPLETE,
        REASON_NUM_NODES_UNREACHABLE,
        REASON_DRIVER_NAMESPACE_UNAVAILABLE,
        REASON_RCT_CONFLICT,
        REASON_DAEMONSET_CONFLICT,
        REASON_HOST_MANAGED,
        REASON_NO_CLIQUE_FITS,
        PROBLEM_NODE_UNREACHABLE,
        PROBLEM_NODE_NOT_READY,
        PROBLEM_DAEMON_TERMINATING,
        PROBLEM_DAEMON_NOT_RUNNING,
    }
)
"""Every reason the controller writes on ``Ready``."""

# -- the fabric conditions ------------------------------------------------------------------------

Condition = tuple[str, str, str]
"""(status ``True``/``False``/``Unknown``, reason, message) of a condition."""

REASON_SINGLE_CLIQUE = "SingleClique"
REASON_MULTIPLE_CLIQUES = "MultipleCliques"
REASON_NO_NODES = "NoNodes"
REASON_ALL_PEERS_CONNECTED = "AllPeersConnected"
REASON_PEERS_UNREACHABLE = "PeersUnreachable"
REASON_NOT_REPORTED = "NotReported"
REASON_INVALID_CLIQUE_ENTRY = "InvalidCliqueEntry"
REASON_ALL_CLIQUE_ENTRIES_VALID = "AllCliqueEntriesValid"


def _clique_label(clique_id: str) -> str:
    return f"clique {clique_id}" if clique_id else "no NVLink clique"


def clique_condition(members: Sequence[Member], bad: Sequence[BadEntry] = ()) -> Condition | None:
    """``SingleClique`` for these members; None while there are none."""
    groups: dict[str, list[str]] = {}
    for m in members:
        groups.setdefault(m.entry.clique_id, []).append(m.entry.node_name)
    if not groups:
        return None
    if len(groups) == 1:
        ((clique_id, names),) = groups.items()
        where = f"in {_clique_label(clique_id)}" if clique_id else "without an NVLink clique"
        return "True", REASON_SINGLE_CLIQUE, f"all {len(names)} nodes are {where}"
    spans = "; ".join(
        f"{_clique_label(cid)}: {', '.join(sorted(names))}" for cid, names in sorted(groups.items())
    )
    return (
        "False",
        REASON_MULTIPLE_CLIQUES,
        f"the domain's nodes span {len(groups)} NVLink cliques ({spans}); an IMEX domain "
        "connects only the nodes of one clique, so workers in different cliques cannot share "
        "GPU memory over NVLink",
    )


def connectivity_condition(
    members: Sequence[Member], bad: Sequence[BadEntry] = ()
) -> Condition | None:
    """``IMEXConnected`` from the Ready members' peer reports; None while none reported."""
    ready = {
        m.entry.node_name: m.entry
        for m in members
        if m.entry.status == c.STATUS_READY and m.entry.clique_id and not m.problem
    }
    reporting = [e for e in ready.values() if e.unreachable_peers is not None]
    if not reporting:
        return None
    broken = []
    for e in sorted(reporting, key=lambda x: x.node_name):
        peers = sorted(
            p
            for p in e.unreachable_peers or ()
            if p != e.node_name and p in ready and ready[p].clique_id == e.clique_id
        )
        if peers:
            broken.append(f"{e.node_name} cannot reach {', '.join(peers)}")
    if broken:
        return (
            "False",
            REASON_PEERS_UNREACHABLE,
            "; ".join(broken) + " (IMEX connection state from nvidia-imex-ctl -N)",
        )
    return (
        "True",
        REASON_ALL_PEERS_CONNECTED,
        f"{len(reporting)} of {len(ready)} ready nodes reported; each reaches all its clique peers",
    )


def entries_condition(members: Sequence[Member], bad: Sequence[BadEntry] = ()) -> Condition:
    """``CliqueEntriesValid`` from the malformed clique entries (the members do not matter)."""
    if not bad:
        return (
            "True",
            REASON_ALL_CLIQUE_ENTRIES_VALID,
            "every clique entry of the domain is well-formed",
        )
    skipped = sum(1 for b in bad if b.skipped)
    return (
        "False",
        REASON_INVALID_CLIQUE_ENTRY,
        f"{len(bad)} malformed clique entries ({skipped} skipped by the controller and the "
        f"IMEX daemons): {describe(list(bad))}",
    )


@dataclass(frozen=True)
class FabricCondition:
    """A condition about the fabric that leaves ``Ready`` alone (see the module docstring)."""

    type: str
    judge: Callable[[Sequence[Member], Sequence[BadEntry]], Condition | None]
    """The condition for the domain's members and its malformed clique entries; None while
    there is nothing to judge."""
    unknown_reason: str
    unknown_message: str
    """``Unknown``'s reason and message once the condition exists and nothing can be judged."""
    absent_while_true: bool = False
    """The condition does not appear while its judge says ``True`` (it appears at ``False``)."""

    def current(
        self, members: Sequence[Member], *, exists: bool, bad: Sequence[BadEntry] = ()
    ) -> Condition | None:
        """What to write for ``members`` and the malformed clique entries ``bad`` (None: write
        nothing), ``exists`` telling whether the domain already has this condition."""
        judged = self.judge(members, bad)
        if not exists and (judged is None or (self.absent_while_true and judged[0] == "True")):
            return None
        return judged or ("Unknown", self.unknown_reason, self.unknown_message)

    def transition_event(self, was: JSON | None, now: JSON | None) -> tuple[str, str, str] | None:
        """(Event type, reason, message) for the change of this condition from ``was`` to
        ``now`` (the condition objects, None when absent); None when no Event goes with it."""
        if now is None:
            return None
        status = now.get("status")
        if was is None and status == "True":
            return None
        same = was is not None and was.get("status") == status
        if same and (status != "False" or (was or {}).get("message") == now.get("message")):
            return None
        kind = "Warning" if status == "False" else "Normal"
        return kind, str(now.get("reason")), f"{self.type}={status}: {now.get('message')}"


FABRIC_CONDITIONS: tuple[FabricCondition, ...] = (
    FabricCondition(
        CONDITION_SINGLE_CLIQUE,
        clique_condition,
        REASON_NO_NODES,
        "no node is a member of the domain",
    ),
    FabricCondition(
        CONDITION_IMEX_CONNECTED,
        connectivity_condition,
        REASON_NOT_REPORTED,
        "no ready node has reported its IMEX peer connections",
    ),
    FabricCondition(
        CONDITION_CLIQUE_ENTRIES_VALID,
        entries_condition,
        REASON_ALL_CLIQUE_ENTRIES_VALID,  # never Unknown: the judge always judges
        "",
        absent_while_true=True,
    ),
)
"""Every fabric condition, in the order they are written and their Events recorded."""
