"""The controller's configuration as one frozen value, shared by every reconciler.

Owns the knobs that shape the objects the controller renders (image, namespace, verbosity,
feature gates, daemon tolerations) and the timing of its background loops. Built once by the
binary from flags/env; reconcilers only read it. Invariant: a ``ControllerConfig`` that exists
has passed :meth:`ControllerConfig.validate`, so renderers never see an empty image name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pkg.api import constants as c

__all__ = ["ControllerConfig"]


@dataclass(frozen=True)
class ControllerConfig:
    """What the ComputeDomain controller needs to know about its deployment."""

    namespace: str
    """Driver namespace: daemon DaemonSets, daemon RCTs and cliques live here."""
    image_name: str
    """Image of the per-domain IMEX daemon DaemonSets."""
    log_verbosity_cd_daemon: int = 1
    max_nodes_per_imex_domain: int = c.DEFAULT_MAX_NODES_PER_IMEX_DOMAIN
    feature_gates: str = ""
    """Rendered ``FEATURE_GATES`` for the daemons (the controller's full effective map)."""
    image_pull_secret_names: tuple[str, ...] = ()
    daemon_service_account: str = "compute-domain-daemon-service-account"
    unreachable_toleration_seconds: int = 60
    """How long a daemon pod stays bound to an unreachable/not-ready node before eviction."""
    cleanup_interval: float = 600.0
    """Seconds between orphan sweeps (upstream: 10 min)."""
    deletion_recheck: float = 30.0
    """Safety-net requeue while waiting for dependents to disappear (events usually win)."""
    extra_daemon_labels: dict[str, str] = field(default_factory=dict)

    def validate(self) -> ControllerConfig:
        if not self.namespace:
            raise ValueError("namespace: Required value")
        if not self.image_name:
            raise ValueError("image-name: Required value")
        if self.max_nodes_per_imex_domain < 1:
            raise ValueError("max-nodes-per-imex-domain: must be >= 1")
        if self.unreachable_toleration_seconds < 0:
            raise ValueError("unreachable toleration seconds must be >= 0")
        return self
