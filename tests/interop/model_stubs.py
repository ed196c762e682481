"""Loopback stand-ins for two model APIs, so a coding agent's own CLI runs against callbox
with no API key and no network: the Anthropic Messages API (Claude Code) and the OpenAI
Responses API (Codex). Each streams server-sent events exactly as the real API does.

A stub plays a script: one tool call per turn, then a final text answer. It finds the tool
it is to call among the tools the request offers (an agent names MCP tools its own way, for
example ``mcp__callbox__shell``), and keeps every request's JSON body, so a test asserts on
the tools offered and on the tool results the agent sent back.

Requests that are not the agent's main loop (a title, a quota probe: any request whose
tools do not include the scripted one) get a short text answer and do not advance the script.
A request with a tool schema the real API refuses (not an object at the top, or ``anyOf``,
``oneOf``, ``allOf``, ``enum`` or ``not`` there) gets the API's 400 error.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ToolPicker = Callable[[list[str]], str | None]
TOP_LEVEL_REFUSED = ("anyOf", "oneOf", "allOf", "enum", "not")


def schema_problem(name: str, schema: Any) -> str | None:
    """Why the model APIs refuse ``schema`` as tool ``name``'s input schema, if they do."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return f"tool {name!r}: the input schema must be of type 'object'"
    refused = [key for key in TOP_LEVEL_REFUSED if key in schema]
    return f"tool {name!r}: the input schema has {refused} at the top level" if refused else None


@dataclass(frozen=True)
class ScriptedCall:
    """A tool call the stub makes: ``pick`` chooses the tool among the names offered (None:
    not offered in this request), with ``arguments``."""

    pick: ToolPicker
    arguments: dict[str, Any]


def tool_ending(suffix: str, server: str = "callbox") -> ToolPicker:
    """Picks the tool whose name names ``server`` and ends with ``suffix`` (``mcp__callbox__shell``)."""

    def pick(names: list[str]) -> str | None:
        found = [name for name in names if server in name and name.endswith(suffix)]
        return found[0] if len(found) == 1 else None

    return pick


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    stub: ModelStub


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.server.stub.unexpected(self, "GET")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body: dict[str, Any] = json.loads(self.rfile.read(length) or b"{}")
        self.server.stub.answer(self, body)


class ModelStub:
    """A threaded HTTP server on 127.0.0.1 playing ``script``; subclasses speak one API."""

    path = "/"

    def __init__(self, script: list[ScriptedCall], final_text: str) -> None:
        self.script = script
        self.final_text = final_text
        self.requests: list[dict[str, Any]] = []
        """The body of every request of the agent's loop (those offering the scripted tools)."""
        self.other_requests: list[tuple[str, str]] = []
        """(method, path) of requests the stub does not script."""
        self.called: list[str] = []
        """The tool name each scripted call used."""
        self.refused: list[str] = []
        """Why requests were refused (a tool schema the real API refuses)."""
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.stub = self
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> ModelStub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # What a subclass says in its API's words.
    def tool_names(self, body: dict[str, Any]) -> list[str]:
        raise NotImplementedError

    def tool_results(self, body: dict[str, Any]) -> list[str]:
        """The text of each tool result the request carries, oldest first."""
        raise NotImplementedError

    def schemas(self, body: dict[str, Any]) -> Iterator[tuple[str, Any]]:
        """(name, input schema) of each function tool the request offers."""
        raise NotImplementedError

    def events(self, body: dict[str, Any], tool: str | None, arguments: dict[str, Any], turn: int,
               ) -> Iterator[tuple[str, dict[str, Any]]]:
        """The SSE events of one answer: a call of ``tool`` (text when None)."""
        raise NotImplementedError

    def answer(self, handler: _Handler, body: dict[str, Any]) -> None:
        if not handler.path.split("?")[0].endswith(self.path):
            self.unexpected(handler, "POST")
            return
        problems = [p for p in (schema_problem(name, schema) for name, schema in self.schemas(body)) if p]
        if problems:
            with self._lock:
                self.refused.extend(problems)
            self.error(handler, 400, "invalid_request_error", "; ".join(problems))
            return
        names = self.tool_names(body)
        with self._lock:
            done = len(self.tool_results(body))
            step = self.script[done] if done < len(self.script) else None
            scripted = any(call.pick(names) for call in self.script)
            if scripted:
                self.requests.append(body)
            turn = len(self.requests)
        tool = step.pick(names) if (step is not None and scripted) else None
        if tool is not None:
            with self._lock:
                self.called.append(tool)
        arguments = step.arguments if (step is not None and tool is not None) else {}
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Cache-Control", "no-cache")
        handler.send_header("Connection", "close")
        handler.end_headers()
        for event, data in self.events(body, tool, arguments, turn):
            handler.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
            handler.wfile.flush()
        handler.close_connection = True

    def unexpected(self, handler: _Handler, method: str) -> None:
        with self._lock:
            self.other_requests.append((method, handler.path))
        self.error(handler, 404, "not_found_error", f"the model stub has no {handler.path}")

    @staticmethod
    def error(handler: _Handler, status: int, kind: str, message: str) -> None:
        payload = json.dumps({"type": "error", "error": {"type": kind, "message": message}})
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload.encode())


