"""The task file of ``callbox eval``: JSONL (one task object per line) or TOML (``[[task]]``
tables), both read into the same :class:`EvalTask` model.

TOML::

    [[task]]
    id = "fix-add"
    instruction = "The tests in test_calc.py fail. Fix calc.py."
    project = "projects/calc"                # copied into the sandbox's working directory
    acceptance = [{ command = "python -m pytest -q", timeout_s = 60 }]
    max_turns = 10

JSONL (blank lines and lines starting with ``#`` are skipped)::

    {"id": "fix-add", "instruction": "...", "project": "projects/calc", "acceptance": [{"command": "..."}]}

``project`` is a directory (relative paths are read from the task file's directory), or a
table: ``{dir = "...", how = "copy" | "mount", image = "...", template = "..."}``. A copied
directory goes into the sandbox before the model's first turn (the sandbox comes from the
warm pool); a mounted one is bind-mounted read-write at the working directory (the host's
files change, and the sandbox starts cold: a pooled sandbox has no mounts). ``image`` runs
the task in another local image, ``template`` in the operator's template of that name
(``callbox template build``). Errors name the file, the task (its id, else its number) and
the key, with what to write instead.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harness.core.errors import UsageError
from harness.core.problems import describe_validation_error
from harness.loop.config import AcceptanceCheck

__all__ = ["EvalTask", "Project", "TaskFileError", "load_tasks"]

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class TaskFileError(UsageError):
    """A task file that cannot be read or holds a task that is not valid."""


class Project(BaseModel):
    """What a task's sandbox starts with."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dir: Path | None = None
    """Host directory of the project (relative: to the task file's directory); None: the
    sandbox starts with an empty working directory."""
    how: Literal["copy", "mount"] = "copy"
    """``copy``: its files are copied into the sandbox's working directory (a warm-pool
    sandbox can take them); ``mount``: bind-mounted there read-write (the host's files change;
    the sandbox starts cold)."""
    image: str | None = None
    """Local image to run the task in instead of the policy's ``sandbox.image``."""
    template: str | None = None
    """The operator's template (``callbox template build NAME``) to run the task in: its image,
    environment, working directory and files (its start command is not run)."""

    @model_validator(mode="after")
    def _one_image(self) -> Project:
        if self.image is not None and self.template is not None:
            raise ValueError("give image or template, not both (a template has its own image)")
        if self.how == "mount" and self.dir is None:
            raise ValueError('how = "mount" needs dir: the host directory to mount')
        return self


