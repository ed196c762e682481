"""callbox's OpenTelemetry traces: one span per call with a child per step, off unless configured.

:func:`configure` with an OTLP/HTTP endpoint (``http://127.0.0.1:4318/v1/traces``) exports
the spans in batches from a background thread; with ``None`` tracing is off, and a call pays
one attribute read (:func:`start_call` returns None) and one check per step.

The spans of one call (:mod:`harness.core.session`, :mod:`harness.core.call_path`):
``callbox.call`` with children ``callbox.validate``, ``callbox.authorize`` (the audit
store's claim and the policy's decision, one transaction), ``callbox.exec`` (the tool's
handler; a ``callbox.sandbox`` child when the run's sandbox is started or claimed from the
warm pool then, with ``callbox.sandbox.source`` ``cold`` or ``pool``), ``callbox.shape`` and
``callbox.audit``. Every span has the ``callbox.run_id`` and ``callbox.call_id`` attributes,
the call span also ``callbox.tool``, ``callbox.door`` and ``callbox.decision``, and an error
status (the error code) when the result is an error.

Why not the SDK's ``Tracer`` and ``BatchSpanProcessor``: an SDK span costs about 20 µs to
start and end in Python, so six of them doubled the harness's own time per call (about
0.2 ms; measured 2.06x in ``make bench`` row 20). A call records its steps as (name, end) in
a :class:`CallTrace` instead, one clock read each, and the export thread turns each finished
trace into the SDK's ``ReadableSpan`` objects (ids made there too) and hands them in batches
to the exporter (the SDK's ``OTLPSpanExporter``, or any ``SpanExporter``). The spans are
those the SDK would make; a trace nobody samples (a caller's ``traceparent`` with the
sampled flag off) is not recorded, as the SDK's default parent-based sampler does. None of
this touches OpenTelemetry's process-wide tracer provider, so configuring twice (a reload,
tests) just replaces the exporter, and libraries that trace through the global provider
(the MCP SDK) are left as their host process set them.

A caller's W3C ``traceparent`` (and ``tracestate``) continue its trace: a door takes them
from the request's metadata or headers (:func:`carrier`) and runs the call inside
:func:`continued`, so the call span's parent is the caller's span. (The parent is that, not
whatever OpenTelemetry span is current in the thread: reading OpenTelemetry's context costs
a few Python calls per call, and no callbox code runs a call inside a span of its own.) A
door whose requests are not calls (the E2B door) makes a server span per request with
:func:`request_span`.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import logging
import random
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = [
    "TRACE_HEADERS",
    "CallTrace",
    "active",
    "annotate",
    "carrier",
    "configure",
    "continued",
    "flush",
    "request_span",
    "shutdown",
    "start_call",
]

log = logging.getLogger("callbox.telemetry")

TRACE_HEADERS = ("traceparent", "tracestate")
"""The W3C Trace Context headers (gRPC metadata keys) a caller's trace arrives in."""

SHUTDOWN_FLUSH_MS = 5000
"""How long ``shutdown`` waits for the spans still queued to be exported."""
EXPORT_DELAY_S = 2.0
"""How often the export thread sends what finished (sooner once ``EXPORT_BATCH`` traces wait)."""
EXPORT_BATCH = 256
EXPORT_TIMEOUT_S = 5.0
"""How long one export to an OTLP endpoint may take, retries included (bounds a stop when the
collector is down)."""
MAX_QUEUED = 4096
"""Finished traces waiting for export; beyond this they are dropped (and counted), never blocking a call."""

_PROPAGATOR = TraceContextTextMapPropagator()
_NULL: contextlib.nullcontext[None] = contextlib.nullcontext()
_SCOPE = InstrumentationScope("callbox")
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_OK = Status(StatusCode.UNSET)
_current: contextvars.ContextVar[CallTrace | None] = contextvars.ContextVar("callbox_call_trace", default=None)
_caller: contextvars.ContextVar[SpanContext | None] = contextvars.ContextVar("callbox_caller_span", default=None)
"""The caller's span a door continues (:func:`continued`): the parent of the calls made in it."""


