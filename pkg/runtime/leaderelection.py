"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

Owns the Lease record this process writes and the decision "am I the leader". Invariants:

* every write is an optimistic-concurrency update carrying the ``resourceVersion`` it read, so
  two candidates can never both believe they acquired the same term (409 = someone else won);
* another holder's lease is judged valid on the *local* monotonic clock: it expires
  ``leaseDurationSeconds`` after this process last saw the record change, never by comparing
  the holder's ``renewTime`` with our wall clock, so clock skew between hosts is harmless;
* ``acquireTime``/``renewTime`` are written as MicroTime with exactly six fractional digits
  (Go's parser rejects anything else, which Python's ``isoformat`` produces whenever the
  microsecond is zero);
* no error escapes the loops: an API error, a dropped connection or a client-side timeout
  (:data:`pkg.kube.errors.TRANSIENT_ERRORS`) is one failed attempt, retried every
  ``retry_period``; anything unexpected is logged and counted the same way, so an API server
  that is away for less than ``renew_deadline`` never costs the lease;
* a leader that cannot renew within ``renew_deadline`` steps down (``on_stopped_leading``) and
  never renews that term again; :meth:`LeaderElector.run_terms` then campaigns again, so the
  process leads again as soon as it wins the lease; on a clean stop it releases the lease
  (empty holder) so a successor need not wait for it to expire.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from pkg.base.clock import Clock
from pkg.base.types import JSON
from pkg.kube.errors import (
    TRANSIENT_ERRORS,
    AlreadyExistsError,
    ApiError,
    ConflictError,
    NotFoundError,
)
from pkg.kube.resources import LEASES, Resource

__all__ = ["LeaderElectionConfig", "LeaderElector", "LeaseClient", "format_micro_time"]

log = logging.getLogger(__name__)

JITTER_FACTOR = 1.2
_FAILURES: tuple[type[Exception], ...] = (ApiError, *TRANSIENT_ERRORS)