class EvalTask(BaseModel):
    """One task of an eval: what the model is asked, where, and how success is checked."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    """Unique name of the task (letters, digits, ``.``, ``_``, ``-``; at most 64): its
    transcript is ``DIR/<id>.jsonl`` and its results carry it."""
    instruction: str = Field(min_length=1)
    """What the model is asked to do (the run's task)."""
    project: Project = Project()
    """The sandbox's starting point: a directory (copied or mounted), an image or a template."""
    acceptance: tuple[AcceptanceCheck, ...] = ()
    """Commands run in the sandbox when the model gives its final answer; the task passes when
    the run ends ``final:accepted``. Without checks a task passes on any final answer."""
    max_rejections: int | None = Field(default=None, ge=0)
    """Final answers the checks may reject before the run ends ``rejected:acceptance`` (None: the loop's default)."""
    max_turns: int | None = Field(default=None, ge=1)
    """Model turns at most (None: the eval's ``--max-turns``, else the loop's default)."""
    max_input_tokens: int | None = Field(default=None, ge=1)
    """Input tokens the run may consume (``budget:input_tokens``)."""
    max_output_tokens: int | None = Field(default=None, ge=1)
    """Output tokens the run may produce (``budget:output_tokens``)."""
    max_cost_usd: float | None = Field(default=None, gt=0)
    """Cost in USD the run may reach (``budget:cost``; when the model reports cost)."""
    timeout_s: float | None = Field(default=None, gt=0)
    """Wall time of the run in seconds (the policy's ``budgets.max_wall_time_s`` for this task;
    ``budget:wall_time``)."""

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if _ID.fullmatch(value) is None:
            raise ValueError(f"{value!r} is not a task id: use 1 to 64 letters, digits, '.', '_' or '-', "
                             "starting with a letter or digit")
        return value

    @field_validator("project", mode="before")
    @classmethod
    def _project_shorthand(cls, value: Any) -> Any:
        return {"dir": value} if isinstance(value, str) else value

    def loop_settings(self) -> dict[str, Any]:
        """The task's LoopConfig fields (its checks and limits that are set)."""
        settings: dict[str, Any] = {"acceptance": [check.model_dump() for check in self.acceptance]}
        for name in ("max_rejections", "max_turns", "max_input_tokens", "max_output_tokens", "max_cost_usd"):
            value = getattr(self, name)
            if value is not None:
                settings[name] = value
        return settings


def load_tasks(path: Path) -> list[EvalTask]:
    """The tasks of ``path`` (``.jsonl`` or ``.toml``), project directories made absolute and
    checked; a TaskFileError naming the file, the task and the key otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TaskFileError(f"{path}: cannot read the task file: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TaskFileError(f"{path}: the task file is not UTF-8 text") from None
    if path.suffix == ".toml":
        raw = _toml_tasks(path, text)
    elif path.suffix == ".jsonl":
        raw = _jsonl_tasks(path, text)
    else:
        raise TaskFileError(f"{path}: a task file is .jsonl (one task per line) or .toml ([[task]] tables)")
    if not raw:
        raise TaskFileError(f"{path}: holds no task")
    tasks: list[EvalTask] = []
    seen: dict[str, str] = {}
    for place, item in raw:
        named = isinstance(item, dict) and isinstance(item.get("id"), str)
        where = f"task {item['id']!r} ({place})" if named else place
        task = _task(path, where, item)
        if task.id in seen:
            raise TaskFileError(f"{path}: {where}: id {task.id!r} is already the id of {seen[task.id]}; "
                                "give each task its own id")
        seen[task.id] = where
        tasks.append(_resolved(path, where, task))
    return tasks


def _toml_tasks(path: Path, text: str) -> list[tuple[str, Any]]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TaskFileError(f"{path}: not valid TOML: {exc}") from None
    extra = sorted(set(data) - {"task"})
    if extra:
        raise TaskFileError(f"{path}: unexpected key {extra[0]!r} at the top level: the tasks are [[task]] tables")
    tasks = data.get("task", [])
    if not isinstance(tasks, list):
        raise TaskFileError(f"{path}: 'task' must be an array of tables: write [[task]] above each task")
    return [(f"task {n}", item) for n, item in enumerate(tasks, start=1)]


def _jsonl_tasks(path: Path, text: str) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            found.append((f"line {number}", json.loads(stripped)))
        except json.JSONDecodeError as exc:
            raise TaskFileError(f"{path}: line {number}: not valid JSON ({exc.msg}); each line is one task "
                                "object") from None
    return found


def _task(path: Path, where: str, item: Any) -> EvalTask:
    if not isinstance(item, dict):
        raise TaskFileError(f"{path}: {where}: a task is an object (a table in TOML), got {type(item).__name__}")
    try:
        return EvalTask.model_validate(item)
    except ValidationError as exc:
        problems = describe_validation_error(exc, EvalTask, noun="key", object_word="a table")
        raise TaskFileError(f"{path}: {where}: " + "; ".join(problems)) from None


def _resolved(path: Path, where: str, task: EvalTask) -> EvalTask:
    """``task`` with its project directory absolute (relative to the task file) and checked."""
    folder = task.project.dir
    if folder is None:
        return task
    absolute = (path.parent / folder.expanduser()).resolve()
    if not absolute.is_dir():
        raise TaskFileError(f"{path}: {where}: key 'project.dir': {absolute} is not a "
                            "directory; give the project's directory (relative paths start at the task file's)")
    return task.model_copy(update={"project": task.project.model_copy(update={"dir": absolute})})