def _span_id() -> int:
    return random.getrandbits(64) or 1


class _Nested:
    """A step timed by a ``with`` block (inside the step running then): for the rare steps,
    such as a sandbox start, that are not one of the call's sequence."""

    __slots__ = ("index", "token", "trace")

    def __init__(self, trace: CallTrace, name: str) -> None:
        self.trace = trace
        self.index = len(trace.inner)
        trace.inner.append((name, 0, 0, len(trace), {}))
        self.token: contextvars.Token[CallTrace | None] | None = None

    def __enter__(self) -> None:
        name, _, _, after, attributes = self.trace.inner[self.index]
        self.trace.inner[self.index] = (name, time.time_ns(), 0, after, attributes)
        self.token = _current.set(self.trace)  # for ``annotate`` (the engine's)

    def __exit__(self, *exc: object) -> None:
        if self.token is not None:
            _current.reset(self.token)
        name, begun, _, after, attributes = self.trace.inner[self.index]
        self.trace.inner[self.index] = (name, begun, time.time_ns(), after, attributes)


class CallTrace(list[tuple[str, int]]):
    """The spans of one call (or one door request), recorded cheaply while it runs and made
    into the SDK's spans by the export thread once it ends (:meth:`finish`).

    The steps of a call follow one another, so each is recorded by one mark at its end, and
    the trace is the list of those marks: ``trace.append((step, time.time_ns()))`` (what
    :meth:`mark` does; the call path appends directly, which costs no Python call). A step
    starts where the one before it ended (the first where the call started). A step inside
    another one (the sandbox's start, inside the exec) is a :meth:`nested` ``with`` block."""

    __slots__ = ("attributes", "end", "error", "inner", "kind", "name", "own", "parent", "start")

    name: str
    attributes: dict[str, Any]
    """The attributes of every span of the call."""
    own: dict[str, Any] | None
    """The call span's own attributes besides those (given to ``finish``)."""
    kind: SpanKind
    parent: SpanContext | None
    """The caller's span (None: the call is the root of a trace of its own)."""
    start: int
    inner: list[tuple[str, int, int, int, dict[str, Any]]]
    """Nested steps: (step, start, end, how many marks were made before it, its own attributes)."""
    error: str | None
    end: int

    @classmethod
    def begin(cls, name: str, attributes: dict[str, Any], kind: SpanKind = SpanKind.INTERNAL) -> CallTrace:
        """A trace starting now, in the caller's trace if a door continued one (no ``__init__``:
        this runs once per call, and a list subclass's own ``__init__`` would cost another call)."""
        trace = cls()
        trace.name, trace.attributes, trace.kind, trace.own, trace.error = name, attributes, kind, None, None
        trace.parent, trace.inner, trace.end = _caller.get(), [], 0
        trace.start = time.time_ns()
        return trace

    @property
    def sampled(self) -> bool:
        """Whether the trace is recorded (a caller that does not sample its trace is followed)."""
        return self.parent is None or self.parent.trace_flags.sampled

    def mark(self, step: str) -> None:
        """The step ``step`` of the call ended now."""
        self.append((step, time.time_ns()))

    def nested(self, name: str) -> _Nested:
        """A ``with`` block timed as a child of the step it runs in."""
        return _Nested(self, name)

    def annotate(self, key: str, value: str | bool | int | float) -> None:
        """An attribute of the nested step open now (of the call span if none is)."""
        for _name, begun, ended, _after, attributes in reversed(self.inner):
            if begun and not ended:
                attributes[key] = value
                return
        self.own = {**(self.own or {}), key: value}

    def finish(self, attributes: dict[str, Any] | None = None, error: str | None = None) -> None:
        """The call ended: ``attributes`` of the call span, ``error`` its status description
        if the result is an error; handed to the export thread."""
        self.end = time.time_ns()
        self.error = error
        if attributes:
            self.own = {**self.own, **attributes} if self.own else attributes
        exporting = _state.exporting
        if exporting is None or (self.parent is not None and not self.parent.trace_flags.sampled):
            return
        if exporting.synchronous:
            exporting.export([self])
            return
        queue = exporting.queue
        if len(queue) >= MAX_QUEUED:
            exporting.dropped += 1
            return
        queue.append(self)
        if len(queue) >= EXPORT_BATCH:
            exporting.wake.set()

    def spans(self, resource: Resource) -> list[ReadableSpan]:
        """The SDK spans of this trace: the call span first, then its steps."""
        parent = self.parent
        trace_id = parent.trace_id if parent is not None else (random.getrandbits(128) or 1)
        state = parent.trace_state if parent is not None else None
        call = SpanContext(trace_id, _span_id(), False, _SAMPLED, state)
        status = Status(StatusCode.ERROR, self.error) if self.error is not None else _OK
        own = {**self.attributes, **self.own} if self.own else self.attributes
        made = [ReadableSpan(self.name, call, parent, resource, own, kind=self.kind, status=status,
                             start_time=self.start, end_time=self.end, instrumentation_scope=_SCOPE)]
        begun = self.start
        steps: list[tuple[SpanContext, int, int]] = []
        for name, ended in self:
            context = SpanContext(trace_id, _span_id(), False, _SAMPLED, state)
            made.append(ReadableSpan(name, context, call, resource, self.attributes, start_time=begun,
                                     end_time=ended, instrumentation_scope=_SCOPE))
            steps.append((context, begun, ended))
            begun = ended
        for name, started, ended, after, attributes in self.inner:
            # inside the step that was running: the one whose mark came after it
            inside = steps[after][0] if after < len(steps) else call
            context = SpanContext(trace_id, _span_id(), False, _SAMPLED, state)
            made.append(ReadableSpan(name, context, inside, resource, {**self.attributes, **attributes},
                                     start_time=started or self.end, end_time=ended or self.end,
                                     instrumentation_scope=_SCOPE))
        return made


