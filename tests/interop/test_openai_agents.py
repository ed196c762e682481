"""The OpenAI Agents SDK (``openai-agents``, pinned in pyproject's dev extras) drives callbox.

Two ways a user wires it: an ``Agent`` with ``MCPServerStdio`` running ``callbox mcp``, and an
``Agent`` whose function tools call the gRPC executor (``callbox serve --grpc``) through
``harness.client``. The model is a scripted implementation of the SDK's own ``Model``
interface (no API key, no network): it plays the shared SESSION, one tool call per turn, and
records what the SDK sends it each turn, so the tests assert on the tool output the model
actually receives, including the readable error for an argument of the wrong type.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from agents import FunctionTool, ModelResponse, Usage
from agents.models.interface import Model
from agents.tool_context import ToolContext
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from harness.client import AsyncExecutorClient
from tests.interop.conftest import CALLBOX, FINAL_ANSWER, SESSION, Step

pytestmark = [pytest.mark.interop, pytest.mark.docker]

RUN_TIMEOUT_S = 240


class ScriptedModel(Model):
    """The SDK's Model interface, playing ``steps`` (one function call per turn, then a final
    answer). ``inputs[n]`` is what turn n received; ``tools[n]`` the tool names it was offered."""

    def __init__(self, steps: list[Step]) -> None:
        self.steps = steps
        self.inputs: list[list[dict[str, Any]]] = []
        self.tools: list[list[str]] = []

    async def get_response(  # type: ignore[override]
        self, system_instructions: str | None, input: str | list[Any], model_settings: Any, tools: list[Any],
        output_schema: Any, handoffs: list[Any], tracing: Any, *, previous_response_id: str | None,
        conversation_id: str | None, prompt: Any,
    ) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else [
            item if isinstance(item, dict) else item.model_dump() for item in input]
        self.inputs.append(items)
        self.tools.append([tool.name for tool in tools])
        turn = len(self.inputs) - 1
        output: list[Any]
        if turn < len(self.steps):
            step = self.steps[turn]
            output = [ResponseFunctionToolCall(type="function_call", id=f"fc_{turn}", call_id=f"call_{turn}",
                                               name=step.tool, arguments=json.dumps(step.arguments),
                                               status="completed")]
        else:
            output = [ResponseOutputMessage(type="message", id="msg_final", role="assistant", status="completed",
                                            content=[ResponseOutputText(type="output_text", text=FINAL_ANSWER,
                                                                        annotations=[])])]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        raise NotImplementedError("these tests run agents without streaming")


def _tool_outputs(items: list[dict[str, Any]]) -> dict[str, str]:
    """call_id -> the text of its function_call_output, as the model receives it."""
    outputs: dict[str, str] = {}
    for item in items:
        if item.get("type") == "function_call_output":
            output = item["output"]
            if not isinstance(output, str):
                output = "".join(part.get("text", "") for part in output)
            outputs[item["call_id"]] = output
    return outputs


def _assert_session_seen(model: ScriptedModel) -> None:
    assert len(model.inputs) == len(SESSION) + 1, model.inputs
    for turn, step in enumerate(SESSION):
        received = _tool_outputs(model.inputs[turn + 1])  # the next turn carries this call's output
        assert f"call_{turn}" in received, (step, model.inputs[turn + 1])
        assert step.expect in received[f"call_{turn}"], (step, received[f"call_{turn}"])
    for offered in model.tools:
        assert {"shell", "read_file", "write_file", "apply_patch", "str_replace_based_edit_tool"} <= set(offered)


def _run(flow: Any) -> Any:
    async def bounded() -> Any:
        with anyio.fail_after(RUN_TIMEOUT_S):
            return await flow()

    return anyio.run(bounded)


def test_agent_with_mcp_server_stdio_runs_a_coding_session(policy: Path, callbox_env: dict[str, str]):
    model = ScriptedModel(SESSION)

    async def flow() -> Any:
        # README: openai-agents snippet start
        from agents import Agent, RunConfig, Runner
        from agents.mcp import MCPServerStdio

        callbox = MCPServerStdio(
            name="callbox",
            params={"command": CALLBOX, "args": ["mcp", "--policy", str(policy)], "env": callbox_env},
            cache_tools_list=True,
            client_session_timeout_seconds=300,  # a call lasts as long as its command (default: 5 s)
        )
        async with callbox:  # one MCP session: one sandbox, removed when it closes
            agent = Agent(name="coder", instructions="Fix stats.mean in /workspace/proj.", model=model,
                          mcp_servers=[callbox])
            result = await Runner.run(agent, "make mean() correct", run_config=RunConfig(tracing_disabled=True))
        print(result.final_output)
        # README: openai-agents snippet end
        return result

    result = _run(flow)
    assert result.final_output == FINAL_ANSWER
    _assert_session_seen(model)


def test_agent_with_function_tools_on_the_grpc_executor(grpc_target: tuple[str, str]):
    target, token = grpc_target
    model = ScriptedModel(SESSION)

    async def flow() -> Any:
        from agents import Agent, RunConfig, Runner

        async with AsyncExecutorClient(target, token) as client:
            box = await client.create_sandbox()

            def callbox_tool(definition: dict[str, Any]) -> FunctionTool:
                async def invoke(ctx: ToolContext[Any], arguments: str) -> str:
                    result = await client.call(box, definition["name"], arguments, call_id=ctx.tool_call_id)
                    return result.text  # errors too: the model reads them and tries again

                return FunctionTool(name=definition["name"], description=definition["description"],
                                    params_json_schema=definition["parameters"], on_invoke_tool=invoke,
                                    strict_json_schema=bool(definition.get("strict")))

            try:
                tools = [callbox_tool(d) for d in await client.list_tools("openai")]
                agent = Agent(name="coder", instructions="Fix stats.mean in /workspace/proj.", model=model,
                              tools=tools)
                result = await Runner.run(agent, "make mean() correct", run_config=RunConfig(tracing_disabled=True))
                runs = {run.run_id: run for run in await client.list_runs()}
                assert box in runs  # the sandbox's run holds every call, under the SDK's call ids
            finally:
                await client.delete_sandbox(box)
        return result

    result = _run(flow)
    assert result.final_output == FINAL_ANSWER
    _assert_session_seen(model)
