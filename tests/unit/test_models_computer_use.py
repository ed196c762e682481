"""The ``computer`` tool in each dialect: Anthropic's computer tool types (request shape, beta
header, version by model name), OpenAI's computer use (the tool entry, ``computer_call`` items
mapped onto the tool's actions, ``computer_call_output`` answers), the scripted model scripting
both, and pending safety checks that only a person can acknowledge.

The adapters talk to a local WireServer through the real SDKs; the loop runs a fake ``computer``
tool (the real one's argument model, a handler that records what it was asked) in a real Session.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.audit.store import AuditStore
from harness.core.calls import Action, ErrorCode, ToolOutput, ToolResult
from harness.core.images import image_part
from harness.core.policy import Policy, ToolPolicy
from harness.core.registry import Tool, ToolDefinition, ToolRegistry
from harness.core.session import Session
from harness.loop.agent_loop import Loop, resume
from harness.loop.checkpoint import load as load_checkpoint
from harness.loop.context_budget import elide
from harness.models.anthropic_messages import AnthropicMessagesModel
from harness.models.base import AllowedTools, ForcedTool, ModelConfigError, ModelToolCall
from harness.models.computer_use import BLANK_PNG_URL, anthropic_computer_version
from harness.models.openai_responses import OpenAIResponsesModel
from harness.models.scripted import ScriptedModel, ScriptError
from harness.tools.computer import COMPUTER, ComputerArgs, from_openai_action
from tests.unit.wire_server import WireServer

PNG = base64.b64decode(BLANK_PNG_URL.removeprefix("data:image/png;base64,"))
SHOT = image_part(PNG, "screenshot")
SHOT_URL = BLANK_PNG_URL
COMPUTER_DEF = COMPUTER.definition
OTHER = ToolDefinition(name="echo", description="Echo.", input_model=ComputerArgs)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN",
                 "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def server() -> Iterator[WireServer]:
    with WireServer() as wire:
        yield wire


# --- Anthropic ------------------------------------------------------------------------------------


def claude_message(content: list[dict[str, Any]], stop_reason: str) -> dict[str, Any]:
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test", "content": content,
            "stop_reason": stop_reason, "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 5}}


def test_anthropic_sends_its_computer_tool_type_with_the_beta_header_and_gets_the_screenshot_block(
        server: WireServer) -> None:
    click = {"type": "tool_use", "id": "toolu_1", "name": "computer",
             "input": {"action": "left_click", "coordinate": [400, 250]}}
    server.json(claude_message([click], "tool_use"))
    server.json(claude_message([{"type": "text", "text": "clicked"}], "end_turn"))
    model = AnthropicMessagesModel("claude-opus-4-7", api_key="k", base_url=server.url)
    context = model.start("", "click the button")
    turn = model.complete(context, [OTHER, COMPUTER_DEF], "auto")
    assert turn.tool_calls == (ModelToolCall("toolu_1", "computer", '{"action":"left_click","coordinate":[400,250]}'),)
    ComputerArgs.model_validate_json(turn.tool_calls[0].arguments)  # Anthropic's input is the tool's arguments
    model.append_turn(context, turn)
    model.append_results(context, [ToolResult("toolu_1", "left_click done; screenshot", images=(SHOT,))])
    model.complete(context, [OTHER, COMPUTER_DEF], ForcedTool("computer"))

    first, second = server.requests
    assert first.headers["anthropic-beta"] == "computer-use-2025-11-24"
    assert first.body["tools"][0]["name"] == "echo" and "input_schema" in first.body["tools"][0]
    assert first.body["tools"][1] == {"type": "computer_20251124", "name": "computer", "display_width_px": 1280,
                                      "display_height_px": 800, "display_number": 1, "enable_zoom": True}
    assert second.body["tool_choice"] == {"type": "tool", "name": "computer"}
    (result,) = second.body["messages"][-1]["content"]
    data = base64.b64encode(PNG).decode()
    assert result["tool_use_id"] == "toolu_1" and result["content"][1] == {
        "type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


@pytest.mark.parametrize(("name", "version"), [
    ("claude-opus-4-5", "computer_20251124"), ("claude-opus-4-6", "computer_20251124"),
    ("claude-sonnet-4-6", "computer_20251124"), ("claude-opus-4-7", "computer_20251124"),
    ("claude-sonnet-4-5-20250929", "computer_20250124"), ("claude-haiku-4-5", "computer_20250124"),
    ("claude-opus-4-1-20250805", "computer_20250124"), ("claude-sonnet-4-20250514", "computer_20250124"),
    ("claude-opus-4-0", "computer_20250124"), ("claude-3-7-sonnet-latest", "computer_20250124"),
])
def test_anthropic_computer_version_follows_the_model(name: str, version: str) -> None:
    assert anthropic_computer_version(name) == version


def test_anthropic_version_override_and_beta_headers_of_the_request_options(server: WireServer) -> None:
    server.json(claude_message([{"type": "text", "text": "ok"}], "end_turn"))
    server.json(claude_message([{"type": "text", "text": "ok"}], "end_turn"))
    model = AnthropicMessagesModel("claude-opus-4-7", api_key="k", base_url=server.url,
                                   computer_tool="computer_20250124",
                                   request_options={"extra_headers": {"anthropic-beta": "prompt-caching-2024-07-31"}})
    model.complete(model.start("", "t"), [COMPUTER_DEF], "auto")
    model.complete(model.start("", "t"), [OTHER], "auto")  # no computer offered: no computer beta
    with_computer, without = server.requests
    assert with_computer.headers["anthropic-beta"] == "prompt-caching-2024-07-31,computer-use-2025-01-24"
    assert with_computer.body["tools"] == [{"type": "computer_20250124", "name": "computer", "display_width_px": 1280,
                                           "display_height_px": 800, "display_number": 1}]
    assert without.headers["anthropic-beta"] == "prompt-caching-2024-07-31"
    with pytest.raises(ModelConfigError, match="computer_20991231"):
        AnthropicMessagesModel("claude-x", api_key="k", base_url=server.url, computer_tool="computer_20991231")


# --- OpenAI Responses -----------------------------------------------------------------------------


def responses(output: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "created_at": 1, "model": "m", "status": "completed",
            "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "usage": {"input_tokens": 1, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 1,
                      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 2}}


def computer_call(call_id: str, **fields: Any) -> dict[str, Any]:
    return {"type": "computer_call", "id": f"cu_{call_id}", "call_id": call_id, "pending_safety_checks": [],
            "status": "completed", **fields}


def test_responses_sends_the_computer_tool_and_answers_a_batched_computer_call_with_one_output(
        server: WireServer) -> None:
    batch = computer_call("call_1", actions=[{"type": "click", "button": "left", "x": 400, "y": 250},
                                             {"type": "type", "text": "hi"},
                                             {"type": "keypress", "keys": ["CTRL", "L"]}])
    server.json(responses([batch]))
    server.json(responses([{"type": "message", "id": "m", "role": "assistant", "status": "completed",
                            "content": [{"type": "output_text", "text": "done", "annotations": []}]}]))
    model = OpenAIResponsesModel("gpt-5.4", api_key="k", base_url=f"{server.url}/v1")
    context = model.start("", "click")
    turn = model.complete(context, [OTHER, COMPUTER_DEF], AllowedTools(("computer",)))
    assert [(c.call_id, json.loads(c.arguments)) for c in turn.tool_calls] == [
        ("call_1:1", {"action": "left_click", "coordinate": [400, 250]}),
        ("call_1:2", {"action": "type", "text": "hi"}),
        ("call_1:3", {"action": "key", "text": "ctrl+l"}),
    ]
    model.append_turn(context, turn)
    model.append_results(context, [
        ToolResult("call_1:1", "left_click done", images=(SHOT,)),
        ToolResult.failure("call_1:2", ErrorCode.TOOL_FAILED, "computer type: xdotool failed"),
        ToolResult("call_1:3", "key done", images=(SHOT,)),
    ])
    model.complete(context, [OTHER, COMPUTER_DEF], ForcedTool("computer"))

    first, second = server.requests
    assert first.body["tools"] == [first.body["tools"][0], {"type": "computer"}]
    assert first.body["tools"][0]["type"] == "function"
    assert first.body["tool_choice"] == {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "computer"}]}
    assert second.body["tool_choice"] == {"type": "computer"}
    assert second.body["input"][-3:] == [
        batch,
        {"type": "computer_call_output", "call_id": "call_1",
         "output": {"type": "computer_screenshot", "image_url": SHOT_URL}},
        {"role": "user", "content": [{"type": "input_text",
                                      "text": "[computer_call call_1: computer type: xdotool failed]"}]},
    ]


def test_responses_preview_models_get_the_preview_tool_and_a_single_action(server: WireServer) -> None:
    server.json(responses([computer_call("c9", action={"type": "screenshot"})]))
    model = OpenAIResponsesModel("computer-use-preview", api_key="k", base_url=f"{server.url}/v1",
                                 native_allowed_tools=False)
    turn = model.complete(model.start("", "look"), [OTHER, COMPUTER_DEF], AllowedTools(("computer",), "required"))
    assert turn.tool_calls == (ModelToolCall("c9", "computer", '{"action":"screenshot"}'),)
    assert server.requests[0].body["tools"] == [{"type": "computer_use_preview", "display_width": 1280,
                                                 "display_height": 800, "environment": "linux"}]
    assert server.requests[0].body["tool_choice"] == "required"


@pytest.mark.parametrize(("action", "mapped"), [
    ({"type": "click", "button": "right", "x": 1, "y": 2, "keys": ["SHIFT"]},
     [{"action": "right_click", "coordinate": [1, 2], "text": "shift"}]),
    ({"type": "click", "button": "wheel", "x": 1, "y": 2}, [{"action": "middle_click", "coordinate": [1, 2]}]),
    ({"type": "click", "button": "back", "x": 1, "y": 2}, [{"action": "key", "text": "alt+Left"}]),
    ({"type": "double_click", "x": 5, "y": 6}, [{"action": "double_click", "coordinate": [5, 6]}]),
    ({"type": "drag", "path": [{"x": 1, "y": 1}, {"x": 9, "y": 9}]},
     [{"action": "left_click_drag", "start_coordinate": [1, 1], "coordinate": [9, 9]}]),
    ({"type": "drag", "path": [{"x": 1, "y": 1}, {"x": 5, "y": 5}, {"x": 9, "y": 9}]},
     [{"action": "left_mouse_down", "coordinate": [1, 1]}, {"action": "mouse_move", "coordinate": [5, 5]},
      {"action": "left_mouse_up", "coordinate": [9, 9]}]),
    ({"type": "keypress", "keys": ["ENTER"]}, [{"action": "key", "text": "Return"}]),
    ({"type": "keypress", "keys": ["ctrl", "shift", "ArrowLeft", "F5"]},
     [{"action": "key", "text": "ctrl+shift+Left+F5"}]),
    ({"type": "move", "x": 3, "y": 4}, [{"action": "mouse_move", "coordinate": [3, 4]}]),
    ({"type": "scroll", "x": 10, "y": 20, "scroll_x": 0, "scroll_y": 300},
     [{"action": "scroll", "coordinate": [10, 20], "scroll_direction": "down", "scroll_amount": 3}]),
    ({"type": "scroll", "x": 10, "y": 20, "scroll_x": -40, "scroll_y": -100},
     [{"action": "scroll", "coordinate": [10, 20], "scroll_direction": "up", "scroll_amount": 1},
      {"action": "scroll", "coordinate": [10, 20], "scroll_direction": "left", "scroll_amount": 1}]),
    ({"type": "type", "text": "hello"}, [{"action": "type", "text": "hello"}]),
    ({"type": "wait"}, [{"action": "wait", "duration": 2.0}]),
    ({"type": "screenshot"}, [{"action": "screenshot"}]),
])
def test_openai_actions_map_onto_the_computer_tools_actions(action: dict[str, Any], mapped: list[Any]) -> None:
    assert from_openai_action(action) == mapped
    for args in mapped:
        ComputerArgs.model_validate(args)


def test_an_openai_action_the_tool_cannot_do_is_refused_by_validation_naming_it() -> None:
    (args,) = from_openai_action({"type": "teleport", "x": 1})
    with pytest.raises(ValueError, match="teleport"):
        ComputerArgs.model_validate(args)


# --- the loop and the scripted model: both dialects, safety checks --------------------------------


class FakeDesktop:
    """The computer tool's arguments and annotations, with a handler that records its actions."""

    def __init__(self) -> None:
        self.actions: list[dict[str, Any]] = []

    def handler(self, ctx: Any, args: ComputerArgs) -> ToolOutput:
        self.actions.append(args.model_dump(exclude_none=True))
        return ToolOutput(text=f"{args.action} done; screenshot", images=(SHOT,))

    def registry(self) -> ToolRegistry:
        return ToolRegistry([Tool(COMPUTER_DEF, self.handler)])


