"""Acceptance checks: what a run's final answer must pass (``AcceptanceCheck``), and the
policy's ``[acceptance]`` section that declares them (``AcceptancePolicy``).

A check is a shell command the agent loop runs in the run's sandbox when the model gives
its final answer (:mod:`harness.loop.acceptance` runs them). A run gets its checks from one
place, the most specific that gives any: ``callbox run --accept`` on the command line, else
the run config's ``[[acceptance]]`` tables (``LoopConfig.acceptance``), else the policy's
``[[acceptance.check]]`` tables. The checks of one source replace those of the others, never
merge with them. ``max_rejections`` follows the same order, each source's own value standing
beside its checks (the policy's when the checks are the policy's and it sets one).

Example (policy)::

    [acceptance]
    max_rejections = 2

    [[acceptance.check]]
    command = "python -m pytest -q"
    workdir = "/workspace/project"
    timeout_s = 120
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["AcceptanceCheck", "AcceptancePolicy"]


class AcceptanceCheck(BaseModel):
    """A command run in the run's sandbox when the model gives its final answer; the run is
    accepted only when every check exits with its expected code."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: str = Field(min_length=1)
    """Command line, run with ``bash -c`` as the ``shell`` tool runs one (e.g. ``python -m pytest -q``)."""
    workdir: str | None = None
    """Absolute directory in the sandbox to run it in; None: the sandbox's working directory."""
    timeout_s: float = Field(default=300.0, gt=0)
    """Seconds the check may take (at most the policy's ``call_timeout_ceiling_s``); a check still
    running then has failed."""
    expect_exit: int = 0
    """Exit code that counts as passing."""

    @field_validator("workdir")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"workdir {value!r} must be an absolute path in the sandbox, e.g. /workspace/{value}")
        return value


class AcceptancePolicy(BaseModel):
    """``[acceptance]``: checks every run of this policy's final answer must pass (unless the run
    config or the command line gives checks of its own, which replace these)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    check: tuple[AcceptanceCheck, ...] = ()
    """``[[acceptance.check]]``: the checks, run in this order; the first that fails rejects the answer."""
    max_rejections: int | None = Field(default=None, ge=0)
    """Rejected answers the model is told of before the next one ends the run ``rejected:acceptance``
    (0: the first rejection ends it); absent: the run config's (default 3)."""
