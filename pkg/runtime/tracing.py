"""OpenTelemetry tracing that costs nothing unless the standard ``OTEL_*`` env asks for it.

Owns the choice of exporters, the W3C ``traceparent`` handling every component uses to join a
ComputeDomain's formation trace, and the one way to emit a span whose ids were chosen earlier
(the domain's root span, whose ids the controller writes into the domain before the span
exists).

Exporters (``OTEL_TRACES_EXPORTER``, comma separated, default ``otlp``):

* ``otlp``: OTLP/HTTP, batched; only when ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
  ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (the exporter reads endpoint, headers, timeout from
  the same ``OTEL_*`` variables);
* ``console``: each span as JSON on stdout when it ends (the SDK's console exporter);
* ``file``: this driver's addition: each span as one line of JSON appended to the file named
  by ``OTEL_EXPORTER_FILE_TRACES_PATH`` when it ends (several processes may share one file:
  every batch is written with one ``write`` under an exclusive ``flock``);
* ``none``: nothing.

Invariants: with no usable exporter (or ``OTEL_SDK_DISABLED=true``) the SDK is not even
imported (only the light OpenTelemetry API is), nothing is exported and no thread is started;
the global tracer provider is never replaced (the :class:`Tracing` is handed to its users
explicitly); ``shutdown()`` flushes pending spans and is idempotent.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from pkg.api import constants as c

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from pkg.runtime.tracingsdk import PresetIds

__all__ = [
    "FILE_PATH_VAR",
    "FormationIds",
    "Tracing",
    "child_span",
    "epoch_ns",
    "exporter_names",
    "new_traceparent",
    "parent_context",
    "parse_traceparent",
    "setup_tracing",
    "traceparent_of",
]

log = logging.getLogger(__name__)

_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
FILE_PATH_VAR = "OTEL_EXPORTER_FILE_TRACES_PATH"

_PROPAGATOR = TraceContextTextMapPropagator()


@dataclass(frozen=True)
class FormationIds:
    """The ids of a span announced before it is emitted."""

    trace_id: int
    span_id: int

    def traceparent(self) -> str:
        """W3C ``traceparent`` (version 00, sampled) naming this span as parent."""
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-01"


def new_traceparent() -> str:
    """A fresh, sampled ``traceparent`` for a span that will be emitted later."""
    rng = random.SystemRandom()
    trace_id = rng.getrandbits(128) or 1
    span_id = rng.getrandbits(64) or 1
    return FormationIds(trace_id, span_id).traceparent()


def parse_traceparent(value: str | None) -> FormationIds | None:
    """The ids in a W3C ``traceparent``; None when absent or malformed."""
    ctx = parent_context(value)
    if ctx is None:
        return None
    span_context = trace.get_current_span(ctx).get_span_context()
    return FormationIds(span_context.trace_id, span_context.span_id)


def parent_context(value: str | None) -> Context | None:
    """A context whose (remote) parent is the span named by ``traceparent``; None if invalid."""
    if not value:
        return None
    ctx = _PROPAGATOR.extract({"traceparent": value.strip()})
    if not trace.get_current_span(ctx).get_span_context().is_valid:
        return None
    return ctx


def traceparent_of(obj: Mapping[str, Any]) -> str | None:
    """A ComputeDomain's formation ``traceparent`` annotation, if any."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(c.TRACEPARENT_ANNOTATION)
    return str(value) if value else None


@contextmanager
def child_span(
    tracer: trace.Tracer,
    parent: Context | None,
    name: str,
    *,
    now: Callable[[], float],
    attributes: Mapping[str, str | int | float | bool] | None = None,
) -> Iterator[trace.Span]:
    """A span under ``parent`` around the block, timed by ``now`` (epoch seconds); an
    exception is recorded on it and re-raised.

    Yields :data:`opentelemetry.trace.INVALID_SPAN` (records nothing) when ``parent`` is None
    or names no valid span, so a caller can nest spans under the yielded one
    (``trace.set_span_in_context(span)``) without checking whether tracing is on.
    """
    if parent is None or not trace.get_current_span(parent).get_span_context().is_valid:
        yield trace.INVALID_SPAN
        return
    span = tracer.start_span(
        name, context=parent, start_time=epoch_ns(now()), attributes=dict(attributes or {})
    )
    try:
        yield span
    except BaseException as exc:
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, str(exc)))
        raise
    finally:
        span.end(end_time=epoch_ns(now()))


