"""What a turn offers the model: the tools (the run's exposed tools, narrowed by the stage
covering the turn) and the tool_choice, and the check that a loop config names only tools
the run can offer.

The exposed tools are the one answer the session gives (``Session.exposed_tools``: the
registry's tools that the policy's ``allowed_tools`` allows); a stage's ``tools`` narrow
them. ``none`` offers no tools; ``{"allowed": [...]}`` offers every exposed tool and
restricts calls to the subset (the Responses API's allowed_tools, which keeps the tools
list, and prompt caches, stable).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.core.registry import ToolDefinition
from harness.loop.config import AllowTools, ChoiceSetting, ForceTool, LoopConfig, LoopConfigError, Stage
from harness.models.base import AllowedTools, ForcedTool, ToolChoice

if TYPE_CHECKING:
    from harness.core.session import Session

__all__ = ["TurnPlan", "check_config", "plan_turn", "stage_for", "turn_tools"]


@dataclass(frozen=True)
class TurnPlan:
    """What one turn offers."""

    tools: list[ToolDefinition]
    choice: ToolChoice
    callable: tuple[str, ...]
    """The tools the model may call this turn, in registry order."""


def stage_for(config: LoopConfig, turn: int) -> tuple[int | None, Stage | None]:
    """The first stage whose ``turns`` cover ``turn``, and its index (None, None: none does)."""
    for index, stage in enumerate(config.stages):
        if stage.covers(turn):
            return index, stage
    return None, None


def turn_tools(session: Session, stage: Stage | None) -> list[ToolDefinition]:
    """The run's exposed tools, narrowed by ``stage`` (None: all of them)."""
    wanted = None if stage is None else stage.tools
    return [t.definition for t in session.exposed_tools() if wanted is None or t.name in wanted]


def plan_turn(choice: ToolChoice, exposed: list[ToolDefinition]) -> TurnPlan | str:
    """What a turn offers under ``choice``; a string says why it cannot be offered."""
    names = [d.name for d in exposed]
    listed = ", ".join(names) or "none"
    if choice == "none":
        return TurnPlan([], choice, ())
    if choice == "required" and not names:
        return "tool_choice is required, but no tool is exposed in this turn"
    if isinstance(choice, ForcedTool):
        if choice.name not in names:
            return f"tool_choice forces {choice.name!r}, which is not exposed in this turn (exposed: {listed})"
        return TurnPlan(exposed, choice, tuple(names))
    if isinstance(choice, AllowedTools):
        subset = tuple(n for n in choice.names if n in names)
        if not subset:
            return (f"tool_choice allows only {', '.join(choice.names)}, none of which is exposed in this turn "
                    f"(exposed: {listed})")
        return TurnPlan(exposed, AllowedTools(subset, choice.mode), subset)
    return TurnPlan(exposed, choice, tuple(names))


def check_config(config: LoopConfig, session: Session) -> None:
    """Every tool ``config`` names must be registered and exposed by the run's policy;
    LoopConfigError naming each one that is not."""
    names: list[tuple[str, str]] = []

    def choice_names(where: str, setting: ChoiceSetting | None) -> None:
        if isinstance(setting, ForceTool):
            names.append((where, setting.tool))
        elif isinstance(setting, AllowTools):
            names.extend((where, n) for n in setting.allowed)

    choice_names("tool_choice", config.tool_choice)
    for index, stage in enumerate(config.stages):
        names.extend((f"stages[{index}].tools", n) for n in stage.tools or ())
        choice_names(f"stages[{index}].tool_choice", stage.tool_choice)
    exposed = {t.name for t in session.exposed_tools()}
    problems = []
    for where, name in names:
        if name not in session.registry:
            problems.append(f"{where} names {name!r}, which is not a registered tool")
        elif name not in exposed:
            problems.append(f"{where} names {name!r}, which the policy's allowed_tools does not allow")
    if problems:
        known = ", ".join(session.registry.names()) or "none"
        raise LoopConfigError(f"loop config: {'; '.join(problems)} (registered tools: {known})")