@pytest.fixture
def desktop() -> FakeDesktop:
    return FakeDesktop()


@pytest.fixture
def make_session(tmp_path: Path, desktop: FakeDesktop) -> Iterator[Callable[..., Session]]:
    made: list[Session] = []
    store = AuditStore(tmp_path / "audit.sqlite3")

    def make(policy: Policy | None = None, run_id: str | None = None) -> Session:
        def no_engine() -> Any:
            raise AssertionError("no sandbox in a unit test")
        session = Session(desktop.registry(), policy or Policy(), store, run_id=run_id, engine_factory=no_engine)
        made.append(session)
        return session

    yield make
    for session in made:
        session.close()
    store.close()


def script(tmp_path: Path, *lines: dict[str, Any]) -> ScriptedModel:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return ScriptedModel.from_file(path)


def test_a_scripted_anthropic_transcript_drives_computer_and_the_context_gets_the_image(
        tmp_path: Path, make_session: Callable[..., Session], desktop: FakeDesktop) -> None:
    model = script(tmp_path, {"format": "anthropic"},
                   {"tool_calls": [{"call_id": "t1", "name": "computer",
                                    "arguments": {"action": "left_click", "coordinate": [400, 250]}}]},
                   {"text": "done"})
    assert model.format == "anthropic"
    outcome = Loop.start(model, make_session(), task="click").run()
    assert (outcome.reason, desktop.actions) == ("final", [{"action": "left_click", "coordinate": [400, 250]}])
    items = model.requests[-1].items
    assert items[1]["content"][0] == {"type": "tool_use", "id": "t1", "name": "computer",
                                      "input": {"action": "left_click", "coordinate": [400, 250]}}
    (block,) = items[2]["content"]
    assert block["type"] == "tool_result" and block["content"][-1]["type"] == "image"
    assert base64.b64decode(block["content"][-1]["source"]["data"]) == PNG


