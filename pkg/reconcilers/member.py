"""A member of a ComputeDomain as the controller judges it: its daemon entry and its problem.

Its own module because two neighbours need it and neither may import the other:
:mod:`pkg.reconcilers.status` makes members (aggregation) and :mod:`pkg.reconcilers.conditions`
judges them (the fabric conditions); both import this one.
"""

from __future__ import annotations

from dataclasses import dataclass

from pkg.api.daemonentry import DaemonEntry

__all__ = ["Member"]


@dataclass(frozen=True)
class Member:
    """One node of the domain and, when it cannot be Ready, why (``""`` when healthy)."""

    entry: DaemonEntry
    problem: str = ""