class _Exporting:
    """Finished traces to the exporter: at once (``synchronous``: tests) or in batches from a
    daemon thread, never blocking a call (a full queue drops, counting what it dropped)."""

    def __init__(self, exporter: SpanExporter, resource: Resource, *, synchronous: bool) -> None:
        self.exporter = exporter
        self.resource = resource
        self.synchronous = synchronous
        self.dropped = 0
        self.queue: collections.deque[CallTrace] = collections.deque()
        self.wake = threading.Event()
        self._stopping = False
        self._export_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        if not synchronous:
            self._thread = threading.Thread(target=self._run, name="callbox-trace-export", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stopping:
            self.wake.wait(EXPORT_DELAY_S)
            self.wake.clear()
            self.drain()

    def drain(self, deadline: float | None = None) -> int:
        """Export everything queued now (until ``deadline``, a ``time.monotonic()``, if given:
        a collector that is down must not hold a stop up); how many traces were left."""
        with self._export_lock:
            queue = self.queue
            while queue:
                if deadline is not None and time.monotonic() >= deadline:
                    return len(queue)
                batch = [queue.popleft() for _ in range(min(len(queue), EXPORT_BATCH))]
                self.export(batch)
        return 0

    def export(self, batch: list[CallTrace]) -> None:
        try:
            spans = [span for trace in batch for span in trace.spans(self.resource)]
            self.exporter.export(spans)
        except Exception:  # a tracing backend that is down must never break a call, nor this thread
            log.warning("could not export %d traces", len(batch), exc_info=True)

    def shutdown(self, timeout_ms: int) -> None:
        """Stop the thread and export what is queued, starting no export after ``timeout_ms``."""
        deadline = time.monotonic() + timeout_ms / 1000
        self._stopping = True
        self.wake.set()
        if self._thread is not None:
            self._thread.join(timeout_ms / 1000)
        self.dropped += self.drain(deadline)
        if self.dropped:
            log.warning("%d traces were not exported: the exporter did not keep up", self.dropped)
        self.exporter.shutdown()


class _State:
    """The exporting in use (None while tracing is off)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.exporting: _Exporting | None = None


_state = _State()


def configure(endpoint: str | None, *, service_name: str = "callbox", exporter: SpanExporter | None = None,
              batch: bool = False) -> None:
    """Trace calls from now on: to the OTLP/HTTP ``endpoint`` (a URL such as
    ``http://127.0.0.1:4318/v1/traces``; spans are batched and sent from a background thread),
    or to ``exporter`` (tests: each call's spans as it ends, or batched like the OTLP
    exporter's with ``batch``). With neither, tracing is off. What was configured before is
    shut down (its queued spans exported) first."""
    exporting: _Exporting | None = None
    if exporter is None and endpoint is not None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter, batch = OTLPSpanExporter(endpoint=endpoint, timeout=EXPORT_TIMEOUT_S), True
    if exporter is not None:
        resource = Resource.create({SERVICE_NAME: service_name})
        exporting = _Exporting(exporter, resource, synchronous=not batch)
    with _state.lock:
        old, _state.exporting = _state.exporting, exporting
    if old is not None:
        old.shutdown(SHUTDOWN_FLUSH_MS)
    if exporting is not None:
        log.info("tracing calls to %s", endpoint or type(exporter).__name__)


def shutdown() -> None:
    """Turn tracing off and export the spans still queued (no export starts after
    ``SHUTDOWN_FLUSH_MS``; one takes at most ``EXPORT_TIMEOUT_S``)."""
    with _state.lock:
        exporting, _state.exporting = _state.exporting, None
    if exporting is not None:
        exporting.shutdown(SHUTDOWN_FLUSH_MS)


def flush() -> bool:
    """Export the spans of the calls that ended so far, now; False while tracing is off."""
    exporting = _state.exporting
    if exporting is None:
        return False
    exporting.drain()
    return True


def active() -> bool:
    """Whether calls are traced."""
    return _state.exporting is not None


def start_call(run_id: str, call_id: object) -> CallTrace | None:
    """The trace of a call starting now (a child of the caller's span when a door continued its
    trace, else the root of a trace of its own), or None while tracing is off."""
    if _state.exporting is None:
        return None
    return CallTrace.begin("callbox.call", {"callbox.run_id": run_id, "callbox.call_id": str(call_id)[:128]})


def annotate(key: str, value: str | bool | int | float) -> None:
    """Set an attribute on the step running now of the current call (nothing while tracing is
    off or outside a traced call)."""
    if _state.exporting is not None and (trace := _current.get()) is not None:
        trace.annotate(key, value)


def carrier(pairs: Iterable[tuple[str, Any]] | Mapping[str, Any] | None) -> dict[str, str]:
    """The trace headers among ``pairs`` (gRPC invocation metadata, HTTP headers; keys
    matched without case), as a carrier for :func:`continued`; empty when tracing is off."""
    if _state.exporting is None or pairs is None:
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
def _attached(caller: SpanContext) -> Iterator[None]:
    token = _caller.set(caller)
    try:
        yield
    finally:
        _caller.reset(token)


def continued(headers: Mapping[str, str] | None) -> contextlib.AbstractContextManager[Any]:
    """Run the block in the trace of a caller's ``headers`` (from :func:`carrier`): calls
    started in it are children of the caller's span. A malformed ``traceparent`` is ignored
    (the call starts a trace of its own), as the W3C recommendation says."""
    if not headers or _state.exporting is None:
        return _NULL
    caller = get_current_span(_PROPAGATOR.extract(headers)).get_span_context()
    return _attached(caller) if caller.is_valid else _NULL


@contextlib.contextmanager
def _server_span(name: str, headers: Mapping[str, str], attributes: Mapping[str, Any] | None) -> Iterator[None]:
    with continued(headers):
        trace = CallTrace.begin(name, dict(attributes or {}), SpanKind.SERVER)
    try:
        yield
    finally:
        trace.finish()


def request_span(name: str, headers: Mapping[str, Any] | None,
                 attributes: Mapping[str, Any] | None = None) -> contextlib.AbstractContextManager[Any]:
    """A server span for one request of a door whose work is not a call through the call path
    (the E2B door's envd and REST requests), the child of the caller's span when its
    ``headers`` carry a traceparent; a no-op while tracing is off."""
    if _state.exporting is None:
        return _NULL
    return _server_span(name, carrier(headers), attributes)