def test_a_scripted_computer_call_runs_each_action_and_gets_one_computer_call_output(
        tmp_path: Path, make_session: Callable[..., Session], desktop: FakeDesktop) -> None:
    model = script(tmp_path, {"tool_calls": [{"type": "computer_call", "call_id": "cc",
                                              "actions": [{"type": "screenshot"},
                                                          {"type": "click", "button": "left", "x": 7, "y": 8}]}]},
                   {"text": "done"})
    outcome = Loop.start(model, make_session(), task="click").run()
    assert outcome.reason == "final" and outcome.tool_calls == 2
    assert desktop.actions == [{"action": "screenshot"}, {"action": "left_click", "coordinate": [7, 8]}]
    items = model.requests[-1].items
    assert items[1]["type"] == "computer_call" and items[1]["actions"][1]["x"] == 7
    assert items[2:] == [{"type": "computer_call_output", "call_id": "cc",
                          "output": {"type": "computer_screenshot", "image_url": SHOT_URL}}]


CHECK = {"id": "sc_1", "code": "malicious_instructions", "message": "The page asks you to ignore the user."}
CHECKED_CLICK = {"tool_calls": [{"type": "computer_call", "call_id": "cc", "pending_safety_checks": [CHECK],
                                 "action": {"type": "click", "button": "left", "x": 7, "y": 8}}]}


