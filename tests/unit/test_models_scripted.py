"""The scripted model: the JSONL transcript format, the turns it replays in each provider's
shapes, what it records, and its errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from harness.core.calls import ErrorCode, ToolResult
from harness.core.registry import ToolDefinition
from harness.models.base import AllowedTools, ForcedTool, ModelAdapter, ModelError, ModelToolCall, Usage
from harness.models.factory import ModelConfigError, make_model
from harness.models.scripted import ScriptedModel, ScriptedRequest, ScriptError


class ShellArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: str = Field(description="Command line to run.")


class ReadArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="File to read.")


SHELL = ToolDefinition(name="shell", description="Run a shell command.", input_model=ShellArgs)
READ = ToolDefinition(name="read_file", description="Read a text file.", input_model=ReadArgs)
TOOLS = [SHELL, READ]

TRANSCRIPT = """\
# list the files, read one, then answer

{"text": "Let me look.", "tool_calls": [{"call_id": "c1", "name": "shell", "arguments": {"command": "ls"}}], "usage": {"input_tokens": 100, "output_tokens": 12, "cost_usd": 0.002}}
{"tool_calls": [{"name": "read_file", "arguments": "{\\"path\\": \\"a.py\\"}"}, {"name": "shell", "arguments": {"command": "pytest -q"}}], "comment": "two calls in one turn"}
   # indented comments are skipped too
{"text": "All tests pass.", "stop_reason": "end_turn"}
"""  # noqa: E501 (JSONL lines as written)


@pytest.fixture
def transcript(tmp_path: Path) -> Path:
    path = tmp_path / "demo.jsonl"
    path.write_text(TRANSCRIPT, encoding="utf-8")
    return path


def test_the_turns_of_a_transcript(transcript: Path) -> None:
    model = ScriptedModel.from_file(transcript)
    assert model.name == f"scripted:{transcript}"
    assert model.format == "openai"
    assert model.remaining == 3
    first, second, third = model.turns

    assert first.text == "Let me look."
    assert first.tool_calls == (ModelToolCall(call_id="c1", name="shell", arguments='{"command":"ls"}'),)
    assert first.usage == Usage(input_tokens=100, output_tokens=12, cost_usd=0.002)
    assert first.stop_reason == "tool_calls"

    # default call ids call_<turn>_<n>; string arguments verbatim, objects as compact JSON
    assert second.text == ""
    assert second.tool_calls == (
        ModelToolCall(call_id="call_2_1", name="read_file", arguments='{"path": "a.py"}'),
        ModelToolCall(call_id="call_2_2", name="shell", arguments='{"command":"pytest -q"}'),
    )
    assert second.usage == Usage()

    assert third.is_final
    assert third.text == "All tests pass."
    assert third.stop_reason == "end_turn"


def test_replay_in_order_and_record_what_was_asked(transcript: Path) -> None:
    model = ScriptedModel.from_file(transcript)
    context = model.start("Be careful.", "Fix it.")
    turns = []
    choices: list[Any] = ["required", AllowedTools(("read_file", "shell")), "auto"]
    for choice in choices:
        turn = model.complete(context, TOOLS, choice)
        turns.append(turn)
        model.append_turn(context, turn)
        model.append_results(context, [ToolResult(call_id=c.call_id, text=f"out {c.call_id}") for c in turn.tool_calls])
    assert turns == model.turns
    assert model.remaining == 0
    assert [r.tool_choice for r in model.requests] == choices
    assert [r.tools for r in model.requests] == [("shell", "read_file")] * 3
    assert [r.context_length for r in model.requests] == [1, 4, 8]  # user; +message, call, output; +2 calls, 2 outputs
    assert model.requests[0] == ScriptedRequest(
        tools=("shell", "read_file"),
        tool_choice="required",
        context_length=1,
        items=[{"role": "user", "content": "Fix it."}],
        system="Be careful.",
    )

    with pytest.raises(ModelError) as caught:
        model.complete(context, TOOLS, "auto")
    assert caught.value.retryable is False
    assert "the transcript has no more turns" in caught.value.message
    assert len(model.requests) == 4


def test_openai_items_and_results(transcript: Path) -> None:
    model = ScriptedModel.from_file(transcript)
    context = model.start("sys", "task")
    assert context.system == "sys"
    turn = model.complete(context, TOOLS, "auto")
    model.append_turn(context, turn)
    model.append_results(context, [ToolResult(call_id="c1", text="a.py\nb.py\n")])
    turn = model.complete(context, TOOLS, "auto")
    model.append_turn(context, turn)
    model.append_results(
        context,
        [
            ToolResult(call_id="call_2_1", text="x = 1\n"),
            ToolResult.failure("call_2_2", ErrorCode.NONZERO_EXIT, "exit 1"),
        ],
    )
    assert context.items == [
        {"role": "user", "content": "task"},
        {"type": "message", "role": "assistant", "content": "Let me look."},
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"command":"ls"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "a.py\nb.py\n"},
        {"type": "function_call", "call_id": "call_2_1", "name": "read_file", "arguments": '{"path": "a.py"}'},
        {"type": "function_call", "call_id": "call_2_2", "name": "shell", "arguments": '{"command":"pytest -q"}'},
        {"type": "function_call_output", "call_id": "call_2_1", "output": "x = 1\n"},
        {"type": "function_call_output", "call_id": "call_2_2", "output": "exit 1"},
    ]


def test_chat_items_and_results(transcript: Path) -> None:
    model = ScriptedModel.from_file(transcript, format="chat")
    context = model.start("sys", "task")
    turn = model.complete(context, TOOLS, "auto")
    model.append_turn(context, turn)
    model.append_results(context, [ToolResult(call_id="c1", text="a.py")])
    final = ScriptedModel([{"text": "done"}], format="chat").turns[0]
    model.append_turn(context, final)
    assert context.items == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "task"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": '{"command":"ls"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
        {"role": "assistant", "content": "done"},
    ]
    assert model.turns[1].items[0]["content"] is None  # tool calls without text


def test_anthropic_items_and_results(transcript: Path) -> None:
    model = ScriptedModel.from_file(transcript, format="anthropic")
    context = model.start("sys", "task")
    assert context.items == [{"role": "user", "content": "task"}]
    model.append_turn(context, model.complete(context, TOOLS, "auto"))
    model.append_results(context, [ToolResult(call_id="c1", text="a.py")])
    turn = model.complete(context, TOOLS, "auto")
    model.append_turn(context, turn)
    model.append_results(
        context,
        [
            ToolResult(call_id="call_2_1", text="x = 1"),
            ToolResult.failure("call_2_2", ErrorCode.NONZERO_EXIT, "exit 1"),
        ],
    )
    assert context.items[1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "c1", "name": "shell", "input": {"command": "ls"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "a.py", "is_error": False}],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "call_2_1", "name": "read_file", "input": {"path": "a.py"}},
                {"type": "tool_use", "id": "call_2_2", "name": "shell", "input": {"command": "pytest -q"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_2_1", "content": "x = 1", "is_error": False},
                {"type": "tool_result", "tool_use_id": "call_2_2", "content": "exit 1", "is_error": True},
            ],
        },
    ]


def test_malformed_arguments_are_replayed_verbatim() -> None:
    model = ScriptedModel(
        [{"tool_calls": [{"call_id": "c9", "name": "shell", "arguments": '{"command": '}]}], format="anthropic"
    )
    turn = model.turns[0]
    assert turn.tool_calls[0].arguments == '{"command": '
    assert turn.items[0]["content"][0]["input"] == {"_arguments": '{"command": '}


def test_append_turn_copies_the_items() -> None:
    model = ScriptedModel([{"text": "hi"}])
    context = model.start("", "task")
    turn = model.complete(context, [], "auto")
    model.append_turn(context, turn)
    context.items[-1]["content"] = "changed"
    assert turn.items[0]["content"] == "hi"


def test_tool_choice_is_checked_like_the_real_adapters() -> None:
    model = ScriptedModel([{"text": "hi"}])
    context = model.start("", "task")
    with pytest.raises(ModelError, match="not among the tools offered"):
        model.complete(context, TOOLS, ForcedTool("delete_everything"))
    assert model.remaining == 1  # the turn is not consumed by a refused request
    assert model.complete(context, TOOLS, ForcedTool("shell")).text == "hi"


def test_on_text_is_never_called() -> None:
    model = ScriptedModel([{"text": "hi"}])
    seen: list[str] = []
    model.on_text = seen.append
    model.complete(model.start("", "t"), [], "auto")
    assert seen == []


def test_is_a_model_adapter(transcript: Path) -> None:
    adapter: ModelAdapter = ScriptedModel.from_file(transcript)
    assert adapter.format == "openai"


# --- errors in transcripts -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"text": "hi"}\n{"text": \n', ":2: not valid JSON"),
        ('["text"]\n', ":1: each line must be a JSON object"),
        ('{"txt": "hi"}\n', "unknown key 'txt'"),
        ('{"tool_call": []}\n', "unknown key 'tool_call'"),
        ('{"tool_calls": [{"arguments": {}}]}\n', "needs a 'name'"),
        ('{"tool_calls": [{"name": "shell", "arguments": [1]}]}\n', "'arguments' must be an object or a string"),
        ('{"tool_calls": [{"name": "shell", "args": {}}]}\n', "unknown key(s) 'args'"),
        ('{"tool_calls": {"name": "shell"}}\n', "'tool_calls' must be a list"),
        ('{"text": 3}\n', "'text' must be a string"),
        ('{"usage": {"input_tokens": -1}}\n', "input_tokens must be a whole number"),
        ('{"usage": {"tokens": 1}}\n', "unknown usage key(s) 'tokens'"),
        ("# only a comment\n\n", "holds no turns"),
    ],
)
def test_transcript_errors_name_the_place(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ScriptError) as caught:
        ScriptedModel.from_file(path)
    assert fragment in caught.value.message
    assert str(path) in caught.value.message
    assert caught.value.exit_code == 2


def test_error_points_at_the_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('# c\n{"text": "a"}\n\n{"tool_calls": [{"name": ""}]}\n', encoding="utf-8")
    with pytest.raises(ScriptError, match=r"t\.jsonl:4: tool_calls\[0\] needs a 'name'"):
        ScriptedModel.from_file(path)


def test_missing_transcript(tmp_path: Path) -> None:
    with pytest.raises(ScriptError, match="not found"):
        ScriptedModel.from_file(tmp_path / "nope.jsonl")


def test_mcp_is_not_a_context_format() -> None:
    with pytest.raises(ScriptError, match="cannot speak 'mcp'"):
        ScriptedModel([{"text": "hi"}], format="mcp")


# --- make_model ---------------------------------------------------------------------------------


def test_make_model_scripted(transcript: Path) -> None:
    by_spec = make_model(f"scripted:{transcript}")
    by_option = make_model("scripted", transcript=transcript)
    assert isinstance(by_spec, ScriptedModel)
    assert isinstance(by_option, ScriptedModel)
    assert by_spec.name == by_option.name == f"scripted:{transcript}"
    assert by_spec.turns == by_option.turns


def test_make_model_scripted_in_another_format(transcript: Path) -> None:
    model = make_model(f"scripted:{transcript}", format="anthropic")
    assert model.format == "anthropic"
    assert model.start("sys", "task").items == [{"role": "user", "content": "task"}]


def test_make_model_scripted_needs_a_transcript() -> None:
    with pytest.raises(ModelConfigError, match="needs a transcript"):
        make_model("scripted")
