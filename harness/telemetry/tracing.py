"""callbox's OpenTelemetry traces: one span per call with a child per step, off unless configured.

:func:`configure` with an OTLP/HTTP endpoint (``http://127.0.0.1:4318/v1/traces``) exports
spans in batches from a background thread; with ``None`` tracing is off, and the call path
pays one module-attribute read per step (:func:`span` hands back a shared no-op context).
The provider is callbox's own, not OpenTelemetry's process-wide one, so configuring it twice
(a reload, tests) just replaces it, and libraries that trace through the global provider
(the MCP SDK) are left as their host process set them.

The spans of one call (:mod:`harness.core.session`, :mod:`harness.core.call_path`):
``callbox.call`` with children ``callbox.validate``, ``callbox.authorize`` (the audit
store's claim and the policy's decision, one transaction), ``callbox.exec`` (the tool's
handler; a ``callbox.sandbox`` child when the run's sandbox is started or claimed from the
warm pool then), ``callbox.shape`` and ``callbox.audit``; every span has the
``callbox.run_id`` and ``callbox.call_id`` attributes, the call span also ``callbox.tool``,
``callbox.door``, ``callbox.decision`` and ``callbox.outcome``.

A caller's W3C ``traceparent`` (and ``tracestate``) continue its trace: a door takes them
from the request's metadata or headers (:func:`carrier`) and runs the call inside
:func:`continued`, so the call span's parent is the caller's span.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = [
    "TRACE_HEADERS",
    "active",
    "annotate",
    "carrier",
    "configure",
    "continued",
    "failed",
    "flush",
    "request_span",
    "shutdown",
    "span",
    "tracer",
]

log = logging.getLogger("callbox.telemetry")

TRACE_HEADERS = ("traceparent", "tracestate")
"""The W3C Trace Context headers (gRPC metadata keys) a caller's trace arrives in."""

SHUTDOWN_FLUSH_MS = 5000
"""How long ``shutdown`` waits for the spans still queued to be exported."""

_PROPAGATOR = TraceContextTextMapPropagator()
_NULL: contextlib.nullcontext[None] = contextlib.nullcontext()


class _State:
    """The provider and tracer in use (both None while tracing is off)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.provider: TracerProvider | None = None
        self.tracer: Tracer | None = None


_state = _State()


def configure(endpoint: str | None, *, service_name: str = "callbox", exporter: SpanExporter | None = None) -> None:
    """Trace calls from now on: to the OTLP/HTTP ``endpoint`` (a URL such as
    ``http://127.0.0.1:4318/v1/traces``; spans are batched and sent from a background thread),
    or to ``exporter`` (tests: span by span, as each ends). With neither, tracing is off. A
    provider configured before is shut down (its queued spans flushed) first."""
    provider: TracerProvider | None = None
    if exporter is not None or endpoint is not None:
        provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}))
        if exporter is not None:
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    with _state.lock:
        old, _state.provider = _state.provider, provider
        _state.tracer = provider.get_tracer("callbox") if provider is not None else None
    if old is not None:
        old.shutdown()
    if provider is not None:
        log.info("tracing calls to %s", endpoint or type(exporter).__name__)


def shutdown() -> None:
    """Export the spans still queued (waiting at most ``SHUTDOWN_FLUSH_MS``) and turn tracing off."""
    with _state.lock:
        provider, _state.provider, _state.tracer = _state.provider, None, None
    if provider is not None:
        provider.force_flush(SHUTDOWN_FLUSH_MS)
        provider.shutdown()


def flush(timeout_ms: int = SHUTDOWN_FLUSH_MS) -> bool:
    """Export the spans queued so far; False if ``timeout_ms`` passed first (or tracing is off)."""
    provider = _state.provider
    return provider.force_flush(timeout_ms) if provider is not None else False


def active() -> bool:
    """Whether calls are traced."""
    return _state.tracer is not None


def tracer() -> Tracer | None:
    """The tracer of callbox's spans, None while tracing is off."""
    return _state.tracer


def span(name: str, attributes: Mapping[str, Any] | None = None) -> contextlib.AbstractContextManager[Any]:
    """A child of the current span (made current while the block runs), or a shared no-op
    context while tracing is off."""
    current = _state.tracer
    if current is None:
        return _NULL
    return current.start_as_current_span(name, attributes=attributes)


def annotate(key: str, value: str | bool | int | float) -> None:
    """Set an attribute on the current span (nothing while tracing is off)."""
    if _state.tracer is not None:
        get_current_span().set_attribute(key, value)


def failed(target: Span, description: str) -> None:
    """Mark ``target`` as failed (a call whose result is an error)."""
    target.set_status(Status(StatusCode.ERROR, description))


def carrier(pairs: Iterable[tuple[str, Any]] | Mapping[str, Any] | None) -> dict[str, str]:
    """The trace headers among ``pairs`` (gRPC invocation metadata, HTTP headers; keys
    matched without case), as a carrier for :func:`continued`; empty when tracing is off."""
    if _state.tracer is None or pairs is None:
        return {}
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    found: dict[str, str] = {}
    for key, value in items:
        name = key.decode("latin-1") if isinstance(key, bytes) else str(key)
        name = name.lower()
        if name in TRACE_HEADERS:
            found[name] = value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return found


@contextlib.contextmanager
def _attached(headers: Mapping[str, str]) -> Iterator[None]:
    token = otel_context.attach(_PROPAGATOR.extract(headers))
    try:
        yield
    finally:
        otel_context.detach(token)


def continued(headers: Mapping[str, str] | None) -> contextlib.AbstractContextManager[Any]:
    """Run the block in the trace of a caller's ``headers`` (from :func:`carrier`): spans
    started in it are children of the caller's span. A malformed ``traceparent`` is ignored
    (the call starts a trace of its own), as the W3C recommendation says."""
    if not headers or _state.tracer is None:
        return _NULL
    return _attached(headers)


@contextlib.contextmanager
def _server_span(current: Tracer, name: str, headers: Mapping[str, str],
                 attributes: Mapping[str, Any] | None) -> Iterator[None]:
    parent = _PROPAGATOR.extract(headers) if headers else None
    with current.start_as_current_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes):
        yield


def request_span(name: str, headers: Mapping[str, Any] | None,
                 attributes: Mapping[str, Any] | None = None) -> contextlib.AbstractContextManager[Any]:
    """A server span for one request of a door whose work is not a call through the call path
    (the E2B door's envd and REST requests), the child of the caller's span when its
    ``headers`` carry a traceparent; a no-op while tracing is off."""
    current = _state.tracer
    if current is None:
        return _NULL
    return _server_span(current, name, carrier(headers), attributes)
