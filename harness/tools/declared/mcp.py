"""``kind = "mcp"``: the tools of a stdio MCP server started in the sandbox.

Listing: :func:`mcp_tools` needs the server's tools before any call (for ``callbox tools``,
the doors' tool lists, the loop), so it starts the server once per process in a throwaway
sandbox with the policy's spec, asks ``tools/list``, and keeps the answer
(:func:`discover`). Each server tool becomes ``PREFIX__NAME`` with its description,
annotations and ``inputSchema`` (validated by :mod:`harness.core.declared_mcp`); a tool
whose name cannot be mapped or whose schema cannot be checked is skipped with a warning.

Calls: each sandbox runs its own server, started on the first call of one of its tools
(:class:`~harness.tools.declared.mcp_client.McpServers`, keyed by the sandbox id and the
``[[tool]]`` name), so it lives as long as the run or session that started it. A call gets
the call's timeout (``ToolContext.timeout_for``) for the server's start and its answer.

Results: ``isError`` is an error result (``tool_failed``) with the server's text;
``structuredContent`` is the structured content; text content is the result text, an image
that is a PNG, JPEG, GIF or WebP a picture of the result (within the policy's image bounds),
other content (audio, resources, other images) a line naming it. A server that crashed or printed
malformed output is ``tool_failed``, one that did not answer in time ``timed_out``; either
way it is killed, and the next call starts a new one. Its stderr goes to callbox's log.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.core.calls import ErrorCode, ImagePart, ToolOutput
from harness.core.context import ToolContext
from harness.core.declared import DeclaredTool
from harness.core.declared_mcp import McpArgs, input_model_for, mcp_tool_name, schema_problem
from harness.core.errors import AgentCallError, CallboxError
from harness.core.images import NotAnImage, image_part
from harness.core.registry import Tool, ToolAnnotations, ToolDefinition
from harness.core.strict_schema import SchemaForm, StrictSchemaError
from harness.engine.base import Engine
from harness.engine.spec import SandboxSpec
from harness.tools.declared.mcp_client import McpConnection, McpProtocolError, McpServerError, McpServers
from harness.tools.shell import agent_failure

__all__ = ["SERVERS", "McpDefinition", "McpDiscoveryError", "discover", "mcp_tools"]

log = logging.getLogger("callbox.mcp")

SERVERS = McpServers()
"""The servers the calls of this process started, one per sandbox and ``[[tool]]`` table."""
DISCOVERY_TIMEOUT_S = 60.0
"""The longest a server may take to start and list its tools when the registry is built
(at least the tool's own timeout)."""


class McpDiscoveryError(CallboxError):
    """The server of an mcp tool could not be started or did not list its tools."""


@dataclass(frozen=True)
class McpDefinition(ToolDefinition):
    """A server tool's definition: its schema forms come from the server's ``inputSchema``.

    A schema the strict form cannot describe (a free-form object, a value of any type) is
    offered as the server wrote it in both forms: plain formats use it as it is; an OpenAI
    strict-mode tools list cannot, and a run offering such a tool there needs ``strict=False``."""

    server_schema: dict[str, Any] = field(default_factory=dict, compare=False)

    def input_schema(self, form: SchemaForm = "strict") -> dict[str, Any]:
        try:
            return super().input_schema(form)
        except StrictSchemaError:
            schema = json.loads(json.dumps(self.server_schema))
            schema.setdefault("properties", {})
            return dict(schema)


def _annotations(listed: Mapping[str, Any]) -> ToolAnnotations:
    hints = listed.get("annotations") if isinstance(listed.get("annotations"), dict) else {}
    assert isinstance(hints, dict)
    read_only = hints.get("readOnlyHint") is True
    title = hints.get("title") or listed.get("title")
    return ToolAnnotations(
        read_only=read_only,
        destructive=not read_only and hints.get("destructiveHint", True) is not False,
        idempotent=hints.get("idempotentHint") is True,
        # A sandbox without network cannot reach the world; the server's own hint is kept.
        open_world=hints.get("openWorldHint") is True,
        title=title if isinstance(title, str) else None,
    )


def _definition(declared: DeclaredTool, full_name: str, listed: Mapping[str, Any]) -> McpDefinition:
    schema = listed["inputSchema"]
    description = listed.get("description")
    if not isinstance(description, str) or not description.strip():
        description = f"The {listed['name']} tool of the MCP server {declared.name!r}."
    return McpDefinition(name=full_name, description=description, input_model=input_model_for(full_name, schema),
                         annotations=_annotations(listed), server_schema=schema)


def _text_of(item: Mapping[str, Any]) -> str:
    kind = item.get("type")
    if kind == "text":
        return str(item.get("text", ""))
    if kind == "resource" and isinstance(item.get("resource"), dict):
        resource = item["resource"]
        if "text" in resource:
            return str(resource["text"])
        return f"[resource {resource.get('uri', '')} ({resource.get('mimeType', 'binary')})]"
    if kind == "resource_link":
        return f"[resource link {item.get('uri', '')}]"
    if kind in ("image", "audio"):
        return f"[{kind} {item.get('mimeType', '')}, {len(str(item.get('data', '')))} base64 characters]"
    return f"[{kind} content]"


def _picture(item: Mapping[str, Any], server: str) -> ImagePart | None:
    """An ``image`` content item as a picture, when it is a PNG, JPEG, GIF or WebP (else None)."""
    if item.get("type") != "image" or not isinstance(item.get("data"), str):
        return None
    try:
        return image_part(base64.b64decode(item["data"], validate=True), label=f"from the MCP server {server}")
    except (binascii.Error, NotAnImage):
        return None


def call_result(result: Mapping[str, Any], server: str = "") -> ToolOutput:
    """A ``tools/call`` result as a ToolOutput: its pictures (``image`` content that is a PNG,
    JPEG, GIF or WebP) as image parts, its other content as text."""
    content = result.get("content")
    items = [item for item in content if isinstance(item, dict)] if isinstance(content, list) else []
    images: list[ImagePart] = []
    texts: list[str] = []
    for item in items:
        picture = _picture(item, server)
        if picture is None:
            texts.append(_text_of(item))
        else:
            images.append(picture)
    text = "\n".join(texts)
    structured = result.get("structuredContent")
    structured = structured if isinstance(structured, dict) else None
    if not text and structured is not None:
        text = json.dumps(structured, ensure_ascii=False)
    if result.get("isError") is True:
        return ToolOutput(text=text or "the MCP tool reported an error without a message", is_error=True,
                          error=ErrorCode.TOOL_FAILED, structured=structured, raw_bytes=len(text.encode()),
                          images=tuple(images))
    return ToolOutput(text=text, structured=structured, raw_bytes=len(text.encode()), images=tuple(images))


def _server_failure(error: McpServerError) -> ToolOutput:
    then = "; the next call starts it again"
    if error.timed_out:
        return ToolOutput(text=f"{error.message}: it was stopped{then}", is_error=True, error=ErrorCode.TIMED_OUT,
                          structured={"reason": "mcp_server_timed_out"})
    return ToolOutput(text=f"{error.message}{then}", is_error=True, error=ErrorCode.TOOL_FAILED,
                      structured={"reason": "mcp_server_failed"})


def _handler(declared: DeclaredTool, server_tool: str) -> Callable[[ToolContext, McpArgs], ToolOutput]:
    command = list(declared.command or ())

    def handler(ctx: ToolContext, args: McpArgs) -> ToolOutput:
        timeout_s = ctx.timeout_for(declared.timeout_s)
        runtime = ctx.runtime()
        key = (runtime.sandbox_id, declared.name)
        try:
            server = SERVERS.get(key, runtime.agent, command, env={**runtime.env, **declared.env},
                                 cwd=runtime.workdir, timeout_s=timeout_s)
            result = server.request("tools/call", {"name": server_tool, "arguments": args.arguments()},
                                    max(0.1, ctx.started_at + timeout_s - time.monotonic()), limit_s=timeout_s)
        except McpServerError as error:
            SERVERS.drop(key)
            return _server_failure(error)
        except McpProtocolError as error:
            return ToolOutput(text=f"the MCP server {declared.name!r} refused the call: {error}", is_error=True,
                              error=ErrorCode.TOOL_FAILED, structured={"reason": "mcp_error", "code": error.code})
        except AgentCallError as error:
            return agent_failure(error, started=None)
        return call_result(result, declared.name)

    return handler


# ---- listing --------------------------------------------------------------------------------

_DISCOVERED: dict[str, list[dict[str, Any]]] = {}
_DISCOVERY_LOCK = threading.Lock()


def discover(declared: DeclaredTool, spec: SandboxSpec, engine_for: Callable[[], Engine],
             timeout_s: float) -> list[dict[str, Any]]:
    """The server's ``tools/list``, asked once per process (per table and spec) in a throwaway
    sandbox; McpDiscoveryError naming the tool and what failed."""
    cache_key = declared.model_dump_json() + spec.model_dump_json()
    with _DISCOVERY_LOCK:
        if cache_key in _DISCOVERED:
            return _DISCOVERED[cache_key]
        where = f"the mcp tool {declared.name!r} (command {' '.join(declared.command or ())})"
        try:
            engine = engine_for()
            sandbox = engine.create(spec)
        except CallboxError as exc:
            raise McpDiscoveryError(f"{where}: its tools cannot be listed without a sandbox: {exc}") from None
        try:
            runtime = sandbox.runtime()
            server = McpConnection(runtime.agent, list(declared.command or ()), env={**runtime.env, **declared.env},
                                   cwd=runtime.workdir, label=declared.name)
            try:
                server.initialize(timeout_s)
                listed = server.list_tools(timeout_s)
            finally:
                server.close()
        except (McpServerError, McpProtocolError) as exc:
            raise McpDiscoveryError(f"{where}: the server did not list its tools: {exc}; check the command, "
                                    "its mounts and env (run it in `callbox sandbox` to see its stderr)") from None
        finally:
            sandbox.destroy()
        _DISCOVERED[cache_key] = listed
        return listed


def mcp_tools(declared: DeclaredTool, listed: list[dict[str, Any]]) -> list[Tool]:
    """The registered tools of one ``kind = "mcp"`` table, from its server's ``tools/list``."""
    tools: list[Tool] = []
    for item in listed:
        server_name = item.get("name")
        if not isinstance(server_name, str):
            log.warning("mcp tool %r: skipped a listed tool without a name", declared.name)
            continue
        full_name = mcp_tool_name(declared.name, server_name)
        if full_name is None:
            log.warning("mcp tool %r: skipped %r: %s__%s is not a tool name (1 to 64 letters, digits, '_', '.', "
                        "'-'); choose a shorter prefix", declared.name, server_name, declared.name, server_name)
            continue
        problem = schema_problem(item.get("inputSchema"))
        if problem is not None:
            log.warning("mcp tool %r: skipped %s: %s", declared.name, full_name, problem)
            continue
        tools.append(Tool(_definition(declared, full_name, item), _handler(declared, server_name)))
    return tools
