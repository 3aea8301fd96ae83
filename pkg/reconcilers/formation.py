"""The controller's part of a ComputeDomain's formation trace (one trace per domain).

Owns the trace-context annotation ``resource.nvidia.com/traceparent`` and the spans the
controller contributes. The annotation names the domain's *root* span (creation → first Ready)
before that span exists; kubelet plugins and IMEX daemons parent their spans to it, and the
controller emits the root itself, with exactly those ids, when it writes the first Ready.

Invariants:

* the annotation costs no write of its own: it rides on the write that adds our finalizer, and
  only when tracing is on; a domain that has our finalizer but no annotation (created while
  tracing was off) is never traced, and an existing annotation is never replaced;
* child spans (``ensure dependents``, ``write status``) are recorded only while the domain is
  not Ready, each parented to the root and linked to the reconcile span that did the work;
* the root span is emitted when this process writes the domain's first Ready status (exactly
  when the time-to-ready histogram is observed, see :mod:`pkg.reconcilers.metrics`), from the
  domain's ``creationTimestamp`` to that write; so at most once per domain per leader term (a
  new leader that sees a formed domain lose and regain Ready emits it again, with the same ids);
* with tracing off every method is a no-op and nothing is allocated per domain.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.trace import Link, Status, StatusCode

from pkg.api import constants as c
from pkg.base.clock import Clock
from pkg.base.types import JSON
from pkg.reconcilers.metrics import parse_timestamp
from pkg.runtime.tracing import (
    Tracing,
    epoch_ns,
    new_traceparent,
    parent_context,
    parse_traceparent,
    traceparent_of,
)

__all__ = ["ROOT_SPAN_NAME", "FormationTracer"]

ROOT_SPAN_NAME = "ComputeDomain formation"

Attributes = Mapping[str, str | int | float | bool]


def _domain_attributes(obj: JSON) -> dict[str, str]:
    meta = obj.get("metadata") or {}
    return {
        "k8s.namespace.name": str(meta.get("namespace", "")),
        "computedomain.name": str(meta.get("name", "")),
        "computedomain.uid": str(meta.get("uid", "")),
    }


class FormationTracer:
    """Annotation, child spans and root span of ComputeDomain formation traces."""

    def __init__(self, tracing: Tracing | None, *, clock: Clock) -> None:
        self._tracing = tracing if tracing is not None and tracing.enabled else None
        self._clock = clock

    @property
    def enabled(self) -> bool:
        return self._tracing is not None

    def annotate(self, body: JSON) -> None:
        """Add a fresh ``traceparent`` annotation to ``body`` (a domain about to be written)
        unless tracing is off or it has one."""
        if self._tracing is None or traceparent_of(body):
            return
        meta = body.setdefault("metadata", {})
        annotations = dict(meta.get("annotations") or {})
        annotations[c.TRACEPARENT_ANNOTATION] = new_traceparent()
        meta["annotations"] = annotations

    @contextmanager
    def span(
        self, obj: JSON, name: str, attributes: Attributes | None = None
    ) -> Iterator[trace.Span | None]:
        """A child span of the domain's root around the block while the domain is not Ready;
        yields None (and records nothing) otherwise."""
        parent = parent_context(traceparent_of(obj)) if self._tracing is not None else None
        forming = (obj.get("status") or {}).get("status") != c.STATUS_READY
        if self._tracing is None or parent is None or not forming:
            yield None
            return
        current = trace.get_current_span().get_span_context()
        span = self._tracing.tracer.start_span(
            name,
            context=parent,
            start_time=epoch_ns(self._clock.now()),
            attributes={**_domain_attributes(obj), **(attributes or {})},
            links=[Link(current)] if current.is_valid else None,
        )
        try:
            yield span
        except Exception as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, str(exc)))
            raise
        finally:
            span.end(end_time=epoch_ns(self._clock.now()))

    def finish(self, obj: JSON, *, ready_at: float, attributes: Attributes | None = None) -> bool:
        """Emit the domain's root span (creation → ``ready_at``); False when there is none to
        emit (tracing off, no or a malformed annotation, no creation time)."""
        if self._tracing is None:
            return False
        ids = parse_traceparent(traceparent_of(obj))
        meta = obj.get("metadata") or {}
        created = parse_timestamp(str(meta.get("creationTimestamp", "")))
        if ids is None or created is None:
            return False
        self._tracing.emit_preannounced(
            ROOT_SPAN_NAME,
            ids,
            start=created,
            end=ready_at,
            attributes={**_domain_attributes(obj), **(attributes or {})},
        )
        return True