def test_pending_safety_checks_are_not_acknowledged_when_the_policy_asks_nobody(
        tmp_path: Path, make_session: Callable[..., Session], desktop: FakeDesktop) -> None:
    model = script(tmp_path, CHECKED_CLICK,
                   {"text": "stopped"})
    session = make_session()
    outcome = Loop.start(model, session, task="click").run()
    assert outcome.reason == "final" and desktop.actions == []  # refused, not run
    refused = session.audit.get_call(session.run_id, "cc")  # and in the run's record, as every call
    assert refused is not None and refused.state == "done" and refused.error_code == "denied"
    assert refused.decision is not None and refused.decision.rule == "loop.safety_checks"
    output, note = model.requests[-1].items[2:]
    assert output == {"type": "computer_call_output", "call_id": "cc",
                      "output": {"type": "computer_screenshot", "image_url": BLANK_PNG_URL}}
    text = note["content"][0]["text"]
    assert "malicious_instructions: The page asks you to ignore the user." in text
    assert 'decision = "ask" in [tools.computer]' in text


def test_a_persons_approval_acknowledges_the_pending_safety_checks(
        tmp_path: Path, make_session: Callable[..., Session], desktop: FakeDesktop) -> None:
    ask = Policy(tools={"computer": ToolPolicy(decision=Action.ASK)})
    first = script(tmp_path, CHECKED_CLICK)
    session = make_session(ask, run_id="run-ask")
    paused = Loop.start(first, session, task="click").run()
    assert paused.reason == "approval_pending" and desktop.actions == []
    checkpoint = load_checkpoint(session.audit, "run-ask")
    assert checkpoint is not None
    (saved,) = [c for c in checkpoint.calls if c.call_id == "cc"]
    assert saved.safety_checks == ("malicious_instructions: The page asks you to ignore the user.",)
    (approval,) = session.audit.list_approvals(run_id="run-ask")
    assert "malicious_instructions: The page asks you to ignore the user." in approval.reason  # what is acknowledged
    session.audit.resolve_approval(approval.id, True, by="tester", reason=None)
    rest = ScriptedModel([{"text": "clicked"}])
    outcome = resume("run-ask", rest, make_session(ask, run_id="run-ask"))
    assert outcome.reason == "final" and desktop.actions == [{"action": "left_click", "coordinate": [7, 8]}]
    assert rest.requests[0].items[-1] == {
        "type": "computer_call_output", "call_id": "cc",
        "output": {"type": "computer_screenshot", "image_url": SHOT_URL}, "acknowledged_safety_checks": [CHECK]}


