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
  what is still pending so the caller keeps its finalizer until the list is empty;
* the upstream finalizer is stripped from dependents created by the upstream controller so a
  takeover never leaves them stuck terminating.
"""

from __future__ import annotations

import copy
import logging

from pkg.api import constants as c
from pkg.api.computedomain import ComputeDomain
from pkg.base.types import JSON
from pkg.kube.client import KubeClient
from pkg.kube.errors import AlreadyExistsError, ApiError, ForbiddenError, NotFoundError
from pkg.kube.resources import DAEMONSETS, RESOURCE_CLAIM_TEMPLATES, Resource
from pkg.reconcilers.cache import BY_DOMAIN, BY_UID, Caches
from pkg.reconcilers.config import ControllerConfig
from pkg.reconcilers.events import NORMAL, EventSink
from pkg.reconcilers.nodecache import patch_node_metadata
from pkg.reconcilers.objects import (
    SPEC_HASH_ANNOTATION,
    render_daemon_rct,
    render_daemonset,
    render_workload_rct,
)
from pkg.reconcilers.status import Problem, node_problem

__all__ = ["Dependents", "RetryLaterError", "remove_domain_label"]

log = logging.getLogger(__name__)


class RetryLaterError(Exception):
    """The cache is behind a write we just made or saw; look again after the backoff."""


def _labels(obj: JSON) -> dict[str, str]:
    return dict(obj.get("metadata", {}).get("labels") or {})


def _key(obj: JSON) -> str:
    meta = obj.get("metadata", {})
    return f"{meta.get('namespace')}/{meta.get('name')}"


def remove_domain_label(client: KubeClient, node: JSON, *, uid: str) -> bool:
    """Drop ``computeDomain=<uid>`` from ``node`` (RV precondition); False if not ours."""
    if _labels(node).get(c.COMPUTE_DOMAIN_LABEL) != uid:
        return False
    patch_node_metadata(client, node, labels={c.COMPUTE_DOMAIN_LABEL: None})
    return True


class Dependents:
    """Ensures and tears down the dependents of one domain at a time (stateless)."""

    def __init__(
        self, *, client: KubeClient, caches: Caches, config: ControllerConfig, events: EventSink
    ) -> None:
        self._client = client
        self._caches = caches
        self._config = config
        self._events = events

    def _domain_exists(self, uid: str) -> bool:
        return bool(self._caches.compute_domains.by_index(BY_UID, uid))

    # -- ensure ---------------------------------------------------------------------------------

    def ensure(self, cd: ComputeDomain, cd_obj: JSON) -> Problem | None:
        """Create or adopt every dependent; a Problem when the user must act first."""
        workload = render_workload_rct(cd, owner=cd_obj)
        problem = self._ensure_rct(cd, cd_obj, workload, what="channel")
        if problem is not None:
            return problem
        try:
            daemon = render_daemon_rct(cd, self._config)
            problem = self._ensure_rct(cd, cd_obj, daemon, what="daemon")
            if problem is not None:
                return problem
            return self._ensure_daemonset(cd, cd_obj)
        except (NotFoundError, ForbiddenError) as exc:
            if isinstance(exc, ForbiddenError) and "being terminated" not in exc.message:
                raise
            return Problem(
                "DriverNamespaceUnavailable",
                f"cannot create objects in driver namespace {self._config.namespace}: "
                f"{exc.message or exc}",
            )

    def _ensure_rct(
        self, cd: ComputeDomain, cd_obj: JSON, desired: JSON, *, what: str
    ) -> Problem | None:
        key = _key(desired)
        existing = self._caches.rcts.get_by_key(key)
        if existing is None:
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
            "ResourceClaimTemplateConflict",
            f"ResourceClaimTemplate {key} already exists and belongs to {holder}; choose another "
            "spec.channel.resourceClaimTemplate.name or delete that object",
        )

    def _ensure_daemonset(self, cd: ComputeDomain, cd_obj: JSON) -> Problem | None:
        desired = render_daemonset(cd, self._config)
        key = _key(desired)
        existing = self._caches.daemonsets.get_by_key(key)
        if existing is None:
            try:
                self._client.create(DAEMONSETS, desired)
            except AlreadyExistsError:
                existing = self._client.get(
                    DAEMONSETS, desired["metadata"]["name"], namespace=self._config.namespace
                )
            else:
                log.info("created IMEX daemon DaemonSet", extra={"key": key})
                return None
        if _labels(existing).get(c.COMPUTE_DOMAIN_LABEL) != cd.uid:
            return Problem(
                "DaemonSetConflict",
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

    def delete(self, resource: Resource, obj: JSON) -> None:
        """Delete one dependent (UID precondition), stripping an upstream finalizer."""
        meta = obj.get("metadata", {})
        if c.FINALIZER in (meta.get("finalizers") or []):
            body = copy.deepcopy(obj)
            body["metadata"]["finalizers"] = [
                f for f in meta.get("finalizers") or [] if f != c.FINALIZER
            ]
            try:
                self._client.update(resource, body)
            except NotFoundError:
                return
        if meta.get("deletionTimestamp"):
            return
        try:
            self._client.delete(
                resource, meta["name"], namespace=meta.get("namespace"), uid=meta.get("uid"),
                propagation_policy="Background",
            )  # fmt: skip
        except NotFoundError:
            pass
        except ApiError as exc:
            if exc.status != 409:  # precondition failed: a new object took the name
                raise

    def teardown(self, uid: str) -> list[str]:
        """One pass of ordered deletion; returns what is still pending (empty when done)."""
        caches = self._caches
        rcts = caches.rcts.by_index(BY_DOMAIN, uid)
        for rct in rcts:
            if _labels(rct).get(c.TARGET_LABEL) != c.TARGET_DAEMON:
                self.delete(RESOURCE_CLAIM_TEMPLATES, rct)
        for node in caches.nodes.by_index(BY_DOMAIN, uid):
            remove_domain_label(self._client, node, uid=uid)
        for ds in caches.daemonsets.by_index(BY_DOMAIN, uid):
            self.delete(DAEMONSETS, ds)
        # Pods on lost nodes cannot terminate until the node returns; do not wait for them.
        pods = [
            p
            for p in caches.pods.by_index(BY_DOMAIN, uid)
            if not node_problem(caches.nodes.get_by_key(str(p.get("spec", {}).get("nodeName"))))
        ]
        if not pods:
            for rct in rcts:
                if _labels(rct).get(c.TARGET_LABEL) == c.TARGET_DAEMON:
                    self.delete(RESOURCE_CLAIM_TEMPLATES, rct)
        pending = [f"ResourceClaimTemplate {_key(r)}" for r in caches.rcts.by_index(BY_DOMAIN, uid)]
        pending += [f"DaemonSet {_key(d)}" for d in caches.daemonsets.by_index(BY_DOMAIN, uid)]
        pending += [f"daemon pod {_key(p)}" for p in pods]
        return pending
