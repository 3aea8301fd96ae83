"""Create-or-adopt and ordered teardown of a ComputeDomain's dependent objects.

Owns the writes to the workload RCT, the daemon RCT, the daemon DaemonSet and the domain's
node labels. Reads come from the informer caches; a create that races the cache answers
AlreadyExists and is diagnosed with a live GET. Invariants:

* an object is adopted only if it carries this domain's UID label; a same-named object without
  the label (someone else's) is never modified or deleted: the domain gets a
  ``ResourceClaimTemplateConflict``/``DaemonSetConflict`` problem instead;
* an object labelled for a domain UID that no longer exists is an orphan and is deleted (with a
  UID precondition) so the name can be reused;
* teardown order is workload RCT → node labels → DaemonSet → wait until the daemon pods are
  gone (pods on lost nodes cannot terminate and are not waited for) → daemon RCT; it reports
  what is still pending so the caller keeps its finalizer until the list is empty; an object
  whose DELETE this pass succeeded without leaving finalizers is gone, not pending, even while
  the cache still shows it (so a domain without daemons is finalized in one pass);
* an object this process created is not created again while the cache has not caught up with
  the create (the memo is dropped once the cache shows it, and at teardown), so a re-reconcile
  right after a create costs no AlreadyExists round trip;
* the daemon RCT and the DaemonSet are created on demand (:meth:`Dependents.daemons_wanted`:
  the first allocated channel claim or labelled node of the domain), so a domain no workload
  ever uses costs two writes to create and two to delete, not six and four;
* the upstream finalizer is stripped from dependents created by the upstream controller so a
  takeover never leaves them stuck terminating.
"""

from __future__ import annotations

import copy
import logging
import threading
from dataclasses import replace

from pkg.api import constants as c
from pkg.api.computedomain import ComputeDomain
from pkg.base.types import JSON
from pkg.informers.store import meta_namespace_key
from pkg.kube.client import KubeClient
from pkg.kube.errors import AlreadyExistsError, ApiError, ForbiddenError, NotFoundError
from pkg.kube.resources import DAEMONSETS, RESOURCE_CLAIM_TEMPLATES, Resource
from pkg.reconcilers.cache import BY_DOMAIN, BY_UID, Caches, ObjectCache
from pkg.reconcilers.conditions import (
    REASON_DAEMONSET_CONFLICT,
    REASON_DRIVER_NAMESPACE_UNAVAILABLE,
    REASON_RCT_CONFLICT,
)
from pkg.reconcilers.config import ControllerConfig
from pkg.reconcilers.events import NORMAL, EventSink
from pkg.reconcilers.nodecache import patch_node_metadata
from pkg.reconcilers.objects import (
    SPEC_HASH_ANNOTATION,
    render_daemon_rct,
    render_daemonset,
    render_workload_rct,
)
from pkg.reconcilers.placement import REASON_PINNED_TO_CLIQUE, choose_clique
from pkg.reconcilers.status import Problem, node_problem

__all__ = ["Dependents", "RetryLaterError", "remove_domain_label"]

log = logging.getLogger(__name__)


class RetryLaterError(Exception):
    """The cache is behind a write we just made or saw; look again after the backoff."""


def _labels(obj: JSON) -> dict[str, str]:
    return dict(obj.get("metadata", {}).get("labels") or {})


def remove_domain_label(client: KubeClient, node: JSON, *, uid: str) -> bool:
    """Drop ``computeDomain=<uid>`` from ``node`` (RV precondition); False if not ours."""
    if _labels(node).get(c.COMPUTE_DOMAIN_LABEL) != uid:
        return False
    patch_node_metadata(client, node, labels={c.COMPUTE_DOMAIN_LABEL: None})
    return True