@pytest.mark.parametrize(("line", "problem"), [
    ({"format": "yaml"}, "format 'yaml' is not one of"),
    ({"format": "chat"}, "a computer_call is the OpenAI Responses shape"),
])
def test_a_transcripts_format_line_and_computer_calls_are_checked(tmp_path: Path, line: dict[str, Any],
                                                                 problem: str) -> None:
    with pytest.raises(ScriptError, match=problem):
        script(tmp_path, line, {"tool_calls": [{"type": "computer_call", "action": {"type": "screenshot"}}]})


def test_a_format_line_that_differs_from_the_asked_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"format": "anthropic"}\n{"text": "hi"}\n')
    with pytest.raises(ScriptError, match="written in the anthropic format, not openai"):
        ScriptedModel.from_file(path, format="openai")
    assert ScriptedModel.from_file(path).format == "anthropic"


@pytest.mark.parametrize("call", [
    {"type": "computer_call", "action": {"type": "screenshot"}, "actions": [{"type": "screenshot"}]},
    {"type": "computer_call"},
    {"type": "computer_call", "action": "screenshot"},
    {"type": "computer_call", "action": {"type": "screenshot"}, "name": "computer"},
    {"type": "computer_call", "action": {"type": "screenshot"}, "pending_safety_checks": [{"code": "x"}]},
])
def test_a_malformed_scripted_computer_call_is_refused(tmp_path: Path, call: dict[str, Any]) -> None:
    with pytest.raises(ScriptError, match=r"computer_call|pending_safety_checks|'action' must"):
        script(tmp_path, {"tool_calls": [call]})


def test_the_context_budget_blanks_old_screenshots_of_computer_call_outputs() -> None:
    shot = "data:image/png;base64," + "A" * 4000
    items: list[dict[str, Any]] = [{"role": "user", "content": "t"}]
    for n in range(4):
        items += [computer_call(f"c{n}", action={"type": "screenshot"}),
                  {"type": "computer_call_output", "call_id": f"c{n}",
                   "output": {"type": "computer_screenshot", "image_url": shot}}]
    elision = elide(items, 12_000, keep_latest=1)
    assert elision.call_ids == ("c0", "c1", "c2")
    urls = [item["output"]["image_url"] for item in items if item.get("type") == "computer_call_output"]
    assert urls == [BLANK_PNG_URL] * 3 + [shot]
    assert not elide(items, 1_000, keep_latest=1).changed  # a blanked screenshot stays as it is


def test_after_a_failed_action_of_a_batch_the_rest_are_not_run(
        tmp_path: Path, make_session: Callable[..., Session], desktop: FakeDesktop) -> None:
    model = script(tmp_path, {"tool_calls": [{"type": "computer_call", "call_id": "cc", "actions": [
        {"type": "click", "button": "left", "x": 5000, "y": 8}, {"type": "type", "text": "secret"}]}]},
                   {"text": "done"})
    outcome = Loop.start(model, make_session(), task="click").run()
    assert outcome.reason == "final" and desktop.actions == []  # the click is invalid, so nothing is typed
    output, note = model.requests[-1].items[2:]
    assert output["output"]["image_url"] == BLANK_PNG_URL
    first, second = note["content"][0]["text"].splitlines()
    assert first.startswith("[computer_call cc: ") and "outside the 1280x800 screen" in first
    assert second.startswith("[computer_call cc: not run: cc:1, an earlier action of the same batch (cc), failed")
