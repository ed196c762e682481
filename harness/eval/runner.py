"""Running an eval: every task times its trials, each in a sandbox of its own, N at a time.

**Where.** One engine connection serves every trial (:class:`~harness.core.shared_engine.SharedEngine`),
on the engine the command line or policy chooses (Docker, or the Ray cluster, whose
placement spreads the sandboxes over its nodes). With a warm pool (the default) it pools
each distinct sandbox spec of the tasks: the policy's ``[pool]`` when it has one, else
``concurrency`` sandboxes per spec, so the trials that run at once each claim a started
sandbox. A task's project directory is *copied* in after the claim, so its spec is the
pooled one; a *mounted* project changes the spec (a mount) and starts cold. A task in a
template gets the template's image, environment and working directory, and the files its
image holds under the sandbox's scratch places (as the E2B door's sandboxes of a template);
its start command is not run. The pool is closed (its sandboxes destroyed) when the eval
ends, also on Ctrl-C.

**A trial** is a run of the agent loop (:class:`~harness.loop.machine.Loop`) on a
:class:`~harness.core.session.Session` of its own: the task's instruction, its acceptance
checks and limits as the run's ``LoopConfig`` (over the eval's loop options), the task's
``timeout_s`` as the policy's ``budgets.max_wall_time_s``. The run's record in the audit
store carries ``meta.door = "eval"`` and ``meta.eval = {"task", "trial", "out"}``. The
checks run inside the loop (its final answer's verification); the eval only reads how the
run ended (:func:`harness.eval.scoring.passed`). A trial whose sandbox cannot start or whose
project cannot be copied ends ``error:setup``, with the reason, and fails; a bug in a trial
(``error:internal``) is logged and fails that trial only.

**Ctrl-C** (or SIGTERM) sets a stop flag and cancels the running tool calls; each running
trial stops before its next step, its run ends ``error:interrupted``, its sandbox is
destroyed, no further trial starts, the pool is closed, and the interruption is raised
again. Those trials have no result line, so ``--resume`` runs them again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from pydantic import ValidationError

from harness.audit.store import AuditStore
from harness.core.errors import CallboxError, UsageError
from harness.core.policy import Policy
from harness.core.problems import describe_validation_error
from harness.core.sandbox_settings import PoolSettings
from harness.core.session import Session
from harness.core.shared_engine import SharedEngine
from harness.engine.base import Engine, LivingSandbox
from harness.engine.spec import Mount, SandboxSpec
from harness.engine.templates.store import Built
from harness.eval.results import ResultsLog
from harness.eval.scoring import TrialResult, passed
from harness.eval.tasks import EvalTask
from harness.loop.config import LoopConfig
from harness.loop.events import RunOutcome
from harness.loop.machine import Loop
from harness.loop.state import Step
from harness.models.base import ModelAdapter, Usage

__all__ = ["EvalRun", "Watcher", "run_eval", "task_spec", "template_of"]

log = logging.getLogger("callbox.eval")


class Watcher(Protocol):
    """What is told as trials start and end (the progress bar)."""

    def started(self, task: str, trial: int) -> None: ...

    def finished(self, result: TrialResult) -> None: ...


@dataclass
class EvalRun:
    """One eval's settings."""

    tasks: Sequence[EvalTask]
    model_for: Callable[[EvalTask, int], ModelAdapter]
    """The model of a task's trial (a scripted one replays that trial's transcript)."""
    policy: Policy
    audit: AuditStore
    results: ResultsLog
    connect: Callable[[], Engine]
    """Connects the engine (Docker or Ray) once, for every trial."""
    trials: int = 1
    concurrency: int = 1
    pool: bool = True
    """Claim each trial's sandbox from a warm pool; False: every sandbox starts cold."""
    system: str = ""
    loop_options: dict[str, Any] = field(default_factory=dict)
    """LoopConfig fields for every task (a task's own settings win)."""
    spec_of: Callable[[EvalTask], SandboxSpec] | None = None
    """A task's sandbox spec (None: :func:`task_spec` of the policy's)."""
    watcher: Watcher | None = None


