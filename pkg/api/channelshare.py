"""Several pods of one ComputeDomain on one node: the device taint and its toleration.

Owns the one contract between the kubelet plugin and the controller that lets the scheduler
give a node's ``channel-0`` to more than one claim of the same ComputeDomain, and never to
claims of two domains at once:

* the plugin publishes ``channel-0`` with ``allowMultipleAllocations: true``
  (DRAConsumableCapacity) and, while a domain's claims use it, with `channel_taint` of that
  domain (``NoSchedule``, DRADeviceTaints);
* the controller's workload ResourceClaimTemplate tolerates exactly `channel_taint` of its own
  domain (`channel_toleration`), so a further claim of that domain may be allocated the used
  channel, and a claim of another domain is sent to another node, as upstream's exclusive
  device sends it.

A template without the toleration (an upstream controller's, or one written before this
extension) never shares: its claims behave exactly as upstream's. Both values are pure.
"""

from __future__ import annotations

from pkg.api.constants import COMPUTE_DOMAIN_LABEL
from pkg.base.types import JSON

__all__ = ["TAINT_EFFECT", "channel_taint", "channel_toleration"]

# NoSchedule keeps new claims of other domains away and never evicts a running pod.
TAINT_EFFECT = "NoSchedule"


def channel_taint(domain_id: str) -> JSON:
    """The device taint of a node's ``channel-0`` while ComputeDomain ``domain_id`` uses it."""
    return {"key": COMPUTE_DOMAIN_LABEL, "value": domain_id, "effect": TAINT_EFFECT}


def channel_toleration(domain_id: str) -> JSON:
    """The toleration of `channel_taint` (and of no other domain's) a workload claim of
    ``domain_id`` carries."""
    return {
        "key": COMPUTE_DOMAIN_LABEL,
        "operator": "Equal",
        "value": domain_id,
        "effect": TAINT_EFFECT,
    }
