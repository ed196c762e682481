"""The agent loop against a fake model (Responses-shaped items) and a real Session.

The tools are small pure-Python ones (no sandbox), the audit store a temporary SQLite file.
Concurrency is proven with barriers and events (never sleeps): calls that must overlap
wait for each other, so running them one after the other would break the barrier.
"""

from __future__ import annotations

import copy
import json
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from harness.audit.store import AuditError, AuditStore
from harness.core.calls import Action, ErrorCode, ToolOutput, ToolResult
from harness.core.formats import Format, result_item
from harness.core.policy import Budgets, Policy, ToolPolicy
from harness.core.registry import Tool, ToolAnnotations, ToolDefinition, ToolRegistry
from harness.core.session import Session
from harness.loop import checkpoint as checkpoints
from harness.loop.agent_loop import (
    AllowTools,
    ContextElided,
    ForceTool,
    Loop,
    LoopConfig,
    LoopConfigError,
    ModelReplied,
    ModelRetrying,
    RunEnded,
    RunStarted,
    Stage,
    Step,
    ToolCallFinished,
    ToolCallStarted,
    ToolOutputChunk,
    TurnStarted,
    resume,
    run_agent,
)
from harness.loop.checkpoint import CheckpointError
from harness.models.base import (
    AllowedTools,
    Context,
    ForcedTool,
    ModelError,
    ModelToolCall,
    ModelTurn,
    ToolChoice,
    Usage,
)
from tests.support.loop_sessions import SessionMaker, no_engine, session_maker

# --------------------------------------------------------------------------- the fake model


@dataclass
class Request:
    tools: list[str]
    tool_choice: ToolChoice
    items: list[dict[str, Any]]


Step_ = ModelTurn | BaseException | Callable[[Context], ModelTurn]


class FakeModel:
    """A ModelAdapter that replays a script, keeping its context as Responses API items."""

    format: Format = "openai"
    name = "fake:unit"

    def __init__(self, script: list[Step_]) -> None:
        self.script = list(script)
        self.requests: list[Request] = []

    def start(self, system: str, task: str) -> Context:
        return Context(system=system, items=[{"role": "user", "content": task}])

    def complete(self, context: Context, tools: list[ToolDefinition], tool_choice: ToolChoice) -> ModelTurn:
        self.requests.append(Request([t.name for t in tools], tool_choice, copy.deepcopy(context.items)))
        if not self.script:
            raise ModelError("the script has no more turns", retryable=False)
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        if callable(step):
            return step(context)
        return step

    def append_turn(self, context: Context, turn: ModelTurn) -> None:
        context.items.extend(copy.deepcopy(turn.items))

    def append_results(self, context: Context, results: list[ToolResult]) -> None:
        context.items.extend(result_item(r, "openai") for r in results)


def calls(*specs: tuple[str, str, dict[str, Any]], usage: Usage | None = None, text: str = "") -> ModelTurn:
    tool_calls = tuple(ModelToolCall(cid, name, json.dumps(args)) for cid, name, args in specs)
    items: list[dict[str, Any]] = []
    if text:
        items.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]})
    items += [{"type": "function_call", "call_id": c.call_id, "name": c.name, "arguments": c.arguments}
              for c in tool_calls]
    return ModelTurn(text=text, tool_calls=tool_calls, items=tuple(items), usage=usage or Usage())


def final(text: str = "done", usage: Usage | None = None) -> ModelTurn:
    item = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
    return ModelTurn(text=text, tool_calls=(), items=(item,), usage=usage or Usage())


def outputs(items: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(i["call_id"], i["output"]) for i in items if i.get("type") == "function_call_output"]


# --------------------------------------------------------------------------- tools


class TextArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str


@dataclass
class Tools:
    """Pure-Python tools that record what ran, in order."""

    log: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    barrier: threading.Barrier | None = None
    events: dict[str, threading.Event] = field(default_factory=dict)
    ran: dict[str, int] = field(default_factory=dict)

    def note(self, entry: str) -> None:
        with self.lock:
            self.log.append(entry)

    def count(self, name: str) -> None:
        with self.lock:
            self.ran[name] = self.ran.get(name, 0) + 1

    def echo(self, ctx: Any, args: TextArgs) -> ToolOutput:
        self.count("echo")
        return ToolOutput(text=f"echo: {args.text}")

    def read(self, ctx: Any, args: TextArgs) -> ToolOutput:
        """Read-only; ``wait:NAME`` blocks until event NAME is set, ``set:NAME`` sets it;
        with a barrier, every read waits for all the others."""
        self.count("read")
        self.note(f"read {args.text} start")
        if self.barrier is not None:
            self.barrier.wait()
        for part in args.text.split(","):
            verb, _, name = part.partition(":")
            if verb == "wait":
                assert self.events.setdefault(name, threading.Event()).wait(10), f"event {name} never came"
            elif verb == "set":
                self.events.setdefault(name, threading.Event()).set()
        self.note(f"read {args.text} end")
        return ToolOutput(text=f"read {args.text}")

    def write(self, ctx: Any, args: TextArgs) -> ToolOutput:
        self.count("write")
        self.note(f"write {args.text}")
        return ToolOutput(text=f"wrote {args.text}")

    def guarded(self, ctx: Any, args: TextArgs) -> ToolOutput:
        self.count("guarded")
        return ToolOutput(text=f"guarded ran with {args.text}")

    def stream(self, ctx: Any, args: TextArgs) -> ToolOutput:
        for chunk in args.text.split():
            assert ctx.on_output is not None
            ctx.on_output("stdout", chunk.encode())
        return ToolOutput(text=args.text)

    def big(self, ctx: Any, args: TextArgs) -> ToolOutput:
        return ToolOutput(text=args.text * 600)

    def registry(self) -> ToolRegistry:
        def tool(name: str, handler: Any, *, read_only: bool = False) -> Tool:
            hints = ToolAnnotations(read_only=read_only, destructive=not read_only)
            return Tool(ToolDefinition(name, f"The {name} test tool.", TextArgs, annotations=hints), handler)

        return ToolRegistry([
            tool("echo", self.echo, read_only=True),
            tool("read", self.read, read_only=True),
            tool("write", self.write),
            tool("guarded", self.guarded),
            tool("stream", self.stream),
            tool("big", self.big, read_only=True),
        ])


