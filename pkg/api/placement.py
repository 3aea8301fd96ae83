"""A ComputeDomain kept inside one NVLink clique on request (an extension of ours).

Owns the opt-in and the contract between the ComputeDomain, the controller and the scheduler:

* the opt-in is the ComputeDomain annotation ``resource.nvidia.com/placement: SingleClique``
  (`PLACEMENT_ANNOTATION`, `SINGLE_CLIQUE`). An annotation rather than a spec field: a manifest
  that carries it applies unchanged against the Go driver's CRD, which would refuse an unknown
  spec field under strict field validation, and that driver simply ignores it. Without it the
  domain behaves exactly as upstream's;
* before it creates the domain's workload ResourceClaimTemplate, the controller chooses one
  clique (``pkg.reconcilers.placement``) and pins the template's channel request to it with a
  CEL selector on the ``cliqueID`` attribute that every node's ``channel-0`` carries
  (`clique_selector`), recording the choice on the template (`PINNED_CLIQUE_ANNOTATION`);
* every claim from that template can then only be allocated a ``channel-0`` of that clique, so
  the scheduler itself places every pod of the workload, also pods created later, on nodes of
  that one clique (each pod's claim is its own: a ``matchAttribute`` constraint could not bind
  claims of different pods together).

A ResourceClaimTemplate's spec is immutable, so the clique is chosen once, for the template's
life. Clique IDs come from the nodes' ResourceSlices (untrusted): only IDs of the form NVML
gives them (`valid_clique_id`) are ever written into a CEL expression.
"""

from __future__ import annotations

import re
from typing import Final

from pkg.api.constants import DRIVER_NAME
from pkg.base.types import JSON

__all__ = [
    "PINNED_CLIQUE_ANNOTATION",
    "PLACEMENTS",
    "PLACEMENT_ANNOTATION",
    "SINGLE_CLIQUE",
    "clique_selector",
    "pinned_clique",
    "valid_clique_id",
]

PLACEMENT_ANNOTATION: Final = "resource.nvidia.com/placement"
SINGLE_CLIQUE: Final = "SingleClique"
PLACEMENTS: Final = (SINGLE_CLIQUE,)
PINNED_CLIQUE_ANNOTATION: Final = "resource.nvidia.com/clique"

# "<cluster UUID>.<clique id>" as the plugin publishes it (hex, dashes, one dot, digits); a
# little wider than that, never a quote, backslash or space.
_CLIQUE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def valid_clique_id(clique_id: str) -> bool:
    """Whether ``clique_id`` may be placed in a CEL string literal (and is not empty)."""
    return bool(_CLIQUE_ID.fullmatch(clique_id))


def clique_selector(clique_id: str) -> JSON:
    """The device selector that admits only a ``channel-0`` of clique ``clique_id``; raises
    ``ValueError`` for an ID `valid_clique_id` rejects."""
    if not valid_clique_id(clique_id):
        raise ValueError(f"invalid clique ID {clique_id!r}")
    attr = f"device.attributes['{DRIVER_NAME}'].cliqueID"
    return {"cel": {"expression": f"{attr} == '{clique_id}'"}}


def pinned_clique(rct: JSON) -> str:
    """The clique a workload ResourceClaimTemplate is pinned to (``""``: not pinned)."""
    annotations = rct.get("metadata", {}).get("annotations") or {}
    return str(annotations.get(PINNED_CLIQUE_ANNOTATION, ""))
