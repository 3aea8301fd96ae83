"""The Prepare/Unprepare fan-out: from the kubelet's claim references to a driver's hooks.

Owns what upstream's ``kubeletplugin`` helper does between the gRPC servicer and the driver, so
that a driver only implements `ClaimDriver` ("prepare this claim", "unprepare this claim"):

* duplicates in a request are answered once, every requested UID gets exactly one entry, an
  empty request gets an empty answer (without counting as a request);
* claims of one request run in parallel on a bounded pool (one claim runs inline), all against
  one deadline: ``budget`` seconds from the request's start on the injected monotonic clock;
* Prepare validates each reference (`pkg.draplugin.claims.ClaimRef.validate`), fetches the
  ResourceClaim (`pkg.draplugin.claims.fetch_claim`: exists, same UID, allocated) and hands the
  *whole object* to the driver; Unprepare only validates the UID and hands the reference on
  (the claim may be gone by then);
* any exception of a claim becomes that claim's error text (`pkg.draplugin.errors`:
  upstream's ``error (un)preparing devices for claim '<ns>/<name>:<uid>': <class>: ...``),
  logged at WARNING (a crash with its traceback) and reported to the `RequestObserver`;
* each claim runs inside a ``NodePrepareResource`` / ``NodeUnprepareResource`` span of the
  injected tracer.

Thread-safety: `ClaimFanOut.prepare_claims` and `ClaimFanOut.unprepare_claims` are called
concurrently by gRPC worker threads; the driver's hooks therefore run concurrently too, for
different claims and - if the kubelet repeats itself - for the same claim.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol, TypeVar

from opentelemetry import trace

from pkg.base.types import JSON
from pkg.draplugin.claims import ClaimRef, fetch_claim
from pkg.draplugin.errors import (
    ClaimError,
    is_permanent,
    prepare_error_text,
    unprepare_error_text,
)
from pkg.draplugin.server import Device, PrepareOutcome
from pkg.kube.client import KubeClient

log = logging.getLogger(__name__)

_R = TypeVar("_R")


class ClaimDriver(Protocol):
    """What a DRA driver implements: the per-claim work. Must be thread-safe (see module)."""

    def prepare_claim(self, claim: JSON, *, deadline: float) -> Sequence[Device]:
        """Prepare one allocated ResourceClaim (the whole object, UID already checked) and
        return its devices (empty: nothing in the claim is this driver's).

        Must be idempotent (the kubelet retries) and should finish by ``deadline`` (injected
        monotonic clock). Raise `pkg.draplugin.errors.PermanentError` or `RetryableError` to
        fail the claim; any other exception counts as a retryable internal error.
        """
        ...

    def unprepare_claim(self, claim: ClaimRef, *, deadline: float) -> None:
        """Undo everything prepared for ``claim``; unknown claims must succeed. Errors as for
        `prepare_claim`."""
        ...


class RequestObserver(Protocol):
    """Metrics hooks of the fan-out; ``operation`` is ``"prepare"`` or ``"unprepare"``."""

    def track(self, operation: str) -> AbstractContextManager[object]:
        """A context spanning one non-empty request (count, in-flight, duration)."""
        ...

    def claim_failed(self, operation: str, *, permanent: bool) -> None:
        """One claim of a request failed; ``permanent`` as `pkg.draplugin.errors.is_permanent`."""
        ...


class _NoObserver:
    def track(self, operation: str) -> AbstractContextManager[object]:
        return nullcontext()

    def claim_failed(self, operation: str, *, permanent: bool) -> None:
        pass


class ClaimFanOut:
    """Implements `pkg.draplugin.server.ClaimHandler` on top of a `ClaimDriver`."""

    def __init__(
        self,
        *,
        driver: ClaimDriver,
        client: KubeClient,
        monotonic: Callable[[], float] = time.monotonic,
        tracer: trace.Tracer | None = None,
        observer: RequestObserver | None = None,
        max_workers: int = 16,
    ) -> None:
        """``client`` reads the ResourceClaims; ``monotonic`` is the injected clock the
        deadlines are on; ``tracer`` records per-claim spans (default: none); ``observer``
        receives metrics hooks (default: none); ``max_workers`` bounds parallel claims."""
        self._driver = driver
        self._client = client
        self._monotonic = monotonic
        self._tracer = tracer or trace.NoOpTracer()
        self._observer: RequestObserver = observer or _NoObserver()
        self._pool = futures.ThreadPoolExecutor(max_workers, "claim")

    def shutdown(self) -> None:
        """Stop the worker pool without waiting; queued claims are cancelled. Call once, after
        the DRA server stopped."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _fan_out(self, claims: Sequence[ClaimRef], one: Callable[[ClaimRef], _R]) -> dict[str, _R]:
        unique = list({c.uid: c for c in claims}.values())
        if len(unique) <= 1:
            return {c.uid: one(c) for c in unique}
        jobs = {c.uid: self._pool.submit(one, c) for c in unique}
        return {uid: job.result() for uid, job in jobs.items()}

    def prepare_claims(
        self, claims: Sequence[ClaimRef], *, budget: float
    ) -> dict[str, PrepareOutcome]:
        """One `PrepareOutcome` per distinct UID in ``claims``; never raises for a claim's
        failure. Blocks until every claim is done (the driver honours the deadline)."""
        if not claims:
            return {}
        deadline = self._monotonic() + budget
        with self._observer.track("prepare"):
            return self._fan_out(claims, lambda c: self._prepare_one(c, deadline))

    def _prepare_one(self, ref: ClaimRef, deadline: float) -> PrepareOutcome:
        with self._tracer.start_as_current_span(
            "NodePrepareResource",
            attributes={
                "claim.uid": ref.uid,
                "claim.namespace": ref.namespace,
                "claim.name": ref.name,
            },
        ) as span:
            try:
                ref.validate()
                with self._tracer.start_as_current_span("get ResourceClaim"):
                    claim = fetch_claim(self._client, ref)
                devices = self._driver.prepare_claim(claim, deadline=deadline)
                return PrepareOutcome(devices=tuple(devices))
            except Exception as err:
                permanent = is_permanent(err)
                self._observer.claim_failed("prepare", permanent=permanent)
                text = prepare_error_text(str(ref), err)
                if permanent:
                    # Upstream's wording: runbooks and its e2e tests grep for it.
                    log.warning("Permanent error preparing devices for claim %s: %s", ref.uid, err)
                elif isinstance(err, ClaimError):
                    log.warning("prepare %s: %s", ref, text)
                else:
                    log.exception("prepare %s/%s (%s) crashed", ref.namespace, ref.name, ref.uid)
                span.record_exception(err)
                return PrepareOutcome(error=text)

    def unprepare_claims(self, claims: Sequence[ClaimRef], *, budget: float) -> dict[str, str]:
        """One error text per distinct UID in ``claims`` (``""`` = unprepared); never raises
        for a claim's failure."""
        if not claims:
            return {}
        deadline = self._monotonic() + budget
        with self._observer.track("unprepare"):
            return self._fan_out(claims, lambda c: self._unprepare_one(c, deadline))

    def _unprepare_one(self, ref: ClaimRef, deadline: float) -> str:
        with self._tracer.start_as_current_span(
            "NodeUnprepareResource", attributes={"claim.uid": ref.uid}
        ):
            try:
                ref.validate(uid_only=True)
                self._driver.unprepare_claim(ref, deadline=deadline)
                return ""
            except Exception as err:
                self._observer.claim_failed("unprepare", permanent=is_permanent(err))
                text = unprepare_error_text(str(ref), err)
                if is_permanent(err):
                    log.warning(
                        "Permanent error unpreparing devices for claim %s: %s", ref.uid, err
                    )
                else:
                    log.warning("unprepare %s failed: %s", ref, text)
                return text