ASK_GUARDED = Policy(tools={"guarded": ToolPolicy(decision=Action.ASK)})


@pytest.fixture
def tools() -> Tools:
    return Tools()


@pytest.fixture
def audit(tmp_path: Path) -> Iterator[AuditStore]:
    with AuditStore(tmp_path / "audit.sqlite3") as store:
        yield store


@pytest.fixture
def make_harness(tools: Tools, audit: AuditStore) -> Iterator[SessionMaker]:
    with session_maker(tools.registry, audit) as make:
        yield make


def run(model: FakeModel, harness: Session, config: LoopConfig | None = None,
        events: list[Any] | None = None, **kwargs: Any) -> Any:
    return Loop.start(model, harness, task="the task", system="be brief", config=config,
                      on_event=None if events is None else events.append, **kwargs).run()


# --------------------------------------------------------------------------- basics


def test_a_final_answer_ends_the_run_with_final(make_harness, audit) -> None:
    harness = make_harness()
    events: list[Any] = []
    model = FakeModel([calls(("c1", "echo", {"text": "hi"})), final("all done")])
    outcome = run_agent(model, harness, task="the task", system="be brief", on_event=events.append)
    assert (outcome.reason, outcome.final_text, outcome.turns, outcome.tool_calls) == ("final", "all done", 2, 1)
    assert audit.get_run(harness.run_id).end_reason == "final"
    assert audit.get_run(harness.run_id).meta["model"] == "fake:unit"
    assert model.requests[1].items[-1] == {"type": "function_call_output", "call_id": "c1", "output": "echo: hi"}
    kinds = [type(e) for e in events]
    assert kinds == [RunStarted, TurnStarted, ModelReplied, ToolCallStarted, ToolCallFinished, TurnStarted,
                     ModelReplied, RunEnded]
    ended = events[-1]
    assert (ended.reason, ended.turns, ended.tool_calls, ended.final_text) == ("final", 2, 1, "all done")
    for event in events:  # every event is a JSON line
        assert json.loads(json.dumps(event.to_dict()))["event"] == event.kind


def test_next_step_walks_the_states(make_harness) -> None:
    loop = Loop.start(FakeModel([calls(("c1", "echo", {"text": "x"})), final()]), make_harness(), task="t")
    steps = [loop.step]
    while loop.step is not Step.DONE:
        steps.append(loop.next_step())
    assert steps == [Step.SELECT_TOOLS, Step.CALL_MODEL, Step.EXECUTE_CALLS, Step.APPEND_RESULTS, Step.CHECK_LIMITS,
                     Step.SELECT_TOOLS, Step.CALL_MODEL, Step.VERIFY, Step.FINISH, Step.DONE]
    assert loop.outcome.reason == "final"


def test_every_call_gets_exactly_one_result_in_the_models_order(make_harness) -> None:
    model = FakeModel([
        calls(("a", "echo", {"text": "1"}), ("b", "write", {"text": "2"}), ("c", "nope", {"text": "3"}),
              ("d", "echo", {"text": "4"})),
        final(),
    ])
    run(model, make_harness())
    got = outputs(model.requests[1].items)
    assert [cid for cid, _ in got] == ["a", "b", "c", "d"]
    assert got[1][1] == "wrote 2"
    assert "unknown tool 'nope'" in got[2][1]


def test_exposed_tools_follow_the_policys_allowed_tools(make_harness) -> None:
    model = FakeModel([calls(("c1", "write", {"text": "x"})), final()])
    run(model, make_harness(Policy(allowed_tools=("echo", "write"))))
    assert model.requests[0].tools == ["echo", "write"]


# --------------------------------------------------------------------------- tool_choice


def test_auto_stays_auto(make_harness) -> None:
    model = FakeModel([calls(("c1", "echo", {"text": "x"})), final()])
    run(model, make_harness())
    assert [r.tool_choice for r in model.requests] == ["auto", "auto"]
    assert model.requests[0].tools == ["echo", "read", "write", "guarded", "stream", "big"]


