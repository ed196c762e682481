"""One turn's tool calls, run through the harness (the loop's EXECUTE_CALLS and RESEND_CALLS).

Consecutive calls of tools annotated ``read_only`` run concurrently in threads (up to
``LoopConfig.max_parallel``); any other call runs alone, after everything before it and
before anything after it. A call of a tool the turn did not offer (a stage or the
tool_choice kept it out) gets a ``tool_not_allowed`` result from the loop itself; every
other call goes to ``Session.call``, which validates, authorizes and records it. A call carrying
the provider's pending safety checks (OpenAI's ``computer_call``) goes there only when the policy
asks a person to approve it (their approval acknowledges the checks); otherwise the loop refuses
it (``denied``, naming the checks): callbox never acknowledges a check it cannot judge. Every
call the loop refuses is recorded in the run's audit record like any other (``Session.refuse``). A call
that is one action of a batch (``ModelToolCall.batch``) is not run once an earlier action of the
batch failed: it gets ``tool_failed`` naming the one that failed. Once a
call finds the sandbox unavailable, the calls after it are not run. A call the loop answers
itself (an agent's ``transfer_to_<agent>``: the ``answer`` hook, :mod:`harness.loop.handoff`)
never reaches the harness; it is recorded in the run like a refused one, with the decision
the hook gives. Each call emits ``ToolCallStarted`` when the harness has decided it (with that
decision), its ``ToolOutputChunk``s and ``ToolCallFinished``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from harness.core.calls import Action, Decision, ErrorCode, ToolCall, ToolResult
from harness.core.session import Session
from harness.loop.config import LoopConfig
from harness.loop.events import Event, ToolCallFinished, ToolCallStarted, ToolOutputChunk
from harness.models.base import ModelToolCall

Recorder = Callable[[ModelToolCall, int, ToolResult, Decision | None], ToolResult]
"""Records a call the loop answered itself (call, turn, its result, the decision) and
returns what the run recorded for it."""
Answerer = Callable[[ModelToolCall, int, tuple[str, ...] | None, Recorder], ToolResult | None]
"""The loop's own answer to a call (call, turn, the tools the turn offers, the recorder), or
None for a call the harness runs."""


class CallRunner:
    """Runs calls of a turn for one loop."""

    def __init__(self, harness: Session, config: LoopConfig, emit: Callable[[Event], None], *,
                 answer: Answerer | None = None) -> None:
        self.harness = harness
        self.config = config
        self._emit = emit
        self._answer = answer

    def run(self, calls: Sequence[ModelToolCall], results: list[ToolResult | None], positions: Sequence[int], *,
            turn: int, offered: tuple[str, ...] | None) -> None:
        """Run the calls at ``positions`` (in order) and store their results by position in
        ``results``; ``offered``: the tools the turn lets the model call (None: not checked)."""
        for group in self._groups(calls, positions):
            if any(r is not None and r.error is ErrorCode.SANDBOX_UNAVAILABLE for r in results):
                return  # the run ends: the calls after it are not run
            if len(group) == 1:
                position = group[0]
                results[position] = (self._after_failed_action(calls, results, position, turn)
                                     or self._one_call(calls[position], turn, offered))
                continue
            with ThreadPoolExecutor(max_workers=min(len(group), self.config.max_parallel),
                                    thread_name_prefix="callbox-call") as pool:
                done = pool.map(lambda p: self._one_call(calls[p], turn, offered), group)
                for position, result in zip(group, done, strict=True):
                    results[position] = result

    def _groups(self, calls: Sequence[ModelToolCall], positions: Sequence[int]) -> list[list[int]]:
        groups: list[list[int]] = []
        reads: list[int] = []
        for position in positions:
            if self._concurrent(calls[position]):
                reads.append(position)
                continue
            if reads:
                groups.append(reads)
                reads = []
            groups.append([position])
        if reads:
            groups.append(reads)
        return groups

    def _concurrent(self, call: ModelToolCall) -> bool:
        if not self.config.parallel_tool_calls:
            return False
        tool = self.harness.registry.get(call.name)
        return tool is not None and tool.definition.annotations.read_only

    def _one_call(self, call: ModelToolCall, turn: int, offered: tuple[str, ...] | None) -> ToolResult:
        answered = None if self._answer is None else self._answer(call, turn, offered, self._refuse)
        if answered is not None:
            return answered
        if offered is not None and call.name not in offered and self._exposable(call.name):
            listed = ", ".join(offered) or "none"
            return self._refuse(call, turn, ToolResult.failure(
                call.call_id[:128], ErrorCode.TOOL_NOT_ALLOWED,
                f"tool {call.name!r} is not offered in this turn; the tools you may call now are: {listed}",
            ))
        if call.safety_checks and not self._asks_a_person(call):
            reason = (f"this {call.name} call carries safety checks that a person must acknowledge "
                      f"({'; '.join(call.safety_checks)}); it was not run. The policy lets the call run without "
                      f"asking anyone, so nobody can: set decision = \"ask\" in [tools.{call.name}] to have such "
                      "calls approved by a person.")
            return self._refuse(call, turn, ToolResult.failure(call.call_id[:128], ErrorCode.DENIED, reason),
                                Decision(Action.DENY, "loop.safety_checks", reason))

        def decided(label: str) -> None:
            self._emit(ToolCallStarted(turn, call.call_id, call.name, call.arguments, label))

        def sink(stream: str, data: bytes) -> None:
            self._emit(ToolOutputChunk(call.call_id, stream, data))

        result = self.harness.call(ToolCall(call.name, call.arguments, call.call_id, flags=call.safety_checks),
                                   on_output=sink,
                                   on_decided=decided)
        self._emit(ToolCallFinished(turn, call.call_id, call.name, str(result.meta["decision"]), result))
        return result

    def _after_failed_action(self, calls: Sequence[ModelToolCall], results: list[ToolResult | None], position: int,
                             turn: int) -> ToolResult | None:
        """The result of a call not run because an earlier action of its batch failed (None: run it)."""
        call = calls[position]
        if not call.batch:
            return None
        for earlier, result in zip(calls[:position], results[:position], strict=True):
            if earlier.batch == call.batch and result is not None and result.is_error:
                text = (f"not run: {earlier.call_id}, an earlier action of the same batch ({call.batch}), "
                        f"failed: {result.text[:300]}")
                return self._refuse(call, turn, ToolResult.failure(call.call_id[:128], ErrorCode.TOOL_FAILED, text))
        return None

    def _refuse(self, call: ModelToolCall, turn: int, failure: ToolResult, decision: Decision | None = None
                ) -> ToolResult:
        """A call the loop does not run (it refused or answered it itself): recorded in the run
        with ``failure`` as its result (a re-sent call_id gets what was recorded), with its events."""
        result = self.harness.refuse(ToolCall(call.name, call.arguments, call.call_id, flags=call.safety_checks),
                                     failure, decision)
        label = str(result.meta.get("decision") or "rejected")
        self._emit(ToolCallStarted(turn, call.call_id, call.name, call.arguments, label))
        self._emit(ToolCallFinished(turn, call.call_id, call.name, label, result))
        return result

    def _asks_a_person(self, call: ModelToolCall) -> bool:
        """Whether the policy's decision for ``call`` is ``ask`` (a person approves it)."""
        tool = self.harness.registry.get(call.name)
        try:
            arguments = json.loads(call.arguments)
        except ValueError:
            return False
        if tool is None or not isinstance(arguments, dict):
            return False
        return self.harness.policy.decide(tool.definition, arguments).action is Action.ASK

    def _exposable(self, name: str) -> bool:
        """Registered and allowed by the policy: a call of any other tool goes to the harness,
        which refuses (and records) it; the loop only refuses what this turn did not offer."""
        return name in self.harness.registry and self.harness.policy.tool_allowed(name)
