"""Handoff between two agents of one run, with scripted models (one transcript per agent)
and a real Session on pure-Python tools (no sandbox), the audit store a temporary file."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from harness.audit.store import AuditStore
from harness.core.calls import Action, ToolOutput
from harness.core.policy import Policy, ToolPolicy
from harness.core.registry import Tool, ToolAnnotations, ToolDefinition, ToolRegistry
from harness.loop import checkpoint as checkpoints
from harness.loop.agent_loop import AllowTools, Loop, LoopConfig, LoopConfigError, RunStarted, resume, run_agent
from harness.loop.agents import transfer_tool_name
from harness.loop.events import HandedOff, ToolCallFinished
from harness.loop.handoff import IGNORED_HANDOFF
from harness.models.scripted import ScriptedModel
from tests.support.loop_sessions import SessionMaker, session_maker

TRIAGE = "You are triage: route the request to the right agent."
BILLING = "You are billing: fix invoices."


class Text(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str


def _registry(ran: list[str]) -> ToolRegistry:
    def tool(name: str) -> Tool:
        def handler(ctx: Any, args: Text) -> ToolOutput:
            ran.append(f"{name} {args.text}")
            return ToolOutput(text=f"{name}: {args.text}")

        return Tool(ToolDefinition(name, f"The {name} tool.", Text, annotations=ToolAnnotations()), handler)

    return ToolRegistry([tool("echo"), tool("invoice"), tool("guarded")])


ASK_GUARDED = Policy(tools={"guarded": ToolPolicy(decision=Action.ASK)})


@pytest.fixture
def ran() -> list[str]:
    return []


@pytest.fixture
def audit(tmp_path: Path) -> Iterator[AuditStore]:
    with AuditStore(tmp_path / "audit.sqlite3") as store:
        yield store


@pytest.fixture
def make_harness(ran: list[str], audit: AuditStore) -> Iterator[SessionMaker]:
    with session_maker(lambda: _registry(ran), audit) as make:
        yield make


@pytest.fixture
def script(tmp_path: Path) -> Callable[..., str]:
    """Writes a transcript; returns its ``scripted:PATH`` spec."""

    def write(name: str, *turns: dict[str, Any], fmt: str | None = None) -> str:
        path = tmp_path / f"{name}.jsonl"
        lines = ([json.dumps({"format": fmt})] if fmt else []) + [json.dumps(t) for t in turns]
        path.write_text("\n".join(lines) + "\n")
        return f"scripted:{path}"

    return write


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"call_id": call_id, "name": name, "arguments": arguments}


def team(triage_model: str | None, billing_model: str | None, **changes: Any) -> LoopConfig:
    triage = {"name": "triage", "instructions": TRIAGE, "model": triage_model, "tools": ["echo"],
              "handoffs": ["billing"]}
    billing = {"name": "billing", "instructions": BILLING, "model": billing_model, "tools": ["invoice", "guarded"],
               "handoffs": ["triage"], "handoff_description": "Invoices and refunds."}
    agents = changes.pop("agents", [triage, billing])
    return LoopConfig.model_validate({"agents": agents, **changes})


def run_model() -> ScriptedModel:
    """A run model no agent of these tests uses (each names its own)."""
    return ScriptedModel([{"text": "never asked"}])


def finished(events: list[Any]) -> list[tuple[str, str, str]]:
    return [(e.call_id, e.name, e.decision) for e in events if isinstance(e, ToolCallFinished)]


# --------------------------------------------------------------------------- the handoff


def test_a_transfer_hands_the_run_to_the_other_agent(make_harness, audit, script, ran) -> None:
    triage = script("triage", {"text": "a billing matter", "tool_calls": [call("e1", "echo", text="look"),
                                                                          call("h1", "transfer_to_billing")]})
    billing = script("billing", {"tool_calls": [call("i1", "invoice", text="fix")]}, {"text": "fixed the invoice"})
    harness = make_harness()
    events: list[Any] = []
    loop = Loop.start(run_model(), harness, task="my invoice is wrong", config=team(triage, billing),
                      on_event=events.append)
    outcome = loop.run()
    assert (outcome.reason, outcome.final_text, outcome.turns, outcome.tool_calls) == ("final", "fixed the invoice",
                                                                                        3, 3)
    assert ran == ["echo look", "invoice fix"]
    assert isinstance(events[0], RunStarted) and events[0].agent == "triage"
    assert events[0].model == triage
    (handed,) = [e for e in events if isinstance(e, HandedOff)]
    assert (handed.turn, handed.call_id, handed.from_agent, handed.to_agent, handed.model) == (
        1, "h1", "triage", "billing", billing)
    assert json.loads(json.dumps(handed.to_dict()))["event"] == "handoff"
    assert finished(events) == [("e1", "echo", "allow"), ("h1", "transfer_to_billing", "allow"),
                                ("i1", "invoice", "allow")]

    # each agent's model was asked with its own instructions and tools (its transfers last)
    assert isinstance(loop.model, ScriptedModel) and loop.model.name == billing
    first = ScriptedModel.from_file(triage.removeprefix("scripted:"))
    assert first.turns  # the transcript as written
    asked_billing = loop.model.requests
    assert [r.system for r in asked_billing] == [BILLING, BILLING]
    assert asked_billing[0].tools == ("invoice", "guarded", "transfer_to_triage")
    # the conversation carried over: the transfer call and its result, as the SDK writes it
    outputs = {i["call_id"]: i["output"] for i in asked_billing[0].items if i.get("type") == "function_call_output"}
    assert outputs == {"e1": "echo: look", "h1": '{"assistant": "billing"}'}
    assert asked_billing[0].items[0] == {"role": "user", "content": "my invoice is wrong"}

    # the audit record: the handoff is a call, decided by the rule naming both agents
    record = {c["call_id"]: c for c in audit.calls_for_run(harness.run_id)}
    assert (record["h1"]["tool"], record["h1"]["decision"], record["h1"]["rule"]) == (
        "transfer_to_billing", "allow", "handoff: triage -> billing")
    assert record["h1"]["result_text"] == '{"assistant": "billing"}'
    run = audit.get_run(harness.run_id)
    assert (run.meta["agent"], run.meta["agents"], run.meta["model"]) == ("billing", ["triage", "billing"], triage)
    assert run.end_reason == "final"

    # the console's run page: the agents, who holds the run, the handoff among the calls
    from harness.doors.http.pages import run_page

    page = run_page(run, audit.calls_for_run(harness.run_id), [], live=False)
    assert "<dt>Agents</dt><dd>triage, billing; held by <strong>billing</strong></dd>" in page
    assert "allow · handoff: triage -&gt; billing" in page and "transfer_to_billing" in page


def test_the_first_turn_offers_the_agents_tools_and_transfers_described_as_the_sdk_does(make_harness, script) -> None:
    triage = script("triage", {"text": "nothing to do"})
    config = team(triage, None)
    loop = Loop.start(run_model(), make_harness(), task="t", config=config)
    loop.next_step()  # SELECT_TOOLS
    assert loop._plan is not None
    (echo, transfer) = loop._plan.tools
    assert (echo.name, transfer.name) == ("echo", "transfer_to_billing")
    assert transfer.description == "Handoff to the billing agent to handle the request. Invoices and refunds."
    assert transfer.input_schema() == {"type": "object", "properties": {}, "required": [],
                                       "additionalProperties": False}
    assert loop.state.context.system == TRIAGE


def test_sdk_tool_names() -> None:
    assert transfer_tool_name("Billing Agent") == "transfer_to_billing_agent"
    assert transfer_tool_name("refunds-2") == "transfer_to_refunds_2"


def test_start_agent_and_an_agent_without_a_model_uses_the_runs(make_harness, script) -> None:
    shared = ScriptedModel([{"text": "billing answers"}], name="run-model")
    config = team(script("triage", {"text": "unused"}), None, start_agent="billing")
    outcome = run_agent(shared, make_harness(), task="t", config=config)
    assert (outcome.reason, outcome.final_text) == ("final", "billing answers")
    assert shared.requests[0].system == BILLING


# --------------------------------------------------------------------------- transfers that fail


def test_transfers_the_agent_may_not_make_are_error_results(make_harness, audit, script) -> None:
    triage = script(
        "triage",
        {"tool_calls": [call("u1", "transfer_to_nobody"), call("s1", "transfer_to_triage")]},
        {"tool_calls": [call("h1", "transfer_to_billing"), call("h2", "transfer_to_billing")]},
    )
    billing = script("billing", {"tool_calls": [call("x1", "echo", text="not mine")]}, {"text": "done"})
    harness = make_harness()
    events: list[Any] = []
    outcome = run_agent(run_model(), harness, task="t", config=team(triage, billing), on_event=events.append)
    assert outcome.reason == "final"
    results = {e.call_id: e.result for e in events if isinstance(e, ToolCallFinished)}
    assert results["u1"].error.value == "unknown_tool"
    assert "may hand off with: transfer_to_billing" in results["u1"].text
    assert results["s1"].error.value == "tool_not_allowed"
    assert "agent triage may not hand the run to triage" in results["s1"].text
    assert not results["h1"].is_error
    assert (results["h2"].error.value, results["h2"].text) == ("conflict", IGNORED_HANDOFF)
    assert results["x1"].error.value == "tool_not_allowed"  # echo is triage's, not billing's
    assert [e.to_agent for e in events if isinstance(e, HandedOff)] == ["billing"]
    decisions = {c["call_id"]: c["decision"] for c in audit.calls_for_run(harness.run_id)}
    assert decisions == {"u1": None, "s1": None, "h1": "allow", "h2": None, "x1": None}  # refused: no decision


def test_a_transfer_the_tool_choice_keeps_out_is_refused(make_harness, script) -> None:
    triage = script("triage", {"tool_calls": [call("h1", "transfer_to_billing")]}, {"text": "stayed"})
    config = team(triage, script("billing", {"text": "never"}), tool_choice=AllowTools(allowed=("echo",)))
    events: list[Any] = []
    outcome = run_agent(run_model(), make_harness(), task="t", config=config, on_event=events.append)
    assert (outcome.reason, outcome.final_text) == ("final", "stayed")
    (result,) = [e.result for e in events if isinstance(e, ToolCallFinished)]
    assert result.error.value == "tool_not_allowed" and "not offered in this turn" in result.text


def test_a_handoff_loop_ends_the_run_naming_the_cycle(make_harness, audit, script) -> None:
    back = {"tool_calls": [{"name": "transfer_to_triage"}]}  # call_billing_<turn>_1
    forth = {"tool_calls": [{"name": "transfer_to_billing"}]}  # call_triage_<turn>_1
    triage = script("triage", forth, forth, forth)
    billing = script("billing", back, back, back)
    harness = make_harness()
    outcome = run_agent(run_model(), harness, task="t", config=team(triage, billing, loop_detection=3))
    assert outcome.reason == "loop_detected"
    assert outcome.message == ("handoff loop: triage -> billing -> triage -> billing: 3 handoffs in a row without "
                               "another tool call, round the cycle billing -> triage -> billing (loop_detection = 3)")
    assert outcome.turns == 3
    assert audit.get_run(harness.run_id).end_reason == "loop_detected"
    # each agent's transcript names its calls after it: one run, distinct call_ids
    assert [c["call_id"] for c in audit.calls_for_run(harness.run_id)] == [
        "call_triage_1_1", "call_billing_1_1", "call_triage_2_1"]


def test_other_tool_calls_between_handoffs_are_no_loop(make_harness, script) -> None:
    triage = script("triage", *[{"tool_calls": [call(f"e{n}", "echo", text=str(n)),
                                                call(f"h{n}", "transfer_to_billing")]} for n in range(3)])
    billing = script("billing", *[{"tool_calls": [call(f"i{n}", "invoice", text=str(n)),
                                                  call(f"b{n}", "transfer_to_triage")]} for n in range(2)],
                     {"text": "settled"})
    outcome = run_agent(run_model(), make_harness(), task="t", config=team(triage, billing, loop_detection=2))
    assert (outcome.reason, outcome.final_text) == ("final", "settled")


# --------------------------------------------------------------------------- the configuration


@pytest.mark.parametrize(("changes", "expected"), [
    ({"agents": [{"name": "a", "instructions": "x"}, {"name": "a", "instructions": "y"}]}, "used twice"),
    ({"agents": [{"name": "A b", "instructions": "x"}, {"name": "a_b", "instructions": "y"}]},
     "would both be handed the run by transfer_to_a_b"),
    ({"agents": [{"name": "a", "instructions": "x", "handoffs": ["c"]}]}, "handoffs names 'c', which is not one"),
    ({"agents": [{"name": "a", "instructions": "x", "handoffs": ["a"]}]}, "handoffs names the agent itself"),
    ({"agents": [{"name": "a", "instructions": "x"}], "start_agent": "b"}, "start_agent 'b' is not one"),
    ({"start_agent": "b"}, "no [[agents]] are declared"),
    ({"agents": [{"name": "a", "instructions": ""}]}, "at least 1 character"),
])
def test_bad_agents_are_refused_by_the_config(changes: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValidationError, match=expected.replace("[", r"\[")):
        LoopConfig.model_validate(changes)


def test_a_tool_outside_the_policy_is_an_error_at_start_naming_it(make_harness, audit, script) -> None:
    harness = make_harness(Policy(allowed_tools=("echo", "invoice")))
    config = team(script("t", {"text": "x"}), script("b", {"text": "y"}))
    with pytest.raises(LoopConfigError, match=r"agents\[1\] \(billing\)\.tools names 'guarded', which the policy's "
                                              "allowed_tools does not allow"):
        Loop.start(run_model(), harness, task="t", config=config)
    assert audit.get_run(harness.run_id).end_reason == "error:config"
    with pytest.raises(LoopConfigError, match="'nope', which is not a registered tool"):
        Loop.start(run_model(), make_harness(), task="t", config=team(
            None, None, agents=[{"name": "a", "instructions": "x", "tools": ["nope"]}]))


def test_models_of_different_apis_are_refused_at_start(make_harness, script) -> None:
    config = team(script("t", {"text": "x"}), script("b", {"text": "y"}, fmt="anthropic"))
    with pytest.raises(LoopConfigError, match=r"agent billing's scripted:.*b\.jsonl \(anthropic\).*does not "
                                              "translate it"):
        Loop.start(run_model(), make_harness(), task="t", config=config)


def test_a_missing_transcript_names_the_agent(make_harness, tmp_path) -> None:
    config = team(f"scripted:{tmp_path / 'none.jsonl'}", None)
    with pytest.raises(LoopConfigError, match=r"agents\[0\] \(triage\): model 'scripted:.*none.jsonl': transcript"):
        Loop.start(run_model(), make_harness(), task="t", config=config)


def test_a_system_prompt_beside_agents_is_refused(make_harness, script) -> None:
    with pytest.raises(LoopConfigError, match="each agent's instructions are its system prompt"):
        Loop.start(run_model(), make_harness(), task="t", system="be brief", config=team(script("t", {}), None))


def test_chat_contexts_change_their_system_message(make_harness, script) -> None:
    triage = script("t", {"tool_calls": [call("h1", "transfer_to_billing")]}, fmt="chat")
    billing = script("b", {"text": "done"}, fmt="chat")
    loop = Loop.start(ScriptedModel([], format="chat"), make_harness(), task="t", config=team(triage, billing))
    assert loop.run().reason == "final"
    assert isinstance(loop.model, ScriptedModel)
    (asked,) = loop.model.requests
    assert asked.items[0] == {"role": "system", "content": BILLING}
    assert [i["role"] for i in asked.items] == ["system", "user", "assistant", "tool"]


# --------------------------------------------------------------------------- pause and resume


def test_a_run_paused_after_a_handoff_resumes_under_the_second_agent(make_harness, audit, script, ran) -> None:
    triage = script("triage", {"tool_calls": [call("h1", "transfer_to_billing")]}, {"text": "triage never again"})
    billing = script("billing", {"tool_calls": [call("i1", "invoice", text="draft"),
                                                call("g1", "guarded", text="refund")]}, {"text": "refunded"})
    config = team(triage, billing)
    harness = make_harness(ASK_GUARDED, run_id="run-h")
    paused = run_agent(run_model(), harness, task="refund me", config=config)
    assert paused.reason == "approval_pending" and ran == ["invoice draft"]
    saved = checkpoints.load(audit, "run-h")
    assert saved is not None
    assert saved.agents == {"current": "billing", "turns": {"triage": 1, "billing": 1}, "chain": []}
    assert saved.model == billing and saved.system == BILLING
    assert checkpoints.Checkpoint.from_json(saved.to_json()) == saved

    (approval,) = audit.list_approvals(run_id="run-h")
    audit.resolve_approval(approval.id, True, by="tester", reason=None)
    events: list[Any] = []
    loop = Loop.resume("run-h", run_model(), make_harness(ASK_GUARDED, run_id="run-h"), on_event=events.append)
    outcome = loop.run()
    assert (outcome.reason, outcome.final_text, outcome.turns) == ("final", "refunded", 3)
    assert ran == ["invoice draft", "guarded refund"]
    assert isinstance(events[0], RunStarted) and (events[0].agent, events[0].model) == ("billing", billing)
    assert isinstance(loop.model, ScriptedModel) and loop.model.position == 2  # its second turn, after its first
    assert loop.model.requests[0].system == BILLING
    assert audit.get_run("run-h").meta["agent"] == "billing"


def test_agents_sharing_the_runs_transcript_resume_where_it_stopped(make_harness, audit, script) -> None:
    shared = script("shared", {"tool_calls": [call("h1", "transfer_to_billing")]},
                    {"tool_calls": [call("g1", "guarded", text="x")]}, {"text": "shared end"})
    config = team(None, None)
    paused = run_agent(ScriptedModel.from_file(shared.removeprefix("scripted:")), make_harness(ASK_GUARDED,
                                                                                               run_id="run-s"),
                       task="t", config=config)
    assert paused.reason == "approval_pending"
    (approval,) = audit.list_approvals(run_id="run-s")
    audit.resolve_approval(approval.id, True, by="tester", reason=None)
    fresh = ScriptedModel.from_file(shared.removeprefix("scripted:"))  # position 0: the team moves it on
    outcome = resume("run-s", fresh, make_harness(ASK_GUARDED, run_id="run-s"))
    assert (outcome.reason, outcome.final_text) == ("final", "shared end")
    assert fresh.requests[0].system == BILLING
