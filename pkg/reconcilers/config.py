"""The controller's configuration as one frozen value, shared by every reconciler.

Owns the knobs that shape the objects the controller renders (image, namespace, verbosity,
feature gates, extra daemon env) and the timing of its background loops and grace periods.
Built once by the binary from flags/env; reconcilers only read it. Invariant: a
``ControllerConfig`` that exists has passed :meth:`ControllerConfig.validate`, so renderers
never see an empty image name or an extra env var that shadows the daemon's own contract.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pkg.api import constants as c
from pkg.api import daemoncontract as dc
from pkg.api.daemonentry import MAX_CLIQUE_DAEMONS
from pkg.api.namespaces import valid_namespace
from pkg.imex.mode import ImexModeConfig

__all__ = [
    "DAEMON_CORE_ENV",
    "DEFAULT_DAEMON_SERVICE_ACCOUNT",
    "ControllerConfig",
    "parse_extra_env",
]

DEFAULT_DAEMON_SERVICE_ACCOUNT = "compute-domain-daemon"
"""The ServiceAccount config/rbac/daemon.yaml ships for the IMEX daemon pods."""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

DAEMON_CORE_ENV: frozenset[str] = dc.DAEMONSET_ENV | dc.CDI_ENV
"""Daemon env names an operator may not set through ``--cd-daemon-extra-env``: what our
DaemonSet (objects.py) and the plugin's CDI spec set (:mod:`pkg.api.daemoncontract`)."""


def _check_extra_env(pairs: tuple[tuple[str, str], ...]) -> None:
    seen: set[str] = set()
    for name, _value in pairs:
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"cd-daemon-extra-env: {name!r} is not a valid variable name")
        if name in DAEMON_CORE_ENV:
            raise ValueError(f"cd-daemon-extra-env: {name} is set by the controller")
        if name in seen:
            raise ValueError(f"cd-daemon-extra-env: {name} given twice")
        seen.add(name)


def parse_extra_env(text: str) -> tuple[tuple[str, str], ...]:
    """``"A=1,B=x=y"`` → ``(("A", "1"), ("B", "x=y"))``, validated; raises ``ValueError``.

    Items are comma separated (so values cannot contain commas), surrounding blanks and empty
    items are ignored, and the value is everything after the first ``=`` (may be empty).
    """
    pairs: list[tuple[str, str]] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"cd-daemon-extra-env: {item!r} is not NAME=value")
        pairs.append((name.strip(), value))
    result = tuple(pairs)
    _check_extra_env(result)
    return result


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
    daemon_service_account: str = DEFAULT_DAEMON_SERVICE_ACCOUNT
    """The daemon pods' ServiceAccount: the one config/rbac ships (upstream's chart names it
    ``compute-domain-daemon-service-account``)."""
    daemon_extra_env: tuple[tuple[str, str], ...] = ()
    """Extra ``(name, value)`` env of the daemon container (e.g. ``HTTPS_PROXY``), rendered
    after the core env; never one of :data:`DAEMON_CORE_ENV`."""
    node_loss_grace_period: float = 60.0
    """How long a node may be NotReady/unreachable (Ready condition False/Unknown, by its
    ``lastTransitionTime``) before its daemon leaves the domain: dropped from
    ``status.nodes`` and from its clique. The daemon pods tolerate every taint like upstream's
    (the DaemonSet controller forces infinite node-failure tolerations anyway), so this,
    not eviction, is what makes a dead node leave."""
    cleanup_interval: float = 0.0
    """Seconds between backstop orphan sweeps; 0 (default): sweeps are event-driven only
    (upstream: every 10 min)."""
    deletion_recheck: float = 30.0
    """Safety-net requeue while waiting for dependents to disappear (events usually win)."""
    clique_entry_grace_period: float = 30.0
    """How long a clique ``daemons[]`` entry survives with no daemon pod of its domain on its
    node (as observed by this controller) before it is pruned; covers DaemonSet restarts."""
    status_update_interval: float = 1.0
    """Least time between two writes of one domain's status that only move counts and lists
    (``readyNodes``, ``nodes[]``, condition messages); a change of ``status`` or of a
    condition's status or reason is written at once, and the deferred state is written when the
    interval ends. 0: every change at once (upstream)."""
    domain_batch_period: float = 0.2
    """Least time between two reconciles of one domain that events ask for: events within it
    are coalesced into one reconcile at its end; the first event after a quiet period is
    reconciled at once. 0: one reconcile per event (upstream)."""
    extra_daemon_labels: dict[str, str] = field(default_factory=dict)
    compute_domain_cliques: bool = True
    """Gate ``ComputeDomainCliques``: daemons record themselves in ComputeDomainClique objects
    (the controller aggregates them into ``status.nodes``); off, they write
    ``ComputeDomain.status.nodes`` themselves and the controller keeps and prunes that list."""
    additional_namespaces: tuple[str, ...] = ()
    """``ADDITIONAL_NAMESPACES``: namespaces besides :attr:`namespace` whose daemon
    DaemonSets, pods and cliques the controller watches, adopts and tears down (upstream's
    migration aid); new daemon objects are still created in :attr:`namespace` only."""

    imex: ImexModeConfig = field(default_factory=ImexModeConfig)
    """``IMEX_MODE``/``IMEX_ISOLATION`` (validated by the binary): in host-managed mode the
    controller runs :mod:`pkg.reconcilers.hostmanaged` instead of the daemon machinery."""

    @property
    def managed_namespaces(self) -> tuple[str, ...]:
        """The driver namespace first, then each additional one (no duplicates)."""
        return tuple(dict.fromkeys((self.namespace, *self.additional_namespaces)))

    def validate(self) -> ControllerConfig:
        """``self`` if every field is usable; ``ValueError`` naming the flag otherwise."""
        if not self.namespace:
            raise ValueError("namespace: Required value")
        if not self.image_name:
            raise ValueError("image-name: Required value")
        if not 1 <= self.max_nodes_per_imex_domain <= MAX_CLIQUE_DAEMONS:
            # A clique holds one entry per daemon; its CRD takes at most MAX_CLIQUE_DAEMONS.
            raise ValueError(
                f"max-nodes-per-imex-domain: must be between 1 and {MAX_CLIQUE_DAEMONS}"
            )
        if self.node_loss_grace_period < 0:
            raise ValueError("node-loss-grace-period: must be >= 0")
        if self.clique_entry_grace_period < 0:
            raise ValueError("clique-entry-grace-period: must be >= 0")
        if self.status_update_interval < 0:
            raise ValueError("status-update-interval: must be >= 0")
        if self.domain_batch_period < 0:
            raise ValueError("domain-batch-period: must be >= 0")
        for ns in self.additional_namespaces:
            if not valid_namespace(ns):
                raise ValueError(
                    f"additional-namespaces: {ns!r} is not a valid namespace name "
                    "(lowercase RFC 1123 label)"
                )
        _check_extra_env(self.daemon_extra_env)
        return self