@pytest.mark.parametrize(("setting", "first", "after"), [
    ("required", "required", "auto"),
    (ForceTool(tool="echo"), ForcedTool("echo"), "auto"),
    (AllowTools(allowed=("echo", "read"), mode="required"), AllowedTools(("echo", "read"), "required"),
     AllowedTools(("echo", "read"), "auto")),
    (AllowTools(allowed=("echo",)), AllowedTools(("echo",), "auto"), AllowedTools(("echo",), "auto")),
])
def test_forcing_choices_are_reset_after_a_turn_that_called_tools(make_harness, setting, first, after) -> None:
    model = FakeModel([calls(("c1", "echo", {"text": "x"})), calls(("c2", "echo", {"text": "y"})), final()])
    outcome = run(model, make_harness(), LoopConfig(tool_choice=setting))
    assert outcome.reason == "final"
    assert [r.tool_choice for r in model.requests] == [first, after, after]
    assert all(len(r.tools) == 6 for r in model.requests)  # allowed_tools keeps the full list offered


def test_required_is_kept_until_the_model_calls_a_tool(make_harness) -> None:
    """A turn without tool calls is final: required never carries over a turn that called none."""
    model = FakeModel([final("nothing to do")])
    outcome = run(model, make_harness(), LoopConfig(tool_choice="required"))
    assert outcome.reason == "final"
    assert model.requests[0].tool_choice == "required"


def test_none_offers_no_tools_and_a_call_anyway_is_refused(make_harness, tools) -> None:
    model = FakeModel([calls(("c1", "echo", {"text": "x"})), final()])
    outcome = run(model, make_harness(), LoopConfig(tool_choice="none"))
    assert model.requests[0].tools == []
    assert model.requests[0].tool_choice == "none"
    assert model.requests[1].tool_choice == "none"  # none is not a forcing choice: it stays
    assert "echo" not in tools.ran
    (_, text), = outputs(model.requests[1].items)
    assert "not offered in this turn" in text
    assert outcome.reason == "final"


def test_allowed_tools_subset_refuses_other_tools(make_harness, tools) -> None:
    model = FakeModel([calls(("c1", "write", {"text": "x"}), ("c2", "echo", {"text": "y"})), final()])
    harness = make_harness()
    run(model, harness, LoopConfig(tool_choice=AllowTools(allowed=("echo",))))
    got = dict(outputs(model.requests[1].items))
    assert "tool 'write' is not offered in this turn; the tools you may call now are: echo" in got["c1"]
    refused = harness.audit.get_call(harness.run_id, "c1")  # the run's record holds the refusal
    assert refused is not None and refused.error_code == "tool_not_allowed" and refused.decision is None
    assert got["c2"] == "echo: y"
    assert "write" not in tools.ran


def test_stages_override_tools_and_choice_per_turn(make_harness) -> None:
    config = LoopConfig(stages=(
        Stage(turns="1", tools=("echo",), tool_choice=ForceTool(tool="echo")),
        Stage(turns="2-3", tools=("echo", "write"), tool_choice="required"),
        Stage(turns="4-", tools=("write",)),
    ))
    model = FakeModel([calls((f"c{n}", "echo", {"text": str(n)})) for n in range(1, 4)] + [final()])
    run(model, make_harness(), config)
    assert [r.tools for r in model.requests] == [["echo"], ["echo", "write"], ["echo", "write"], ["write"]]
    # a stage's choice applies on its first turn; the reset applies within it
    assert [r.tool_choice for r in model.requests] == [ForcedTool("echo"), "required", "auto", "auto"]


def test_a_stage_forcing_a_tool_it_does_not_expose_ends_with_error_config(make_harness, audit) -> None:
    config = LoopConfig(stages=(Stage(turns="1-", tools=("write",), tool_choice=ForceTool(tool="echo")),))
    harness = make_harness()
    outcome = run(FakeModel([final()]), harness, config)
    assert outcome.reason == "error:config"
    assert "forces 'echo'" in outcome.message
    assert audit.get_run(harness.run_id).end_reason == "error:config"


def test_a_config_naming_unknown_or_disallowed_tools_is_refused(make_harness, audit) -> None:
    harness = make_harness(Policy(allowed_tools=("echo",)))
    config = LoopConfig(tool_choice=ForceTool(tool="write"), stages=(Stage(turns="1", tools=("ghost",)),))
    with pytest.raises(LoopConfigError) as info:
        run(FakeModel([final()]), harness, config)
    assert "'write', which the policy's allowed_tools does not allow" in info.value.message
    assert "'ghost', which is not a registered tool" in info.value.message
    assert audit.get_run(harness.run_id).end_reason == "error:config"


@pytest.mark.parametrize("turns", ["0", "3-2", "x", "-2", ""])
def test_bad_stage_ranges_are_refused(turns: str) -> None:
    with pytest.raises(ValueError, match="turns"):
        Stage(turns=turns)


# --------------------------------------------------------------------------- parallel calls


