"""A tiny HTTP server that plays a model API for wire tests.

It runs in a thread on 127.0.0.1 (a free port), records every request (method, path,
headers, JSON body) and answers each with the next canned response: JSON with a status,
or a Server-Sent Events stream. The real SDKs are pointed at it with ``base_url``.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    raw: bytes


@dataclass
class Canned:
    status: int
    content_type: str
    payload: bytes
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


def sse(events: list[tuple[str | None, Any]], *, done: bool = False) -> bytes:
    """Events as an SSE body: ``event: NAME`` (when named) and ``data: JSON`` per event."""
    chunks: list[str] = []
    for name, data in events:
        lines = [f"event: {name}"] if name else []
        lines.append(f"data: {data if isinstance(data, str) else json.dumps(data)}")
        chunks.append("\n".join(lines) + "\n\n")
    if done:
        chunks.append("data: [DONE]\n\n")
    return "".join(chunks).encode()


class WireServer:
    """``with WireServer() as server:`` ... ``server.url``, ``server.requests``."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self._canned: deque[Canned] = deque()
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # silence the test output
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                with outer._lock:
                    outer.requests.append(
                        Recorded(
                            method=self.command,
                            path=self.path,
                            headers={k.lower(): v for k, v in self.headers.items()},
                            body=body,
                            raw=raw,
                        )
                    )
                    canned = outer._canned.popleft() if outer._canned else None
                if canned is None:
                    canned = Canned(500, "application/json", b'{"error": {"message": "no canned response left"}}')
                if canned.delay_s:
                    time.sleep(canned.delay_s)
                try:
                    self.send_response(canned.status)
                    self.send_header("Content-Type", canned.content_type)
                    self.send_header("Content-Length", str(len(canned.payload)))
                    for name, value in canned.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(canned.payload)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout tests)
                    self.close_connection = True

            do_POST = _handle
            do_GET = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def json(
        self, body: Any, *, status: int = 200, headers: dict[str, str] | None = None, delay_s: float = 0.0
    ) -> None:
        """Queue a JSON answer (sent after ``delay_s``)."""
        payload = json.dumps(body).encode()
        self._canned.append(Canned(status, "application/json", payload, dict(headers or {}), delay_s))

    def raw(self, status: int, content_type: str, payload: bytes) -> None:
        """Queue an answer with any body."""
        self._canned.append(Canned(status, content_type, payload))

    def stream(self, events: list[tuple[str | None, Any]], *, done: bool = False) -> None:
        """Queue an SSE answer."""
        self._canned.append(Canned(200, "text/event-stream", sse(events, done=done)))

    def bodies(self) -> list[Any]:
        return [request.body for request in self.requests]

    def __enter__(self) -> WireServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
