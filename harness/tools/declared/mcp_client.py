"""A stdio MCP client speaking to one server process in a sandbox, through the agent.

The server is started with ``agent.exec(command, keep_stdin_open=True)``: requests go to
its stdin with ``WriteStdin``, one JSON-RPC message per line (MCP's stdio framing); a
reader thread consumes the exec's event stream, splits stdout into lines and hands each
response to the request waiting for its id. Stderr goes to the log, line by line.

Nothing here waits without a limit: every request has a timeout. A server that exits, does
not answer in time, or prints a line that is not a JSON-RPC message is *broken*: the
waiting request fails with :class:`McpServerError` saying which, the process is killed
(its exec stream is cancelled, and the agent kills its whole process tree), and the next
request made through :class:`McpServers` starts a new server.

Requests the server sends (``ping``, ``roots/list``, ...) get an answer (``ping``: an empty
result; anything else: "method not found"), so a server that asks never waits forever.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.core.errors import AgentCallError
from harness.engine.agent_client import AgentClient
from sandbox.v1 import process_pb2

__all__ = ["PROTOCOL_VERSION", "McpConnection", "McpServerError", "McpServers", "ServerKey"]

log = logging.getLogger("callbox.mcp")

PROTOCOL_VERSION = "2025-06-18"
"""The MCP protocol version callbox asks for in ``initialize``."""
SERVER_LIFETIME_MS = 24 * 3600 * 1000
"""The server's exec limit: the agent's maximum (it ends with its sandbox well before)."""
UNBOUNDED_OUTPUT = 1 << 62
"""The exec's output cap: large enough that every byte streams live (none is held as a tail)."""
MAX_LINE = 64 << 20
"""A longer stdout line without a newline is malformed output."""
_SHOWN = 200


class McpServerError(Exception):
    """The server crashed, did not answer in time, or printed malformed output.

    ``timed_out`` tells a hang from the rest; ``message`` names what happened and the fix."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.timed_out = timed_out


class McpProtocolError(Exception):
    """The server answered a request with a JSON-RPC error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{message} (JSON-RPC error {code})")
        self.code = code


@dataclass
class _Waiting:
    done: threading.Event = field(default_factory=threading.Event)
    response: dict[str, Any] | None = None