class Dependents:
    """Ensures and tears down the dependents of one domain at a time."""

    def __init__(
        self, *, client: KubeClient, caches: Caches, config: ControllerConfig, events: EventSink
    ) -> None:
        self._client = client
        self._caches = caches
        self._config = config
        self._events = events
        # (resource, "ns/name") of objects we created that the cache may not show yet → the
        # owning domain UID (the daemon RCT and the DaemonSet share their name).
        self._created: dict[tuple[str, str], str] = {}
        # Domain UID -> the clique its workload RCT was created pinned to: the choice of the
        # next SingleClique domain counts it before the RCT cache shows it.
        self._pins: dict[str, str] = {}
        self._lock = threading.Lock()
        self._placement_lock = threading.Lock()  # one SingleClique choice at a time

    def _cached(
        self, resource: Resource, indexer: ObjectCache, key: str, uid: str
    ) -> JSON | bool | None:
        """The cached object at ``key``; True if only our own recent create says it exists."""
        existing = indexer.get_by_key(key)
        with self._lock:
            if existing is not None:
                self._created.pop((resource.plural, key), None)
                return existing
            return self._created.get((resource.plural, key)) == uid

    def _remember(self, resource: Resource, key: str, uid: str) -> None:
        with self._lock:
            self._created[(resource.plural, key)] = uid

    def forget(self, uid: str) -> None:
        """Drop the create memo of the domain ``uid`` (it is being torn down)."""
        with self._lock:
            for key in [k for k, v in self._created.items() if v == uid]:
                del self._created[key]
            self._pins.pop(uid, None)

    def _domain_exists(self, uid: str) -> bool:
        return bool(self._caches.compute_domains.by_index(BY_UID, uid))

    # -- ensure ---------------------------------------------------------------------------------

    def ensure_workload_rct(self, cd: ComputeDomain, cd_obj: JSON) -> Problem | None:
        """Create or adopt the workload RCT only: the write that unblocks the user's pods.

        A ``SingleClique`` domain's template is created pinned to the clique
        `pkg.reconcilers.placement` chooses; while no clique has room, nothing is created
        and the `REASON_NO_CLIQUE_FITS` problem returned. An existing template is adopted
        as it is (its spec is immutable)."""
        if not cd.single_clique:
            return self._ensure_rct(
                cd, cd_obj, render_workload_rct(cd, owner=cd_obj), what="channel"
            )
        key = f"{cd.namespace}/{cd.resource_claim_template_name}"
        with self._placement_lock:
            if self._cached(RESOURCE_CLAIM_TEMPLATES, self._caches.rcts, key, cd.uid):
                return self._ensure_rct(cd, cd_obj, render_workload_rct(cd), what="channel")
            with self._lock:
                recent = dict(self._pins)
            clique, problem = choose_clique(cd, self._caches, recent=recent)
            if problem is not None:
                return problem
            desired = render_workload_rct(cd, owner=cd_obj, clique=clique)
            problem = self._ensure_rct(cd, cd_obj, desired, what="channel")
            if problem is None:
                with self._lock:
                    self._pins[cd.uid] = clique
                log.info(
                    "pinned workload ResourceClaimTemplate to NVLink clique %s",
                    clique,
                    extra={"key": cd.key},
                )
                self._events.event(
                    cd_obj,
                    NORMAL,
                    REASON_PINNED_TO_CLIQUE,
                    f"placement SingleClique: the workload ResourceClaimTemplate {key} admits "
                    f"only IMEX channels of NVLink clique {clique}",
                )
            return problem

    def daemons_wanted(self, uid: str) -> bool:
        """Whether the domain ``uid`` needs its IMEX daemon objects: a channel claim of it is
        allocated, a node is labelled for it, or daemon objects (DaemonSet, daemon RCT, daemon
        pods, cliques) already exist. Until then a domain costs no DaemonSet."""
        caches = self._caches
        return bool(
            caches.claims.by_index(BY_DOMAIN, uid)
            or caches.nodes.by_index(BY_DOMAIN, uid)
            or caches.daemonsets.by_index(BY_DOMAIN, uid)
            or caches.pods.by_index(BY_DOMAIN, uid)
            or caches.cliques.by_index(BY_DOMAIN, uid)
            or any(
                _labels(r).get(c.TARGET_LABEL) == c.TARGET_DAEMON
                and r["metadata"].get("namespace") in self._config.managed_namespaces
                for r in caches.rcts.by_index(BY_DOMAIN, uid)
            )
        )

    def ensure(self, cd: ComputeDomain, cd_obj: JSON, *, daemons: bool = True) -> Problem | None:
        """Create or adopt the workload RCT and, with ``daemons``, the daemon RCT and the
        DaemonSet; a Problem when the user must act first."""
        problem = self.ensure_workload_rct(cd, cd_obj)
        if problem is not None or not daemons:
            return problem
        config = self._daemon_config(cd.uid)
        try:
            daemon = render_daemon_rct(cd, config)
            problem = self._ensure_rct(cd, cd_obj, daemon, what="daemon")
            if problem is not None:
                return problem
            return self._ensure_daemonset(cd, cd_obj, config)
        except (NotFoundError, ForbiddenError) as exc:
            if isinstance(exc, ForbiddenError) and "being terminated" not in exc.message:
                raise
            return Problem(
                REASON_DRIVER_NAMESPACE_UNAVAILABLE,
                f"cannot create objects in driver namespace {self._config.namespace}: "
                f"{exc.message or exc}",
            )

    def _ensure_rct(
        self, cd: ComputeDomain, cd_obj: JSON, desired: JSON, *, what: str
    ) -> Problem | None:
        key = meta_namespace_key(desired)
        existing = self._cached(RESOURCE_CLAIM_TEMPLATES, self._caches.rcts, key, cd.uid)
        if existing is True:
            return None
        if not isinstance(existing, dict):
            try:
                self._client.create(RESOURCE_CLAIM_TEMPLATES, desired)
            except AlreadyExistsError:
                meta = desired["metadata"]
                existing = self._client.get(
                    RESOURCE_CLAIM_TEMPLATES, meta["name"], namespace=meta["namespace"]
                )
            else:
                # No Normal Event at creation (upstream records none; the status conditions
                # show progress): one API write less per domain on the critical path.
                self._remember(RESOURCE_CLAIM_TEMPLATES, key, cd.uid)
                log.info("created %s ResourceClaimTemplate", what, extra={"key": key})
                return None
        owner = _labels(existing).get(c.COMPUTE_DOMAIN_LABEL)
        if owner == cd.uid:
            return None
        if owner and not self._domain_exists(owner):
            self.delete(RESOURCE_CLAIM_TEMPLATES, existing)
            raise RetryLaterError(f"deleted orphaned ResourceClaimTemplate {key} of domain {owner}")
        holder = f"ComputeDomain UID {owner}" if owner else "a user or another controller"
        return Problem(
            REASON_RCT_CONFLICT,
            f"ResourceClaimTemplate {key} already exists and belongs to {holder}; choose another "
            "spec.channel.resourceClaimTemplate.name or delete that object",
        )

    def _daemon_config(self, uid: str) -> ControllerConfig:
        """The config to render the domain's daemon objects with: ours, or, when its DaemonSet
        exists only in an additional namespace (``ADDITIONAL_NAMESPACES``, an older
        installation's), ours with that namespace, so that DaemonSet and its daemon RCT are
        adopted there and nothing is created in the driver namespace (upstream's rule)."""
        elsewhere = sorted(
            str(ds["metadata"].get("namespace"))
            for ds in self._caches.daemonsets.by_index(BY_DOMAIN, uid)
            if ds["metadata"].get("namespace") in self._config.additional_namespaces
        )
        if not elsewhere or any(
            ds["metadata"].get("namespace") == self._config.namespace
            for ds in self._caches.daemonsets.by_index(BY_DOMAIN, uid)
        ):
            return self._config
        return replace(self._config, namespace=elsewhere[0])

    def _ensure_daemonset(
        self, cd: ComputeDomain, cd_obj: JSON, config: ControllerConfig
    ) -> Problem | None:
        desired = render_daemonset(cd, config)
        key = meta_namespace_key(desired)
        existing = self._cached(DAEMONSETS, self._caches.daemonsets, key, cd.uid)
        if existing is True:
            return None
        if not isinstance(existing, dict):
            try:
                self._client.create(DAEMONSETS, desired)
            except AlreadyExistsError:
                existing = self._client.get(
                    DAEMONSETS, desired["metadata"]["name"], namespace=config.namespace
                )
            else:
                self._remember(DAEMONSETS, key, cd.uid)
                log.info("created IMEX daemon DaemonSet", extra={"key": key})
                return None
        if _labels(existing).get(c.COMPUTE_DOMAIN_LABEL) != cd.uid:
            return Problem(
                REASON_DAEMONSET_CONFLICT,
                f"DaemonSet {key} exists but is not labelled for this domain; delete it",
            )
        annotations = existing.get("metadata", {}).get("annotations") or {}
        have = annotations.get(SPEC_HASH_ANNOTATION)
        want = desired["metadata"]["annotations"][SPEC_HASH_ANNOTATION]
        # Only a DaemonSet we rendered is updated; one adopted from the upstream controller
        # (no hash) is left as is, so a takeover never restarts running IMEX daemons.
        if have and have != want and not existing["metadata"].get("deletionTimestamp"):
            body = copy.deepcopy(existing)
            body["spec"] = desired["spec"]
            body["metadata"].setdefault("annotations", {})[SPEC_HASH_ANNOTATION] = want
            self._client.update(DAEMONSETS, body)
            self._events.event(
                cd_obj, NORMAL, "DaemonSetUpdated", f"updated IMEX daemon DaemonSet {key}"
            )
        return None

    # -- teardown -------------------------------------------------------------------------------

    def delete(self, resource: Resource, obj: JSON) -> bool:
        """Delete one dependent (UID precondition), stripping an upstream finalizer.

        True when that object (this UID) is gone for sure: deleted without finalizers left,
        already absent, or its name taken by a new object."""
        meta = obj.get("metadata", {})
        if c.FINALIZER in (meta.get("finalizers") or []):
            body = copy.deepcopy(obj)
            body["metadata"]["finalizers"] = [
                f for f in meta.get("finalizers") or [] if f != c.FINALIZER
            ]
            try:
                obj = self._client.update(resource, body)
            except NotFoundError:
                return True
            meta = obj.get("metadata", {})
        if meta.get("deletionTimestamp"):
            return not meta.get("finalizers")
        try:
            left = self._client.delete(
                resource,
                meta["name"],
                namespace=meta.get("namespace"),
                uid=meta.get("uid"),
                propagation_policy="Background",
            )
        except NotFoundError:
            return True
        except ApiError as exc:
            if exc.status != 409:  # precondition failed: a new object took the name
                raise
            return True
        # The API answers the deleted object, or (finalizers left) the terminating one.
        return not (left or {}).get("metadata", {}).get("finalizers")

    def domain_rcts(self, uid: str, namespace: str) -> list[JSON]:
        """The ResourceClaimTemplates of domain ``uid`` (in ``namespace``): its workload
        template in its own namespace and its daemon template in a namespace of the driver.
        A template elsewhere that carries the domain's label is another tenant's object (the
        label proves nothing), so it never holds up, or is touched by, this domain's
        teardown."""
        return [
            r
            for r in self._caches.rcts.by_index(BY_DOMAIN, uid)
            if str(r["metadata"].get("namespace"))
            in (
                self._config.managed_namespaces
                if _labels(r).get(c.TARGET_LABEL) == c.TARGET_DAEMON
                else (namespace,)
            )
        ]

    def teardown(self, uid: str, namespace: str) -> list[str]:
        """One pass of ordered deletion of domain ``uid`` in ``namespace``; returns what is
        still pending (empty when done)."""
        caches = self._caches
        self.forget(uid)
        gone: set[str] = set()  # UIDs whose DELETE this pass left nothing behind

        def delete(resource: Resource, obj: JSON) -> None:
            if self.delete(resource, obj):
                gone.add(str(obj["metadata"].get("uid")))

        rcts = self.domain_rcts(uid, namespace)
        for rct in rcts:
            if _labels(rct).get(c.TARGET_LABEL) != c.TARGET_DAEMON:
                delete(RESOURCE_CLAIM_TEMPLATES, rct)
        for node in caches.nodes.by_index(BY_DOMAIN, uid):
            remove_domain_label(self._client, node, uid=uid)
        for ds in caches.daemonsets.by_index(BY_DOMAIN, uid):
            delete(DAEMONSETS, ds)
        # Pods on lost nodes cannot terminate until the node returns; do not wait for them.
        pods = [
            p
            for p in caches.pods.by_index(BY_DOMAIN, uid)
            if not node_problem(caches.nodes.get_by_key(str(p.get("spec", {}).get("nodeName"))))
        ]
        if not pods:
            for rct in rcts:
                if _labels(rct).get(c.TARGET_LABEL) == c.TARGET_DAEMON:
                    delete(RESOURCE_CLAIM_TEMPLATES, rct)
        pending = [
            f"{kind} {meta_namespace_key(o)}"
            for kind, objs in (
                ("ResourceClaimTemplate", self.domain_rcts(uid, namespace)),
                ("DaemonSet", caches.daemonsets.by_index(BY_DOMAIN, uid)),
            )
            for o in objs
            if str(o["metadata"].get("uid")) not in gone
        ]
        pending += [f"daemon pod {meta_namespace_key(p)}" for p in pods]
        return pending