def format_micro_time(epoch: float) -> str:
    """``metav1.MicroTime`` wire format: always six fractional digits, UTC ``Z``."""
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseClient(Protocol):
    """The part of :class:`pkg.kube.client.KubeClient` leader election needs."""

    def get(
        self,
        resource: Resource,
        name: str,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> JSON: ...

    def create(self, resource: Resource, obj: JSON, *, namespace: str | None = None) -> JSON: ...

    def update(self, resource: Resource, obj: JSON, *, subresource: str | None = None) -> JSON: ...


@dataclass(frozen=True)
class LeaderElectionConfig:
    """Where the lock lives, who we are, and client-go's three timing knobs (seconds)."""

    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    release_on_cancel: bool = True

    def validate(self) -> None:
        if not self.identity:
            raise ValueError("leader election identity must not be empty")
        if self.lease_duration <= self.renew_deadline:
            raise ValueError("leader election: lease duration must exceed renew deadline")
        if self.renew_deadline <= JITTER_FACTOR * self.retry_period:
            raise ValueError(
                f"leader election: renew deadline must exceed {JITTER_FACTOR} x retry period"
            )


class LeaderElector:
    """Acquires, renews and releases one Lease; thread-compatible (one ``run`` at a time)."""

    def __init__(
        self,
        client: LeaseClient,
        config: LeaderElectionConfig,
        *,
        clock: Clock,
        rng: random.Random | None = None,
    ) -> None:
        config.validate()
        self._client = client
        self._config = config
        self._clock = clock
        self._rng = rng or random.Random()
        self._observed_spec: JSON | None = None
        self._observed_rv: str | None = None
        self._written: JSON | None = None  # the Lease as our last successful write returned it
        self._observed_at = 0.0
        self._leading = False
        self._lock = threading.Lock()

    @property
    def identity(self) -> str:
        return self._config.identity

    def is_leader(self) -> bool:
        with self._lock:
            return self._leading

    def observed_holder(self) -> str:
        """The holder of the lease as last read ("" when none)."""
        spec = self._observed_spec or {}
        return str(spec.get("holderIdentity") or "")

    # -- one step ------------------------------------------------------------------------------

    def try_acquire_or_renew(self) -> bool:
        """One attempt; returns whether we hold the lease afterwards.

        Never raises an API, connection or timeout error: each is logged as a failed attempt.
        """
        cfg = self._config
        now_wall = self._clock.now()
        if self._renew_optimistically(now_wall):
            return True
        try:
            lease = self._client.get(LEASES, cfg.name, namespace=cfg.namespace)
        except NotFoundError:
            return self._create(now_wall)
        except _FAILURES as exc:
            log.warning("lease get failed lease=%s/%s error=%s", cfg.namespace, cfg.name, exc)
            return False
        spec: JSON = dict(lease.get("spec") or {})
        rv = str(lease.get("metadata", {}).get("resourceVersion", ""))
        if spec != self._observed_spec or rv != self._observed_rv:
            self._observed_spec, self._observed_rv = spec, rv
            self._observed_at = self._clock.monotonic()
        holder = str(spec.get("holderIdentity") or "")
        duration = float(spec.get("leaseDurationSeconds") or cfg.lease_duration)
        if (
            holder
            and holder != cfg.identity
            and self._observed_at + duration > self._clock.monotonic()
        ):
            return False
        stamp = format_micro_time(now_wall)
        new_spec = dict(spec)
        new_spec.update(
            holderIdentity=cfg.identity,
            leaseDurationSeconds=int(cfg.lease_duration),
            renewTime=stamp,
        )
        if holder != cfg.identity:
            new_spec["acquireTime"] = stamp
            new_spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        body = dict(lease)
        body["spec"] = new_spec
        return self._write(lambda: self._client.update(LEASES, body))

    def _renew_optimistically(self, now_wall: float) -> bool:
        """While leading, renew with one PUT of our last write (client-go's fast path).

        Saves the GET of every renewal. Only tried while our own record is still valid by
        our clock; any failure (409 when someone else wrote, or an API error) falls back to
        the GET-then-update path, which decides from what the server holds.
        """
        cfg = self._config
        written = self._written
        if written is None or not self.is_leader():
            return False
        spec = dict(written.get("spec") or {})
        if spec.get("holderIdentity") != cfg.identity:
            return False
        if self._observed_at + float(cfg.lease_duration) <= self._clock.monotonic():
            return False
        spec["renewTime"] = format_micro_time(now_wall)
        body = dict(written)
        body["spec"] = spec
        try:
            stored = self._client.update(LEASES, body)
        except (ConflictError, NotFoundError) as exc:
            log.info("lease renewal raced; reading it lease=%s error=%s", cfg.name, exc)
            self._written = None
            return False
        except _FAILURES as exc:
            log.warning("lease renewal failed lease=%s error=%s", cfg.name, exc)
            return False
        self._record_write(stored)
        return True

    def _record_write(self, written: JSON) -> None:
        self._written = written
        self._observed_spec = dict(written.get("spec") or {})
        self._observed_rv = str(written.get("metadata", {}).get("resourceVersion", ""))
        self._observed_at = self._clock.monotonic()

    def _create(self, now_wall: float) -> bool:
        cfg = self._config
        stamp = format_micro_time(now_wall)
        body: JSON = {
            "apiVersion": LEASES.api_version,
            "kind": LEASES.kind,
            "metadata": {"name": cfg.name, "namespace": cfg.namespace},
            "spec": {
                "holderIdentity": cfg.identity,
                "leaseDurationSeconds": int(cfg.lease_duration),
                "acquireTime": stamp,
                "renewTime": stamp,
                "leaseTransitions": 0,
            },
        }
        return self._write(lambda: self._client.create(LEASES, body, namespace=cfg.namespace))

    def _write(self, call: Callable[[], JSON]) -> bool:
        try:
            written = call()
        except (ConflictError, AlreadyExistsError):
            return False
        except _FAILURES as exc:
            log.warning("lease write failed lease=%s error=%s", self._config.name, exc)
            return False
        self._record_write(written)
        return True

    def release(self) -> bool:
        """Give the lease up if we hold it (empty holder, 1 s duration); returns success."""
        cfg = self._config
        try:
            lease = self._client.get(LEASES, cfg.name, namespace=cfg.namespace)
        except _FAILURES as exc:
            log.warning("lease release: get failed error=%s", exc)
            return False
        spec = dict(lease.get("spec") or {})
        if spec.get("holderIdentity") != cfg.identity:
            return True
        stamp = format_micro_time(self._clock.now())
        spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=stamp, acquireTime=stamp)
        body = dict(lease)
        body["spec"] = spec
        released = self._write(lambda: self._client.update(LEASES, body))
        if released:
            with self._lock:
                self._leading = False
            log.info("lease released lease=%s/%s", cfg.namespace, cfg.name)
        return released

    # -- the loop ------------------------------------------------------------------------------

    def _jittered(self, seconds: float) -> float:
        return seconds * (1.0 + self._rng.random() * (JITTER_FACTOR - 1.0))

    def _attempt(self) -> bool:
        """:meth:`try_acquire_or_renew` that also survives an unexpected error (logged)."""
        try:
            return self.try_acquire_or_renew()
        except Exception:
            log.exception(
                "lease attempt failed unexpectedly lease=%s/%s",
                self._config.namespace,
                self._config.name,
            )
            return False

    def acquire(self, stop: threading.Event) -> bool:
        """Block until we lead (True) or ``stop`` is set (False)."""
        cfg = self._config
        log.info(
            "waiting for leadership lease=%s/%s identity=%s", cfg.namespace, cfg.name, cfg.identity
        )
        while not stop.is_set():
            if self._attempt():
                with self._lock:
                    self._leading = True
                log.info(
                    "acquired leadership lease=%s/%s identity=%s",
                    cfg.namespace,
                    cfg.name,
                    cfg.identity,
                )
                return True
            if self._clock.wait(stop, self._jittered(cfg.retry_period)):
                break
        return False

    def renew_until_lost(self, stop: threading.Event) -> bool:
        """Renew every retry period; returns True when ``stop`` was set, False when lost."""
        cfg = self._config
        last_renew = self._clock.monotonic()
        while True:
            if self._clock.wait(stop, cfg.retry_period):
                return True
            if self._attempt():
                last_renew = self._clock.monotonic()
                continue
            if self._clock.monotonic() - last_renew >= cfg.renew_deadline or (
                self.observed_holder() not in ("", cfg.identity)
            ):
                with self._lock:
                    self._leading = False
                log.error(
                    "leadership lost lease=%s/%s identity=%s holder=%s",
                    cfg.namespace,
                    cfg.name,
                    cfg.identity,
                    self.observed_holder(),
                )
                return False

    def run(
        self,
        stop: threading.Event,
        *,
        on_started_leading: Callable[[], None],
        on_stopped_leading: Callable[[], None],
    ) -> bool:
        """Acquire, call ``on_started_leading``, renew; returns False iff leadership was lost.

        ``on_started_leading`` must not block (start workers on their own threads).
        ``on_stopped_leading`` runs whenever we led, whether we were stopped or lost the lease.
        """
        if not self.acquire(stop):
            return True
        on_started_leading()
        kept = False
        try:
            kept = self.renew_until_lost(stop)
        finally:
            on_stopped_leading()
            if kept and self._config.release_on_cancel:
                self.release()
        return kept

    def run_terms(
        self,
        stop: threading.Event,
        *,
        on_started_leading: Callable[[], None],
        on_stopped_leading: Callable[[], None],
    ) -> int:
        """:meth:`run` until ``stop`` is set, campaigning again after every lost term.

        Returns how many terms were lost. The callbacks run once per term, in pairs, so each
        term can build its state afresh and tear it down completely before the next one.
        """
        lost = 0
        while not stop.is_set():
            if self.run(
                stop, on_started_leading=on_started_leading, on_stopped_leading=on_stopped_leading
            ):
                return lost
            lost += 1
            cfg = self._config
            log.warning(
                "stepped down; campaigning again lease=%s/%s identity=%s",
                cfg.namespace,
                cfg.name,
                cfg.identity,
            )
        return lost