def epoch_ns(seconds: float) -> int:
    """Epoch seconds as the integer nanoseconds span timestamps use."""
    return int(seconds * 1e9)


class Tracing:
    """A tracer plus the means to emit pre-announced spans and to flush on exit."""

    def __init__(
        self,
        tracer: trace.Tracer,
        *,
        provider: object | None = None,
        preset: PresetIds | None = None,
    ) -> None:
        self.tracer = tracer
        self._provider = provider
        self._preset = preset

    @classmethod
    def with_exporters(
        cls,
        service_name: str,
        exporters: Sequence[SpanExporter] = (),
        *,
        batched: Sequence[SpanExporter] = (),
    ) -> Tracing:
        """An SDK-backed Tracing: ``exporters`` get each span when it ends, ``batched`` in
        batches from a background thread."""
        from pkg.runtime.tracingsdk import build_provider  # noqa: PLC0415  (only when tracing)

        provider, preset = build_provider(service_name, exporters, batched)
        return cls(provider.get_tracer(service_name), provider=provider, preset=preset)

    @property
    def enabled(self) -> bool:
        return self._provider is not None

    def emit_preannounced(
        self,
        name: str,
        ids: FormationIds,
        *,
        start: float,
        end: float,
        attributes: Mapping[str, str | int | float | bool] | None = None,
    ) -> None:
        """Emit a finished root span with exactly ``ids``, from ``start`` to ``end`` (epoch s).

        This is how a span whose children were created first (elsewhere, from its
        ``traceparent``) is recorded once its end is known. A no-op when tracing is off.
        """
        if self._preset is None:
            return
        with self._preset.using(ids):
            span = self.tracer.start_span(
                name,
                context=Context(),
                start_time=epoch_ns(start),
                attributes=dict(attributes or {}),
            )
        span.end(end_time=epoch_ns(max(end, start)))

    def shutdown(self) -> None:
        provider, self._provider = self._provider, None
        shutdown = getattr(provider, "shutdown", None)
        if callable(shutdown):
            shutdown()


def exporter_names(env: Mapping[str, str]) -> list[str]:
    """The exporters ``env`` asks for and can have (``otlp`` needs an endpoint, ``file`` a
    path), in order; empty when tracing is off. Unknown names are warned about and dropped.
    Reads only the environment: nothing of the SDK is imported."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = [
        n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if n.strip()
    ]
    if "none" in names:
        return []
    usable: list[str] = []
    for name in names:
        if name == "otlp":
            if any(env.get(var, "").strip() for var in _ENDPOINT_VARS):
                usable.append(name)
        elif name == "console":
            usable.append(name)
        elif name == "file":
            if env.get(FILE_PATH_VAR, "").strip():
                usable.append(name)
            else:
                log.warning("OTEL_TRACES_EXPORTER=file needs %s; ignored", FILE_PATH_VAR)
        else:
            log.warning("OTEL_TRACES_EXPORTER %r is not supported; ignored", name)
    return usable


def setup_tracing(service_name: str, *, env: Mapping[str, str]) -> Tracing:
    """A no-op :class:`Tracing` unless ``env`` configures an exporter (module docstring); the
    SDK (`pkg.runtime.tracingsdk`) is imported only then."""
    names = exporter_names(env)
    if not names:
        return Tracing(trace.NoOpTracer())
    from pkg.runtime.tracingsdk import build_exporters  # noqa: PLC0415  (only when tracing)

    simple, batched = build_exporters(names, env)
    service = env.get("OTEL_SERVICE_NAME") or service_name
    log.info("tracing enabled service=%s", service)
    return Tracing.with_exporters(service, simple, batched=batched)