def test_read_only_calls_of_a_turn_run_concurrently_and_results_keep_the_order(make_harness, tools) -> None:
    tools.barrier = threading.Barrier(3, timeout=10)  # breaks unless all three run at once
    model = FakeModel([
        calls(("r1", "read", {"text": "wait:last"}), ("r2", "read", {"text": "b"}),
              ("r3", "read", {"text": "set:last"})),
        final(),
    ])
    outcome = run(model, make_harness())
    assert outcome.reason == "final"
    # r1 finished last (it waited for r3), yet the results are in the order the model issued them
    assert tools.log.index("read wait:last end") > tools.log.index("read set:last end")
    assert outputs(model.requests[1].items) == [("r1", "read wait:last"), ("r2", "read b"), ("r3", "read set:last")]


def test_a_write_runs_alone_between_the_reads_around_it(make_harness, tools) -> None:
    tools.barrier = threading.Barrier(2, timeout=10)  # the reads pair up around the write
    model = FakeModel([
        calls(("r1", "read", {"text": "a"}), ("r2", "read", {"text": "b"}), ("w", "write", {"text": "w"}),
              ("r3", "read", {"text": "c"}), ("r4", "read", {"text": "d"})),
        final(),
    ])
    assert run(model, make_harness()).reason == "final"
    position = tools.log.index("write w")
    assert {e for e in tools.log[:position]} == {"read a start", "read a end", "read b start", "read b end"}
    assert {e for e in tools.log[position + 1:]} == {"read c start", "read c end", "read d start", "read d end"}
    assert [cid for cid, _ in outputs(model.requests[1].items)] == ["r1", "r2", "w", "r3", "r4"]


def test_parallel_off_runs_everything_in_order(make_harness, tools) -> None:
    model = FakeModel([calls(("r1", "read", {"text": "a"}), ("r2", "read", {"text": "b"})), final()])
    run(model, make_harness(), LoopConfig(parallel_tool_calls=False))
    assert tools.log == ["read a start", "read a end", "read b start", "read b end"]


# --------------------------------------------------------------------------- termination


def test_max_turns(make_harness, audit) -> None:
    harness = make_harness()
    model = FakeModel([calls((f"c{n}", "echo", {"text": str(n)})) for n in range(5)])
    outcome = run(model, harness, LoopConfig(max_turns=2))
    assert (outcome.reason, outcome.turns, outcome.tool_calls) == ("max_turns", 2, 2)
    assert audit.get_run(harness.run_id).end_reason == "max_turns"


def test_budget_tool_calls(make_harness, audit, tools) -> None:
    harness = make_harness(Policy(budgets=Budgets(max_tool_calls=2)))
    model = FakeModel([calls(("a", "echo", {"text": "1"}), ("b", "echo", {"text": "2"}), ("c", "write", {"text": "3"})),
                       final()])
    outcome = run(model, harness, LoopConfig(parallel_tool_calls=False))
    assert outcome.reason == "budget:tool_calls"
    assert tools.ran == {"echo": 2}
    assert audit.get_run(harness.run_id).end_reason == "budget:tool_calls"


def test_budget_wall_time_counts_with_the_loops_clock(make_harness) -> None:
    now = [0.0]

    def slow(turn: ModelTurn) -> Callable[[Context], ModelTurn]:
        def step(_context: Context) -> ModelTurn:
            now[0] += 100.0
            return turn
        return step

    harness = make_harness(Policy(budgets=Budgets(max_wall_time_s=150)))
    model = FakeModel([slow(calls(("a", "echo", {"text": "1"}))), slow(calls(("b", "echo", {"text": "2"}))),
                       final()])
    loop = Loop.start(model, harness, task="t", clock=lambda: now[0])
    outcome = loop.run()
    assert (outcome.reason, outcome.turns, outcome.seconds) == ("budget:wall_time", 2, 200.0)


@pytest.mark.parametrize(("config", "usage", "reason"), [
    (LoopConfig(max_input_tokens=250), Usage(input_tokens=100, output_tokens=1), "budget:input_tokens"),
    (LoopConfig(max_output_tokens=25), Usage(input_tokens=1, output_tokens=10), "budget:output_tokens"),
    (LoopConfig(max_cost_usd=0.25), Usage(cost_usd=0.1), "budget:cost"),
])
def test_token_and_cost_budgets(make_harness, config, usage, reason) -> None:
    model = FakeModel([calls((f"c{n}", "echo", {"text": str(n)}), usage=usage) for n in range(10)])
    outcome = run(model, make_harness(), config)
    assert (outcome.reason, outcome.turns) == (reason, 3)


def test_cost_is_not_checked_when_the_model_reports_none(make_harness) -> None:
    model = FakeModel([calls(("c1", "echo", {"text": "x"}), usage=Usage(5, 5)), final()])
    outcome = run(model, make_harness(), LoopConfig(max_cost_usd=0.01))
    assert outcome.reason == "final"
    assert outcome.usage == Usage(5, 5, None)


def test_the_same_call_n_times_in_a_row_is_a_loop(make_harness, audit) -> None:
    harness = make_harness()
    model = FakeModel([calls((f"c{n}", "echo", {"text": "same"})) for n in range(10)])
    outcome = run(model, harness, LoopConfig(loop_detection=3))
    assert (outcome.reason, outcome.turns) == ("loop_detected", 3)
    assert audit.get_run(harness.run_id).end_reason == "loop_detected"


