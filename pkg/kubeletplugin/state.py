"""DeviceState: prepare/unprepare orchestration for one node.

Owns the order of side effects for a claim and the locking around them:

1. take the claim the library fetched (`pkg.draplugin.claims.fetch_claim`: allocated, same
   UID), group our driver's results by the config that applies to each
   (`claims.config_groups`: a claim may hold ``channel-0`` and ``daemon-0``), strictly decode
   the opaque configs (``domainID`` must be a UID) and refuse a daemon claim outside the driver
   namespace - failures here are permanent and have no side effects (no checkpoint entry,
   directory or CDI spec);
2. under the node lock: return the checkpointed devices if the claim is PrepareCompleted; refuse
   permanently a PrepareAborted claim whose stored status equals the claim's (a stale retry
   after Unprepare); refuse channel 0 while a PrepareCompleted claim of another ComputeDomain
   holds it -- claims of the same domain share it (one label, one daemon, the channel device in
   each claim's CDI spec) -- and any other device another PrepareCompleted claim holds, e.g.
   ``daemon-0`` (both retryable; Started and Aborted entries block nothing, as upstream);
   record PrepareStarted with the claim's status (the Go driver's checkpoint shape, see
   `checkpoint`: one entry per claim, sharing recorded only by the scheduler's ``shareID``);
3. without the lock, per config group: domain checks (exists, same namespace: permanent), node
   label (retryable on conflict) and the event-driven wait for this node's IMEX daemon
   (retryable on timeout). The label and the Started record are kept on a retryable error - the
   daemon can only come up *because* of the label; a permanent error undoes the earlier groups
   and removes the entry;
4. under the node lock: still PrepareStarted (else Unprepare came meanwhile: retryable), the
   step-2 checks again (another claim may have completed), write the CDI spec (one device per
   group) and record PrepareCompleted with the devices.

Unprepare (idempotent) removes the label if this was the domain's last channel claim here and
the per-domain dir if it was the last daemon claim (Aborted entries hold nothing; a claim of
the domain still Started or Completed keeps them, so the others' channel stays), then
deletes a PrepareCompleted entry, or turns a PrepareStarted one into a PrepareAborted tombstone
with ``abortedAt``, then deletes the CDI spec; a PrepareAborted or unknown claim is a no-op --
for entries either driver wrote: what to undo comes from the entry's device groups, or for a
PrepareStarted entry from the configs in its stored claim status. `expire_aborted` deletes old
tombstones (called by `cleanup`).
The node lock is an in-process mutex plus ``flock(<plugin dir>/pu.lock)`` so a second plugin
instance during a rolling update is serialised too; claims of one request run in parallel
outside it.

Steps 2 and 4 are spans ``record PrepareStarted`` and ``write CDI spec, record
PrepareCompleted`` (both include the wait for the node lock) under the current span, the
plugin library's ``NodePrepareResource`` (beside its ``get ResourceClaim``).
Step 3 is traced when the domain carries a formation ``traceparent`` annotation: a span
``prepare <kind> claim`` under the domain's root with ``label node`` and ``wait for IMEX daemon``
inside it (one per attempt, so kubelet retries show), and a daemon claim's CDI env hands the
``traceparent`` on to the IMEX daemon as ``TRACEPARENT``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from opentelemetry import trace
from opentelemetry.context import Context

from pkg.api import daemoncontract as dc
from pkg.api.opaque import ChannelConfig, DaemonConfig
from pkg.base.types import JSON
from pkg.draplugin.claims import ClaimRef
from pkg.draplugin.errors import PermanentError, RetryableError
from pkg.kubeletplugin.cdi import CdiDevice, CdiWriter, ContainerEdits, qualified_name
from pkg.kubeletplugin.checkpoint import (
    CheckpointStore,
    ClaimEntry,
    ClaimState,
    DeviceGroup,
    OpenReport,
    PreparedDevice,
    canonical_status,
)
from pkg.kubeletplugin.checkpointformat import go_time, parse_go_time, same_status
from pkg.kubeletplugin.claims import ConfigGroup, config_groups, requested_devices
from pkg.kubeletplugin.gojson import SchemaError
from pkg.kubeletplugin.hostimex import DAEMON_CLAIMS_REFUSED, HostManagedChannels
from pkg.kubeletplugin.procdevices import DeviceNode
from pkg.runtime.logsetup import V
from pkg.runtime.tracing import (
    child_span,
    parent_context,
    parse_traceparent,
    traceparent_of,
)

log = logging.getLogger(__name__)


def domain_dir(plugin_dir: Path, domain_id: str) -> Path:
    """The per-domain directory a daemon claim's CDI spec mounts at ``/imexd``.

    Raises `ValueError` for an id that would not name one entry directly under
    ``<plugin_dir>/domains`` (empty, ``.``, ``..``, a separator, an absolute path, a NUL): the
    result is mounted read-write into a pod and removed with ``shutil.rmtree`` as root, so it must
    never leave that root whatever a claim or checkpoint says (opaque-config decoding already
    admits only UIDs; this is the second line).
    """
    root = plugin_dir / "domains"
    if (
        domain_id in ("", ".", "..")
        or "/" in domain_id
        or "\0" in domain_id
        or (root / domain_id).parent != root
    ):
        raise ValueError(f"domain id {domain_id[:64]!r} would leave {root}")
    return root / domain_id


def channel_domain(entries: Iterable[ClaimEntry]) -> str:
    """The ComputeDomain this node's channel is in use by, ``""`` if none.

    That is the domain of a PrepareCompleted channel claim, else of a PrepareStarted one (the
    first in UID order: claims of two domains can only both be Started, never both Completed);
    Aborted tombstones hold nothing. The plugin taints its published ``channel-0`` with it
    (`claims.slice_devices`), so the scheduler hands the shared channel only to more claims of
    that domain.
    """
    best: tuple[int, str, str] | None = None
    for entry in entries:
        if entry.state == ClaimState.PREPARE_ABORTED:
            continue
        rank = 0 if entry.state == ClaimState.PREPARE_COMPLETED else 1
        for kind, domain_id in entry.targets:
            if kind == "channel" and domain_id:
                key = (rank, entry.uid, domain_id)
                best = key if best is None or key < best else best
    return best[2] if best is not None else ""


class Domains(Protocol):
    """What DeviceState needs from `computedomains.DomainTracker`."""

    def get_domain(self, uid: str, *, deadline: float) -> JSON | None: ...
    def add_node_label(self, cd_uid: str) -> None: ...
    def remove_node_label(self, cd_uid: str) -> None: ...
    def wait_ready(self, cd_uid: str, *, deadline: float) -> bool: ...


def _prepared(ref: ClaimRef, devices: tuple[PreparedDevice, ...]) -> tuple[PreparedDevice, ...]:
    """Log upstream's V(1) success line of a Prepare and hand ``devices`` back."""
    names = " ".join(d.device_name for d in devices)
    log.log(V(1), "Prepared devices for claim '%s': [%s]", ref, names)
    return devices


