"""OpenTelemetry tracing setup that costs nothing unless the standard ``OTEL_*`` env asks for it.

Owns the choice between a no-op tracer and an OTLP/HTTP exporting one. Invariants: without
``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (or with
``OTEL_SDK_DISABLED=true`` / ``OTEL_TRACES_EXPORTER=none``) no SDK object is built, nothing is
exported and no thread is started; the global tracer provider is never replaced (the tracer is
handed to its users explicitly); ``shutdown()`` flushes pending spans and is idempotent.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from opentelemetry import trace

__all__ = ["Tracing", "setup_tracing"]

log = logging.getLogger(__name__)

_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


class Tracing:
    """A tracer plus the means to flush it on exit."""

    def __init__(self, tracer: trace.Tracer, *, provider: object | None = None) -> None:
        self.tracer = tracer
        self._provider = provider

    @property
    def enabled(self) -> bool:
        return self._provider is not None

    def shutdown(self) -> None:
        provider, self._provider = self._provider, None
        shutdown = getattr(provider, "shutdown", None)
        if callable(shutdown):
            shutdown()


def _wants_export(env: Mapping[str, str]) -> bool:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() in ("none", ""):
        return False
    return any(env.get(var, "").strip() for var in _ENDPOINT_VARS)


def setup_tracing(service_name: str, *, env: Mapping[str, str]) -> Tracing:
    """A no-op :class:`Tracing` unless ``env`` configures an OTLP endpoint."""
    if not _wants_export(env):
        return Tracing(trace.NoOpTracer())
    # Imported lazily: the SDK and exporter are only paid for when tracing is on.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
        OTLPSpanExporter,
    )
    from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415

    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or service_name})
    provider = TracerProvider(resource=resource)
    # The exporter reads endpoint, headers and timeout from the same OTEL_* variables.
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    log.info("tracing enabled service=%s", service_name)
    return Tracing(provider.get_tracer(service_name), provider=provider)
