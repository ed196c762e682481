"""The agent loop's state machine: :class:`Loop`.

::

    start ──> SELECT_TOOLS ──> CALL_MODEL ──(final answer)──> VERIFY ──(accepted, or no checks)──> FINISH ──> DONE
                  ^                 │ (tool calls)                 │ (rejected)                      ^
                  │                 v                              v                                 │
                  │            EXECUTE_CALLS ──> APPEND_RESULTS ──> CHECK_LIMITS                     │
                  │                                   │ (a call pending)  │ (a limit reached) ───────┘
                  │                                   └──> PAUSE ──> DONE │
                  └─────────────────────(within limits)───────────────────┘

    resume ──> ATTACH_SANDBOX ──> RESEND_CALLS ──> APPEND_RESULTS ──> ...
                    └──(sandbox expired or gone)──> FINISH

``Loop.next_step`` runs the current state's handler (one small method each) and returns
the state it leads to; ``Loop.run`` steps until DONE and returns a :class:`RunOutcome`.

**SELECT_TOOLS** starts a turn (:mod:`harness.loop.planning`). The tools exposed are the
run's exposed tools (``Session.exposed_tools``), narrowed by the stage covering this turn
(``LoopConfig.stages``: the first whose ``turns`` range contains it). The tool_choice is
the run's current one; on the first turn of a stage that sets ``tool_choice``, that one
(the initial ``tool_choice`` likewise applies from turn 1). ``none`` offers no tools;
``{"allowed": [...]}`` offers every exposed tool and restricts calls to the subset (the
Responses API's allowed_tools, which keeps the tools list, and prompt caches, stable).

**CALL_MODEL** asks the adapter, retrying only a ``ModelError`` with ``retryable`` (at most
``model_retries`` times, exponential backoff through tenacity); a non-retryable error, or
the last retry failing, ends the run with ``error:model``. The adapter's items are
appended. A turn without tool calls is a final answer: VERIFY.

**VERIFY** (:mod:`harness.loop.acceptance`): without acceptance checks the run ends
``final``. With checks (``LoopConfig.acceptance``, else the policy's ``[acceptance]``),
they run in the run's sandbox as the harness's own calls of ``shell`` (through the session:
authorized, audited, marked ``origin: acceptance``); all pass: ``final:accepted``. The
first that fails rejects the answer: the model gets a user message naming it, with its exit
code and bounded output, and the run goes to CHECK_LIMITS; past ``max_rejections`` the run
ends ``rejected:acceptance``. A check the run cannot run ends it (``error:config``,
``budget:*``, ``error:sandbox_unavailable``); checks the policy refuses are refused before
the first turn (``error:config``).

**EXECUTE_CALLS** turns every ModelToolCall into ``harness.call(ToolCall(name, arguments,
call_id), on_output=...)`` (validation, policy, approvals, at-most-once and audit are the
harness's, including refusing unknown tools and tools outside the policy's
``allowed_tools``), except a call of a tool that a stage or the tool_choice kept out of
this turn, which gets a ``tool_not_allowed`` result from the loop itself. Independence rule for
concurrency: consecutive calls of tools annotated ``read_only`` run concurrently in
threads (up to ``max_parallel``); any other call runs alone, after everything before it
and before anything after it. So writes keep the model's order, a read after a write sees
it, and only runs of reads overlap. After a turn that called tools, a ``required`` or
forced tool_choice becomes ``auto`` (an allowed-tools subset with mode ``required``
becomes mode ``auto``), so the model is never forced to keep calling tools once done.
A call whose result is ``sandbox_unavailable`` (no engine answers, or the sandbox is gone)
ends the run with ``error:sandbox_unavailable`` and that result's text: the calls after it
are not run (every one of them would fail the same way) and the model is not asked again.

**APPEND_RESULTS** appends exactly one result per call, in the order the model issued
them (``model.append_results``), then applies the context budget
(:mod:`harness.loop.context_budget`). If any call is pending approval, nothing is appended:
the turn goes to PAUSE instead.

**CHECK_LIMITS**, in this order: ``loop_detected`` (the last ``loop_detection`` calls were
the same tool with the same arguments, compared as canonical JSON, across turns),
``budget:tool_calls`` (the policy's ``max_tool_calls`` authorized calls reached, as the
audit store counts them), ``budget:wall_time`` (the policy's ``max_wall_time_s`` of active
run time: a pause does not count), ``budget:input_tokens``, ``budget:output_tokens``,
``budget:cost`` (totals the adapter reported; cost only when it reports one), and
``max_turns``. Otherwise the next turn starts.

**PAUSE** (``approval_pending``): the other calls of the turn have run; their results are
held in the checkpoint, not appended yet. The run's sandbox (if one started) is kept
(``Sandbox.keep``: gc leaves it until ``paused_sandbox_ttl_s`` or its own expiry)
and detached from the harness so closing the harness leaves it alone; the state is saved
(:mod:`harness.loop.checkpoint`); the run is marked ``approval_pending`` in the audit store,
which is a paused state, not a final end: ``resume`` re-opens it and its final reason is
recorded when it really ends. ``resume`` (any process): attaches the kept sandbox (if it
expired or is gone the run ends with ``error:sandbox_expired`` and says when, rather than
silently starting a fresh one), re-sends the pending calls under their call_ids (an
approved call runs exactly once, a denied one returns the denial, a still-pending one
pauses the run again), appends the whole turn's results in order and continues.

**FINISH** records the reason with ``audit.end_run``. Every run ends with one of ``final``,
``final:accepted`` (every acceptance check passed), ``rejected:acceptance``, ``max_turns``,
``budget:tool_calls``, ``budget:wall_time``, ``budget:input_tokens``,
``budget:output_tokens``, ``budget:cost``, ``loop_detected``, ``approval_pending``
(paused), ``error:model``, ``error:sandbox_expired``, ``error:sandbox_unavailable``,
``error:config`` (a stage names a tool this turn cannot offer, or an acceptance check
cannot run), ``error:harness`` (the audit store or engine failed), ``error:internal`` (a
bug, logged) or ``error:interrupted`` (Ctrl-C; re-raised).

**Events**: ``on_event`` receives small frozen dataclasses (:data:`Event`), each with a
``kind`` and ``to_dict()`` for JSON lines. Events from concurrent calls are delivered one
at a time (under a lock), from the thread running the call; an exception in the callback
is logged and does not disturb the run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import tenacity

from harness.core.calls import ErrorCode
from harness.core.errors import CallboxError
from harness.core.session import Session
from harness.core.times import stamp
from harness.engine.docker.engine import DockerEngine, SandboxExpired
from harness.loop import checkpoint as checkpoints
from harness.loop.acceptance import Acceptance, effective, preflight
from harness.loop.calls import CallRunner
from harness.loop.checkpoint import Checkpoint, CheckpointError, SandboxRef
from harness.loop.config import LoopConfig, LoopConfigError, describe_choice, relaxed, to_tool_choice
from harness.loop.context_budget import elide
from harness.loop.events import (
    PAUSED,
    ContextElided,
    Event,
    EventSink,
    ModelReplied,
    ModelRetrying,
    RunEnded,
    RunOutcome,
    RunStarted,
    TurnStarted,
)
from harness.loop.paused import checkpoint_of, pause_message, restore
from harness.loop.planning import TurnPlan, check_config, plan_turn, stage_for, turn_tools
from harness.loop.state import RunState, Step, call_key
from harness.models.base import ModelAdapter, ModelError, ModelTurn, Usage

__all__ = ["Loop"]

log = logging.getLogger("callbox.loop")


class Loop:
    """One agent run, driven step by step (``next_step``) or to the end (``run``)."""

    def __init__(
        self,
        model: ModelAdapter,
        harness: Session,
        state: RunState,
        config: LoopConfig,
        *,
        on_event: EventSink | None = None,
        first_step: Step = Step.SELECT_TOOLS,
        engine: DockerEngine | None = None,
        clock: Callable[[], float] = time.monotonic,
        resume_command: str | None = None,
    ) -> None:
        config = effective(config, harness.policy)  # the policy's acceptance checks, unless the config has some
        self.model = model
        self.harness = harness
        self.state = state
        self.config = config
        self.step = first_step
        self._on_event = on_event
        self._event_lock = threading.Lock()
        self._engine = engine
        self._clock = clock
        self._resume_command = resume_command
        self._calls = CallRunner(harness, config, self._emit)
        self._segment_start = clock()
        self._plan: TurnPlan | None = None
        self._resumed = first_step is Step.ATTACH_SANDBOX
        self._announced = False
        self._handlers: dict[Step, Callable[[], Step]] = {
            Step.ATTACH_SANDBOX: self._attach_sandbox,
            Step.RESEND_CALLS: self._resend_calls,
            Step.SELECT_TOOLS: self._select_tools,
            Step.CALL_MODEL: self._call_model,
            Step.EXECUTE_CALLS: self._execute_calls,
            Step.APPEND_RESULTS: self._append_results,
            Step.VERIFY: self._verify,
            Step.CHECK_LIMITS: self._check_limits,
            Step.PAUSE: self._pause,
            Step.FINISH: self._finish,
        }
        check_config(config, harness)
        preflight(config, harness)
        self._acceptance = Acceptance(harness, config, self._emit,
                                      lambda: harness.policy.budgets.max_wall_time_s - self.seconds())

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        model: ModelAdapter,
        harness: Session,
        *,
        task: str,
        system: str = "",
        config: LoopConfig | None = None,
        on_event: EventSink | None = None,
        clock: Callable[[], float] = time.monotonic,
        resume_command: str | None = None,
    ) -> Loop:
        """A new run of ``task`` on the harness's run. ``resume_command``: the command a person
        runs to continue the run if it pauses (the CLI's, exactly runnable), put in the pause's
        message and outcome."""
        config = config or LoopConfig()
        state = RunState(run_id=harness.run_id, context=model.start(system, task),
                         choice=to_tool_choice(config.tool_choice))
        try:
            loop = cls(model, harness, state, config, on_event=on_event, clock=clock, resume_command=resume_command)
        except LoopConfigError as exc:
            harness.audit.end_run(harness.run_id, "error:config")
            raise exc from None
        harness.audit.update_run_meta(harness.run_id, {"model": model.name, "task": task[:2000], "loop": True})
        return loop

    @classmethod
    def resume(
        cls,
        run_id: str,
        model: ModelAdapter,
        harness: Session,
        *,
        config: LoopConfig | None = None,
        on_event: EventSink | None = None,
        engine: DockerEngine | None = None,
        clock: Callable[[], float] = time.monotonic,
        resume_command: str | None = None,
    ) -> Loop:
        """Continue a paused run from its checkpoint (in any process). ``harness`` must be
        built for ``run_id`` (``Checkpoint.policy_model()``/``spec_model()`` give the paused
        run's policy and spec); ``config`` replaces the checkpointed one if given."""
        if harness.run_id != run_id:
            raise ValueError(f"the harness is for run {harness.run_id}, not {run_id}")
        found = checkpoints.load(harness.audit, run_id)
        if found is None:
            raise CheckpointError(f"run {run_id} has no checkpoint: only a run paused for approval can be resumed")
        cls._prepare(found, model, harness, config, on_event, engine, clock, resume_command)  # check before claiming
        claimed = checkpoints.claim(harness.audit, run_id)
        loop = cls._prepare(claimed, model, harness, config, on_event, engine, clock, resume_command)
        # The harness's wall-time budget counts active time too, not the pause.
        harness.started = time.time() - claimed.seconds
        return loop

    @classmethod
    def _prepare(
        cls,
        cp: Checkpoint,
        model: ModelAdapter,
        harness: Session,
        config: LoopConfig | None,
        on_event: EventSink | None,
        engine: DockerEngine | None,
        clock: Callable[[], float],
        resume_command: str | None,
    ) -> Loop:
        state, config = restore(cp, model, config)
        return cls(model, harness, state, config, on_event=on_event, first_step=Step.ATTACH_SANDBOX,
                   engine=engine, clock=clock, resume_command=resume_command)

    # ---- driving ------------------------------------------------------------------------

    def run(self) -> RunOutcome:
        """Step until the run ends or pauses. Ctrl-C (or an error while recording the end)
        is recorded as ``error:interrupted`` (``error:internal``) and raised."""
        try:
            while self.step is not Step.DONE:
                self.next_step()
        except BaseException as exc:
            if self.step is not Step.DONE:
                reason = "error:internal" if isinstance(exc, Exception) else "error:interrupted"
                self.state.reason = reason
                try:
                    self.harness.audit.end_run(self.state.run_id, reason)
                except Exception:  # the original error matters more
                    log.exception("could not record the end of run %s", self.state.run_id)
            raise
        return self.outcome

    def next_step(self) -> Step:
        """Run the current state's handler; return (and move to) the state it leads to."""
        if self.step is Step.DONE:
            return Step.DONE
        if not self._announced:
            self._announced = True
            self._emit(RunStarted(self.state.run_id, self.model.name, self._resumed))
        current = self.step
        try:
            following = self._handlers[current]()
        except CallboxError as exc:
            if current is Step.FINISH:
                raise
            log.warning("run %s: %s failed: %s", self.state.run_id, current, exc.message)
            following = self._end("error:harness", exc.message)
        except Exception as exc:
            if current is Step.FINISH:
                raise
            log.exception("run %s: %s failed", self.state.run_id, current)
            following = self._end("error:internal", f"{type(exc).__name__}: {exc}")
        self.step = following
        return following

    @property
    def outcome(self) -> RunOutcome:
        s = self.state
        return RunOutcome(
            run_id=s.run_id, reason=s.reason, final_text=s.final_text, turns=s.turn, tool_calls=s.tool_calls,
            seconds=round(self.seconds(), 3), usage=Usage(s.input_tokens, s.output_tokens, s.cost_usd),
            message=s.message, pending_approvals=tuple(s.approvals.values()) if s.reason == PAUSED else (),
            resume_command=(self._resume_command or "") if s.reason == PAUSED else "", rejections=s.rejections,
        )

    def seconds(self) -> float:
        """Active run time: earlier segments (before a pause) plus this one."""
        return self.state.prior_seconds + (self._clock() - self._segment_start)

    # ---- the states ---------------------------------------------------------------------

    def _attach_sandbox(self) -> Step:
        ref = self.state.sandbox
        if ref is None:
            return Step.RESEND_CALLS
        engine = self._engine or self.harness.connect_engine()
        try:
            sandbox = engine.attach(ref.id)
        except SandboxExpired as exc:
            run = self.state.run_id
            when = stamp(ref.expires)
            if time.time() >= ref.expires:
                return self._end("error:sandbox_expired",
                                 f"the sandbox of run {run} expired at {when}; its files are gone")
            return self._end("error:sandbox_expired",
                             f"the sandbox of run {run} is gone before its expiry at {when} ({exc.message})")
        except CallboxError as exc:
            return self._end("error:sandbox_unavailable",
                             f"the sandbox of run {self.state.run_id} cannot be used: {exc.message}")
        self.harness.attach(sandbox)
        return Step.RESEND_CALLS

    def _resend_calls(self) -> Step:
        s = self.state
        self._run_calls([i for i, result in enumerate(s.results) if result is None])
        return self._unless_unavailable() or Step.APPEND_RESULTS

    def _select_tools(self) -> Step:
        s = self.state
        s.turn += 1
        index, stage = stage_for(self.config, s.turn)
        if index is not None and index != s.stage:
            s.stage = index
            if stage is not None and stage.tool_choice is not None:
                s.choice = to_tool_choice(stage.tool_choice)
        plan = plan_turn(s.choice, turn_tools(self.harness, stage))
        if isinstance(plan, str):
            return self._end("error:config", f"turn {s.turn}: {plan}")
        self._plan = plan
        self._emit(TurnStarted(s.turn, tuple(d.name for d in plan.tools), describe_choice(plan.choice)))
        return Step.CALL_MODEL

    def _call_model(self) -> Step:
        s = self.state
        plan = self._plan
        assert plan is not None
        try:
            turn = self._complete(plan)
        except ModelError as exc:
            return self._end("error:model", f"the model failed: {exc.message}")
        s.input_tokens += turn.usage.input_tokens
        s.output_tokens += turn.usage.output_tokens
        if turn.usage.cost_usd is not None:
            s.cost_usd = (s.cost_usd or 0.0) + turn.usage.cost_usd
        self.model.append_turn(s.context, turn)
        self._emit(ModelReplied(s.turn, turn.text, turn.tool_calls, turn.usage))
        if turn.is_final:
            s.final_text = turn.text
            return Step.VERIFY
        s.calls = list(turn.tool_calls)
        s.results = [None] * len(s.calls)
        s.approvals = {}
        return Step.EXECUTE_CALLS

    def _execute_calls(self) -> Step:
        s = self.state
        self._run_calls(list(range(len(s.calls))))
        s.tool_calls += sum(r is not None for r in s.results)
        for call in s.calls:
            key = call_key(call)
            s.streak_count = s.streak_count + 1 if key == s.streak_key else 1
            s.streak_key = key
        s.choice = relaxed(s.choice)
        return self._unless_unavailable() or Step.APPEND_RESULTS

    def _unless_unavailable(self) -> Step | None:
        """End the run if a call found the sandbox unavailable: every later call would too."""
        for result in self.state.results:
            if result is not None and result.error is ErrorCode.SANDBOX_UNAVAILABLE:
                return self._end("error:sandbox_unavailable", result.text)
        return None

    def _append_results(self) -> Step:
        s = self.state
        results = [r for r in s.results if r is not None]
        assert len(results) == len(s.calls), "every call has a result before they are appended"
        s.approvals = {
            r.call_id: str(r.meta.get("approval_id", "")) for r in results if r.error is ErrorCode.APPROVAL_PENDING
        }
        if s.approvals:
            return Step.PAUSE
        self.model.append_results(s.context, results)
        s.calls, s.results = [], []
        budget = self.config.context_budget_bytes
        if budget is not None:
            elision = elide(s.context.items, budget, keep_latest=self.config.keep_latest_outputs)
            if elision.changed:
                self._emit(ContextElided(s.turn, elision.call_ids, elision.bytes_before, elision.bytes_after))
        return Step.CHECK_LIMITS

    def _verify(self) -> Step:
        verdict = self._acceptance.verify(self.state)
        return self._end(verdict.reason, verdict.message) if verdict.reason else Step.CHECK_LIMITS

    def _check_limits(self) -> Step:
        reason = self._limit_reached()
        return self._end(reason) if reason else Step.SELECT_TOOLS

    def _pause(self) -> Step:
        s = self.state
        sandbox = self.harness.active_sandbox
        ref: SandboxRef | None = None
        if sandbox is not None:
            ttl = self.config.paused_sandbox_ttl_s
            kept_until = sandbox.keep(run_id=s.run_id, until=None if ttl is None else time.time() + ttl)
            ref = SandboxRef(sandbox.id, kept_until)
        s.sandbox = ref
        saved = checkpoint_of(s, model=self.model, config=self.config, session=self.harness, seconds=self.seconds())
        checkpoints.save(self.harness.audit, saved)
        if sandbox is not None:
            self.harness.detach()
            sandbox.agent.close()
        s.reason = PAUSED
        s.message = pause_message(s.run_id, list(s.approvals.values()), ref, self._resume_command)
        self._emit(RunEnded.of(self.outcome))
        return Step.DONE

    def _finish(self) -> Step:
        self.harness.audit.end_run(self.state.run_id, self.state.reason)
        self._emit(RunEnded.of(self.outcome))
        return Step.DONE

    # ---- helpers ------------------------------------------------------------------------

    def _end(self, reason: str, message: str = "") -> Step:
        self.state.reason = reason
        self.state.message = message
        return Step.FINISH

    def _complete(self, plan: TurnPlan) -> ModelTurn:
        cfg = self.config
        turn_number = self.state.turn

        def before_sleep(retry_state: tenacity.RetryCallState) -> None:
            outcome = retry_state.outcome
            error = outcome.exception() if outcome is not None else None
            self._emit(ModelRetrying(turn_number, retry_state.attempt_number, str(error)))

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(lambda e: isinstance(e, ModelError) and e.retryable),
            stop=tenacity.stop_after_attempt(cfg.model_retries + 1),
            wait=tenacity.wait_exponential(multiplier=cfg.retry_wait_s, max=cfg.retry_wait_max_s),
            before_sleep=before_sleep,
            reraise=True,
        )
        return retrying(self.model.complete, self.state.context, plan.tools, plan.choice)

    def _limit_reached(self) -> str | None:
        s, cfg = self.state, self.config
        budgets = self.harness.policy.budgets
        if cfg.loop_detection is not None and s.streak_count >= cfg.loop_detection:
            return "loop_detected"
        if self.harness.audit.count_calls(s.run_id) >= budgets.max_tool_calls:
            return "budget:tool_calls"
        if self.seconds() >= budgets.max_wall_time_s:
            return "budget:wall_time"
        if cfg.max_input_tokens is not None and s.input_tokens >= cfg.max_input_tokens:
            return "budget:input_tokens"
        if cfg.max_output_tokens is not None and s.output_tokens >= cfg.max_output_tokens:
            return "budget:output_tokens"
        if cfg.max_cost_usd is not None and s.cost_usd is not None and s.cost_usd >= cfg.max_cost_usd:
            return "budget:cost"
        if s.turn >= cfg.max_turns:
            return "max_turns"
        return None

    # -- calls

    def _run_calls(self, positions: Sequence[int]) -> None:
        s = self.state
        offered = None if self._plan is None else self._plan.callable
        self._calls.run(s.calls, s.results, positions, turn=s.turn, offered=offered)

    def _emit(self, event: Event) -> None:
        if self._on_event is None:
            return
        with self._event_lock:
            try:
                self._on_event(event)
            except Exception:
                log.exception("the on_event callback failed on %s", event.kind)
