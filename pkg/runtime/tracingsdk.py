"""The OpenTelemetry SDK side of `pkg.runtime.tracing`, imported only when tracing is on.

Owns the tracer provider with its span processors, the id generator that lets a span be
emitted with ids chosen earlier, and this driver's ``file`` exporter (one line of JSON per
span, appended under an exclusive ``flock`` so several processes may share the file). Kept apart
so that a process without an exporter (the default) never pays for importing the SDK.
"""

from __future__ import annotations

import fcntl
import logging
import os
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

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

from pkg.runtime.tracing import FILE_PATH_VAR, FormationIds

__all__ = ["JsonLinesFileExporter", "PresetIds", "build_exporters", "build_provider"]

log = logging.getLogger(__name__)


class PresetIds(IdGenerator):
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


def build_exporters(
    names: Sequence[str], env: Mapping[str, str]
) -> tuple[list[SpanExporter], list[SpanExporter]]:
    """The exporters named (`pkg.runtime.tracing.exporter_names`): (per span, batched)."""
    simple: list[SpanExporter] = []
    batched: list[SpanExporter] = []
    for name in names:
        if name == "otlp":
            # Imported lazily: protobuf and an HTTP stack are only paid for when used.
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
                OTLPSpanExporter,
            )

            batched.append(OTLPSpanExporter())
        elif name == "console":
            simple.append(ConsoleSpanExporter(out=sys.stdout))
        elif name == "file":
            simple.append(JsonLinesFileExporter(env[FILE_PATH_VAR].strip()))
    return simple, batched


def build_provider(
    service_name: str, exporters: Sequence[SpanExporter], batched: Sequence[SpanExporter]
) -> tuple[TracerProvider, PresetIds]:
    """A tracer provider for ``service_name``: ``exporters`` get each span when it ends,
    ``batched`` in batches from a background thread; with its preset-id generator."""
    preset = PresetIds()
    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name}), id_generator=preset
    )
    for exporter in exporters:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    for exporter in batched:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider, preset
