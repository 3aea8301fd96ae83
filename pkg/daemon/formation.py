"""One IMEX daemon's part of its ComputeDomain's formation trace.

Owns the spans a daemon process contributes under the ``traceparent`` the kubelet plugin
injected (CDI env ``TRACEPARENT``): a span ``IMEX daemon`` from :meth:`DaemonFormation.begin`
(process start) to the first time this process published its entry ``Ready``, with children
``join`` (the first write of our entry), ``start IMEX`` (the pass that started the IMEX
process), ``IMEX ready on the node`` (the node-local readiness record written) and ``IMEX
ready`` (IMEX started → ``Ready`` published). All are timed by the
injected clock's wall time.

Invariants: without a valid ``traceparent`` (or with tracing off) nothing is recorded; each
child is recorded at most once per process; the ``IMEX daemon`` span always ends - at Ready, or
with an error status saying why when the process stops (or gives up) first. A daemon
restarted later in the same pod adds a new ``IMEX daemon`` span to the same trace, after the
domain's root span ended, which is how a re-formation shows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from pkg.runtime.tracing import epoch_ns, parent_context

__all__ = ["DaemonFormation"]

Attributes = Mapping[str, str | int | float | bool]


class DaemonFormation:
    """Formation-trace spans of one daemon process (see the module docstring)."""

    def __init__(
        self,
        tracer: trace.Tracer,
        traceparent: str,
        *,
        now: Callable[[], float],
        attributes: Attributes | None = None,
    ) -> None:
        self._tracer = tracer
        self._parent = parent_context(traceparent)
        self._now = now
        self._attributes = dict(attributes or {})
        self._span: trace.Span | None = None
        self._recorded: set[str] = set()
        self._imex_started_at: float | None = None

    @property
    def open(self) -> bool:
        """The ``IMEX daemon`` span is running (begun, not yet ended)."""
        return self._span is not None

    def begin(self) -> None:
        """Start the ``IMEX daemon`` span (once; no-op without a trace to join)."""
        if self._parent is None or self._span is not None or "begin" in self._recorded:
            return
        self._recorded.add("begin")
        self._span = self._tracer.start_span(
            "IMEX daemon",
            context=self._parent,
            start_time=epoch_ns(self._now()),
            attributes=self._attributes,
        )

    def _child(self, name: str, start: float, end: float, attributes: Attributes | None) -> None:
        if self._span is None or name in self._recorded:
            return
        self._recorded.add(name)
        child = self._tracer.start_span(
            name,
            context=trace.set_span_in_context(self._span),
            start_time=epoch_ns(start),
            attributes={**self._attributes, **(attributes or {})},
        )
        child.end(end_time=epoch_ns(max(end, start)))

    def joined(self, start: float, end: float) -> None:
        """Our entry was first written between ``start`` and ``end``."""
        self._child("join", start, end, None)

    def imex_started(self, start: float, end: float) -> None:
        """The pass from ``start`` to ``end`` started the IMEX process."""
        if self._imex_started_at is None:
            self._imex_started_at = end
        self._child("start IMEX", start, end, None)

    def ready_on_node(self, start: float, end: float) -> None:
        """The node-local readiness record was written between ``start`` and ``end``
        (child ``IMEX ready on the node``; the ``IMEX daemon`` span stays open until the entry
        says Ready)."""
        self._child("IMEX ready on the node", start, end, None)

    def ready(self, attributes: Attributes | None = None) -> None:
        """Our entry now says Ready: record ``IMEX ready`` and end the ``IMEX daemon`` span."""
        if self._span is None:
            return
        now = self._now()
        self._child("IMEX ready", self._imex_started_at or now, now, attributes)
        self._end(now, None)

    def end(self, reason: str) -> None:
        """End the ``IMEX daemon`` span before Ready, with an error status naming ``reason``."""
        if self._span is not None:
            self._end(self._now(), reason)

    def _end(self, at: float, error: str | None) -> None:
        span, self._span = self._span, None
        if span is None:
            return
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=epoch_ns(at))