@dataclass(frozen=True)
class _PreparePlan:
    """What Prepare of one claim works on, derived from the claim alone (`DeviceState._plan`)."""

    ref: ClaimRef
    groups: tuple[ConfigGroup, ...]  # our results, each with the config that applies to it
    status: dict[str, Any]  # the claim's status as the checkpoint records it
    wanted: set[str]  # our devices the claim holds, adminAccess ones left out


def _recorded_outcome(
    plan: _PreparePlan, existing: ClaimEntry | None
) -> tuple[PreparedDevice, ...] | None:
    """What the claim's checkpoint entry decides before any side effect (pure): the recorded
    devices of a PrepareCompleted claim (idempotent Prepare), `PermanentError` for a
    PrepareAborted one with the same status (a stale retry after Unprepare), else None: the
    claim is to be prepared."""
    if existing is not None and existing.state == ClaimState.PREPARE_COMPLETED:
        return existing.devices
    if (
        existing is not None
        and existing.state == ClaimState.PREPARE_ABORTED
        and same_status(existing.status, plan.status)
    ):
        raise PermanentError(
            f"stale prepare for claim {plan.ref}: claim prepare was already aborted"
        )
    return None


class NodeLock:
    """In-process mutex + exclusive flock on a file shared by all plugin instances on the node."""

    def __init__(self, path: Path, *, timeout: float = 10.0) -> None:
        self._path = path
        self._timeout = timeout
        self._mutex = threading.Lock()

    @contextmanager
    def held(self) -> Iterator[None]:
        if not self._mutex.acquire(timeout=self._timeout):
            raise RetryableError("timed out waiting for the node lock (busy)")
        try:
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                deadline = time.monotonic() + self._timeout
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() > deadline:
                            raise RetryableError(
                                f"timed out waiting for {self._path} (another plugin instance)"
                            ) from None
                        time.sleep(0.01)  # only contends with another process
                yield
            finally:
                os.close(fd)  # closing the descriptor releases the flock
        finally:
            self._mutex.release()