def test_different_arguments_break_the_streak(make_harness) -> None:
    texts = ["same", "same", "other", "same", "same", "other"]
    model = FakeModel([calls((f"c{n}", "echo", {"text": t})) for n, t in enumerate(texts)] + [final()])
    assert run(model, make_harness(), LoopConfig(loop_detection=3)).reason == "final"


def test_repeats_within_one_turn_count_too(make_harness) -> None:
    model = FakeModel([calls(*[(f"c{n}", "echo", {"text": "same"}) for n in range(3)]), final()])
    assert run(model, make_harness(), LoopConfig(loop_detection=3)).reason == "loop_detected"


def test_a_retryable_model_error_is_retried(make_harness) -> None:
    events: list[Any] = []
    model = FakeModel([ModelError("overloaded", retryable=True), ModelError("rate limited", retryable=True),
                       final("fine")])
    outcome = run(model, make_harness(), LoopConfig(model_retries=2, retry_wait_s=0), events)
    assert (outcome.reason, outcome.final_text) == ("final", "fine")
    retries = [e for e in events if isinstance(e, ModelRetrying)]
    assert [(r.attempt, r.error) for r in retries] == [(1, "overloaded"), (2, "rate limited")]
    assert len(model.requests) == 3


def test_retries_are_bounded(make_harness, audit) -> None:
    harness = make_harness()
    model = FakeModel([ModelError("overloaded", retryable=True)] * 5)
    outcome = run(model, harness, LoopConfig(model_retries=2, retry_wait_s=0))
    assert outcome.reason == "error:model"
    assert "overloaded" in outcome.message
    assert len(model.requests) == 3
    assert audit.get_run(harness.run_id).end_reason == "error:model"


def test_a_non_retryable_model_error_is_not_retried(make_harness) -> None:
    model = FakeModel([ModelError("bad request: no such model", retryable=False), final()])
    outcome = run(model, make_harness(), LoopConfig(retry_wait_s=0))
    assert (outcome.reason, len(model.requests)) == ("error:model", 1)
    assert "no such model" in outcome.message


def test_a_bug_in_the_adapter_ends_with_error_internal(make_harness, audit) -> None:
    harness = make_harness()
    outcome = run(FakeModel([KeyError("choices")]), harness)
    assert outcome.reason == "error:internal"
    assert "KeyError" in outcome.message
    assert audit.get_run(harness.run_id).end_reason == "error:internal"


def test_ctrl_c_records_interrupted_and_propagates(make_harness, audit) -> None:
    harness = make_harness()
    with pytest.raises(KeyboardInterrupt):
        run(FakeModel([KeyboardInterrupt()]), harness)
    assert audit.get_run(harness.run_id).end_reason == "error:interrupted"


# --------------------------------------------------------------------------- events


def test_events_carry_decisions_and_streamed_output(make_harness) -> None:
    events: list[Any] = []
    model = FakeModel([calls(("s", "stream", {"text": "one two"}), ("g", "guarded", {"text": "x"})), final()])
    run(model, make_harness(ASK_GUARDED), events=events)
    started = {e.call_id: e.decision for e in events if isinstance(e, ToolCallStarted)}
    finished = {e.call_id: e.decision for e in events if isinstance(e, ToolCallFinished)}
    assert started == finished == {"s": "allow", "g": "ask"}
    chunks = [(e.call_id, e.stream, e.data) for e in events if isinstance(e, ToolOutputChunk)]
    assert chunks == [("s", "stdout", b"one"), ("s", "stdout", b"two")]
    assert ToolOutputChunk("s", "stdout", b"\xffok").to_dict() == {
        "event": "tool_output", "call_id": "s", "stream": "stdout", "data": "\ufffdok"}


def test_a_failing_event_callback_does_not_break_the_run(make_harness) -> None:
    def broken(_event: Any) -> None:
        raise RuntimeError("renderer bug")

    model = FakeModel([calls(("c1", "echo", {"text": "x"})), final()])
    outcome = Loop.start(model, make_harness(), task="t", on_event=broken).run()
    assert outcome.reason == "final"


# --------------------------------------------------------------------------- context budget


def test_old_outputs_are_elided_when_the_context_nears_its_budget(make_harness) -> None:
    events: list[Any] = []
    model = FakeModel([calls((f"c{n}", "big", {"text": str(n)})) for n in range(4)] + [final()])
    config = LoopConfig(context_budget_bytes=2000, keep_latest_outputs=1)
    assert run(model, make_harness(), config, events).reason == "final"
    last = outputs(model.requests[-1].items)
    assert [cid for cid, _ in last] == ["c0", "c1", "c2", "c3"]
    assert last[0][1] == "[output of c0 elided: 600 bytes]"
    assert last[-1][1] == "3" * 600  # the latest stays whole
    elided = [e for e in events if isinstance(e, ContextElided)]
    assert elided and all(e.bytes_after < e.bytes_before for e in elided)


