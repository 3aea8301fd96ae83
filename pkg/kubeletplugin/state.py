"""DeviceState: prepare/unprepare orchestration for one node.

Owns the order of side effects for a claim and the locking around them:

1. take the claim the library fetched (`pkg.draplugin.claims.fetch_claim`: allocated, same
   UID), pick our driver's results, strictly decode the opaque configs (``domainID`` must be a
   UID) and refuse a daemon claim outside the driver namespace - failures here are permanent and
   have no side effects (no checkpoint entry, directory or CDI spec);
2. under the node lock: return the checkpointed devices if the claim is PrepareCompleted;
   refuse a second channel claim (channel 0 is node-exclusive) and any device another claim
   already holds, e.g. ``daemon-0`` (both retryable); record PrepareStarted with the claim's
   status (the Go driver's checkpoint shape, see `checkpoint`);
3. without the lock: domain checks (exists, same namespace: permanent), node label
   (retryable on conflict) and the event-driven wait for this node's IMEX daemon (retryable on
   timeout). The label and the Started record are kept on a retryable error - the daemon can only
   come up *because* of the label;
4. under the node lock: write the CDI spec and record PrepareCompleted with the devices.

Unprepare (idempotent) removes the label if this was the domain's last channel claim here, the
per-domain dir if it was the last daemon claim, the CDI spec and finally the checkpoint entry --
for entries either driver wrote: what to undo comes from the entry's device groups, or for a
PrepareStarted entry from the configs in its stored claim status.
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
from typing import Protocol

from opentelemetry import trace
from opentelemetry.context import Context

from pkg.api.opaque import ChannelConfig, DaemonConfig
from pkg.base.types import JSON
from pkg.draplugin.claims import ClaimRef
from pkg.draplugin.errors import PermanentError, RetryableError
from pkg.kube.client import KubeClient
from pkg.kube.errors import ApiError, NotFoundError
from pkg.kube.resources import RESOURCE_CLAIMS
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
from pkg.kubeletplugin.claims import requested_devices, resolve_claim_config
from pkg.kubeletplugin.gojson import SchemaError
from pkg.kubeletplugin.procdevices import DeviceNode
from pkg.runtime.tracing import (
    TRACEPARENT_ENV,
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


class Domains(Protocol):
    """What DeviceState needs from `computedomains.DomainTracker`."""

    def get_domain(self, uid: str, *, deadline: float) -> JSON | None: ...
    def add_node_label(self, cd_uid: str) -> None: ...
    def remove_node_label(self, cd_uid: str) -> None: ...
    def wait_ready(self, cd_uid: str, *, deadline: float) -> bool: ...


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


class DeviceState:
    def __init__(
        self,
        *,
        client: KubeClient,
        store: CheckpointStore,
        cdi: CdiWriter,
        domains: Domains,
        lock: NodeLock,
        setup: NodeSetup,
        monotonic: Callable[[], float] = time.monotonic,
        on_checkpoint_change: Callable[[list[ClaimEntry]], None] = lambda _entries: None,
        tracer: trace.Tracer | None = None,
        now: Callable[[], float] = time.time,
    ) -> None:
        """``tracer`` records Prepare's part of each domain's formation trace (spans under the
        domain's ``traceparent`` annotation; none without one); ``now`` times those spans."""
        self._client = client
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
        """Clean what a previous boot or a crash left behind (see module and checkpoint docs)."""
        for entry in report.dropped_other_boot:
            self._cdi.delete_claim_spec(entry.uid)
        self.collect_stale(deadline=self._monotonic() + 20.0)

    def collect_stale(self, *, deadline: float) -> None:
        """Unprepare PrepareStarted entries whose claim is gone or was replaced (new UID)."""
        with self._lock.held():
            started = [
                e for e in self._store.entries().values() if e.state == ClaimState.PREPARE_STARTED
            ]
        for entry in started:
            if not entry.name:
                continue  # written without a name (older Go driver): cannot look it up
            try:
                claim = self._client.get(RESOURCE_CLAIMS, entry.name, namespace=entry.namespace)
                gone = (claim.get("metadata") or {}).get("uid") != entry.uid
            except NotFoundError:
                gone = True
            except ApiError as err:
                log.warning("stale-entry check for claim %s failed: %s", entry.uid, err)
                continue
            if gone:
                log.info("unpreparing stale PrepareStarted claim %s/%s (%s)",
                         entry.namespace, entry.name, entry.uid)  # fmt: skip
                self.unprepare(ClaimRef(entry.namespace, entry.uid, entry.name), deadline=deadline)

    def entries(self) -> dict[str, ClaimEntry]:
        """A snapshot of the checkpoint entries, read under the node lock."""
        with self._lock.held():
            return self._store.entries()

    # -- prepare --------------------------------------------------------------------------------

    def prepare(self, claim: JSON, *, deadline: float) -> tuple[PreparedDevice, ...]:
        """Prepare one allocated ResourceClaim (the whole object, as the library fetched it);
        raises `ClaimError` (permanent or retryable).

        Idempotent: a claim already PrepareCompleted (by either driver) gets its recorded
        devices back without any side effect.
        """
        ref = ClaimRef.of(claim)
        resolved = resolve_claim_config(claim)
        if resolved is None:
            return ()  # nothing of ours in this claim
        result, config = resolved
        kind = "channel" if isinstance(config, ChannelConfig) else "daemon"
        if kind == "daemon" and ref.namespace != self._setup.driver_namespace:
            # Before any side effect: the daemon device carries the node's IMEX management
            # device and a read-write host directory (issue 33).
            raise PermanentError(
                "ComputeDomain daemon claims are only prepared in the driver namespace "
                f"{self._setup.driver_namespace}"
            )
        try:
            status = canonical_status(claim.get("status"))
        except SchemaError as err:
            raise PermanentError(f"cannot record the claim's status: {err}") from err
        with self._tracer.start_as_current_span("record PrepareStarted"), self._lock.held():
            entries = self._store.entries()
            existing = entries.get(ref.uid)
            if existing is not None and existing.state == ClaimState.PREPARE_COMPLETED:
                return existing.devices
            self._assert_not_held(ref, kind, requested_devices(status), entries.values())
            started = ClaimEntry(
                uid=ref.uid, state=ClaimState.PREPARE_STARTED, status=status,
                namespace=ref.namespace, name=ref.name,
            )  # fmt: skip
            self._put(started)
        try:
            domain = self._domains.get_domain(config.domain_id, deadline=deadline)
            if domain is None:
                raise PermanentError(f"ComputeDomain with UID {config.domain_id} not found")
            with self._span(
                parent_context(traceparent_of(domain)), f"prepare {kind} claim",
                {"claim.uid": ref.uid, "claim.namespace": ref.namespace, "claim.name": ref.name},
            ) as span:  # fmt: skip
                parent = trace.set_span_in_context(span)
                if isinstance(config, ChannelConfig):
                    edits = self._prepare_channel(ref, config, domain, deadline=deadline,
                                                  trace_parent=parent)  # fmt: skip
                else:
                    edits = self._prepare_daemon(config, domain)
        except PermanentError:
            with self._lock.held():
                self._remove(ref.uid)  # nothing was changed yet for permanent failures
            raise
        request = str(result.get("request", ""))
        device_name = str(result.get("device", ""))
        with (
            self._tracer.start_as_current_span("write CDI spec, record PrepareCompleted"),
            self._lock.held(),
        ):
            if ref.uid not in self._store.entries():
                raise RetryableError("claim was unprepared while it was being prepared")
            ids = self._cdi.write_claim_spec(ref.uid, [CdiDevice(device_name, edits)])
            cdi_ids = ([self._base_cdi_id] if kind == "daemon" else []) + list(ids.values())
            devices = (
                PreparedDevice(
                    request_names=(request,) if request else (),
                    pool_name=str(result.get("pool", "")),
                    device_name=device_name,
                    cdi_device_ids=tuple(cdi_ids),
                ),
            )
            self._put(
                ClaimEntry(
                    uid=ref.uid,
                    state=ClaimState.PREPARE_COMPLETED,
                    status=status,
                    groups=(DeviceGroup(kind, config.domain_id, devices),),
                    namespace=ref.namespace,
                    name=ref.name,
                )
            )
        return devices

    def _assert_not_held(
        self, ref: ClaimRef, kind: str, wanted: set[str], entries: Iterable[ClaimEntry]
    ) -> None:
        """Refuse devices another (Started or Completed) claim holds; retryable.

        Channel claims all use IMEX channel 0, so any other channel claim blocks one (upstream
        ``assertImexChannelNotAllocated``); any other overlap of device names -- e.g. a second
        daemon claim for ``daemon-0`` -- is refused like upstream's
        ``validateNoOverlappingPreparedDevices``. adminAccess results never conflict.
        """
        for other in entries:
            if other.uid == ref.uid or other.state == ClaimState.PREPARE_ABORTED:
                continue
            holder = f"{other.namespace}/{other.name} ({other.uid})"
            if kind == "channel" and any(k == "channel" for k, _ in other.targets):
                raise RetryableError(
                    f"IMEX channel 0 on node {self._setup.node_name} is in use by claim {holder}"
                )
            clash = sorted(wanted & other.held_devices())
            if clash:
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

    def _prepare_daemon(self, config: DaemonConfig, domain: JSON) -> ContainerEdits:
        meta = domain.get("metadata") or {}
        try:
            domain_dir = self._domain_dir(config.domain_id)
        except ValueError as err:
            raise PermanentError(str(err)) from err
        domain_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        env: tuple[str, ...] = (
            f"CLIQUE_ID={self._setup.clique_id()}",
            f"COMPUTE_DOMAIN_UUID={meta.get('uid', '')}",
            f"COMPUTE_DOMAIN_NAME={meta.get('name', '')}",
            f"COMPUTE_DOMAIN_NAMESPACE={meta.get('namespace', '')}",
        )
        traceparent = traceparent_of(domain)
        if traceparent and parse_traceparent(traceparent) is not None:
            # The daemon's formation spans join the domain's trace (OTel's env carrier).
            env += (f"{TRACEPARENT_ENV}={traceparent}",)
        mount = {
            "containerPath": "/imexd",
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
        """Undo a claim; unknown claims succeed. Raises `ClaimError` on failure."""
        del deadline  # every step is a bounded single API call
        with self._lock.held():
            entries = self._store.entries()
            entry = entries.pop(ref.uid, None)
            if entry is None:
                self._cdi.delete_claim_spec(ref.uid)  # also covers entries lost to corruption
                return
            for target in entry.targets:
                kind, domain_id = target
                if not domain_id or any(target in e.targets for e in entries.values()):
                    continue  # another claim of this domain still needs it
                if kind == "channel":
                    self._domains.remove_node_label(domain_id)
                    continue
                try:
                    path = self._domain_dir(domain_id)
                except ValueError as err:  # a hand-edited or foreign checkpoint: remove nothing
                    log.warning("claim %s: not removing a domain directory: %s", ref.uid, err)
                    continue
                shutil.rmtree(path, ignore_errors=True)
            self._cdi.delete_claim_spec(ref.uid)
            self._remove(ref.uid)

    # -- checkpoint helpers (node lock held) ------------------------------------------------------

    def _put(self, entry: ClaimEntry) -> None:
        self._store.put(entry)
        self._on_change(list(self._store.entries().values()))

    def _remove(self, uid: str) -> None:
        self._store.remove(uid)
        self._on_change(list(self._store.entries().values()))
