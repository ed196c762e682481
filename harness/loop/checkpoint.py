"""A paused run's state, saved in and loaded from the audit store.

When a call of a turn needs approval, the loop finishes the turn's other calls, then
saves a :class:`Checkpoint` (``AuditStore.save_checkpoint``; the run shows
``end_reason = approval_pending`` meanwhile) and exits. A later process loads it
(``claim`` takes it atomically, so only one process resumes a pause), re-sends the
pending calls under their original call_ids (the harness runs an approved call exactly
once, or returns the denial), appends the whole turn's results and carries on.

The format is one JSON object (``version`` 1)::

    {
      "version": 1,
      "run_id": "20250101T000000-ab12cd34",
      "model": "openai:gpt-5",            # ModelAdapter.name when paused
      "format": "openai",                 # the shape of "items": a resume needs the same
      "system": "...",                    # Context.system
      "items": [...],                     # Context.items: the provider-shaped conversation,
                                          # ending with the assistant turn whose calls paused
      "turn": 3,                          # turns taken (the paused one included)
      "calls": [                          # that turn's calls, in the order the model issued them
        {"call_id": "c1", "name": "read_file", "arguments": "{...}", "approval_id": null,
         "result": {...}},                # done: the ToolResult (audit.result_to_json's shape)
        {"call_id": "c2", "name": "shell", "arguments": "{...}", "approval_id": "k3m9...",
         "result": null}                  # pending: re-sent on resume
      ],
      "tool_choice": "auto",              # the current choice: "auto" | "required" | "none" |
                                          # {"tool": NAME} | {"allowed": [...], "mode": ...}
      "stage": 0,                         # index of the stage whose tool_choice was applied last
      "usage": {"input_tokens": 0, "output_tokens": 0, "cost_usd": null},
      "tool_calls": 7,                    # calls the model has issued in the run
      "seconds": 12.5,                    # active run time so far (pauses not counted)
      "streak": {"key": "...", "count": 1},   # loop detection: last call and its repeats
      "rejections": 0,                    # final answers the acceptance checks rejected (absent: 0)
      "config": {...},                    # LoopConfig.model_dump(mode="json")
      "sandbox": {"id": "0123456789ab", "expires": 1735690000.0} | null,
      "policy": {...},                    # Policy.model_dump(mode="json"), to rebuild the harness
      "spec": {...},                      # SandboxSpec of the run (mounts included)
      "saved": 1735686400.0
    }

The results of a paused turn's finished calls are held here and appended together with
the approved calls' results, in the model's order, so the context never holds a turn
with a missing result (every provider rejects that).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from harness.audit.store import AuditStore, result_from_json, result_to_json
from harness.core.calls import ToolResult
from harness.core.errors import CallboxError, ErrorCode
from harness.core.policy import Policy
from harness.engine.spec import SandboxSpec

__all__ = ["CHECKPOINT_VERSION", "Checkpoint", "CheckpointError", "PausedCall", "SandboxRef", "claim", "load",
           "save"]

CHECKPOINT_VERSION = 1


class CheckpointError(CallboxError):
    """A checkpoint that cannot be used: missing, unreadable, or for another kind of model."""

    code = ErrorCode.INVALID_REQUEST


@dataclass(frozen=True)
class PausedCall:
    """One call of the paused turn; ``result`` None means it was pending approval."""

    call_id: str
    name: str
    arguments: str | dict[str, Any]
    result: ToolResult | None = None
    approval_id: str | None = None
    safety_checks: tuple[str, ...] = ()
    """The provider's pending safety checks on the call (a person's approval acknowledges them)."""
    batch: str = ""
    """The provider item the call is one action of (its later actions stop once one fails)."""

    @property
    def pending(self) -> bool:
        return self.result is None

    def to_dict(self) -> dict[str, Any]:
        data = {
            "call_id": self.call_id,
            "name": self.name,
            "arguments": self.arguments,
            "approval_id": self.approval_id,
            "result": None if self.result is None else json.loads(result_to_json(self.result)),
        }
        if self.safety_checks:
            data["safety_checks"] = list(self.safety_checks)
        if self.batch:
            data["batch"] = self.batch
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PausedCall:
        raw = data.get("result")
        arguments = data["arguments"]
        return cls(
            call_id=str(data["call_id"]),
            name=str(data["name"]),
            arguments=arguments if isinstance(arguments, dict) else str(arguments),
            result=None if raw is None else result_from_json(json.dumps(raw)),
            approval_id=data.get("approval_id"),
            safety_checks=tuple(str(check) for check in data.get("safety_checks") or ()),
            batch=str(data.get("batch") or ""),
        )


@dataclass(frozen=True)
class SandboxRef:
    """The kept sandbox of a paused run."""

    id: str
    expires: float


@dataclass
class Checkpoint:
    """Everything a new process needs to continue a paused run (see the module docstring)."""

    run_id: str
    model: str
    format: str
    system: str
    items: list[dict[str, Any]]
    turn: int
    calls: list[PausedCall]
    tool_choice: Any = "auto"
    stage: int | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    tool_calls: int = 0
    seconds: float = 0.0
    streak_key: str | None = None
    streak_count: int = 0
    rejections: int = 0
    config: dict[str, Any] = field(default_factory=dict)
    sandbox: SandboxRef | None = None
    policy: dict[str, Any] = field(default_factory=dict)
    spec: dict[str, Any] = field(default_factory=dict)
    saved: float = field(default_factory=time.time)

    @property
    def pending(self) -> list[PausedCall]:
        return [c for c in self.calls if c.pending]

    def policy_model(self) -> Policy:
        """The run's policy, to build the resuming harness with."""
        return Policy.model_validate(self.policy)

    def spec_model(self) -> SandboxSpec:
        """The run's sandbox spec (mounts included), to build the resuming harness with."""
        return SandboxSpec.model_validate(self.spec)

    def to_json(self) -> str:
        return json.dumps({
            "version": CHECKPOINT_VERSION,
            "run_id": self.run_id,
            "model": self.model,
            "format": self.format,
            "system": self.system,
            "items": self.items,
            "turn": self.turn,
            "calls": [c.to_dict() for c in self.calls],
            "tool_choice": self.tool_choice,
            "stage": self.stage,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                      "cost_usd": self.cost_usd},
            "tool_calls": self.tool_calls,
            "seconds": self.seconds,
            "streak": {"key": self.streak_key, "count": self.streak_count},
            "rejections": self.rejections,
            "config": self.config,
            "sandbox": None if self.sandbox is None else {"id": self.sandbox.id, "expires": self.sandbox.expires},
            "policy": self.policy,
            "spec": self.spec,
            "saved": self.saved,
        }, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Checkpoint:
        try:
            data = json.loads(text)
            version = data.get("version")
            if version != CHECKPOINT_VERSION:
                raise CheckpointError(
                    f"checkpoint version {version!r} is not one this callbox reads ({CHECKPOINT_VERSION}); "
                    "resume it with the callbox version that paused it"
                )
            usage = data.get("usage") or {}
            streak = data.get("streak") or {}
            box = data.get("sandbox")
            return cls(
                run_id=str(data["run_id"]),
                model=str(data["model"]),
                format=str(data["format"]),
                system=str(data["system"]),
                items=list(data["items"]),
                turn=int(data["turn"]),
                calls=[PausedCall.from_dict(c) for c in data["calls"]],
                tool_choice=data.get("tool_choice", "auto"),
                stage=data.get("stage"),
                input_tokens=int(usage.get("input_tokens", 0)),
                output_tokens=int(usage.get("output_tokens", 0)),
                cost_usd=usage.get("cost_usd"),
                tool_calls=int(data.get("tool_calls", 0)),
                seconds=float(data.get("seconds", 0.0)),
                streak_key=streak.get("key"),
                streak_count=int(streak.get("count", 0)),
                rejections=int(data.get("rejections", 0)),
                config=dict(data.get("config") or {}),
                sandbox=None if box is None else SandboxRef(str(box["id"]), float(box["expires"])),
                policy=dict(data.get("policy") or {}),
                spec=dict(data.get("spec") or {}),
                saved=float(data.get("saved", 0.0)),
            )
        except CheckpointError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"the checkpoint is unreadable ({type(exc).__name__}: {exc})") from None


def save(audit: AuditStore, checkpoint: Checkpoint) -> None:
    """Store ``checkpoint``; the run is marked ``approval_pending`` (paused)."""
    audit.save_checkpoint(checkpoint.run_id, checkpoint.to_json())


def load(audit: AuditStore, run_id: str) -> Checkpoint | None:
    """The checkpoint of ``run_id`` (without claiming it), or None if it never paused."""
    record = audit.load_checkpoint(run_id)
    return None if record is None else Checkpoint.from_json(record.state)


def claim(audit: AuditStore, run_id: str) -> Checkpoint:
    """Take the checkpoint to resume the run (AuditError if it is not resumable now)."""
    return Checkpoint.from_json(audit.claim_checkpoint(run_id).state)