# --------------------------------------------------------------------------- approval pause and resume


def pause_run(make_harness: Callable[..., Session], run_id: str = "run-pause") -> tuple[Any, FakeModel]:
    harness = make_harness(ASK_GUARDED, run_id=run_id)
    model = FakeModel([
        calls(("e1", "echo", {"text": "first"})),
        calls(("e2", "echo", {"text": "before"}), ("g1", "guarded", {"text": "launch"}),
              ("e3", "echo", {"text": "after"})),
    ])
    return run(model, harness, LoopConfig(max_input_tokens=10_000)), model


def test_a_call_needing_approval_pauses_after_the_other_calls_ran(make_harness, audit, tools) -> None:
    outcome, _model = pause_run(make_harness)
    assert outcome.reason == "approval_pending"
    assert outcome.paused
    assert tools.ran == {"echo": 3}  # the other calls of the turn ran, guarded did not
    (approval,) = audit.list_approvals(run_id="run-pause")
    assert outcome.pending_approvals == (approval.id,)
    assert f"`callbox approvals approve {approval.id}`" in outcome.message
    assert "then resume run run-pause with the model it ran with" in outcome.message
    run_record = audit.get_run("run-pause")
    assert run_record.end_reason == "approval_pending"  # paused, re-opened by resume
    cp = checkpoints.load(audit, "run-pause")
    assert cp is not None
    assert [(c.call_id, c.pending) for c in cp.calls] == [("e2", False), ("g1", True), ("e3", False)]
    assert cp.calls[1].approval_id == approval.id
    assert cp.calls[0].result is not None and cp.calls[0].result.text == "echo: before"
    assert (cp.turn, cp.tool_calls, cp.format, cp.model, cp.sandbox) == (2, 4, "openai", "fake:unit", None)
    # the paused turn's results are held, not appended: the context ends with the model's calls
    assert cp.items[-1] == {"type": "function_call", "call_id": "e3", "name": "echo",
                            "arguments": json.dumps({"text": "after"})}
    assert cp.config["max_input_tokens"] == 10_000
    assert cp.policy_model() == ASK_GUARDED
    assert checkpoints.Checkpoint.from_json(cp.to_json()) == cp


def test_resume_after_approval_runs_the_call_exactly_once(make_harness, audit, tools) -> None:
    pause_run(make_harness)
    (approval,) = audit.list_approvals(run_id="run-pause")
    audit.resolve_approval(approval.id, True, by="tester", reason=None)

    events: list[Any] = []
    model = FakeModel([final("launched")])
    outcome = resume("run-pause", model, make_harness(ASK_GUARDED, run_id="run-pause"), on_event=events.append)
    assert (outcome.reason, outcome.final_text, outcome.turns, outcome.tool_calls) == ("final", "launched", 3, 4)
    assert tools.ran == {"echo": 3, "guarded": 1}
    # the whole paused turn's results, in the model's order, then the final turn
    assert outputs(model.requests[0].items)[-3:] == [("e2", "echo: before"), ("g1", "guarded ran with launch"),
                                                    ("e3", "echo: after")]
    assert audit.get_run("run-pause").end_reason == "final"
    assert isinstance(events[0], RunStarted) and events[0].resumed
    resent = [(e.call_id, e.decision) for e in events if isinstance(e, ToolCallFinished)]
    assert resent == [("g1", "approved")]
    # nothing left to resume
    with pytest.raises(AuditError, match="already ended \\(final\\)"):
        resume("run-pause", FakeModel([final()]), make_harness(ASK_GUARDED, run_id="run-pause"))
    assert tools.ran["guarded"] == 1


def test_resume_after_a_denial_hands_the_model_the_denial(make_harness, audit, tools) -> None:
    pause_run(make_harness)
    (approval,) = audit.list_approvals(run_id="run-pause")
    audit.resolve_approval(approval.id, False, by="tester", reason="not in production")
    model = FakeModel([final("ok, not launching")])
    outcome = resume("run-pause", model, make_harness(ASK_GUARDED, run_id="run-pause"))
    assert outcome.reason == "final"
    assert "guarded" not in tools.ran
    got = dict(outputs(model.requests[0].items))
    assert "denied" in got["g1"] and "not in production" in got["g1"]


def test_resume_while_still_pending_pauses_again(make_harness, audit, tools) -> None:
    pause_run(make_harness)
    model = FakeModel([final()])
    outcome = resume("run-pause", model, make_harness(ASK_GUARDED, run_id="run-pause"))
    assert outcome.reason == "approval_pending"
    assert model.requests == []  # the model is not asked with a turn missing a result
    assert audit.get_run("run-pause").end_reason == "approval_pending"
    (approval,) = audit.list_approvals(run_id="run-pause")
    audit.resolve_approval(approval.id, True, by="tester", reason=None)
    assert resume("run-pause", model, make_harness(ASK_GUARDED, run_id="run-pause")).reason == "final"
    assert tools.ran["guarded"] == 1


