"""Pydantic AI's MCP client (``pydantic-ai-slim[mcp]``: ``MCPToolset`` on the FastMCP client,
an MCP implementation of its own, not the ``mcp`` SDK's client) drives callbox over stdio
(``callbox mcp``) and over streamable HTTP (``callbox serve --mcp-http``).

The model is Pydantic AI's ``FunctionModel`` playing the shared SESSION, one tool call per
turn; it records the messages each turn receives, so the tests assert on the tool results the
agent hands back to the model: a ``ToolReturnPart`` for each call, and for the argument of the
wrong type a retry carrying callbox's readable error (``tool_error_behavior='retry'``, the
default, turns an MCP error result into a retry the model sees).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from tests.interop.conftest import CALLBOX, FINAL_ANSWER, SESSION, Step

pytestmark = [pytest.mark.interop, pytest.mark.docker]

RUN_TIMEOUT_S = 240


class ScriptedSession:
    """A FunctionModel function playing ``steps``; ``received[n]`` is what turn n was sent."""

    def __init__(self, steps: list[Step]) -> None:
        self.steps = steps
        self.received: list[list[ModelMessage]] = []
        self.tools: list[list[str]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.received.append(list(messages))
        self.tools.append([tool.name for tool in info.function_tools])
        turn = len(self.received) - 1
        if turn < len(self.steps):
            step = self.steps[turn]
            return ModelResponse(parts=[ToolCallPart(step.tool, step.arguments, tool_call_id=f"call_{turn}")])
        return ModelResponse(parts=[TextPart(FINAL_ANSWER)])

    def results(self, turn: int) -> dict[str, tuple[str, str]]:
        """call id -> (outcome, text) of the tool results in the request turn ``turn`` got."""
        request = self.received[turn][-1]
        assert isinstance(request, ModelRequest), request
        found: dict[str, tuple[str, str]] = {}
        for part in request.parts:
            call_id = getattr(part, "tool_call_id", None)
            if call_id is None:
                continue
            render = getattr(part, "model_response_str", None) or getattr(part, "model_response", None)
            text = render() if render is not None else part.content
            outcome = f"{type(part).__name__}:{getattr(part, 'outcome', '')}"
            found[call_id] = (outcome, text if isinstance(text, str) else json.dumps(text, default=str))
        return found

    def assert_seen(self) -> None:
        assert len(self.received) == len(SESSION) + 1, self.received
        for turn, step in enumerate(SESSION):
            outcome, text = self.results(turn + 1)[f"call_{turn}"]
            assert step.expect in _readable(text), (step, outcome, text)
            # an MCP error result comes back as a retry of that call, carrying callbox's text
            assert outcome == ("ToolReturnPart:retried" if step.is_error else "ToolReturnPart:success"), step
        for offered in self.tools:
            assert {"shell", "read_file", "write_file", "apply_patch", "str_replace_based_edit_tool"} <= set(offered)


def _readable(text: str) -> str:
    """The text the model reads in a result: Pydantic AI sends callbox's structuredContent
    (a JSON object whose ``text`` is the result's text) when there is one."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value["text"] if isinstance(value, dict) and isinstance(value.get("text"), str) else text


def _run(flow: Any) -> Any:
    async def bounded() -> Any:
        with anyio.fail_after(RUN_TIMEOUT_S):
            return await flow()

    return anyio.run(bounded)


def test_mcp_toolset_over_stdio_runs_a_coding_session(policy: Path, callbox_env: dict[str, str]):
    session = ScriptedSession(SESSION)
    model = FunctionModel(session)

    async def flow() -> Any:
        # README: pydantic-ai snippet start
        from fastmcp.client.transports import StdioTransport
        from pydantic_ai import Agent
        from pydantic_ai.mcp import MCPToolset

        callbox = MCPToolset(
            StdioTransport(CALLBOX, ["mcp", "--policy", str(policy)], env=callbox_env, keep_alive=False),
            read_timeout=300,  # a call lasts as long as its command
        )
        agent = Agent(model, instructions="Fix stats.mean in /workspace/proj.", toolsets=[callbox])
        async with agent:  # one MCP session: one sandbox, removed when it closes
            result = await agent.run("make mean() correct")
        print(result.output)
        # README: pydantic-ai snippet end
        return result

    result = _run(flow)
    assert result.output == FINAL_ANSWER
    session.assert_seen()


def test_mcp_toolset_over_streamable_http_runs_a_coding_session(mcp_http_url: str):
    session = ScriptedSession(SESSION)

    async def flow() -> Any:
        from pydantic_ai import Agent
        from pydantic_ai.mcp import MCPToolset

        agent = Agent(FunctionModel(session), toolsets=[MCPToolset(mcp_http_url, read_timeout=300)])
        async with agent:
            return await agent.run("make mean() correct")

    result = _run(flow)
    assert result.output == FINAL_ANSWER
    session.assert_seen()