def template_of(task: EvalTask) -> Built | None:
    """The operator's built template ``task`` runs in (None: it names none); a CallboxError
    naming the fix when there is no such template, or it was never built."""
    if task.project.template is None:
        return None
    from harness.engine.templates.store import OPERATOR, TemplateStore

    store = TemplateStore()
    template = store.find(OPERATOR, task.project.template)
    built = store.built(template.key) if template is not None and template.key else None
    if built is None:
        raise CallboxError(f"task {task.id!r}: no built template {task.project.template!r} of the operator's in "
                           f"{store.root} (`callbox template ls` lists them; `callbox template build` makes one)")
    return built


def task_spec(task: EvalTask, base: SandboxSpec, built: Built | None = None) -> SandboxSpec:
    """The sandbox spec of ``task``: ``base`` (the policy's) with its image (or its template's
    ``built`` image, environment and working directory), and its project mounted read-write
    at the working directory when it is mounted; checked for this host."""
    update: dict[str, Any] = {}
    project = task.project
    if project.image is not None:
        update["image"] = project.image
    if built is not None:
        update.update(image=built.image, env={**built.env, **base.env}, workdir=built.workdir or base.workdir)
    if project.how == "mount" and project.dir is not None:
        update["mounts"] = (*base.mounts, Mount(source=project.dir, target=update.get("workdir", base.workdir),
                                                read_only=False))
    return base.model_copy(update=update).for_host() if update else base


def run_eval(settings: EvalRun) -> None:
    """Run every trial not already in ``settings.results``; each result is kept as it ends.
    Returns when all have ended; a KeyboardInterrupt or SystemExit stops the eval as the
    module docstring says and is raised again."""
    _Eval(settings).run()


class _Stopped(Exception):
    """The eval was interrupted: the trial stops before its next step."""


