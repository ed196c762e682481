"""A timeout the model asked for above the policy's ceiling runs with the ceiling, and the model reads that."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest

from harness.audit.store import AuditStore
from harness.core.calls import ToolCall, ToolOutput
from harness.core.context import ToolContext
from harness.core.policy import Budgets, Policy
from harness.core.registry import Tool, ToolDefinition, ToolRegistry
from harness.core.session import Session
from harness.tools.shell import format_exec_output

NOTE = "Timeout lowered: wait_s 900 is above this sandbox's ceiling; the command got wait_s 60 (60 s)."


class WaitArgs(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    wait_s: float | None = None


def waiting(ctx: ToolContext, args: WaitArgs) -> ToolOutput:
    """A tool that takes a timeout and says nothing of it itself."""
    seconds = ctx.call_timeout(args.wait_s, argument="wait_s").seconds
    return ToolOutput(text=f"waited at most {seconds:g} s", structured={"waited": True})


def no_engine() -> Any:
    raise AssertionError("no sandbox here")


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    registry = ToolRegistry([Tool(ToolDefinition("wait", "Waits.", WaitArgs), waiting)])
    policy = Policy(budgets=Budgets(call_timeout_ceiling_s=60, default_call_timeout_s=30))
    with AuditStore(tmp_path / "audit.sqlite3") as audit, Session(registry, policy, audit,
                                                                  engine_factory=no_engine) as made:
        yield made


def test_any_tool_that_lowers_a_timeout_gets_the_note_and_the_field(session: Session) -> None:
    result = session.call(ToolCall("wait", {"wait_s": 900}, "c1"))
    assert result.text == f"{NOTE}\nwaited at most 60 s"
    clamped = {"requested_s": 900, "ceiling_s": 60}
    assert result.structured == {"waited": True, "timeout_clamped": clamped}
    assert result.meta["timeout_clamped"] == clamped


@pytest.mark.parametrize("wait_s", [None, 60, 0.5])
def test_a_timeout_within_the_ceiling_says_nothing(session: Session, wait_s: float | None) -> None:
    result = session.call(ToolCall("wait", {"wait_s": wait_s}, f"c-{wait_s}"))
    assert result.text.startswith("waited at most") and "timeout_clamped" not in result.meta
    assert result.structured == {"waited": True}


def test_shell_puts_the_note_in_its_header_within_the_budget() -> None:
    note = ("Timeout lowered: timeout_ms 99999999 is above this sandbox's ceiling; the command got timeout_ms "
            "600000 (600 s).")
    short = format_exec_output(exit_code=0, duration_ms=200, output="hi\n", budget=10_000, notes=(note, ""))
    assert short.text == f"Exit code: 0\nWall time: 0.2 seconds\n{note}\nOutput:\nhi\n"
    long = format_exec_output(exit_code=124, duration_ms=600_000, output="x" * 5000, budget=400, timed_out=True,
                              notes=(note,))
    assert len(long.text.encode()) <= 400 and long.truncated
    assert long.text.startswith(f"Exit code: 124\nWall time: 600 seconds\n{note}\nTotal output lines: 2\nOutput:\n")