def _text_of(content: Any) -> str:
    """The text of a tool result's content: a string, or a list of parts with ``text``."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_text_of(part.get("text", part.get("content", ""))) for part in content
                       if isinstance(part, dict))
    return ""


class AnthropicMessagesStub(ModelStub):
    """``POST /v1/messages`` of the Anthropic Messages API, streaming (``"stream": true``)."""

    path = "/v1/messages"

    def tool_names(self, body: dict[str, Any]) -> list[str]:
        return [tool["name"] for tool in body.get("tools", []) if "name" in tool]

    def schemas(self, body: dict[str, Any]) -> Iterator[tuple[str, Any]]:
        for tool in body.get("tools", []):
            if "input_schema" in tool:
                yield tool["name"], tool["input_schema"]

    @staticmethod
    def _result_blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
        return [block for message in body.get("messages", [])
                if message.get("role") == "user" and isinstance(message.get("content"), list)
                for block in message["content"] if block.get("type") == "tool_result"]

    def tool_results(self, body: dict[str, Any]) -> list[str]:
        return [_text_of(block.get("content")) for block in self._result_blocks(body)]

    def tool_result_errors(self, body: dict[str, Any]) -> list[bool]:
        """The ``is_error`` flag of each tool result, oldest first."""
        return [bool(block.get("is_error")) for block in self._result_blocks(body)]

    def events(self, body: dict[str, Any], tool: str | None, arguments: dict[str, Any], turn: int,
               ) -> Iterator[tuple[str, dict[str, Any]]]:
        usage = {"input_tokens": 10, "output_tokens": 1, "cache_creation_input_tokens": 0,
                 "cache_read_input_tokens": 0}
        yield "message_start", {"type": "message_start", "message": {
            "id": f"msg_stub_{turn}", "type": "message", "role": "assistant", "model": body.get("model", "stub"),
            "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}}
        if tool is not None:
            yield "content_block_start", {"type": "content_block_start", "index": 0, "content_block": {
                "type": "tool_use", "id": f"toolu_stub_{turn}", "name": tool, "input": {}}}
            text = json.dumps(arguments)
            for part in (text[: len(text) // 2], text[len(text) // 2:]):  # as the API does: in pieces
                yield "content_block_delta", {"type": "content_block_delta", "index": 0,
                                              "delta": {"type": "input_json_delta", "partial_json": part}}
            stop_reason = "tool_use"
        else:
            yield "content_block_start", {"type": "content_block_start", "index": 0,
                                          "content_block": {"type": "text", "text": ""}}
            yield "content_block_delta", {"type": "content_block_delta", "index": 0,
                                          "delta": {"type": "text_delta", "text": self.final_text}}
            stop_reason = "end_turn"
        yield "content_block_stop", {"type": "content_block_stop", "index": 0}
        yield "message_delta", {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                                "usage": {"output_tokens": 12}}
        yield "message_stop", {"type": "message_stop"}


class OpenAIResponsesStub(ModelStub):
    """``POST /v1/responses`` of the OpenAI Responses API, streaming."""

    path = "/responses"

    def tool_names(self, body: dict[str, Any]) -> list[str]:
        """Function tools by name; those in a ``namespace`` tool (as Codex offers an MCP
        server's) as ``NAMESPACE__NAME``."""
        names: list[str] = []
        for tool in body.get("tools", []):
            if tool.get("type") == "namespace":
                names.extend(f"{tool['name']}__{inner['name']}" for inner in tool.get("tools", []))
            elif "name" in tool:
                names.append(tool["name"])
        return names

    def schemas(self, body: dict[str, Any]) -> Iterator[tuple[str, Any]]:
        for tool in body.get("tools", []):
            for inner in tool.get("tools", []) if tool.get("type") == "namespace" else [tool]:
                if inner.get("type") == "function":
                    yield inner["name"], inner.get("parameters")

    @staticmethod
    def _namespace(body: dict[str, Any], tool: str) -> tuple[str | None, str]:
        """(namespace, name) of a name :meth:`tool_names` gave."""
        for outer in body.get("tools", []):
            prefix = f"{outer.get('name')}__"
            if outer.get("type") == "namespace" and tool.startswith(prefix):
                return outer["name"], tool.removeprefix(prefix)
        return None, tool

    def tool_results(self, body: dict[str, Any]) -> list[str]:
        items = body.get("input", [])
        return [_text_of(item.get("output")) for item in items if isinstance(item, dict)
                and item.get("type") in ("function_call_output", "custom_tool_call_output")]

    def events(self, body: dict[str, Any], tool: str | None, arguments: dict[str, Any], turn: int,
               ) -> Iterator[tuple[str, dict[str, Any]]]:
        response: dict[str, Any] = {"id": f"resp_stub_{turn}", "object": "response", "created_at": 0,
                                    "status": "in_progress", "model": body.get("model", "stub"), "output": []}
        yield "response.created", {"type": "response.created", "sequence_number": 0, "response": response}
        if tool is not None:
            namespace, name = self._namespace(body, tool)
            item: dict[str, Any] = {"type": "function_call", "id": f"fc_stub_{turn}", "call_id": f"call_stub_{turn}",
                                    "name": name, "arguments": json.dumps(arguments), "status": "completed"}
            if namespace is not None:
                item["namespace"] = namespace
        else:
            item = {"type": "message", "id": f"msg_stub_{turn}", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": self.final_text, "annotations": []}]}
        yield "response.output_item.added", {"type": "response.output_item.added", "sequence_number": 1,
                                             "output_index": 0, "item": {**item, "status": "in_progress"}}
        if tool is None:
            yield "response.output_text.delta", {"type": "response.output_text.delta", "sequence_number": 2,
                                                 "item_id": item["id"], "output_index": 0, "content_index": 0,
                                                 "delta": self.final_text}
        yield "response.output_item.done", {"type": "response.output_item.done", "sequence_number": 3,
                                            "output_index": 0, "item": item}
        usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 12,
                 "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 22}
        yield "response.completed", {"type": "response.completed", "sequence_number": 4, "response": {
            **response, "status": "completed", "output": [item], "usage": usage}}