def test_a_pause_is_resumed_by_one_process_only(make_harness, audit) -> None:
    pause_run(make_harness)
    first = Loop.resume("run-pause", FakeModel([final()]), make_harness(ASK_GUARDED, run_id="run-pause"))
    with pytest.raises(AuditError, match="already being resumed"):
        Loop.resume("run-pause", FakeModel([final()]), make_harness(ASK_GUARDED, run_id="run-pause"))
    assert first.step is Step.ATTACH_SANDBOX


def test_resume_needs_a_checkpoint_and_the_same_api(make_harness, audit) -> None:
    harness = make_harness(run_id="never-paused")
    with pytest.raises(CheckpointError, match="no checkpoint"):
        resume("never-paused", FakeModel([]), harness)
    pause_run(make_harness)

    class ChatModel(FakeModel):
        format: Format = "chat"
        name = "fake:chat"

    with pytest.raises(CheckpointError, match="same API"):
        resume("run-pause", ChatModel([final()]), make_harness(ASK_GUARDED, run_id="run-pause"))
    # refused before claiming: the right model can still resume it
    assert audit.load_checkpoint("run-pause").status == "paused"  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="the harness is for run"):
        resume("run-pause", FakeModel([final()]), make_harness(ASK_GUARDED, run_id="other"))


def test_a_resumed_run_keeps_its_limits_and_counts(make_harness, audit) -> None:
    pause_run(make_harness)
    (approval,) = audit.list_approvals(run_id="run-pause")
    audit.resolve_approval(approval.id, True, by="tester", reason=None)
    model = FakeModel([calls(("e9", "echo", {"text": "x"}))] * 5)
    outcome = resume("run-pause", model, make_harness(ASK_GUARDED, run_id="run-pause"),
                     config=LoopConfig(max_turns=3))
    assert (outcome.reason, outcome.turns, outcome.tool_calls) == ("max_turns", 3, 5)


def test_checkpoint_of_a_dead_resumer_can_be_claimed_again(audit) -> None:
    audit.start_run("r")
    audit.save_checkpoint("r", '{"x": 1}')
    assert audit.get_run("r").end_reason == "approval_pending"
    audit.claim_checkpoint("r")
    assert audit.get_run("r").end_reason is None
    with pytest.raises(AuditError, match="already being resumed"):  # this process is alive
        audit.claim_checkpoint("r")
    # a resumer on another host: cannot tell whether it lives, so refuse
    audit._write(lambda c: c.execute("UPDATE checkpoints SET owner = 'ghost-host/999999999/1.00'"))
    with pytest.raises(AuditError, match="already being resumed"):
        audit.claim_checkpoint("r")
    # a resumer on this host whose process is gone: claimable again
    dead = f"{socket.gethostname()}/999999999/1.00"
    audit._write(lambda c: c.execute("UPDATE checkpoints SET owner = ?", (dead,)))
    assert audit.claim_checkpoint("r").status == "resumed"
    assert audit.get_run("r").end_reason is None


def test_approval_pending_result_text_is_never_appended(make_harness, audit) -> None:
    """The pending call's placeholder result must not reach the model's context."""
    pause_run(make_harness)
    cp = checkpoints.load(audit, "run-pause")
    assert cp is not None
    assert all(i.get("type") != "function_call_output" or i["call_id"] != "g1" for i in cp.items)
    assert ErrorCode.APPROVAL_PENDING.value not in json.dumps(cp.items)


# --------------------------------------------------------------------------- the paused run's sandbox (fakes)


@dataclass
class FakeAgent:
    closed: bool = False

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeEngine:
    """Records keep/attach; ``attach_error`` makes attach fail."""

    log: list[str] = field(default_factory=list)
    attach_error: Exception | None = None

    def keep(self, sandbox: Any, *, run_id: str, until: float | None = None) -> Any:
        self.log.append(f"keep {sandbox.id} for {run_id}")
        return type("Kept", (), {"until": 4_000_000_000.0 if until is None else until})()

    def attach(self, sandbox_id: str) -> Any:
        self.log.append(f"attach {sandbox_id}")
        if self.attach_error is not None:
            raise self.attach_error
        return FakeSandbox(sandbox_id, self)


@dataclass
class FakeSandbox:
    id: str
    engine: FakeEngine
    agent: FakeAgent = field(default_factory=FakeAgent)

    def destroy(self) -> None:
        self.engine.log.append(f"destroy {self.id}")

    def new_egress_events(self) -> list[object]:
        return []  # network none: no egress proxy

    def keep(self, *, run_id: str, until: float | None = None) -> float:
        return self.engine.keep(self, run_id=run_id, until=until).until


