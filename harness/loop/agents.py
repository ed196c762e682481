"""The agents of a run, as configured (``[[agents]]`` in a run config), and who holds the run.

A run may declare several agents. Each has a name, its instructions (its system prompt
while it holds the run), a model (or the run's), a subset of the run's tools and the
agents it may hand the run to. The first agent (or ``start_agent``) starts; an agent hands
off by calling ``transfer_to_<name>``, the OpenAI Agents SDK's convention
(:func:`transfer_tool_name`). What happens then is :mod:`harness.loop.handoff`'s.

This module is plain data: the configuration (pydantic, checked when a LoopConfig is made)
and :class:`HandoffState`, the part of a run's state a checkpoint keeps.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["TRANSFER_PREFIX", "AgentConfig", "HandoffState", "agent_problems", "transfer_tool_name"]

TRANSFER_PREFIX = "transfer_to_"
_TOOL_NAME_MAX = 64
"""The longest tool name the providers take (OpenAI and Anthropic: 64 characters)."""


def transfer_tool_name(agent: str) -> str:
    """The tool that hands the run to ``agent``, named as the OpenAI Agents SDK names it:
    ``transfer_to_`` and the name with whitespace and every character other than a letter,
    a digit or ``_`` made ``_``, lower-cased (``Billing Agent`` -> ``transfer_to_billing_agent``)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", re.sub(r"\s", "_", f"{TRANSFER_PREFIX}{agent}")).lower()


class AgentConfig(BaseModel):
    """One agent of a run: ``[[agents]]`` in a run config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=52)
    """Its name, unique in the run; the tool that hands the run to it is
    ``transfer_to_<name>`` (lower-cased, other characters than letters, digits and ``_`` as ``_``)."""
    instructions: str = Field(min_length=1)
    """Its system prompt: the model reads these instructions on every turn this agent holds the run."""
    model: str | None = None
    """``PROVIDER:NAME`` (e.g. ``openai:gpt-5``) or a scripted transcript ``scripted:PATH`` (a
    relative path in a run config is taken from the config file's directory); None: the run's
    model (the TRANSCRIPT or ``--model`` of ``callbox run``). Every model of a run must keep its
    context in the same provider's shapes."""
    tools: tuple[str, ...] | None = None
    """The tools it may call, each one the run's policy exposes (still bounded by the policy's
    rules); None: every tool the run exposes."""
    handoffs: tuple[str, ...] = ()
    """The agents it may hand the run to (each gets a ``transfer_to_<name>`` tool in its turns)."""
    handoff_description: str = ""
    """What it is for, added to the description of the tool that hands the run to it."""


@dataclass
class HandoffState:
    """Who holds the run, and what the loop needs to know of its handoffs (kept in a checkpoint)."""

    current: str
    """The agent holding the run."""
    turns: dict[str, int] = field(default_factory=dict)
    """Model turns taken by each agent."""
    chain: list[str] = field(default_factory=list)
    """The agents handed the run by handoffs in a row, without another tool call in between,
    starting with the one that handed it first (empty: the last call was not a handoff)."""

    def to_json(self) -> dict[str, Any]:
        return {"current": self.current, "turns": dict(self.turns), "chain": list(self.chain)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HandoffState:
        turns = data.get("turns") or {}
        return cls(current=str(data["current"]), turns={str(k): int(v) for k, v in turns.items()},
                   chain=[str(a) for a in data.get("chain") or ()])


def agent_problems(agents: Sequence[AgentConfig], start_agent: str | None) -> list[str]:
    """What is wrong with a run's agents on their own (no tool or model is looked at here):
    names twice or whose transfer tools collide, handoffs to an agent that is not declared
    or to itself, a ``start_agent`` that is not one of them."""
    problems: list[str] = []
    names = [a.name for a in agents]
    if start_agent is not None and not agents:
        problems.append(f"start_agent is {start_agent!r}, but no [[agents]] are declared")
    elif start_agent is not None and start_agent not in names:
        problems.append(f"start_agent {start_agent!r} is not one of the agents ({', '.join(names)})")
    by_tool: dict[str, str] = {}
    for index, agent in enumerate(agents):
        tool = transfer_tool_name(agent.name)
        if agent.name in names[:index]:
            problems.append(f"agents[{index}]: the name {agent.name!r} is used twice")
        elif tool in by_tool:
            problems.append(f"agents[{index}]: {agent.name!r} and {by_tool[tool]!r} would both be handed the run "
                            f"by {tool}; rename one")
        by_tool.setdefault(tool, agent.name)
        if len(tool) > _TOOL_NAME_MAX:
            problems.append(f"agents[{index}]: the name {agent.name!r} is too long for its tool {tool} "
                            f"(at most {_TOOL_NAME_MAX} characters)")
        for target in agent.handoffs:
            if target == agent.name:
                problems.append(f"agents[{index}] ({agent.name}): handoffs names the agent itself")
            elif target not in names:
                problems.append(f"agents[{index}] ({agent.name}): handoffs names {target!r}, which is not one of "
                                f"the agents ({', '.join(names)})")
    return problems