@dataclass(frozen=True)
class NodeSetup:
    """Node facts fixed at start-up, and the accessor of the one that is not."""

    node_name: str
    # The node's current clique ID (`pkg.kubeletplugin.clique.CliqueRefresher.clique_id`):
    # it can change while the plugin runs, so it is read at each use.
    clique_id: Callable[[], str]
    channel_nodes: tuple[DeviceNode, ...]
    imex_mgmt_node: DeviceNode | None
    plugin_dir: Path
    # Where the controller creates the daemons' claims; daemon claims elsewhere are refused.
    driver_namespace: str
    # ADDITIONAL_NAMESPACES: namespaces whose (older installations') daemons may claim the
    # daemon device as well, as the controller adopts their DaemonSets there.
    daemon_namespaces: tuple[str, ...] = ()


class DeviceState:
    def __init__(
        self,
        *,
        store: CheckpointStore,
        cdi: CdiWriter,
        domains: Domains,
        lock: NodeLock,
        setup: NodeSetup,
        monotonic: Callable[[], float] = time.monotonic,
        on_checkpoint_change: Callable[[list[ClaimEntry]], None] = lambda _entries: None,
        tracer: trace.Tracer | None = None,
        now: Callable[[], float] = time.time,
        host_imex: HostManagedChannels | None = None,
    ) -> None:
        """``tracer`` records Prepare's part of each domain's formation trace (spans under the
        domain's ``traceparent`` annotation; none without one); ``now`` times those spans.
        ``host_imex`` (host-managed IMEX mode): channel groups are prepared by it, daemon claims
        are refused, and Unprepare removes no node label (`pkg.kubeletplugin.hostimex`)."""
        self._host_imex = host_imex
        self._store = store
        self._cdi = cdi
        self._domains = domains
        self._lock = lock
        self._setup = setup
        self._monotonic = monotonic
        self._on_change = on_checkpoint_change
        self._tracer = tracer or trace.NoOpTracer()
        self._now = now
        self._base_cdi_id = qualified_name("device", "all")

    # -- start-up -------------------------------------------------------------------------------

    def recover(self, report: OpenReport) -> None:
        """Delete the CDI specs of entries a previous boot left behind (see checkpoint docs);
        the store keeps those entries, on disk, for their Unprepare (`take_previous_boot`).

        A reboot empties ``/run`` (devices, CDI specs) but not what those claims set up outside
        it: the node label (API state) and the per-domain dir (under ``/var/lib``). The kubelet
        re-prepares the claims of pods that still run; for a claim whose pod was deleted
        meanwhile it calls Unprepare only, which then undoes those targets as the entry's own
        Unprepare would have (`unprepare`). Stale PrepareStarted entries are the periodic
        cleanup's (`cleanup.CheckpointCleanup`), whose first pass runs at start-up.
        """
        for entry in report.dropped_other_boot:
            self._cdi.delete_claim_spec(entry.uid)

    def entries(self) -> dict[str, ClaimEntry]:
        """A snapshot of the checkpoint entries, read under the node lock."""
        with self._lock.held():
            return self._store.entries()

    # -- prepare --------------------------------------------------------------------------------

    def prepare(self, claim: JSON, *, deadline: float) -> tuple[PreparedDevice, ...]:
        """Prepare one allocated ResourceClaim (the whole object, as the library fetched it);
        raises `ClaimError` (permanent or retryable).

        Each of our results is prepared with the config that applies to it (`config_groups`),
        so one claim may hold both ``channel-0`` and ``daemon-0``. Idempotent: a claim already
        PrepareCompleted (by either driver) gets its recorded devices back without any side
        effect. A claim whose entry is PrepareAborted with the same status is a stale retry
        arriving after Unprepare: refused permanently, with no side effect; a different
        status (the claim was re-allocated) is prepared afresh.
        """
        plan = self._plan(claim)
        if plan is None:
            return ()  # nothing of ours in this claim
        done = self._record_started(plan)
        if done is not None:
            return done
        edits = self._prepare_groups(plan, deadline=deadline)
        return self._record_completed(plan, edits)

    def _plan(self, claim: JSON) -> _PreparePlan | None:
        """Step 1 (no side effects): our config groups of ``claim`` and its status to record;
        None if nothing in it is ours. `PermanentError` for a claim this node must not prepare
        (a daemon claim in host-managed mode or outside the driver namespaces) or whose status
        the checkpoint cannot hold."""
        ref = ClaimRef.of(claim)
        groups = config_groups(claim)
        if not groups:
            return None
        if self._host_imex is not None and any(g.kind == "daemon" for g in groups):
            raise PermanentError(DAEMON_CLAIMS_REFUSED)
        if not self._daemon_namespace(ref.namespace) and any(g.kind == "daemon" for g in groups):
            # Before any side effect: the daemon device carries the node's IMEX management
            # device and a read-write host directory.
            raise PermanentError(
                "ComputeDomain daemon claims are only prepared in the driver namespace "
                f"{self._setup.driver_namespace}"
            )
        try:
            status = canonical_status(claim.get("status"))
        except SchemaError as err:
            raise PermanentError(f"cannot record the claim's status: {err}") from err
        return _PreparePlan(ref, groups, status, requested_devices(status))

    def _record_started(self, plan: _PreparePlan) -> tuple[PreparedDevice, ...] | None:
        """Step 2 (under the node lock): the recorded devices if the claim is already
        PrepareCompleted; else refuse it (`_recorded_outcome`, `_assert_not_held`) or record it
        PrepareStarted and return None."""
        ref = plan.ref
        with self._tracer.start_as_current_span("record PrepareStarted"), self._lock.held():
            entries = self._store.entries()
            done = _recorded_outcome(plan, entries.get(ref.uid))
            if done is not None:
                log.log(V(4), "Skip prepare: claim already in PrepareCompleted state: %s", ref)
                return _prepared(ref, done)
            self._assert_not_held(ref, plan.groups, plan.wanted, entries.values())
            started = ClaimEntry(
                uid=ref.uid,
                state=ClaimState.PREPARE_STARTED,
                status=plan.status,
                namespace=ref.namespace,
                name=ref.name,
            )
            self._put(started)
        return None

    def _prepare_groups(self, plan: _PreparePlan, *, deadline: float) -> list[ContainerEdits]:
        """Step 3 (without the lock): each group's side effects, in order, and their CDI edits.
        A permanent error undoes the groups before the failing one and forgets the claim (if
        it is still PrepareStarted); a retryable one keeps both for the retry."""
        ref, groups = plan.ref, plan.groups
        edits: list[ContainerEdits] = []
        try:
            for group in groups:
                edits.append(self._prepare_group(ref, group, deadline=deadline))
        except PermanentError:
            with self._lock.held():
                current = self._store.entries()
                entry = current.get(ref.uid)
                if entry is not None and entry.state == ClaimState.PREPARE_STARTED:
                    # Undo what the groups before the failing one did, then forget the claim.
                    done = tuple((g.kind, g.config.domain_id) for g in groups[: len(edits)])
                    del current[ref.uid]
                    self._undo_targets(ref, done, current.values())
                    self._remove(ref.uid)
            raise
        return edits

    def _record_completed(
        self, plan: _PreparePlan, edits: list[ContainerEdits]
    ) -> tuple[PreparedDevice, ...]:
        """Step 4 (under the node lock): if the claim is still PrepareStarted and none of its
        devices got taken meanwhile, write its CDI spec and record it PrepareCompleted."""
        ref, groups = plan.ref, plan.groups
        with (
            self._tracer.start_as_current_span("write CDI spec, record PrepareCompleted"),
            self._lock.held(),
        ):
            current = self._store.entries()
            entry = current.get(ref.uid)
            if entry is None or entry.state != ClaimState.PREPARE_STARTED:
                raise RetryableError("claim was unprepared while it was being prepared")
            # Another claim may have completed while this one waited outside the lock.
            self._assert_not_held(ref, groups, plan.wanted, current.values())
            ids = self._cdi.write_claim_spec(
                ref.uid,
                [
                    CdiDevice(str(g.result.get("device", "")), e)
                    for g, e in zip(groups, edits, strict=True)
                ],
            )
            checkpoint_groups = tuple(self._device_group(g, ids) for g in groups)
            self._put(
                ClaimEntry(
                    uid=ref.uid,
                    state=ClaimState.PREPARE_COMPLETED,
                    status=plan.status,
                    groups=checkpoint_groups,
                    namespace=ref.namespace,
                    name=ref.name,
                )
            )
        return _prepared(ref, tuple(d for g in checkpoint_groups for d in g.devices))

    def _prepare_group(
        self, ref: ClaimRef, group: ConfigGroup, *, deadline: float
    ) -> ContainerEdits:
        """Side effects of one config group (without the node lock); the CDI edits it needs."""
        config = group.config
        domain = self._domains.get_domain(config.domain_id, deadline=deadline)
        if domain is None:
            raise PermanentError(f"ComputeDomain with UID {config.domain_id} not found")
        with self._span(
            parent_context(traceparent_of(domain)),
            f"prepare {group.kind} claim",
            {"claim.uid": ref.uid, "claim.namespace": ref.namespace, "claim.name": ref.name},
        ) as span:
            parent = trace.set_span_in_context(span)
            if isinstance(config, ChannelConfig) and self._host_imex is not None:
                device = str(group.result.get("device", ""))
                return self._host_imex.prepare_channel(ref, config, domain, device=device)
            if isinstance(config, ChannelConfig):
                return self._prepare_channel(
                    ref, config, domain, deadline=deadline, trace_parent=parent
                )
            assert isinstance(config, DaemonConfig)
            return self._prepare_daemon(config, domain)

    def _device_group(self, group: ConfigGroup, cdi_ids: dict[str, str]) -> DeviceGroup:
        """The checkpoint record of one prepared config group (upstream ``PreparedDeviceGroup``)."""
        result = group.result
        request = str(result.get("request", ""))
        device_name = str(result.get("device", ""))
        ids = [cdi_ids[device_name]] if device_name in cdi_ids else []
        if group.kind == "daemon":
            ids.insert(0, self._base_cdi_id)
        share_id = result.get("shareID")
        device = PreparedDevice(
            request_names=(request,) if request else (),
            pool_name=str(result.get("pool", "")),
            device_name=device_name,
            cdi_device_ids=tuple(ids),
            # The scheduler's mark of one allocation of a shared device (``channel-0``):
            # upstream's own ``CheckpointedDevice.ShareID`` records it, no field of ours.
            share_id=str(share_id) if share_id else None,
        )
        return DeviceGroup(group.kind, group.config.domain_id, (device,))

    def _assert_not_held(
        self,
        ref: ClaimRef,
        groups: tuple[ConfigGroup, ...],
        wanted: set[str],
        entries: Iterable[ClaimEntry],
    ) -> None:
        """Refuse devices another PrepareCompleted claim holds; retryable.

        Only PrepareCompleted entries count, as upstream's ``assertImexChannelNotAllocated`` and
        ``validateNoOverlappingPreparedDevices`` do: a claim stuck in PrepareStarted (or an
        Aborted tombstone) blocks nobody. Channel claims all use IMEX channel 0: a completed
        channel claim of **another** ComputeDomain blocks one (upstream's text), while claims
        of the **same** domain share the node's channel (`channel_domain`; upstream refuses
        any second channel claim) -- so the shared ``channel-0`` is no overlap either.
        Any other overlap of device names -- e.g. a second daemon claim for ``daemon-0`` -- is
        refused. adminAccess results never conflict. Called again right before
        PrepareCompleted, because the domain steps run outside the node lock.
        """
        channels = {g.config.domain_id for g in groups if g.kind == "channel"}
        shared = {str(g.result.get("device", "")) for g in groups if g.kind == "channel"}
        for other in entries:
            if other.uid == ref.uid or other.state != ClaimState.PREPARE_COMPLETED:
                continue
            theirs = {d for k, d in other.targets if k == "channel"}
            if channels and theirs and (len(channels | theirs) > 1 or "" in theirs):
                raise RetryableError(
                    f"allocation failed: channel 0 already allocated by claim {other.uid} "
                    "(according to checkpoint)"
                )
            held = other.held_devices() - (shared if theirs else set())
            clash = sorted(wanted & held)
            if clash:
                holder = f"{other.namespace}/{other.name} ({other.uid})"
                raise RetryableError(
                    f"requested device {clash[0]} is already allocated to different claim {holder}"
                )

    def _span(
        self, parent: Context | None, name: str, attributes: dict[str, str] | None = None
    ) -> AbstractContextManager[trace.Span]:
        """A formation-trace span (``pkg.runtime.tracing.child_span``) naming this node."""
        attrs = {"k8s.node.name": self._setup.node_name, **(attributes or {})}
        return child_span(self._tracer, parent, name, now=self._now, attributes=attrs)

    def _prepare_channel(
        self,
        ref: ClaimRef,
        config: ChannelConfig,
        domain: JSON,
        *,
        deadline: float,
        trace_parent: Context | None = None,
    ) -> ContainerEdits:
        cd_ns = (domain.get("metadata") or {}).get("namespace")
        if cd_ns != ref.namespace:
            # Upstream also names the ComputeDomain's namespace; that would tell a tenant where
            # another tenant's domain lives, so only the claim's own namespace is named.
            raise PermanentError(
                "the ResourceClaim's namespace is different than the ComputeDomain's namespace "
                f"(claim namespace {ref.namespace})"
            )
        with self._span(trace_parent, "label node"):
            self._domains.add_node_label(config.domain_id)
        with self._span(trace_parent, "wait for IMEX daemon") as span:
            ready = self._domains.wait_ready(config.domain_id, deadline=deadline)
            span.set_attribute("imex.daemon.ready", ready)
        if not ready:
            raise RetryableError(
                f"current node not ready in ComputeDomain {config.domain_id}: the IMEX daemon on "
                f"node {self._setup.node_name} is not Ready yet"
            )
        if not self._setup.clique_id():
            return ContainerEdits()  # non-NVLink node: released without an IMEX channel
        nodes = self._setup.channel_nodes[: config.channel_count]
        return ContainerEdits(device_nodes=tuple(n.to_cdi() for n in nodes))

    def _daemon_namespace(self, namespace: str) -> bool:
        """Whether daemon claims may be prepared in ``namespace``: the driver namespace or one of
        ``ADDITIONAL_NAMESPACES``."""
        return namespace == self._setup.driver_namespace or (
            namespace in self._setup.daemon_namespaces
        )

    def _prepare_daemon(self, config: DaemonConfig, domain: JSON) -> ContainerEdits:
        meta = domain.get("metadata") or {}
        try:
            domain_dir = self._domain_dir(config.domain_id)
        except ValueError as err:
            raise PermanentError(str(err)) from err
        domain_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        env: tuple[str, ...] = (
            f"{dc.CLIQUE_ID}={self._setup.clique_id()}",
            f"{dc.COMPUTE_DOMAIN_UUID}={meta.get('uid', '')}",
            f"{dc.COMPUTE_DOMAIN_NAME}={meta.get('name', '')}",
            f"{dc.COMPUTE_DOMAIN_NAMESPACE}={meta.get('namespace', '')}",
        )
        traceparent = traceparent_of(domain)
        if traceparent and parse_traceparent(traceparent) is not None:
            # The daemon's formation spans join the domain's trace (OTel's env carrier).
            env += (f"{dc.TRACEPARENT}={traceparent}",)
        mount = {
            "containerPath": dc.CONFIG_DIR,
            "hostPath": str(domain_dir),
            "options": ["rw", "nosuid", "nodev", "bind"],
        }
        nodes: tuple[dict[str, object], ...] = ()
        if self._setup.clique_id() and self._setup.imex_mgmt_node is not None:
            nodes = (self._setup.imex_mgmt_node.to_cdi(),)
        return ContainerEdits(env=env, device_nodes=nodes, mounts=(mount,))

    def _domain_dir(self, domain_id: str) -> Path:
        return domain_dir(self._setup.plugin_dir, domain_id)

    # -- unprepare ------------------------------------------------------------------------------

    def unprepare(self, ref: ClaimRef, *, deadline: float) -> None:
        """Undo a claim, by its checkpoint state; raises `ClaimError` on failure.

        * unknown claim: success (its CDI specs are deleted anyway, in case the entry was lost
          to a corrupt checkpoint); a claim prepared in a previous boot (`recover`) has its
          node label and domain dir removed as below;
        * PrepareAborted: success, nothing touched;
        * PrepareCompleted: undo the devices, delete the entry, then the CDI spec;
        * PrepareStarted (kubelet or the stale-claim cleanup): undo the devices, rewrite the
          entry as PrepareAborted (status kept, devices dropped, name/namespace from ``ref``,
          ``abortedAt`` now) so a Prepare retry still in flight cannot re-create the claim's
          state, then delete the CDI spec. `expire_aborted` drops the tombstone later.

        Undoing removes the node label when this was the domain's last channel claim here and
        the per-domain dir when it was the last daemon claim (Aborted entries do not count).
        """
        del deadline  # every step is a bounded single API call
        with self._lock.held():
            self._unprepare_locked(ref)
        log.log(V(1), "Unprepared devices for claim '%s'", ref)

    def _unprepare_locked(self, ref: ClaimRef) -> None:
        """`unprepare` with the node lock held."""
        text = str(ref)
        entries = self._store.entries()
        entry = entries.pop(ref.uid, None)
        before_reboot = self._store.take_previous_boot(ref.uid)
        if entry is None:
            if before_reboot is not None:  # its label and domain dir outlived the reboot
                self._undo_targets(ref, before_reboot.targets, entries.values())
                log.log(V(2), "Unprepared claim of a previous boot: %s", text)
            else:
                log.log(V(2), "Unprepare noop: claim not found in checkpoint data: %s", text)
            self._cdi.delete_claim_spec(ref.uid)  # also covers entries lost to corruption
            return
        if entry.state == ClaimState.PREPARE_ABORTED:
            log.log(V(2), "Unprepare noop: claim in PrepareAborted state: %s", text)
            return
        self._undo_targets(ref, entry.targets, entries.values())
        if entry.state == ClaimState.PREPARE_COMPLETED:
            self._remove(ref.uid)
            log.log(V(6), "Deleted claim from checkpoint: %s", text)
            self._cdi.delete_claim_spec(ref.uid)
            return
        aborted = ClaimEntry(
            uid=ref.uid,
            state=ClaimState.PREPARE_ABORTED,
            status=entry.status,
            namespace=ref.namespace or entry.namespace,
            name=ref.name or entry.name,
            aborted_at=go_time(self._now()),
        )
        self._put(aborted)
        log.log(V(6), "Marked claim PrepareAborted in checkpoint: %s", text)
        self._cdi.delete_claim_spec(ref.uid)

    def expire_aborted(self, *, ttl: float) -> int:
        """Delete PrepareAborted entries aborted ``ttl`` seconds ago or more (or with no
        ``abortedAt``); returns how many. Takes the node lock."""
        now = self._now()
        with self._lock.held():
            expired = [
                uid
                for uid, e in self._store.entries().items()
                if e.state == ClaimState.PREPARE_ABORTED
                and (e.aborted_at is None or now - parse_go_time(e.aborted_at) >= ttl)
            ]
            for uid in expired:
                self._remove(uid)
        return len(expired)

    def _undo_targets(
        self, ref: ClaimRef, targets: Iterable[tuple[str, str]], others: Iterable[ClaimEntry]
    ) -> None:
        """Remove the node label / domain dir of ``targets`` no other live claim still needs."""
        live = [e for e in others if e.uid != ref.uid and e.state != ClaimState.PREPARE_ABORTED]
        for target in targets:
            kind, domain_id = target
            if not domain_id or any(target in e.targets for e in live):
                continue  # another claim of this domain still needs it
            if kind == "channel":
                if self._host_imex is None:  # host-managed mode sets no label
                    self._domains.remove_node_label(domain_id)
                continue
            try:
                path = self._domain_dir(domain_id)
            except ValueError as err:  # a hand-edited or foreign checkpoint: remove nothing
                log.warning("claim %s: not removing a domain directory: %s", ref.uid, err)
                continue
            shutil.rmtree(path, ignore_errors=True)

    # -- checkpoint helpers (node lock held) ------------------------------------------------------

    def _put(self, entry: ClaimEntry) -> None:
        self._store.put(entry)
        self._on_change(list(self._store.entries().values()))

    def _remove(self, uid: str) -> None:
        self._store.remove(uid)
        self._on_change(list(self._store.entries().values()))
