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

Invariants: with no usable exporter (or ``OTEL_SDK_DISABLED=true``) no SDK object is built,
nothing is exported and no thread is started; the global tracer provider is never replaced
(the :class:`Tracing` is handed to its users explicitly); ``shutdown()`` flushes pending spans
and is idempotent.
"""

from __future__ import annotations

import fcntl
import logging
import os
import random
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from pkg.api import constants as c

__all__ = [
    "FILE_PATH_VAR",
    "TRACEPARENT_ENV",
    "FormationIds",
    "JsonLinesFileExporter",
    "Tracing",
    "child_span",
    "epoch_ns",
    "new_traceparent",
    "parent_context",
    "parse_traceparent",
    "setup_tracing",
    "traceparent_of",
]

log = logging.getLogger(__name__)

_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
FILE_PATH_VAR = "OTEL_EXPORTER_FILE_TRACES_PATH"
TRACEPARENT_ENV = "TRACEPARENT"
"""The environment variable carrying W3C trace context into a process (OTel's env carrier)."""

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
        preset: _PresetIds | None = None,
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
        preset = _PresetIds()
        provider = TracerProvider(
            resource=Resource.create({"service.name": service_name}), id_generator=preset
        )
        for exporter in exporters:
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        for exporter in batched:
            provider.add_span_processor(BatchSpanProcessor(exporter))
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
                name, context=Context(), start_time=epoch_ns(start),
                attributes=dict(attributes or {}),
            )  # fmt: skip
        span.end(end_time=epoch_ns(max(end, start)))

    def shutdown(self) -> None:
        provider, self._provider = self._provider, None
        shutdown = getattr(provider, "shutdown", None)
        if callable(shutdown):
            shutdown()


class _PresetIds(IdGenerator):
    """An SDK IdGenerator that hands out preset ids to the thread inside :meth:`using`."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self._local = threading.local()

    @contextmanager
    def using(self, ids: FormationIds) -> Iterator[None]:
        self._local.ids = ids
        try:
            yield
        finally:
            self._local.ids = None

    def _ids(self) -> FormationIds | None:
        ids: FormationIds | None = getattr(self._local, "ids", None)
        return ids

    def generate_trace_id(self) -> int:
        ids = self._ids()
        return ids.trace_id if ids is not None else self._random.generate_trace_id()

    def generate_span_id(self) -> int:
        ids = self._ids()
        return ids.span_id if ids is not None else self._random.generate_span_id()

    def is_trace_id_random(self) -> bool:
        return True


class JsonLinesFileExporter(SpanExporter):
    """Appends each span as one line of JSON to a file several processes may share."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        data = "".join(span.to_json(indent=None) + "\n" for span in spans).encode()
        try:
            with self._lock:
                fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                finally:
                    os.close(fd)  # also releases the flock
        except OSError as err:
            log.warning("cannot write spans to %s: %s", self._path, err)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS


def _exporters(env: Mapping[str, str]) -> tuple[list[SpanExporter], list[SpanExporter]]:
    """The exporters ``env`` asks for: (per span, batched)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return [], []
    names = [
        n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if n.strip()
    ]
    if "none" in names:
        return [], []
    simple: list[SpanExporter] = []
    batched: list[SpanExporter] = []
    for name in names:
        if name == "otlp":
            if not any(env.get(var, "").strip() for var in _ENDPOINT_VARS):
                continue
            # Imported lazily: protobuf and an HTTP stack are only paid for when used.
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
                OTLPSpanExporter,
            )

            batched.append(OTLPSpanExporter())
        elif name == "console":
            simple.append(ConsoleSpanExporter(out=sys.stdout))
        elif name == "file":
            path = env.get(FILE_PATH_VAR, "").strip()
            if path:
                simple.append(JsonLinesFileExporter(path))
            else:
                log.warning("OTEL_TRACES_EXPORTER=file needs %s; ignored", FILE_PATH_VAR)
        else:
            log.warning("OTEL_TRACES_EXPORTER %r is not supported; ignored", name)
    return simple, batched


def setup_tracing(service_name: str, *, env: Mapping[str, str]) -> Tracing:
    """A no-op :class:`Tracing` unless ``env`` configures an exporter (module docstring)."""
    simple, batched = _exporters(env)
    if not simple and not batched:
        return Tracing(trace.NoOpTracer())
    service = env.get("OTEL_SERVICE_NAME") or service_name
    log.info("tracing enabled service=%s", service)
    return Tracing.with_exporters(service, simple, batched=batched)
