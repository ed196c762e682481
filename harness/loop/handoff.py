"""Handoff between the agents of one run (``LoopConfig.agents``): :class:`Team`.

A run that declares agents is held by one of them at a time, the first (or
``start_agent``) at the start. Each turn the loop asks the holder's model, with the
holder's instructions as the system prompt, offering the run's exposed tools narrowed by
the turn's stage and then by the holder's ``tools``, plus one ``transfer_to_<agent>`` tool
per agent in its ``handoffs``: the OpenAI Agents SDK's convention, named and described as
the SDK does (``Handoff to the billing agent to handle the request.`` and the target's
``handoff_description``), with no arguments (any the model sends are ignored).

A call of ``transfer_to_B`` never reaches the harness: the loop answers it. Its result is
the SDK's transfer message, ``{"assistant": "B"}``; from the next turn B holds the run: B's
instructions, model and tools apply, on the same sandbox, the same audit run and the same
conversation (the transfer call and its result stay in it, as in the SDK). The calls of the
turn that handed off run as the model made them. The call is recorded in the run's audit
record like every call, decided ``allow`` by the rule ``handoff: A -> B`` (so
``callbox audit --run`` and the console's run page show it, and it counts as a tool call
toward ``max_tool_calls``); the run's meta names the agent holding it (``agent``); the loop
emits :class:`~harness.loop.events.HandedOff`.

A transfer the model may not make is a tool error result for it, recorded like any other,
and the run goes on with the same agent: ``unknown_tool`` for a ``transfer_to_`` name no
agent has, ``tool_not_allowed`` for an agent not in the holder's ``handoffs`` (itself
included) or a transfer the turn's tool_choice kept out, and ``conflict`` for a second
transfer in one turn (the first one counts: the SDK's "Multiple handoffs detected, ignoring
this one.").

A handoff loop: once ``loop_detection`` handoffs in a row, with no other tool call between
them, have handed the run back to an agent that already held it, the run ends
``loop_detected`` with a message naming the agents in order and the cycle.

Checked when the loop is made (``LoopConfigError``, the run ending ``error:config``): every
agent's tools are registered and exposed by the policy; no registered tool has the name of
a transfer tool; every agent's model keeps its context in the run model's provider shapes.
A run keeps one conversation as JSON in one provider's shapes and callbox does not
translate it to another's: Responses reasoning items, Anthropic thinking blocks (signed)
and computer-use items have no faithful equivalent in another API, and a lossy translation
would change what the next model reads without saying so. So agents of one run use models
of one API (``openai``, ``openai-chat`` or ``anthropic``; any model names within it).

An agent's model ``scripted:PATH`` is its own transcript, replayed from its first turn;
agents without a model share the run's. A paused run keeps the holder and each agent's
turns in its checkpoint (:class:`~harness.loop.agents.HandoffState`), so it resumes under
the agent that held it, with that agent's model, and each transcript from where it stopped.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from harness.core.calls import Action, Decision, ErrorCode, ToolResult
from harness.core.errors import CallboxError
from harness.core.registry import ToolAnnotations, ToolDefinition
from harness.loop.agents import TRANSFER_PREFIX, AgentConfig, HandoffState, transfer_tool_name
from harness.loop.calls import Recorder
from harness.loop.config import LoopConfig, LoopConfigError
from harness.loop.events import Event, HandedOff
from harness.loop.state import RunState
from harness.models.base import ModelAdapter, ModelToolCall
from harness.models.common import set_system

if TYPE_CHECKING:
    from harness.core.session import Session

__all__ = ["IGNORED_HANDOFF", "Team", "transfer_message", "transfer_tool"]

IGNORED_HANDOFF = "Multiple handoffs detected, ignoring this one."
"""The result of a second transfer in one turn (the OpenAI Agents SDK's words)."""


def transfer_message(agent: str) -> str:
    """The result of a transfer the model reads, as the SDK writes it."""
    return json.dumps({"assistant": agent})


class _NoArguments(BaseModel):
    # A transfer takes no arguments (no docstring: it would become the schema's description).
    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class _Agent:
    config: AgentConfig
    model: ModelAdapter
    transfer: ToolDefinition
    """The tool that hands the run to this agent."""

    @property
    def name(self) -> str:
        return self.config.name


def transfer_tool(agent: AgentConfig) -> ToolDefinition:
    """The tool that hands the run to ``agent``: name, description and (empty) arguments as the
    OpenAI Agents SDK makes them (without the SDK's trailing space when there is no description)."""
    description = f"Handoff to the {agent.name} agent to handle the request. {agent.handoff_description}".strip()
    hints = ToolAnnotations(read_only=False, destructive=False, title=f"Hand off to {agent.name}")
    return ToolDefinition(transfer_tool_name(agent.name), description, _NoArguments, annotations=hints)


class Team:
    """The agents of one run and who holds it; made by the loop when the config has agents."""

    def __init__(self, config: LoopConfig, state: RunState, run_model: ModelAdapter, harness: Session,
                 emit: Callable[[Event], None]) -> None:
        self._config = config
        self._state = state
        self._harness = harness
        self._emit = emit
        self._agents = {a.name: _Agent(a, self._model_of(index, a, run_model), transfer_tool(a))
                        for index, a in enumerate(config.agents)}
        self._by_tool = {a.transfer.name: a for a in self._agents.values()}
        self._check(run_model)
        restored = state.handoff is not None
        if state.handoff is None:
            state.handoff = HandoffState(current=config.start_agent or config.agents[0].name)
        elif state.handoff.current not in self._agents:
            raise LoopConfigError(f"run {state.run_id} is held by agent {state.handoff.current!r}, which its "
                                  f"config no longer declares (agents: {', '.join(self._agents)})")
        self._handoff: HandoffState = state.handoff
        self._turn_agent = self._handoff.current
        """The agent whose turn it is (a handoff during the turn changes the holder, not this)."""
        self._handed_in_turn: int | None = None
        if restored:
            self._replay_positions()
        elif state.turn == 0 and state.context.system:
            raise LoopConfigError("with agents, each agent's instructions are its system prompt: start the run "
                                  "without one (no system argument; the CLI's --system)")

    @classmethod
    def of(cls, config: LoopConfig, state: RunState, run_model: ModelAdapter, harness: Session,
           emit: Callable[[Event], None]) -> Team | None:
        """The run's team, or None for a run of one agent (no ``agents`` configured)."""
        return cls(config, state, run_model, harness, emit) if config.agents else None

    # ---- what the loop asks -----------------------------------------------------------------

    @property
    def current(self) -> str:
        """The agent holding the run."""
        return self._handoff.current

    @property
    def model(self) -> ModelAdapter:
        """The model of the agent holding the run."""
        return self._agents[self.current].model

    def meta(self) -> dict[str, Any]:
        """What the run's audit record says of its agents."""
        return {"agent": self.current, "agents": list(self._agents)}

    def begin_turn(self, tools: Sequence[ToolDefinition]) -> tuple[ModelAdapter, list[ToolDefinition]]:
        """Start a turn of the agent holding the run: its instructions become the system
        prompt; returns its model and what it is offered of ``tools`` (the turn's tools), its
        transfer tools after them."""
        agent = self._agents[self.current]
        self._turn_agent = agent.name
        self._handoff.turns[agent.name] = self._handoff.turns.get(agent.name, 0) + 1
        set_system(self._state.context, agent.model.format, agent.config.instructions)
        wanted = agent.config.tools
        offered = [t for t in tools if wanted is None or t.name in wanted]
        return agent.model, offered + [self._agents[name].transfer for name in agent.config.handoffs]

    def answer(self, call: ModelToolCall, turn: int, offered: tuple[str, ...] | None,
               record: Recorder) -> ToolResult | None:
        """The loop's answer to a transfer call (recorded with ``record``), or None for a
        call of any other tool, which the harness runs."""
        if not call.name.startswith(TRANSFER_PREFIX) or call.name in self._harness.registry:
            self._handoff.chain = []  # another tool call: the handoffs so far were no loop
            return None
        agent = self._agents[self._turn_agent]
        may = [self._agents[name].transfer.name for name in agent.config.handoffs]
        listed = ", ".join(may) or "none (it hands the run to no agent)"
        target = self._by_tool.get(call.name)
        call_id = call.call_id[:128]
        if target is None:
            return record(call, turn, ToolResult.failure(
                call_id, ErrorCode.UNKNOWN_TOOL,
                f"unknown tool {call.name!r}: no agent of this run is handed the run by it; you ({agent.name}) "
                f"may hand off with: {listed}"), None)
        if target.name not in agent.config.handoffs:
            return record(call, turn, ToolResult.failure(
                call_id, ErrorCode.TOOL_NOT_ALLOWED,
                f"agent {agent.name} may not hand the run to {target.name}; it may hand off with: {listed}"), None)
        if offered is not None and call.name not in offered:
            return record(call, turn, ToolResult.failure(
                call_id, ErrorCode.TOOL_NOT_ALLOWED,
                f"tool {call.name!r} is not offered in this turn; the tools you may call now are: "
                f"{', '.join(offered) or 'none'}"), None)
        if self._handed_in_turn == turn:
            return record(call, turn, ToolResult.failure(call_id, ErrorCode.CONFLICT, IGNORED_HANDOFF), None)
        handed = {"from": agent.name, "to": target.name}
        result = ToolResult(call_id=call_id, text=transfer_message(target.name), structured={"handoff": handed})
        decision = Decision(Action.ALLOW, f"handoff: {agent.name} -> {target.name}",
                            f"agent {agent.name} hands the run to {target.name}")
        recorded = record(call, turn, result, decision)
        if recorded.is_error or recorded.structured != result.structured:
            return recorded  # the call_id was recorded before, as something else: that stands
        self._hand_over(agent.name, target, call.call_id, turn)
        return recorded

    def loop_message(self) -> str | None:
        """Why the run ends ``loop_detected`` (a handoff loop), or None."""
        limit = self._config.loop_detection
        chain = self._handoff.chain
        handoffs = len(chain) - 1
        if limit is None or handoffs < limit or len(set(chain)) == len(chain):
            return None
        last = chain[-1]
        start = max(i for i, name in enumerate(chain[:-1]) if name == last) if last in chain[:-1] else 0
        return (f"handoff loop: {' -> '.join(chain)}: {handoffs} handoffs in a row without another tool call, "
                f"round the cycle {' -> '.join(chain[start:])} (loop_detection = {limit})")

    # ---- inside ---------------------------------------------------------------------------------

    def _hand_over(self, source: str, target: _Agent, call_id: str, turn: int) -> None:
        h = self._handoff
        h.current = target.name
        h.chain = (h.chain or [source]) + [target.name]
        self._handed_in_turn = turn
        self._harness.audit.update_run_meta(self._state.run_id, {"agent": target.name})
        self._emit(HandedOff(turn, call_id, source, target.name, target.model.name))

    def _model_of(self, index: int, agent: AgentConfig, run_model: ModelAdapter) -> ModelAdapter:
        if agent.model is None:
            return run_model
        from harness.models.factory import make_model
        from harness.models.scripted import ScriptedModel

        provider, _, path = agent.model.partition(":")
        try:
            if provider.strip().lower() == "scripted" and path.strip():
                # its own transcript: its calls named after it, so call_ids stay distinct in the run
                slug = transfer_tool_name(agent.name).removeprefix(TRANSFER_PREFIX)
                return ScriptedModel.from_file(path.strip(), call_prefix=f"call_{slug}")
            return make_model(agent.model)
        except CallboxError as exc:
            raise LoopConfigError(f"agents[{index}] ({agent.name}): model {agent.model!r}: {exc.message}") from None

    def _check(self, run_model: ModelAdapter) -> None:
        """The agents' tools against the run's, and their models' context shapes."""
        session = self._harness
        exposed = {t.name for t in session.exposed_tools()}
        problems: list[str] = []
        for index, agent in enumerate(self._config.agents):
            where = f"agents[{index}] ({agent.name})"
            for name in agent.tools or ():
                if name not in session.registry:
                    problems.append(f"{where}.tools names {name!r}, which is not a registered tool")
                elif name not in exposed:
                    problems.append(f"{where}.tools names {name!r}, which the policy's allowed_tools does not allow")
            tool = self._agents[agent.name].transfer.name
            if tool in session.registry:
                problems.append(f"{where}: the tool that hands the run to it, {tool}, is also a registered tool; "
                                "rename the agent")
        if problems:
            known = ", ".join(session.registry.names()) or "none"
            raise LoopConfigError(f"loop config: {'; '.join(problems)} (registered tools: {known})")
        other = [a for a in self._agents.values() if a.model.format != run_model.format]
        if other:
            named = ", ".join(f"agent {a.name}'s {a.model.name} ({a.model.format})" for a in other)
            raise LoopConfigError(
                f"loop config: the run's context is in {run_model.format} shapes ({run_model.name}), but {named}; "
                "one run keeps one conversation in one provider's shapes and callbox does not translate it "
                "(reasoning items, signed thinking blocks and computer-use items have no faithful equivalent in "
                "another API): give every agent a model of the same API")

    def _replay_positions(self) -> None:
        """Each scripted model of a resumed run continues after the turns its agents took."""
        from harness.models.scripted import ScriptedModel

        models = {id(a.model): a.model for a in self._agents.values()}
        for key, model in models.items():
            if isinstance(model, ScriptedModel):
                users = [a.name for a in self._agents.values() if id(a.model) == key]
                model.position = sum(self._handoff.turns.get(name, 0) for name in users)
