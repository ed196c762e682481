"""Acceptance checks on the loop's final answers, against a fake model and a real Session.

The ``shell`` tool here is a pure-Python stand-in with the real tool's arguments: it answers
from a table of exit codes the test sets (``Shell.codes``), so no sandbox starts; the
integration tests (tests/integration/test_acceptance.py) run real checks in a real sandbox.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.audit.store import AuditStore
from harness.core.acceptance import AcceptanceCheck, AcceptancePolicy
from harness.core.calls import Action, ErrorCode, ToolOutput
from harness.core.policy import Budgets, Policy, ToolPolicy
from harness.core.registry import Tool, ToolAnnotations, ToolDefinition, ToolRegistry
from harness.core.rules import Rule
from harness.core.session import Session
from harness.loop import checkpoint as checkpoints
from harness.loop.acceptance import CHECK_CALL_PREFIX, ORIGIN, effective
from harness.loop.agent_loop import Loop, LoopConfig, RunEnded, resume
from harness.loop.events import AcceptanceCheckFinished, AcceptanceCheckStarted, AnswerRejected
from harness.tools.shell import ShellArgs
from tests.support.loop_sessions import SessionMaker, session_maker
from tests.unit.test_loop import FakeModel, TextArgs, calls, final


@dataclass
class Shell:
    """``shell`` that exits with ``codes[command]`` (a list: one code per run, the last repeating)."""

    codes: dict[str, list[int]] = field(default_factory=dict)
    ran: list[dict[str, Any]] = field(default_factory=list)

    def run(self, ctx: Any, args: ShellArgs) -> ToolOutput:
        self.ran.append(args.model_dump())
        codes = self.codes.get(args.command, [0])
        code = codes.pop(0) if len(codes) > 1 else codes[0]
        text = f"Exit code: {code}\nWall time: 0 seconds\nOutput:\n{args.command}: {'ok' if code == 0 else 'FAILED'}\n"
        return ToolOutput(text=text, is_error=code != 0, error=None if code == 0 else ErrorCode.NONZERO_EXIT,
                          structured={"exit_code": code, "timed_out": False})

    def registry(self) -> ToolRegistry:
        hints = ToolAnnotations(read_only=False, destructive=True)
        guarded = Tool(ToolDefinition("guarded", "Needs approval.", TextArgs, annotations=hints),
                       lambda ctx, args: ToolOutput(text=f"guarded ran with {args.text}"))
        return ToolRegistry([
            Tool(ToolDefinition("shell", "Run a command.", ShellArgs, annotations=hints, command_field="command"),
                 self.run),
            guarded,
        ])


@pytest.fixture
def shell() -> Shell:
    return Shell()


@pytest.fixture
def audit(tmp_path: Path) -> Iterator[AuditStore]:
    with AuditStore(tmp_path / "audit.sqlite3") as store:
        yield store


@pytest.fixture
def make_harness(shell: Shell, audit: AuditStore) -> Iterator[SessionMaker]:
    with session_maker(shell.registry, audit) as make:
        yield make


def run(model: FakeModel, harness: Session, config: LoopConfig | None = None, events: list[Any] | None = None) -> Any:
    return Loop.start(model, harness, task="the task", config=config,
                      on_event=None if events is None else events.append).run()


PYTEST = AcceptanceCheck(command="python -m pytest -q", workdir="/workspace/project", timeout_s=60)
LINT = AcceptanceCheck(command="ruff check .")


def test_without_checks_a_final_answer_ends_the_run_final(make_harness, shell) -> None:
    outcome = run(FakeModel([final("done")]), make_harness())
    assert (outcome.reason, outcome.rejections) == ("final", 0)
    assert shell.ran == []


def test_all_checks_pass_the_run_ends_final_accepted(make_harness, shell, audit) -> None:
    harness = make_harness()
    events: list[Any] = []
    outcome = run(FakeModel([final("fixed")]), harness, LoopConfig(acceptance=(PYTEST, LINT)), events)
    assert (outcome.reason, outcome.final_text, outcome.tool_calls) == ("final:accepted", "fixed", 0)
    assert shell.ran == [{"command": "python -m pytest -q", "workdir": "/workspace/project", "timeout_ms": 60_000},
                         {"command": "ruff check .", "workdir": None, "timeout_ms": 300_000}]
    assert audit.get_run(harness.run_id).end_reason == "final:accepted"
    started = [e for e in events if isinstance(e, AcceptanceCheckStarted)]
    finished = [e for e in events if isinstance(e, AcceptanceCheckFinished)]
    assert [(e.index, e.total, e.command) for e in started] == [(1, 2, PYTEST.command), (2, 2, LINT.command)]
    assert [(e.passed, e.exit_code) for e in finished] == [(True, 0), (True, 0)]
    for event in events:  # every event is a JSON line
        assert json.loads(json.dumps(event.to_dict()))["event"] == event.kind
    # the checks are recorded as the harness's own calls, not the model's
    records = audit.calls_for_run(harness.run_id)
    assert [(c["tool"], c["origin"], c["exit_code"]) for c in records] == [("shell", ORIGIN, 0), ("shell", ORIGIN, 0)]
    assert all(c["call_id"].startswith(CHECK_CALL_PREFIX) for c in records)
    meta = audit.get_run(harness.run_id).meta["acceptance"]
    assert (meta["verdict"], meta["rejections"], len(meta["rounds"])) == ("final:accepted", 0, 1)
    assert [c["passed"] for c in meta["rounds"][0]["checks"]] == [True, True]


def test_a_failed_check_is_told_to_the_model_and_the_run_goes_on(make_harness, shell, audit) -> None:
    shell.codes[PYTEST.command] = [1, 0]
    model = FakeModel([final("first try"), calls(("c1", "shell", {"command": "fix"})), final("fixed")])
    events: list[Any] = []
    outcome = run(model, make_harness(), LoopConfig(acceptance=(PYTEST, LINT)), events)
    assert (outcome.reason, outcome.rejections, outcome.turns, outcome.tool_calls) == ("final:accepted", 1, 3, 1)
    told = model.requests[1].items[-1]
    assert told["role"] == "user"
    assert "acceptance check 1 (`python -m pytest -q` in /workspace/project), 1 of 2, exited with 1" in told["content"]
    assert "python -m pytest -q: FAILED" in told["content"]  # the check's output reaches the model
    assert "3 more rejections end the run" in told["content"]
    # the second check did not run after the first failed; both ran on the second answer
    assert [r["command"] for r in shell.ran] == [PYTEST.command, "fix", PYTEST.command, LINT.command]
    (rejected,) = [e for e in events if isinstance(e, AnswerRejected)]
    assert (rejected.rejections, rejected.ends_run) == (1, False)


def test_past_max_rejections_the_run_ends_rejected_acceptance(make_harness, shell, audit) -> None:
    shell.codes[PYTEST.command] = [1]
    harness = make_harness()
    model = FakeModel([final("a"), final("b"), final("c")])
    outcome = run(model, harness, LoopConfig(acceptance=(PYTEST,), max_rejections=2))
    assert (outcome.reason, outcome.rejections, outcome.turns) == ("rejected:acceptance", 3, 3)
    assert outcome.message == ("the acceptance checks rejected 3 answers (max_rejections = 2); the last: acceptance "
                               "check 1 (`python -m pytest -q` in /workspace/project), 1 of 1, exited with 1, "
                               "expected 0.")
    assert outcome.final_text == "c"  # the last answer, the one rejected
    assert "the next rejection ends the run" in model.requests[2].items[-1]["content"]
    assert audit.get_run(harness.run_id).end_reason == "rejected:acceptance"
    assert audit.get_run(harness.run_id).meta["acceptance"]["verdict"] == "rejected:acceptance"


def test_max_rejections_zero_ends_at_the_first_rejection(make_harness, shell) -> None:
    shell.codes[PYTEST.command] = [2]
    outcome = run(FakeModel([final("a")]), make_harness(), LoopConfig(acceptance=(PYTEST,), max_rejections=0))
    assert (outcome.reason, outcome.rejections) == ("rejected:acceptance", 1)


def test_an_expected_nonzero_exit_passes(make_harness, shell) -> None:
    shell.codes["grep -q TODO src.py"] = [1]
    check = AcceptanceCheck(command="grep -q TODO src.py", expect_exit=1)
    assert run(FakeModel([final()]), make_harness(), LoopConfig(acceptance=(check,))).reason == "final:accepted"


def test_a_rejection_still_meets_max_turns(make_harness, shell) -> None:
    shell.codes[PYTEST.command] = [1]
    outcome = run(FakeModel([final("a")]), make_harness(), LoopConfig(acceptance=(PYTEST,), max_turns=1))
    assert (outcome.reason, outcome.rejections) == ("max_turns", 1)


def test_checks_count_toward_max_tool_calls(make_harness, shell, audit) -> None:
    harness = make_harness(Policy(budgets=Budgets(max_tool_calls=2)))
    model = FakeModel([calls(("c1", "shell", {"command": "make"})), final("b")])
    outcome = run(model, harness, LoopConfig(acceptance=(LINT, PYTEST)))
    # the model's call and the first check used the budget: the second check is refused by it
    assert outcome.reason == "budget:tool_calls"
    assert outcome.message.startswith("acceptance check 2 (`python -m pytest -q` in /workspace/project) was not "
                                      "run: denied: this run has used its budget of 2 tool calls")
    assert [r["command"] for r in shell.ran] == ["make", LINT.command]
    assert [c["decision"] for c in audit.calls_for_run(harness.run_id)] == ["allow", "allow", "deny"]


def test_a_check_the_policy_denies_is_refused_before_the_first_turn(make_harness, audit, shell) -> None:
    policy = Policy(tools={"shell": ToolPolicy(rules=(Rule(action=Action.DENY, command="python *"),))})
    harness = make_harness(policy)
    model = FakeModel([final()])
    with pytest.raises(Exception, match=r"acceptance check 1 \(`python -m pytest -q`.*\) cannot run: the policy "
                                        r"denies it \(tools.shell.rules\[0\]"):
        run(model, harness, LoopConfig(acceptance=(PYTEST,)))
    assert model.requests == []  # no turn was spent
    assert audit.get_run(harness.run_id).end_reason == "error:config"
    assert shell.ran == []


def test_a_check_that_would_ask_a_person_is_refused_too(make_harness) -> None:
    harness = make_harness(Policy(tools={"shell": ToolPolicy(decision=Action.ASK)}))
    with pytest.raises(Exception, match="would ask a person to approve it"):
        run(FakeModel([final()]), harness, LoopConfig(acceptance=(PYTEST,)))


def test_checks_need_the_shell_tool(make_harness) -> None:
    harness = make_harness(Policy(allowed_tools=("guarded",)))
    with pytest.raises(Exception, match="add 'shell' to allowed_tools"):
        run(FakeModel([final()]), harness, LoopConfig(acceptance=(PYTEST,)))


def test_the_policys_checks_apply_unless_the_config_gives_some() -> None:
    policy = Policy(acceptance=AcceptancePolicy(check=(LINT,), max_rejections=1))
    assert effective(LoopConfig(), policy).acceptance == (LINT,)
    assert effective(LoopConfig(), policy).max_rejections == 1
    assert effective(LoopConfig(max_rejections=5), policy).max_rejections == 5  # the config set its own
    assert effective(LoopConfig(acceptance=(PYTEST,)), policy).acceptance == (PYTEST,)  # replaced, not merged
    assert effective(LoopConfig(acceptance=(PYTEST,)), policy).max_rejections == 3
    assert effective(LoopConfig(), Policy()).acceptance == ()


def test_policy_checks_run_in_a_run_without_config_checks(make_harness, shell) -> None:
    harness = make_harness(Policy(acceptance=AcceptancePolicy(check=(LINT,))))
    assert run(FakeModel([final()]), harness).reason == "final:accepted"
    assert [r["command"] for r in shell.ran] == [LINT.command]


def test_the_rejection_count_survives_a_pause_and_resume(make_harness, shell, audit) -> None:
    ask = Policy(tools={"guarded": ToolPolicy(decision=Action.ASK)})
    shell.codes[PYTEST.command] = [1]
    config = LoopConfig(acceptance=(PYTEST,), max_rejections=1)
    model = FakeModel([final("a"), calls(("g1", "guarded", {"text": "x"}))])
    paused = run(model, make_harness(ask, run_id="run-acc"), config)
    assert (paused.reason, paused.rejections) == ("approval_pending", 1)
    assert checkpoints.load(audit, "run-acc").rejections == 1
    (approval,) = audit.list_approvals(run_id="run-acc")
    audit.resolve_approval(approval.id, approve=True, by="tester", reason=None)
    events: list[Any] = []
    outcome = resume("run-acc", FakeModel([final("b")]), make_harness(ask, run_id="run-acc"),
                     on_event=events.append)
    # the count went on from 1: the second rejection is one past max_rejections = 1
    assert (outcome.reason, outcome.rejections) == ("rejected:acceptance", 2)
    assert isinstance(events[-1], RunEnded) and events[-1].rejections == 2
    assert audit.get_run("run-acc").meta["acceptance"]["rejections"] == 2
    assert len(audit.get_run("run-acc").meta["acceptance"]["rounds"]) == 2


def test_the_policys_acceptance_section_loads(tmp_path) -> None:
    from harness.core.policy import PolicyError, parse_policy

    policy = parse_policy('[acceptance]\nmax_rejections = 2\n\n[[acceptance.check]]\ncommand = "make test"\n'
                          'workdir = "/workspace/project"\ntimeout_s = 90\n')
    assert policy.acceptance == AcceptancePolicy(
        check=(AcceptanceCheck(command="make test", workdir="/workspace/project", timeout_s=90),), max_rejections=2)
    with pytest.raises(PolicyError, match="must be an absolute path in the sandbox"):
        parse_policy('[[acceptance.check]]\ncommand = "make"\nworkdir = "project"\n')
    with pytest.raises(PolicyError, match=r"acceptance\.check\[0\]"):
        parse_policy('[[acceptance.check]]\ncmd = "make"\n')


def test_the_record_shows_in_callbox_audit_and_the_console(make_harness, shell, audit) -> None:
    from harness.doors.http.pages import run_page
    from harness.loop.acceptance import record_lines

    shell.codes[PYTEST.command] = [1, 0]
    harness = make_harness()
    run(FakeModel([final("a"), final("<b>")]), harness, LoopConfig(acceptance=(PYTEST,)))
    record = audit.get_run(harness.run_id)
    calls = audit.calls_for_run(harness.run_id)
    first, second = (c["call_id"] for c in calls)
    assert record_lines(record.meta) == [
        "acceptance: final:accepted after 1 rejected answer (max_rejections 3)",
        f"  turn 1: ✗ check 1 `python -m pytest -q` exit 1 (expected 0) {first}",
        f"  turn 2: ✓ check 1 `python -m pytest -q` exit 0 {second}",
    ]
    assert record_lines({}) == []
    page = str(run_page(record, calls, [], live=False))
    assert "<h2>Acceptance checks</h2>" in page and "final:accepted: 1 rejected answer(s), max_rejections 3" in page
    assert f'<a href="#call-{first}"><code>{first}</code></a>' in page
    assert '<td class="decision deny">failed</td><td>1</td>' in page
    assert '<span class="tool">shell [acceptance]</span>' in page


def test_a_checks_timeout_is_at_most_what_is_left_of_the_wall_time_budget(make_harness, shell) -> None:
    now = [0.0]
    harness = make_harness(Policy(budgets=Budgets(max_wall_time_s=10)))
    loop = Loop.start(FakeModel([final()]), harness, task="t", config=LoopConfig(acceptance=(PYTEST,)),
                      clock=lambda: now[0])
    now[0] = 7.0  # the model took 7 of the run's 10 seconds
    assert loop.run().reason == "final:accepted"
    assert shell.ran[0]["timeout_ms"] == 3000


def test_a_check_that_timed_out_fails_whatever_its_exit_code(make_harness, shell) -> None:
    def timed_out(ctx: Any, args: ShellArgs) -> ToolOutput:
        return ToolOutput(text="command timed out after 1000 milliseconds", is_error=True, error=ErrorCode.TIMED_OUT,
                          structured={"exit_code": 124, "timed_out": True})

    shell.run = timed_out  # type: ignore[method-assign]
    check = AcceptanceCheck(command="sleep 100", expect_exit=124, timeout_s=1)
    model = FakeModel([final("a")])
    outcome = run(model, make_harness(), LoopConfig(acceptance=(check,), max_rejections=0))
    assert outcome.reason == "rejected:acceptance"
    assert "did not finish within its timeout (exit code 124)" in outcome.message
