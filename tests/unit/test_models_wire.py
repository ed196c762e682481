"""The model adapters against a local server speaking each API's wire format.

The real ``openai`` and ``anthropic`` SDKs send their requests to a WireServer on
127.0.0.1; the tests assert the exact JSON they sent (model, tools, tool_choice, the
appended assistant items and tool results with their call ids, auth headers) and the
parsing of the canned answers, plain and streamed (SSE).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from harness.core.calls import ErrorCode, ToolResult
from harness.core.formats import tool_definitions
from harness.core.registry import ToolDefinition
from harness.models.anthropic_messages import AnthropicMessagesModel
from harness.models.base import AllowedTools, ForcedTool, ModelError, ModelToolCall, ToolChoice, Usage
from harness.models.factory import MissingApiKey, ModelConfigError, UnknownModelProvider, make_model
from harness.models.openai_chat import OpenAIChatModel
from harness.models.openai_responses import OpenAIResponsesModel
from tests.unit.wire_server import WireServer


class ReadArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="File to read.")


class ShellArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: str = Field(description="Command line to run.")


READ = ToolDefinition(name="read_file", description="Read a text file.", input_model=ReadArgs)
SHELL = ToolDefinition(name="shell", description="Run a shell command.", input_model=ShellArgs)
TOOLS = [READ, SHELL]

READ_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string", "description": "File to read."}},
    "required": ["path"],
    "additionalProperties": False,
}
SHELL_SCHEMA = {
    "type": "object",
    "properties": {"command": {"type": "string", "description": "Command line to run."}},
    "required": ["command"],
    "additionalProperties": False,
}

SYSTEM = "You are a careful coding agent."
TASK = "Fix the failing test."
RESULTS = [
    ToolResult(call_id="call_A", text="def add(a, b):\n    return a - b\n"),
    ToolResult.failure("call_B", ErrorCode.NONZERO_EXIT, "exit 1: 1 failed"),
]

_ENV = [
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_ORG_ID",
    "OPENAI_PROJECT_ID",
    "OPENAI_ADMIN_KEY",
    "OPENAI_CUSTOM_HEADERS",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_CUSTOM_HEADERS",
    "ANTHROPIC_PROFILE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def server() -> Iterator[WireServer]:
    with WireServer() as wire:
        yield wire


def responses_model(server: WireServer, **options: Any) -> OpenAIResponsesModel:
    return OpenAIResponsesModel("gpt-test", api_key="sk-test", base_url=f"{server.url}/v1", **options)


def chat_model(server: WireServer, **options: Any) -> OpenAIChatModel:
    return OpenAIChatModel("qwen-test", api_key="sk-test", base_url=f"{server.url}/v1", **options)


def anthropic_model(server: WireServer, **options: Any) -> AnthropicMessagesModel:
    return AnthropicMessagesModel("claude-test", api_key="sk-ant-test", base_url=server.url, **options)


# =============================================================================================
# OpenAI Responses API
# =============================================================================================

RESPONSES_TOOLS = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a text file.",
        "parameters": READ_SCHEMA,
        "strict": True,
    },
    {
        "type": "function",
        "name": "shell",
        "description": "Run a shell command.",
        "parameters": SHELL_SCHEMA,
        "strict": True,
    },
]

REASONING = {"type": "reasoning", "id": "rs_1", "summary": []}
MESSAGE = {
    "type": "message",
    "id": "msg_1",
    "role": "assistant",
    "status": "completed",
    "content": [{"type": "output_text", "text": "Reading the code and running the tests.", "annotations": []}],
}
CALL_A = {
    "type": "function_call",
    "id": "fc_1",
    "call_id": "call_A",
    "name": "read_file",
    "arguments": '{"path":"calc.py"}',
    "status": "completed",
}
CALL_B = {
    "type": "function_call",
    "id": "fc_2",
    "call_id": "call_B",
    "name": "shell",
    "arguments": '{"command":"pytest -q"}',
    "status": "completed",
}
FINAL_MESSAGE = {
    "type": "message",
    "id": "msg_2",
    "role": "assistant",
    "status": "completed",
    "content": [{"type": "output_text", "text": "The bug is in add().", "annotations": []}],
}


def response(output: list[dict[str, Any]], *, status: str = "completed", **extra: Any) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1760000000,
        "model": "gpt-test",
        "status": status,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 321,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 45,
            "output_tokens_details": {"reasoning_tokens": 12},
            "total_tokens": 366,
        },
        **extra,
    }


def test_responses_two_turn_exchange_exact_requests(server: WireServer) -> None:
    server.json(response([REASONING, MESSAGE, CALL_A, CALL_B]))
    server.json(response([FINAL_MESSAGE]))
    model = responses_model(server)

    context = model.start(SYSTEM, TASK)
    assert context.items == [{"role": "user", "content": TASK}]
    turn = model.complete(context, TOOLS, "auto")
    model.append_turn(context, turn)
    model.append_results(context, RESULTS)
    final = model.complete(context, TOOLS, "auto")

    first, second = server.requests
    assert first.method == "POST"
    assert first.path == "/v1/responses"
    assert first.headers["authorization"] == "Bearer sk-test"
    assert first.body == {
        "model": "gpt-test",
        "input": [{"role": "user", "content": TASK}],
        "instructions": SYSTEM,
        "tools": RESPONSES_TOOLS,
        "tool_choice": "auto",
    }
    assert tool_definitions(TOOLS, "openai") == RESPONSES_TOOLS
    assert second.path == "/v1/responses"
    assert second.body == {
        "model": "gpt-test",
        "input": [
            {"role": "user", "content": TASK},
            REASONING,
            MESSAGE,
            CALL_A,
            CALL_B,
            {"type": "function_call_output", "call_id": "call_A", "output": "def add(a, b):\n    return a - b\n"},
            {"type": "function_call_output", "call_id": "call_B", "output": "exit 1: 1 failed"},
        ],
        "instructions": SYSTEM,
        "tools": RESPONSES_TOOLS,
        "tool_choice": "auto",
    }

    assert turn.text == "Reading the code and running the tests."
    assert turn.tool_calls == (
        ModelToolCall(call_id="call_A", name="read_file", arguments='{"path":"calc.py"}'),
        ModelToolCall(call_id="call_B", name="shell", arguments='{"command":"pytest -q"}'),
    )
    assert turn.items == (REASONING, MESSAGE, CALL_A, CALL_B)
    assert turn.usage == Usage(input_tokens=321, output_tokens=45)
    assert turn.stop_reason == "completed"
    assert not turn.is_final
    assert final.is_final
    assert final.text == "The bug is in add()."
    assert final.items == (FINAL_MESSAGE,)


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("auto", "auto"),
        ("required", "required"),
        ("none", "none"),
        (ForcedTool("shell"), {"type": "function", "name": "shell"}),
        (
            AllowedTools(("read_file",)),
            {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "read_file"}]},
        ),
        (
            AllowedTools(("shell", "read_file"), mode="required"),
            {
                "type": "allowed_tools",
                "mode": "required",
                "tools": [{"type": "function", "name": "shell"}, {"type": "function", "name": "read_file"}],
            },
        ),
    ],
)
def test_responses_tool_choice_modes(server: WireServer, choice: ToolChoice, wire: Any) -> None:
    server.json(response([FINAL_MESSAGE]))
    model = responses_model(server)
    model.complete(model.start(SYSTEM, TASK), TOOLS, choice)
    body = server.requests[0].body
    assert body["tool_choice"] == wire
    assert body["tools"] == RESPONSES_TOOLS  # every tool stays offered; tool_choice restricts


def test_responses_allowed_tools_filtered_when_not_native(server: WireServer) -> None:
    server.json(response([FINAL_MESSAGE]))
    model = responses_model(server, native_allowed_tools=False)
    model.complete(model.start(SYSTEM, TASK), TOOLS, AllowedTools(("shell",), mode="required"))
    body = server.requests[0].body
    assert body["tool_choice"] == "required"
    assert body["tools"] == [RESPONSES_TOOLS[1]]


def test_responses_without_tools_sends_neither_tools_nor_tool_choice(server: WireServer) -> None:
    server.json(response([FINAL_MESSAGE]))
    model = responses_model(server, max_output_tokens=256, request_options={"temperature": 0})
    model.complete(model.start("", TASK), [], "auto")
    assert server.requests[0].body == {
        "model": "gpt-test",
        "input": [{"role": "user", "content": TASK}],
        "max_output_tokens": 256,
        "temperature": 0,
    }


def test_responses_custom_tool_call_and_its_output_item(server: WireServer) -> None:
    custom = {
        "type": "custom_tool_call",
        "id": "ctc_1",
        "call_id": "call_P",
        "name": "apply_patch",
        "input": "*** Begin Patch\n*** End Patch\n",
    }
    server.json(response([custom]))
    server.json(response([FINAL_MESSAGE]))
    model = responses_model(server)
    context = model.start(SYSTEM, TASK)
    turn = model.complete(context, TOOLS, "auto")
    assert turn.tool_calls == (
        ModelToolCall(call_id="call_P", name="apply_patch", arguments="*** Begin Patch\n*** End Patch\n"),
    )
    model.append_turn(context, turn)
    model.append_results(context, [ToolResult(call_id="call_P", text="Done.")])
    model.complete(context, TOOLS, "auto")
    assert server.requests[1].body["input"][-2:] == [
        custom,
        {"type": "custom_tool_call_output", "call_id": "call_P", "output": "Done."},
    ]


def test_responses_incomplete_reports_the_reason(server: WireServer) -> None:
    server.json(response([MESSAGE], status="incomplete", incomplete_details={"reason": "max_output_tokens"}))
    model = responses_model(server)
    turn = model.complete(model.start(SYSTEM, TASK), TOOLS, "auto")
    assert turn.stop_reason == "max_output_tokens"
    assert turn.text == "Reading the code and running the tests."


def test_responses_failed_status_is_a_model_error(server: WireServer) -> None:
    server.json(response([], status="failed", error={"code": "server_error", "message": "The model crashed."}))
    model = responses_model(server)
    with pytest.raises(ModelError) as caught:
        model.complete(model.start(SYSTEM, TASK), TOOLS, "auto")
    assert caught.value.retryable is True
    assert "The model crashed." in caught.value.message


def _responses_stream_events(*, completed_output: bool = True) -> list[tuple[str | None, Any]]:
    """What the Responses API streams for: text, then two parallel function calls."""
    message_added = {"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress", "content": []}
    call_a_added = {**CALL_A, "arguments": "", "status": "in_progress"}
    call_b_added = {**CALL_B, "arguments": "", "status": "in_progress"}
    part = {"type": "output_text", "text": "", "annotations": []}
    created = response([], status="in_progress")
    completed = response([MESSAGE, CALL_A, CALL_B] if completed_output else [])
    seq = iter(range(1000))

    def ev(kind: str, **data: Any) -> tuple[str, dict[str, Any]]:
        return kind, {"type": kind, "sequence_number": next(seq), **data}

    return [
        ev("response.created", response=created),
        ev("response.in_progress", response=created),
        ev("response.output_item.added", output_index=0, item=message_added),
        ev("response.content_part.added", output_index=0, item_id="msg_1", content_index=0, part=part),
        ev(
            "response.output_text.delta",
            output_index=0,
            item_id="msg_1",
            content_index=0,
            delta="Reading the code",
            logprobs=[],
        ),
        ev(
            "response.output_text.delta",
            output_index=0,
            item_id="msg_1",
            content_index=0,
            delta=" and running the tests.",
            logprobs=[],
        ),
        ev(
            "response.output_text.done",
            output_index=0,
            item_id="msg_1",
            content_index=0,
            text="Reading the code and running the tests.",
            logprobs=[],
        ),
        ev("response.output_item.done", output_index=0, item=MESSAGE),
        ev("response.output_item.added", output_index=1, item=call_a_added),
        ev("response.function_call_arguments.delta", output_index=1, item_id="fc_1", delta='{"path":'),
        ev("response.function_call_arguments.delta", output_index=1, item_id="fc_1", delta='"calc.py"}'),
        ev("response.function_call_arguments.done", output_index=1, item_id="fc_1", arguments='{"path":"calc.py"}'),
        ev("response.output_item.done", output_index=1, item=CALL_A),
        ev("response.output_item.added", output_index=2, item=call_b_added),
        ev("response.function_call_arguments.delta", output_index=2, item_id="fc_2", delta='{"command":"pytest -q"}'),
        ev("response.output_item.done", output_index=2, item=CALL_B),
        ev("response.completed", response=completed),
    ]


@pytest.mark.parametrize("completed_output", [True, False], ids=["completed-event", "item-events"])
def test_responses_streamed(server: WireServer, completed_output: bool) -> None:
    server.stream(_responses_stream_events(completed_output=completed_output))
    seen: list[str] = []
    model = responses_model(server, stream=True, on_text=seen.append)
    turn = model.complete(model.start(SYSTEM, TASK), TOOLS, "required")

    body = server.requests[0].body
    assert body == {
        "model": "gpt-test",
        "input": [{"role": "user", "content": TASK}],
        "instructions": SYSTEM,
        "tools": RESPONSES_TOOLS,
        "tool_choice": "required",
        "stream": True,
    }
    assert seen == ["Reading the code", " and running the tests."]
    assert turn.text == "Reading the code and running the tests."
    assert [call.call_id for call in turn.tool_calls] == ["call_A", "call_B"]
    assert turn.tool_calls[1] == ModelToolCall(call_id="call_B", name="shell", arguments='{"command":"pytest -q"}')
    assert turn.items == (MESSAGE, CALL_A, CALL_B)
    assert turn.usage == Usage(input_tokens=321, output_tokens=45)


def test_responses_stream_deltas_alone_build_the_items(server: WireServer) -> None:
    """A server that sends no output_item.done and an empty completed output still yields the turn."""
    events = [
        event for event in _responses_stream_events(completed_output=False) if event[0] != "response.output_item.done"
    ]
    server.stream(events)
    model = responses_model(server, stream=True)
    turn = model.complete(model.start(SYSTEM, TASK), TOOLS, "auto")
    assert turn.text == "Reading the code and running the tests."
    assert [(c.call_id, c.arguments) for c in turn.tool_calls] == [
        ("call_A", '{"path":"calc.py"}'),
        ("call_B", '{"command":"pytest -q"}'),
    ]


def test_responses_stream_error_event(server: WireServer) -> None:
    server.stream(
        [
            ("response.created", {"type": "response.created", "sequence_number": 0, "response": response([])}),
            ("error", {"type": "error", "sequence_number": 1, "code": "server_error", "message": "Overloaded, retry."}),
        ]
    )
    model = responses_model(server, stream=True)
    with pytest.raises(ModelError) as caught:
        model.complete(model.start(SYSTEM, TASK), TOOLS, "auto")
    assert caught.value.retryable is True
    assert "Overloaded, retry." in caught.value.message


def test_responses_stream_cut_short_is_retryable(server: WireServer) -> None:
    server.stream(_responses_stream_events()[:5])
    model = responses_model(server, stream=True)
    with pytest.raises(ModelError) as caught:
        model.complete(model.start(SYSTEM, TASK), TOOLS, "auto")
    assert caught.value.retryable is True
    assert "ended before the response was complete" in caught.value.message


# =============================================================================================
# Chat Completions
# =============================================================================================

CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file.",
            "parameters": READ_SCHEMA,
            "strict": True,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "Run a shell command.",
            "parameters": SHELL_SCHEMA,
            "strict": True,
        },
    },
]


def completion(message: dict[str, Any], finish_reason: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1760000000,
        "model": "qwen-test",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
        "usage": {"prompt_tokens": 200, "completion_tokens": 30, "total_tokens": 230},
    }


CHAT_CALLS = [
    {"id": "call_A", "type": "function", "function": {"name": "read_file", "arguments": '{"path":"calc.py"}'}},
    {"id": "call_B", "type": "function", "function": {"name": "shell", "arguments": '{"command":"pytest -q"}'}},
]


def test_chat_two_turn_exchange_exact_requests(server: WireServer) -> None:
    server.json(
        completion(
            {"role": "assistant", "content": None, "tool_calls": CHAT_CALLS, "refusal": None, "annotations": []},
            "tool_calls",
        )
    )
    server.json(completion({"role": "assistant", "content": "The bug is in add()."}, "stop"))
    model = chat_model(server)

    context = model.start(SYSTEM, TASK)
    turn = model.complete(context, TOOLS, "auto")
    model.append_turn(context, turn)
    model.append_results(context, RESULTS)
    final = model.complete(context, TOOLS, "auto")

    first, second = server.requests
    assert first.path == "/v1/chat/completions"
    assert first.headers["authorization"] == "Bearer sk-test"
    assert first.body == {
        "model": "qwen-test",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}],
        "tools": CHAT_TOOLS,
        "tool_choice": "auto",
    }
    assert tool_definitions(TOOLS, "chat") == CHAT_TOOLS
    assert second.body == {
        "model": "qwen-test",
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": TASK},
            {"role": "assistant", "content": None, "tool_calls": CHAT_CALLS},
            {"role": "tool", "tool_call_id": "call_A", "content": "def add(a, b):\n    return a - b\n"},
            {"role": "tool", "tool_call_id": "call_B", "content": "exit 1: 1 failed"},
        ],
        "tools": CHAT_TOOLS,
        "tool_choice": "auto",
    }
    assert turn.tool_calls == (
        ModelToolCall(call_id="call_A", name="read_file", arguments='{"path":"calc.py"}'),
        ModelToolCall(call_id="call_B", name="shell", arguments='{"command":"pytest -q"}'),
    )
    assert turn.text == ""
    assert turn.usage == Usage(input_tokens=200, output_tokens=30)
    assert turn.stop_reason == "tool_calls"
    assert final.is_final
    assert final.text == "The bug is in add()."
    assert final.items == ({"role": "assistant", "content": "The bug is in add()."},)


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("auto", "auto"),
        ("required", "required"),
        ("none", "none"),
        (ForcedTool("read_file"), {"type": "function", "function": {"name": "read_file"}}),
        (
            AllowedTools(("shell",), mode="required"),
            {
                "type": "allowed_tools",
                "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": "shell"}}]},
            },
        ),
        (
            AllowedTools(("read_file", "shell")),
            {
                "type": "allowed_tools",
                "allowed_tools": {
                    "mode": "auto",
                    "tools": [
                        {"type": "function", "function": {"name": "read_file"}},
                        {"type": "function", "function": {"name": "shell"}},
                    ],
                },
            },
        ),
    ],
)
def test_chat_tool_choice_modes(server: WireServer, choice: ToolChoice, wire: Any) -> None:
    server.json(completion({"role": "assistant", "content": "ok"}, "stop"))
    model = chat_model(server)
    model.complete(model.start(SYSTEM, TASK), TOOLS, choice)
    body = server.requests[0].body
    assert body["tool_choice"] == wire
    assert body["tools"] == CHAT_TOOLS


def test_chat_allowed_tools_filtered_for_local_servers(server: WireServer) -> None:
    server.json(completion({"role": "assistant", "content": "ok"}, "stop"))
    model = chat_model(server, native_allowed_tools=False)
    model.complete(model.start(SYSTEM, TASK), TOOLS, AllowedTools(("read_file",)))
    body = server.requests[0].body
    assert body["tool_choice"] == "auto"
    assert body["tools"] == [CHAT_TOOLS[0]]


def test_chat_call_without_id_gets_one_used_consistently(server: WireServer) -> None:
    server.json(
        completion(
            {
                "role": "assistant",
                "content": "Listing.",
                "tool_calls": [{"type": "function", "function": {"name": "shell", "arguments": '{"command":"ls"}'}}],
            },
            "tool_calls",
        )
    )
    server.json(completion({"role": "assistant", "content": "done"}, "stop"))
    model = chat_model(server)
    context = model.start(SYSTEM, TASK)
    turn = model.complete(context, TOOLS, "auto")
    call_id = turn.tool_calls[0].call_id
    assert call_id.startswith("call_")
    model.append_turn(context, turn)
    model.append_results(context, [ToolResult(call_id=call_id, text="a.py")])
    model.complete(context, TOOLS, "auto")
    messages = server.requests[1].body["messages"]
    assert messages[2] == {
        "role": "assistant",
        "content": "Listing.",
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "shell", "arguments": '{"command":"ls"}'}}
        ],
    }
    assert messages[3] == {"role": "tool", "tool_call_id": call_id, "content": "a.py"}


def _chunk(delta: dict[str, Any], finish_reason: str | None = None, usage: Any = None) -> dict[str, Any]:
    choices = [{"index": 0, "delta": delta, "finish_reason": finish_reason}] if delta is not None else []
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1760000000, "model": "qwen-test"}
    chunk["choices"] = choices
    if usage is not None:
        chunk["usage"] = usage
    return chunk


def test_chat_streamed_with_parallel_calls(server: WireServer) -> None:
    tool_deltas = [
        {"index": 0, "id": "call_A", "type": "function", "function": {"name": "read_file", "arguments": ""}},
        {"index": 0, "function": {"arguments": '{"path":'}},
        {"index": 1, "id": "call_B", "type": "function", "function": {"name": "shell", "arguments": ""}},
        {"index": 0, "function": {"arguments": '"calc.py"}'}},
        {"index": 1, "function": {"arguments": '{"command":"pytest -q"}'}},
    ]
    events: list[tuple[str | None, Any]] = [(None, _chunk({"role": "assistant", "content": ""}))]
    events += [(None, _chunk({"content": piece})) for piece in ("Let me ", "look.")]
    events += [(None, _chunk({"tool_calls": [delta]})) for delta in tool_deltas]
    events.append((None, _chunk({}, "tool_calls")))
    events.append((None, {**_chunk(None), "choices": [], "usage": {"prompt_tokens": 90, "completion_tokens": 7}}))
    server.stream(events, done=True)
    seen: list[str] = []
    model = chat_model(server, stream=True, on_text=seen.append)
    turn = model.complete(model.start(SYSTEM, TASK), TOOLS, "auto")

    body = server.requests[0].body
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert seen == ["Let me ", "look."]
    assert turn.text == "Let me look."
    assert turn.tool_calls == (
        ModelToolCall(call_id="call_A", name="read_file", arguments='{"path":"calc.py"}'),
        ModelToolCall(call_id="call_B", name="shell", arguments='{"command":"pytest -q"}'),
    )
    assert turn.items == ({"role": "assistant", "content": "Let me look.", "tool_calls": CHAT_CALLS},)
    assert turn.usage == Usage(input_tokens=90, output_tokens=7)
    assert turn.stop_reason == "tool_calls"


# =============================================================================================
# Anthropic Messages API
# =============================================================================================

ANTHROPIC_TOOLS = [
    {"name": "read_file", "description": "Read a text file.", "input_schema": READ_SCHEMA},
    {"name": "shell", "description": "Run a shell command.", "input_schema": SHELL_SCHEMA},
]
THINKING = {"type": "thinking", "thinking": "Read first, then test.", "signature": "sig=="}
TEXT = {"type": "text", "text": "Reading the code and running the tests."}
USE_A = {"type": "tool_use", "id": "toolu_A", "name": "read_file", "input": {"path": "calc.py"}}
USE_B = {"type": "tool_use", "id": "toolu_B", "name": "shell", "input": {"command": "pytest -q"}}


def message(content: list[dict[str, Any]], stop_reason: str) -> dict[str, Any]:
    return {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": 400,
            "cache_creation_input_tokens": 100,
            "cache_read_input_tokens": 20,
            "output_tokens": 60,
        },
    }


def anthropic_key(headers: dict[str, str]) -> str:
    """The key as the SDK sent it: ``x-api-key`` (older SDKs) or ``Authorization: Bearer``
    (anthropic 2.x sends API keys as bearer tokens); never both."""
    bearer = headers.get("authorization", "")
    assert not (bearer and "x-api-key" in headers)
    return headers.get("x-api-key") or bearer.removeprefix("Bearer ")


def test_anthropic_two_turn_exchange_exact_requests(server: WireServer) -> None:
    server.json(message([THINKING, {**TEXT, "citations": None}, USE_A, USE_B], "tool_use"))
    server.json(message([{"type": "text", "text": "The bug is in add()."}], "end_turn"))
    model = anthropic_model(server)

    context = model.start(SYSTEM, TASK)
    assert context.items == [{"role": "user", "content": TASK}]
    turn = model.complete(context, TOOLS, "auto")
    model.append_turn(context, turn)
    results = [
        ToolResult(call_id="toolu_A", text="def add(a, b):\n    return a - b\n"),
        ToolResult.failure("toolu_B", ErrorCode.NONZERO_EXIT, "exit 1: 1 failed"),
    ]
    model.append_results(context, results)
    final = model.complete(context, TOOLS, "auto")

    first, second = server.requests
    assert first.path == "/v1/messages"
    assert anthropic_key(first.headers) == "sk-ant-test"
    assert "anthropic-version" in first.headers
    assert first.body == {
        "model": "claude-test",
        "max_tokens": 8192,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": TASK}],
        "tools": ANTHROPIC_TOOLS,
        "tool_choice": {"type": "auto"},
    }
    assert tool_definitions(TOOLS, "anthropic") == ANTHROPIC_TOOLS
    assert second.body == {
        "model": "claude-test",
        "max_tokens": 8192,
        "system": SYSTEM,
        "messages": [
            {"role": "user", "content": TASK},
            {"role": "assistant", "content": [THINKING, TEXT, USE_A, USE_B]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_A",
                        "content": "def add(a, b):\n    return a - b\n",
                        "is_error": False,
                    },
                    {"type": "tool_result", "tool_use_id": "toolu_B", "content": "exit 1: 1 failed", "is_error": True},
                ],
            },
        ],
        "tools": ANTHROPIC_TOOLS,
        "tool_choice": {"type": "auto"},
    }
    assert turn.text == "Reading the code and running the tests."
    assert turn.tool_calls == (
        ModelToolCall(call_id="toolu_A", name="read_file", arguments='{"path":"calc.py"}'),
        ModelToolCall(call_id="toolu_B", name="shell", arguments='{"command":"pytest -q"}'),
    )
    assert json.loads(turn.tool_calls[0].arguments) == {"path": "calc.py"}
    assert turn.usage == Usage(input_tokens=520, output_tokens=60)
    assert turn.stop_reason == "tool_use"
    assert final.is_final
    assert final.text == "The bug is in add()."
    assert final.stop_reason == "end_turn"


@pytest.mark.parametrize(
    ("choice", "wire", "offered"),
    [
        ("auto", {"type": "auto"}, ["read_file", "shell"]),
        ("required", {"type": "any"}, ["read_file", "shell"]),
        ("none", {"type": "none"}, ["read_file", "shell"]),
        (ForcedTool("shell"), {"type": "tool", "name": "shell"}, ["read_file", "shell"]),
        # emulated: the subset is what is sent
        (AllowedTools(("shell",)), {"type": "auto"}, ["shell"]),
        (AllowedTools(("shell", "read_file"), mode="required"), {"type": "any"}, ["read_file", "shell"]),
        (AllowedTools(("read_file",), mode="required"), {"type": "any"}, ["read_file"]),
    ],
)
def test_anthropic_tool_choice_modes(server: WireServer, choice: ToolChoice, wire: Any, offered: list[str]) -> None:
    server.json(message([{"type": "text", "text": "ok"}], "end_turn"))
    model = anthropic_model(server)
    model.complete(model.start(SYSTEM, TASK), TOOLS, choice)
    body = server.requests[0].body
    assert body["tool_choice"] == wire
    assert [tool["name"] for tool in body["tools"]] == offered


def test_anthropic_streamed_with_parallel_calls(server: WireServer) -> None:
    start = message([], "")
    start["stop_reason"] = None
    start["usage"] = {"input_tokens": 400, "output_tokens": 1}
    events: list[tuple[str | None, Any]] = [
        ("message_start", {"type": "message_start", "message": start}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        ("ping", {"type": "ping"}),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Reading the code"}},
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": " and running the tests."},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 1, "content_block": {**USE_A, "input": {}}},
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": '{"path": '},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": '"calc.py"}'},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 2, "content_block": {**USE_B, "input": {}}},
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 2,
                "delta": {"type": "input_json_delta", "partial_json": '{"command": "pytest -q"}'},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 2}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": 77},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    server.stream(events)
    seen: list[str] = []
    model = anthropic_model(server, stream=True, on_text=seen.append)
    context = model.start(SYSTEM, TASK)
    turn = model.complete(context, TOOLS, ForcedTool("read_file"))

    body = server.requests[0].body
    assert body["stream"] is True
    assert body["tool_choice"] == {"type": "tool", "name": "read_file"}
    assert body["messages"] == [{"role": "user", "content": TASK}]
    assert seen == ["Reading the code", " and running the tests."]
    assert turn.text == "Reading the code and running the tests."
    assert turn.tool_calls == (
        ModelToolCall(call_id="toolu_A", name="read_file", arguments='{"path":"calc.py"}'),
        ModelToolCall(call_id="toolu_B", name="shell", arguments='{"command":"pytest -q"}'),
    )
    assert turn.items == ({"role": "assistant", "content": [TEXT, USE_A, USE_B]},)
    assert turn.usage == Usage(input_tokens=400, output_tokens=77)
    assert turn.stop_reason == "tool_use"


def test_anthropic_stream_error_event_is_retryable(server: WireServer) -> None:
    start = message([], "")
    start["stop_reason"] = None
    server.stream(
        [
            ("message_start", {"type": "message_start", "message": start}),
            ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        ]
    )
    model = anthropic_model(server, stream=True)
    with pytest.raises(ModelError) as caught:
        model.complete(model.start(SYSTEM, TASK), TOOLS, "auto")
    assert caught.value.retryable is True
    assert "Overloaded" in caught.value.message


def test_anthropic_auth_token_is_a_bearer(server: WireServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "tok-123")
    server.json(message([{"type": "text", "text": "hi"}], "end_turn"))
    model = AnthropicMessagesModel("claude-test", base_url=server.url)
    model.complete(model.start("", TASK), [], "auto")
    request = server.requests[0]
    assert request.headers["authorization"] == "Bearer tok-123"
    assert "x-api-key" not in request.headers
    assert request.body == {"model": "claude-test", "max_tokens": 8192, "messages": [{"role": "user", "content": TASK}]}


# =============================================================================================
# Errors, keys and base URLs (all three adapters)
# =============================================================================================

OPENAI_ERROR = {
    "error": {"message": "Invalid schema for function 'shell'.", "type": "invalid_request_error", "code": None}
}
ANTHROPIC_ERROR = {"type": "error", "error": {"type": "invalid_request_error", "message": "tools.0: bad schema"}}


def _make(kind: str, server: WireServer) -> Any:
    return {"responses": responses_model, "chat": chat_model, "anthropic": anthropic_model}[kind](server)


@pytest.mark.parametrize("kind", ["responses", "chat", "anthropic"])
@pytest.mark.parametrize(
    ("status", "retryable"),
    [(400, False), (401, False), (404, False), (422, False), (429, True), (500, True), (503, True), (529, True)],
)
def test_http_errors_map_to_model_errors(server: WireServer, kind: str, status: int, retryable: bool) -> None:
    body = ANTHROPIC_ERROR if kind == "anthropic" else OPENAI_ERROR
    server.json(body, status=status)
    model = _make(kind, server)
    with pytest.raises(ModelError) as caught:
        model.complete(model.start(SYSTEM, TASK), TOOLS, "auto")
    error = caught.value
    assert error.retryable is retryable
    assert f"HTTP {status}" in error.message
    assert ("bad schema" if kind == "anthropic" else "Invalid schema for function 'shell'.") in error.message
    assert "Traceback" not in error.message
    assert len(server.requests) == 1  # max_retries=0: the loop retries, not the SDK
    if status == 401:
        assert ("ANTHROPIC_API_KEY" if kind == "anthropic" else "OPENAI_API_KEY") in error.message


def test_error_body_that_is_not_json_still_reads(server: WireServer) -> None:
    server.raw(502, "text/html", b"<h1>Bad gateway</h1>")
    model = chat_model(server)
    with pytest.raises(ModelError) as caught:
        model.complete(model.start(SYSTEM, TASK), TOOLS, "auto")
    assert caught.value.retryable is True
    assert "HTTP 502" in caught.value.message


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("kind", ["responses", "chat", "anthropic"])
def test_connection_refused_is_retryable(kind: str) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    model: Any
    if kind == "responses":
        model = OpenAIResponsesModel("m", api_key="k", base_url=url + "/v1", timeout_s=5)
    elif kind == "chat":
        model = OpenAIChatModel("m", api_key="k", base_url=url + "/v1", timeout_s=5)
    else:
        model = AnthropicMessagesModel("m", api_key="k", base_url=url, timeout_s=5)
    with pytest.raises(ModelError) as caught:
        model.complete(model.start(SYSTEM, TASK), TOOLS, "auto")
    assert caught.value.retryable is True
    assert "cannot reach" in caught.value.message
    assert url in caught.value.message


@pytest.mark.parametrize("kind", ["responses", "chat", "anthropic"])
def test_timeout_is_retryable(server: WireServer, kind: str) -> None:
    server.json({}, delay_s=2.0)
    model: Any
    if kind == "responses":
        model = responses_model(server, timeout_s=0.3)
    elif kind == "chat":
        model = chat_model(server, timeout_s=0.3)
    else:
        model = anthropic_model(server, timeout_s=0.3)
    with pytest.raises(ModelError) as caught:
        model.complete(model.start(SYSTEM, TASK), TOOLS, "auto")
    assert caught.value.retryable is True
    assert "timed out" in caught.value.message


@pytest.mark.parametrize(
    ("spec", "variable"),
    [
        ("openai:gpt-test", "OPENAI_API_KEY"),
        ("openai-chat:gpt-test", "OPENAI_API_KEY"),
        ("anthropic:claude-test", "ANTHROPIC_API_KEY"),
    ],
)
def test_missing_key_names_the_variable(spec: str, variable: str) -> None:
    with pytest.raises(MissingApiKey) as caught:
        make_model(spec)
    assert caught.value.variable == variable
    assert variable in caught.value.message
    assert caught.value.exit_code == 2


def test_keys_come_from_the_environment(server: WireServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("OPENAI_BASE_URL", f"{server.url}/v1")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
    server.json(response([FINAL_MESSAGE]))
    server.json(message([{"type": "text", "text": "hi"}], "end_turn"))
    openai_model = make_model("openai:gpt-test")
    openai_model.complete(openai_model.start(SYSTEM, TASK), TOOLS, "auto")
    claude = make_model("anthropic:claude-test")
    claude.complete(claude.start(SYSTEM, TASK), TOOLS, "auto")
    assert server.requests[0].path == "/v1/responses"
    assert server.requests[0].headers["authorization"] == "Bearer sk-from-env"
    assert server.requests[1].path == "/v1/messages"
    assert anthropic_key(server.requests[1].headers) == "sk-ant-from-env"


def test_local_server_needs_no_key(server: WireServer) -> None:
    server.json(completion({"role": "assistant", "content": "hello"}, "stop"))
    model = make_model("openai-chat:llama3.1:8b", base_url=f"{server.url}/v1")
    assert model.name == "openai-chat:llama3.1:8b"
    turn = model.complete(model.start(SYSTEM, TASK), [], "auto")
    assert turn.text == "hello"
    request = server.requests[0]
    assert request.headers["authorization"] == "Bearer not-needed"
    assert request.body == {
        "model": "llama3.1:8b",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}],
    }


def test_make_model_builds_each_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    responses = make_model("openai:gpt-5", stream=True)
    chat = make_model("openai-chat:gpt-4.1")
    claude = make_model("anthropic:claude-sonnet-4-5", max_tokens=1024)
    assert isinstance(responses, OpenAIResponsesModel)
    assert (responses.name, responses.format, responses.stream) == ("openai:gpt-5", "openai", True)
    assert isinstance(chat, OpenAIChatModel)
    assert (chat.name, chat.format) == ("openai-chat:gpt-4.1", "chat")
    assert isinstance(claude, AnthropicMessagesModel)
    assert (claude.name, claude.format, claude.max_tokens) == ("anthropic:claude-sonnet-4-5", "anthropic", 1024)


@pytest.mark.parametrize("spec", ["gemini:pro", "gpt-5", ""])
def test_unknown_provider_lists_the_choices(spec: str) -> None:
    with pytest.raises(UnknownModelProvider) as caught:
        make_model(spec)
    assert caught.value.exit_code == 2
    for provider in ("openai", "openai-chat", "anthropic", "scripted"):
        assert provider in caught.value.message


def test_spec_without_model_name() -> None:
    with pytest.raises(ModelConfigError, match="names no model"):
        make_model("anthropic:")


@pytest.mark.parametrize("kind", ["responses", "chat", "anthropic"])
@pytest.mark.parametrize(
    ("choice", "fragment"),
    [
        (ForcedTool("delete_everything"), "not among the tools offered"),
        (AllowedTools(("read_file", "nope")), "not among the tools offered"),
        (AllowedTools((), mode="required"), "allows no tools"),
    ],
)
def test_bad_tool_choice_fails_before_any_request(
    server: WireServer, kind: str, choice: ToolChoice, fragment: str
) -> None:
    model = _make(kind, server)
    with pytest.raises(ModelError, match=fragment) as caught:
        model.complete(model.start(SYSTEM, TASK), TOOLS, choice)
    assert caught.value.retryable is False
    assert server.requests == []


@pytest.mark.parametrize("kind", ["responses", "chat", "anthropic"])
def test_empty_allowed_subset_means_none(server: WireServer, kind: str) -> None:
    if kind == "anthropic":
        server.json(message([{"type": "text", "text": "ok"}], "end_turn"))
    elif kind == "chat":
        server.json(completion({"role": "assistant", "content": "ok"}, "stop"))
    else:
        server.json(response([FINAL_MESSAGE]))
    model = _make(kind, server)
    model.complete(model.start(SYSTEM, TASK), TOOLS, AllowedTools(()))
    assert server.requests[0].body["tool_choice"] == ({"type": "none"} if kind == "anthropic" else "none")
    assert len(server.requests[0].body["tools"]) == 2
