"""The MCP door over stdio: ``callbox mcp``.

The server process is the session (one client per process, in either protocol era); it
ends when stdin closes (the client's shutdown), or on SIGTERM/SIGINT, and then destroys the
session's sandbox. Logs go to stderr, so stdout carries nothing but JSON-RPC.

Input that is not JSON-RPC
    Every line of stdin must be one JSON-RPC message. A line that is not (not JSON, or JSON
    that is no JSON-RPC message) is answered on stdout the way JSON-RPC prescribes, with
    ``-32700`` (parse error) or ``-32600`` (invalid request) and ``"id": null``, and reported
    on stderr with its line number; the server keeps serving the lines after it. When stdin
    ends, such a session exits with status 2 and a one-line summary on stderr, so
    ``echo garbage | callbox mcp`` tells a person what happened instead of exiting 0
    silently. Blank lines are skipped.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.from_thread
import anyio.lowlevel
import mcp_types as types
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from harness.core.errors import UsageError
from harness.doors.mcp.process import log_to_stderr, terminate_ignored
from harness.doors.mcp.protocol import build_mcp_server
from harness.doors.mcp.service import McpToolService

__all__ = ["run_mcp_stdio"]

log = logging.getLogger("callbox.mcp")

REPORTED_LINES_MAX = 5
"""Lines that are not JSON-RPC reported one by one on stderr; later ones only in the summary."""
PREVIEW_CHARS = 80


class _StdinLines(anyio.AsyncFile[str]):
    """stdin, line by line, read by a daemon thread.

    anyio's own file reads run in worker threads that cannot be abandoned, so a server
    blocked reading stdin could not stop on SIGTERM (its cancellation would wait for the
    next line) and such a thread would also hold up interpreter exit. ``stdio_server`` only
    iterates its stdin, which is all this overrides. ``lineno`` is the number of the line
    last handed on (the SDK parses each line before it asks for the next)."""

    def __init__(self) -> None:
        fp = open(os.dup(sys.stdin.fileno()), encoding="utf-8", errors="replace", newline="\n")  # noqa: SIM115
        super().__init__(fp)
        self._reader = fp
        self.lineno = 0

    async def __aiter__(self) -> AsyncIterator[str]:
        send, receive = anyio.create_memory_object_stream[str](16)
        token = anyio.lowlevel.current_token()

        def pump() -> None:
            try:
                for line in iter(self._reader.readline, ""):
                    anyio.from_thread.run(send.send, line, token=token)
            except Exception:  # the loop ended or the stream closed: stop reading
                log.debug("stdin reader stopped", exc_info=True)
            finally:
                with contextlib.suppress(Exception):
                    anyio.from_thread.run_sync(send.close, token=token)

        threading.Thread(target=pump, name="callbox-mcp-stdin", daemon=True).start()
        async with receive:
            async for line in receive:
                self.lineno += 1
                if line.strip():
                    yield line


def _preview(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = text.strip()
    return repr(text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…")


class _JsonRpcOnly:
    """The stdio transport's read stream without the lines that are not JSON-RPC: the SDK
    hands those on as exceptions (and would drop them silently); here each is answered with
    the JSON-RPC error, reported on stderr and counted."""

    def __init__(self, inner: Any, write_stream: Any, lines: _StdinLines) -> None:
        self._inner = inner
        self._write = write_stream
        self._lines = lines
        self.refused = 0
        self.first: str | None = None

    @property
    def last_context(self) -> contextvars.Context | None:
        context: contextvars.Context | None = getattr(self._inner, "last_context", None)
        return context

    async def receive(self) -> SessionMessage | Exception:
        while True:
            item: SessionMessage | Exception = await self._inner.receive()
            if not isinstance(item, Exception):
                return item
            await self._refuse(item)

    async def _refuse(self, error: Exception) -> None:
        self.refused += 1
        code, what, preview = types.PARSE_ERROR, "not JSON", ""
        if isinstance(error, ValidationError) and error.errors():
            first = error.errors()[0]
            preview = _preview(first.get("input"))
            if first.get("type") != "json_invalid":
                code, what = types.INVALID_REQUEST, "JSON but not a JSON-RPC message"
            else:
                what = f"not JSON ({first.get('msg', 'invalid')})"
        description = f"stdin line {self._lines.lineno} is {what}: {preview or type(error).__name__}"
        if self.first is None:
            self.first = description
        if self.refused <= REPORTED_LINES_MAX:
            log.warning("%s; answered with JSON-RPC error %d", description, code)
        if self.refused == REPORTED_LINES_MAX + 1:
            log.warning("more lines that are not JSON-RPC follow; only their count is reported at the end")
        message = "Parse error" if code == types.PARSE_ERROR else "Invalid Request"
        reply = types.JSONRPCError(jsonrpc="2.0", id=None, error=types.ErrorData(
            code=code, message=f"{message}: {description}; send one JSON-RPC message per line"))
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            await self._write.send(SessionMessage(reply))

    def summary(self) -> str:
        lines = "line that is" if self.refused == 1 else "lines that are"
        return (
            f"stdin carried {self.refused} {lines} not JSON-RPC (the first: {self.first}); `callbox mcp` is an MCP "
            "server for an MCP client to start: it reads one JSON-RPC message per line on stdin"
        )

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc_val: BaseException | None, exc_tb: TracebackType | None,
    ) -> bool | None:
        await self.aclose()
        return None


async def _serve(service: McpToolService, outcome: dict[str, str]) -> None:
    server = build_mcp_server(service, session_scope="process", transport="stdio")

    async def stop_on_signal(scope: anyio.CancelScope) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("MCP stdio server: %s, shutting down", signal.Signals(signum).name)
                scope.cancel()
                return

    lines = _StdinLines()
    async with anyio.create_task_group() as tg:
        tg.start_soon(stop_on_signal, tg.cancel_scope)
        async with stdio_server(stdin=lines) as (read_stream, write_stream):
            guarded = _JsonRpcOnly(read_stream, write_stream, lines)
            try:
                await server.run(guarded, write_stream, server.create_initialization_options())
            finally:
                if guarded.refused:
                    outcome["refused"] = guarded.summary()
        tg.cancel_scope.cancel()


def run_mcp_stdio(*, policy_path: Path | None = None, audit_path: Path | None = None) -> None:
    """``callbox mcp``: serve MCP over stdin/stdout until stdin closes (or SIGTERM/SIGINT),
    then destroy the session's sandbox. A bad policy raises PolicyError before anything is
    read from stdin; input that was not JSON-RPC raises UsageError (exit status 2) once
    stdin has ended and the sandbox is gone."""
    log_to_stderr()
    service = McpToolService.open(policy_path=policy_path, audit_path=audit_path)
    outcome: dict[str, str] = {}
    try:
        anyio.run(_serve, service, outcome)
    finally:
        with terminate_ignored():
            service.close()
    if "refused" in outcome:
        raise UsageError(outcome["refused"])
