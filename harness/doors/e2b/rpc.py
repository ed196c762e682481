"""The shapes the E2B door's handlers are written against, apart from any HTTP server.

Every handler is synchronous and runs on a worker thread of the server
(:mod:`harness.doors.e2b.app` bridges them to the ASGI event loop):

* an envd Connect method (:class:`Method`) takes the decoded request message (a client
  stream: an iterator of them) and an :class:`EnvdCall`, and returns the response message
  (a server stream: an iterator of them; the server sends ``Method.keepalive()`` whenever
  the stream has been idle for the interval the client asked for);
* a plain HTTP route of envd (``/files``, ``/health``) takes an :class:`HttpRequest` and an
  :class:`EnvdCall` and returns an :class:`HttpResponse`;
* a control-plane REST route takes an :class:`HttpRequest` and the calling client's name.

A handler refuses with :class:`~harness.doors.e2b.errors.E2bError`; anything else it raises
is logged and answered as ``internal``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from google.protobuf.message import Message

from harness.core.errors import ErrorCode
from harness.doors.e2b.errors import E2bError
from harness.engine.cancel import CallScope

if TYPE_CHECKING:
    from harness.doors.e2b.boxes import E2bSandbox

__all__ = ["EnvdCall", "EnvdRoute", "HttpRequest", "HttpResponse", "Kind", "Method", "RestRoute", "Service",
           "json_response"]

Kind = Literal["unary", "server_stream", "client_stream"]


@dataclass(frozen=True)
class Method:
    """One RPC of an envd service."""

    name: str
    """As in the path ``/process.Process/Start``: ``Start``."""
    kind: Kind
    request: type[Message]
    """The request message class (decoded from JSON or binary protobuf)."""
    handler: Callable[..., Any]
    """``(request, call) -> response`` (unary), ``-> Iterator[response]`` (server stream),
    ``(Iterator[request], call) -> response`` (client stream)."""
    keepalive: Callable[[], Message] | None = None
    """A server stream's keepalive response, sent when the stream is idle for the
    ``Keepalive-Ping-Interval`` (seconds) the client sent; None: never."""


@dataclass(frozen=True)
class Service:
    """An envd Connect service: its full name (``process.Process``) and methods by name."""

    name: str
    methods: Mapping[str, Method]


@dataclass
class EnvdCall:
    """What an envd request carries besides its message."""

    sandbox: E2bSandbox
    """The sandbox the request names (``E2b-Sandbox-Id``), its access token checked."""
    headers: Mapping[str, str]
    """The request headers, names in lower case."""
    scope: CallScope = field(default_factory=CallScope)
    """Cancelled when the client goes away or the deadline passes: run the agent RPCs the
    handler makes under it (``with current_scope(call.scope)``) so they end with the request."""
    deadline: float | None = None
    """``time.monotonic()`` by which the client wants an answer (``Connect-Timeout-Ms``), or None."""
    user: str | None = None
    """The user the SDK asked to act as (``Authorization: Basic USER:``), or None: the sandbox's own."""
    signed: bool = False
    """A ``/files`` request without the access token: its handler must check the URL's
    signature (:mod:`harness.doors.e2b.signing`) before anything else."""


@dataclass
class HttpRequest:
    """A plain HTTP request (control plane or envd's ``/files``)."""

    method: str
    path: str
    """Without the query string, percent-decoded."""
    query: Mapping[str, list[str]]
    headers: Mapping[str, str]
    """Names in lower case."""
    body: Iterator[bytes]
    """The body in chunks as they arrive (read it once)."""
    path_params: dict[str, str] = field(default_factory=dict)
    """What a route's ``{name}`` placeholders matched."""

    def first(self, name: str, default: str | None = None) -> str | None:
        """The first value of query parameter ``name``."""
        values = self.query.get(name)
        return values[0] if values else default

    def read(self, limit: int) -> bytes:
        """The whole body, ``invalid_argument`` (413) if it is longer than ``limit`` bytes."""
        parts: list[bytes] = []
        size = 0
        for chunk in self.body:
            size += len(chunk)
            if size > limit:
                raise E2bError(ErrorCode.TOO_LARGE, f"the request body is over {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)

    def json(self, limit: int = 1 << 20) -> Any:
        """The body as JSON (empty: ``{}``); ``invalid_argument`` if it is not JSON."""
        raw = self.read(limit)
        if not raw.strip():
            return {}
        try:
            return json.loads(raw)
        except ValueError as error:
            raise E2bError(ErrorCode.INVALID_REQUEST, f"the request body is not JSON: {error}") from None


@dataclass
class HttpResponse:
    """A plain HTTP response; ``body`` may be an iterator of chunks (streamed)."""

    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes | Iterator[bytes] = b""


def json_response(status: int, value: Any, headers: list[tuple[str, str]] | None = None) -> HttpResponse:
    """A JSON response (``204`` gets no body)."""
    body = b"" if status == 204 else json.dumps(value, separators=(",", ":")).encode()
    head = [("content-type", "application/json")] if status != 204 else []
    return HttpResponse(status, head + (headers or []), body)


RestRoute = tuple[str, str, Callable[[HttpRequest, str], HttpResponse]]
"""A control-plane route: HTTP method, path template (``/sandboxes/{sandboxID}``), handler(request, client)."""

EnvdRoute = tuple[str, str, Callable[[HttpRequest, EnvdCall], HttpResponse]]
"""A plain HTTP route of envd (``/files``): HTTP method, path, handler(request, call)."""