class McpConnection:
    """One running server: start it, send requests, get responses, kill it."""

    def __init__(self, agent: AgentClient, command: Sequence[str], *, env: Mapping[str, str], cwd: str,
                 label: str) -> None:
        self.agent = agent
        self.label = label
        self.exec_id = f"mcp-{uuid.uuid4().hex}"
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._next_id = 0
        self._waiting: dict[int, _Waiting] = {}
        self._broken: str | None = None
        self._started = threading.Event()
        self.server_info: dict[str, Any] = {}
        # The stream is opened in the reader thread, outside any tool call's cancel scope:
        # the server outlives the call that started it.
        self._reader = threading.Thread(target=self._read, args=(list(command), dict(env), cwd),
                                        name=f"mcp-{label}", daemon=True)
        self._reader.start()

    @property
    def broken(self) -> str | None:
        """Why this connection can no longer be used (None while it can)."""
        return self._broken

    # ---- requests ---------------------------------------------------------------------

    def initialize(self, timeout_s: float) -> dict[str, Any]:
        """The MCP handshake: ``initialize``, then ``notifications/initialized``."""
        result = self.request("initialize", {
            "protocolVersion": PROTOCOL_VERSION, "capabilities": {},
            "clientInfo": {"name": "callbox", "version": "0.1.0"},
        }, timeout_s)
        self.server_info = result
        self.notify("notifications/initialized", {})
        return result

    def list_tools(self, timeout_s: float) -> list[dict[str, Any]]:
        """Every tool of ``tools/list``, following ``nextCursor``."""
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        for _page in range(1000):
            result = self.request("tools/list", {"cursor": cursor} if cursor else {}, timeout_s)
            page = result.get("tools")
            if not isinstance(page, list):
                raise self._fail("answered tools/list without a tools list")
            tools.extend(t for t in page if isinstance(t, dict))
            cursor = result.get("nextCursor")
            if not cursor:
                return tools
        raise self._fail("kept answering tools/list with another nextCursor (over 1000 pages)")

    def request(self, method: str, params: Mapping[str, Any], timeout_s: float, *,
                limit_s: float | None = None) -> dict[str, Any]:
        """Send a request and wait ``timeout_s`` for its result; McpServerError when the server
        broke, or McpProtocolError when it answered with an error. ``limit_s`` is the limit a
        timeout message names (default ``timeout_s``: a call's whole timeout when part of it
        went to starting the server)."""
        with self._lock:
            self._next_id += 1
            request_id = self._next_id
            waiting = self._waiting[request_id] = _Waiting()
        try:
            self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": dict(params)}, timeout_s)
            if not waiting.done.wait(timeout_s):
                limit = timeout_s if limit_s is None else limit_s
                raise self._fail(f"did not answer {method} within {limit:g} s", timed_out=True)
        finally:
            with self._lock:
                self._waiting.pop(request_id, None)
        response = waiting.response
        if response is None:
            raise McpServerError(self._broken or f"the MCP server {self.label!r} stopped")
        error = response.get("error")
        if error is not None:
            code = error.get("code", 0) if isinstance(error, dict) else 0
            message = error.get("message", "") if isinstance(error, dict) else str(error)
            raise McpProtocolError(int(code) if isinstance(code, int) else 0, str(message))
        result = response.get("result")
        if not isinstance(result, dict):
            raise self._fail(f"answered {method} with a result that is not an object")
        return result

    def notify(self, method: str, params: Mapping[str, Any]) -> None:
        self._send({"jsonrpc": "2.0", "method": method, "params": dict(params)}, 30.0)

    def close(self) -> None:
        """Kill the server's whole process tree (its exec then ends, and the reader with it)."""
        self._mark_broken(f"the MCP server {self.label!r} was stopped")
        with contextlib.suppress(AgentCallError):
            self.agent.signal(self.exec_id, signal.SIGKILL)

    # ---- internals --------------------------------------------------------------------

    def _send(self, message: Mapping[str, Any], timeout_s: float) -> None:
        if not self._started.wait(timeout_s):
            raise self._fail(f"did not start within {timeout_s:g} s", timed_out=True)
        if self._broken is not None:
            raise McpServerError(self._broken)
        line = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        try:
            with self._write_lock:
                self.agent.write_stdin(self.exec_id, line, timeout=max(1.0, timeout_s))
        except AgentCallError as error:
            raise self._fail(f"could not be written to ({error.message})") from None

    def _fail(self, what: str, *, timed_out: bool = False) -> McpServerError:
        """Mark the connection broken because the server ``what``; kill it; the error to raise."""
        message = f"the MCP server {self.label!r} {what}"
        self._mark_broken(message)
        self.close()
        return McpServerError(self._broken or message, timed_out=timed_out)

    def _mark_broken(self, why: str) -> None:
        with self._lock:
            if self._broken is None:
                self._broken = why
            waiting = list(self._waiting.values())
        self._started.set()
        for slot in waiting:
            slot.done.set()

    def _read(self, command: list[str], env: dict[str, str], cwd: str) -> None:
        buffers = {"stdout": bytearray(), "stderr": bytearray()}
        exited: process_pb2.Exited | None = None
        try:
            events = self.agent.exec(
                command, env=env, cwd=cwd, exec_id=self.exec_id, keep_stdin_open=True,
                timeout_ms=SERVER_LIFETIME_MS, output_cap_bytes=UNBOUNDED_OUTPUT)
            for event in events:
                kind = event.WhichOneof("event")
                if kind == "started":
                    self._started.set()
                elif kind == "output":
                    stream = event.output.WhichOneof("data")
                    if stream is not None:
                        buffers[stream] += getattr(event.output, stream)
                        self._lines(stream, buffers[stream])
                elif kind == "exited":
                    exited = event.exited
        except AgentCallError as error:
            self._mark_broken(f"the MCP server {self.label!r} could not be run: {error.message}")
        except Exception as error:  # the channel closed under the stream
            self._mark_broken(f"the MCP server {self.label!r} stopped ({type(error).__name__}: {error})")
        finally:
            if buffers["stderr"]:
                log.info("mcp %s stderr: %s", self.label, buffers["stderr"].decode(errors="replace"))
            self._mark_broken(_exit_message(self.label, exited))

    def _lines(self, stream: str, buffer: bytearray) -> None:
        while (end := buffer.find(b"\n")) >= 0:
            line = bytes(buffer[:end]).strip()
            del buffer[:end + 1]
            if stream == "stderr":
                log.info("mcp %s stderr: %s", self.label, line.decode(errors="replace"))
            elif line:
                self._message(line)
        if stream == "stdout" and len(buffer) > MAX_LINE:
            self._fail(f"printed a line over {MAX_LINE} bytes without a newline (malformed output)")

    def _message(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            shown = line[:_SHOWN].decode(errors="replace")
            self._fail(f"printed output that is not a JSON-RPC message on stdout: {shown!r} (an MCP server "
                       "writes only JSON-RPC there; logs go to stderr)")
            return
        if "method" in message:
            self._answer_server(message)
            return
        request_id = message.get("id")
        with self._lock:
            waiting = self._waiting.get(request_id) if isinstance(request_id, int) else None
        if waiting is not None:
            waiting.response = message
            waiting.done.set()

    def _answer_server(self, message: dict[str, Any]) -> None:
        """Answer a request of the server's own (a notification needs none)."""
        if "id" not in message:
            return
        if message["method"] == "ping":
            reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"], "result": {}}
        else:
            reply = {"jsonrpc": "2.0", "id": message["id"],
                     "error": {"code": -32601, "message": f"callbox does not offer {message['method']}"}}
        # Answered from another thread: the reader must keep reading meanwhile.
        threading.Thread(target=self._reply, args=(reply,), daemon=True).start()

    def _reply(self, reply: dict[str, Any]) -> None:
        with contextlib.suppress(McpServerError):
            self._send(reply, 10.0)


def _exit_message(label: str, exited: process_pb2.Exited | None) -> str:
    if exited is None:
        return f"the MCP server {label!r} stopped"
    if exited.timed_out:
        return f"the MCP server {label!r} reached its lifetime limit and was stopped"
    how = f"was killed by signal {exited.signal}" if exited.signal else f"exited with code {exited.exit_code}"
    return f"the MCP server {label!r} {how} (its stderr is in callbox's log)"


ServerKey = tuple[str, str]
"""(sandbox id, declared tool name): one server per sandbox and ``[[tool]]`` table."""


class McpServers:
    """The running servers by sandbox and tool: started on first use, restarted when broken."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._servers: dict[ServerKey, McpConnection] = {}
        self._starting: dict[ServerKey, threading.Lock] = {}

    def get(self, key: ServerKey, agent: AgentClient, command: Sequence[str], *, env: Mapping[str, str],
            cwd: str, timeout_s: float) -> McpConnection:
        """The live, initialized server for ``key``; a new one when there is none or it broke."""
        with self._lock:
            gate = self._starting.setdefault(key, threading.Lock())
        with gate:
            with self._lock:
                current = self._servers.get(key)
            if current is not None and current.broken is None:
                return current
            connection = McpConnection(agent, command, env=env, cwd=cwd, label=key[1])
            try:
                connection.initialize(timeout_s)
            except BaseException:
                connection.close()
                raise
            with self._lock:
                self._servers[key] = connection
                # Servers of sandboxes that are gone have broken streams: forget them.
                for other in [k for k, c in self._servers.items() if c.broken is not None]:
                    del self._servers[other]
            return connection

    def drop(self, key: ServerKey) -> None:
        """Kill and forget the server for ``key`` (if any)."""
        with self._lock:
            connection = self._servers.pop(key, None)
        if connection is not None:
            connection.close()