def test_a_pause_keeps_and_detaches_the_sandbox_and_resume_attaches_it(make_harness, audit) -> None:
    engine = FakeEngine()
    harness = make_harness(ASK_GUARDED, run_id="run-box")
    box = FakeSandbox("box123456789", engine)
    harness.attach(box)  # as if a tool had started it
    model = FakeModel([calls(("g1", "guarded", {"text": "x"}))])
    outcome = run(model, harness, LoopConfig(paused_sandbox_ttl_s=60))
    assert outcome.reason == "approval_pending"
    assert engine.log == ["keep box123456789 for run-box"]
    assert harness.active_sandbox is None and box.agent.closed  # closing the harness leaves it alone
    cp = checkpoints.load(audit, "run-box")
    assert cp is not None and cp.sandbox is not None and cp.sandbox.id == "box123456789"
    assert "its sandbox box123456789 is kept until" in outcome.message

    (approval,) = audit.list_approvals(run_id="run-box")
    audit.resolve_approval(approval.id, True, by="tester", reason=None)
    resumed = make_harness(ASK_GUARDED, run_id="run-box")
    loop = Loop.resume("run-box", FakeModel([final()]), resumed, engine=engine)  # type: ignore[arg-type]
    assert loop.run().reason == "final"
    assert engine.log[-1] == "attach box123456789"
    assert resumed.active_sandbox is not None and resumed.active_sandbox.id == "box123456789"


@pytest.mark.parametrize(("expires", "expected"), [
    (1_000_000_000.0, "the sandbox of run run-box expired at 2001-09-09 01:46:40 UTC; its files are gone"),
    (4_000_000_000.0, "the sandbox of run run-box is gone before its expiry at 2096-10-02 07:06:40 UTC "
                      "(container removed)"),
])
@pytest.mark.usefixtures("utc_zone")  # moments are shown in local time with their zone
def test_resume_with_an_expired_or_gone_sandbox_says_so(make_harness, audit, tools, expires, expected) -> None:
    from harness.engine.docker.engine import SandboxExpired

    engine = FakeEngine()
    harness = make_harness(ASK_GUARDED, run_id="run-box")
    harness.attach(FakeSandbox("box123456789", engine))
    run(FakeModel([calls(("g1", "guarded", {"text": "x"}))]), harness)
    cp = checkpoints.load(audit, "run-box")
    assert cp is not None and cp.sandbox is not None
    cp.sandbox = checkpoints.SandboxRef(cp.sandbox.id, expires)
    audit.save_checkpoint("run-box", cp.to_json())
    (approval,) = audit.list_approvals(run_id="run-box")
    audit.resolve_approval(approval.id, True, by="tester", reason=None)

    engine.attach_error = SandboxExpired("container removed", sandbox_id="box123456789", expired_at=expires)
    model = FakeModel([final()])
    outcome = Loop.resume("run-box", model, make_harness(ASK_GUARDED, run_id="run-box"),
                          engine=engine).run()  # type: ignore[arg-type]
    assert (outcome.reason, outcome.message) == ("error:sandbox_expired", expected)
    assert model.requests == []  # never silently continued
    assert "guarded" not in tools.ran
    assert audit.get_run("run-box").end_reason == "error:sandbox_expired"


def test_a_broken_audit_store_ends_with_error_harness(make_harness, audit, monkeypatch) -> None:
    harness = make_harness()

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise AuditError("the audit database is locked")

    monkeypatch.setattr(audit, "claim_call", broken)
    monkeypatch.setattr(audit, "claim_and_start", broken)  # the claim of a call that passed validation
    outcome = run(FakeModel([calls(("c1", "echo", {"text": "x"}))]), harness)
    assert (outcome.reason, outcome.message) == ("error:harness", "the audit database is locked")
    assert audit.get_run(harness.run_id).end_reason == "error:harness"


def test_a_pause_names_the_command_that_resumes_it(make_harness) -> None:
    harness = make_harness(ASK_GUARDED, run_id="run-hint")
    model = FakeModel([calls(("g1", "guarded", {"text": "x"}))])
    command = "callbox run /abs/t.jsonl --resume run-hint --audit-db '/a b/audit.db'"
    outcome = Loop.start(model, harness, task="t", resume_command=command).run()
    assert outcome.reason == "approval_pending"
    assert outcome.message.endswith(f"then continue it with: {command}")
    assert outcome.resume_command == command


def test_the_run_stops_at_the_first_call_that_finds_the_sandbox_unavailable(audit, tools) -> None:
    from harness.core.errors import EngineUnavailable

    def gone(_ctx: Any, _args: TextArgs) -> ToolOutput:
        tools.count("gone")
        raise EngineUnavailable("cannot reach the Docker engine at unix:///closed.sock")

    registry = ToolRegistry([*tools.registry().tools(),
                             Tool(ToolDefinition("gone", "Needs the sandbox.", TextArgs), gone)])
    events: list[Any] = []
    with Session(registry, Policy(), audit, run_id="run-gone", engine_factory=no_engine) as harness:
        model = FakeModel([
            calls(("w1", "write", {"text": "a"}), ("u1", "gone", {"text": "b"}), ("u2", "gone", {"text": "c"}),
                  ("w2", "write", {"text": "d"})),
            final("never asked"),
        ])
        outcome = run(model, harness, events=events)
    assert outcome.reason == "error:sandbox_unavailable"
    assert "cannot reach the Docker engine at unix:///closed.sock" in outcome.message
    assert tools.ran == {"write": 1, "gone": 1}  # nothing after the first unavailable call ran
    assert len(model.requests) == 1  # the model is not asked again
    assert [e.call_id for e in events if isinstance(e, ToolCallFinished)] == ["w1", "u1"]
    assert audit.get_run("run-gone").end_reason == "error:sandbox_unavailable"