class _Eval:
    def __init__(self, settings: EvalRun) -> None:
        self.s = settings
        base = settings.policy.sandbox_spec()
        # A missing template or a bad spec fails here, before anything runs.
        self.templates: dict[str, Built | None] = {}
        self.specs: dict[str, SandboxSpec] = {}
        self.configs: dict[str, LoopConfig] = {}
        for task in settings.tasks:
            try:
                self.templates[task.id] = template_of(task)
                self.specs[task.id] = (settings.spec_of(task) if settings.spec_of is not None
                                       else task_spec(task, base, self.templates[task.id]))
                self.configs[task.id] = LoopConfig.model_validate({**settings.loop_options, **task.loop_settings()})
            except CallboxError as exc:
                message = exc.message if exc.message.startswith("task ") else f"task {task.id!r}: {exc.message}"
                raise UsageError(message) from None
            except ValidationError as exc:
                problems = describe_validation_error(exc, LoopConfig, noun="key")
                raise UsageError(f"task {task.id!r}: " + "; ".join(problems)) from None
        pooled: list[SandboxSpec] = []
        for task in settings.tasks:
            spec = self.specs[task.id]
            if task.project.how == "copy" and spec not in pooled:
                pooled.append(spec)
        pool = settings.policy.pool
        if settings.pool and pool.size == 0:
            pool = PoolSettings(size=min(settings.concurrency, len(settings.tasks) * settings.trials))
        self._connected: Engine | None = None

        def connect() -> Engine:
            self._connected = settings.connect()
            return self._connected

        self.engine = SharedEngine(connect, pool=pool if settings.pool else None, pool_specs=pooled)
        self.stop = threading.Event()
        self._sessions: set[Session] = set()
        self._lock = threading.Lock()

    def run(self) -> None:
        done = self.s.results.done()
        todo = [(task, trial) for trial in range(1, self.s.trials + 1) for task in self.s.tasks
                if (task.id, trial) not in done]
        if not todo:
            return
        if self.s.pool:
            self.engine.warm_in_background()
        executor = ThreadPoolExecutor(max_workers=self.s.concurrency, thread_name_prefix="callbox-eval")
        try:
            pending: set[Future[None]] = {executor.submit(self._trial, task, trial) for task, trial in todo}
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    future.result()
        except BaseException:
            self.stop.set()
            with self._lock:
                sessions = list(self._sessions)
            for session in sessions:
                session.cancel_calls()
            executor.shutdown(wait=True, cancel_futures=True)
            raise
        finally:
            executor.shutdown(wait=True)
            self.engine.close()
            # A pool kept elsewhere (the Ray nodes' own, which the shared engine does not hold) goes too.
            disable = getattr(self._connected, "disable_pool", None)
            if self.s.pool and disable is not None:
                disable()

    def _trial(self, task: EvalTask, trial: int) -> None:
        if self.stop.is_set():
            return
        if self.s.watcher is not None:
            self.s.watcher.started(task.id, trial)
        begun = time.monotonic()
        policy = self.s.policy
        if task.timeout_s is not None:
            policy = policy.model_copy(update={"budgets": policy.budgets.model_copy(
                update={"max_wall_time_s": task.timeout_s})})
        from harness.tools import registry_for

        with Session(registry_for(policy), policy, self.s.audit, spec=self.specs[task.id],
                     engine_factory=self.engine, door="eval") as session:
            with self._lock:
                self._sessions.add(session)
            try:
                outcome = self._run(task, trial, session)
            finally:
                with self._lock:
                    self._sessions.discard(session)
        if outcome is None:
            return
        result = TrialResult(
            task=task.id, trial=trial, run_id=outcome.run_id, reason=outcome.reason,
            passed=passed(outcome.reason, has_checks=bool(task.acceptance)), turns=outcome.turns,
            tool_calls=outcome.tool_calls, input_tokens=outcome.usage.input_tokens,
            output_tokens=outcome.usage.output_tokens, cost_usd=outcome.usage.cost_usd,
            seconds=round(time.monotonic() - begun, 3), final_text=outcome.final_text, message=outcome.message,
            finished=time.time())
        self.s.results.add(result)
        if self.s.watcher is not None:
            self.s.watcher.finished(result)

    def _run(self, task: EvalTask, trial: int, session: Session) -> RunOutcome | None:
        """The trial's run on ``session``: its outcome, or None when the eval was interrupted."""
        audit = self.s.audit
        audit.update_run_meta(session.run_id, {"door": "eval", "eval": {"task": task.id, "trial": trial,
                                                                         "out": str(self.s.results.out)}})
        try:
            config = self.configs[task.id]
            built = self.templates[task.id]
            if built is not None:  # the files its image holds where the sandbox has scratch tmpfs
                from harness.engine.templates.store import TemplateStore

                TemplateStore().seed_into(built, _living(session))
            if task.project.dir is not None and task.project.how == "copy":
                _copy_project(session, task.project.dir)
            if self.stop.is_set():
                raise _Stopped
            loop = Loop.start(self.s.model_for(task, trial), session, task=task.instruction, system=self.s.system,
                              config=config)
            while loop.step is not Step.DONE:
                if self.stop.is_set():
                    raise _Stopped
                loop.next_step()
            return loop.outcome
        except _Stopped:
            audit.end_run(session.run_id, "error:interrupted")
            return None
        except CallboxError as exc:
            audit.end_run(session.run_id, "error:setup")
            return _unstarted(session.run_id, "error:setup", exc.message)
        except Exception as exc:
            log.exception("eval: task %s trial %d failed", task.id, trial)
            audit.end_run(session.run_id, "error:internal")
            return _unstarted(session.run_id, "error:internal", f"{type(exc).__name__}: {exc}")


def _living(session: Session) -> LivingSandbox:
    """The session's sandbox (started now), as one that takes files."""
    sandbox = session.sandbox()
    if getattr(sandbox, "transfer", None) is None:
        raise CallboxError("this engine's sandboxes cannot take files, so a project cannot be copied in; mount it "
                           'instead (project.how = "mount")')
    return cast(LivingSandbox, sandbox)


def _copy_project(session: Session, folder: Path) -> None:
    """The files of ``folder`` into the working directory of the session's sandbox (started now)."""
    from harness.engine.tarstream import HostTar, chunked

    box = _living(session)
    box.transfer.upload_tar_stream(box.spec.workdir, chunked(HostTar(folder, ".").pieces()), overwrite=True)


def _unstarted(run_id: str, reason: str, message: str) -> RunOutcome:
    """The outcome of a trial that failed before (or outside) its loop."""
    return RunOutcome(run_id=run_id, reason=reason, final_text="", turns=0, tool_calls=0, seconds=0.0,
                      usage=Usage(), message=message)
