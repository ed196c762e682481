"""What the audit store holds, as Python values: records of runs, calls, approvals and
checkpoints, the rows they are read from, and the JSON a result and arguments are kept as.

A call's record also says what finally happened to it: a call that waited for a person
carries its approval (:class:`Approval`), and :func:`final_decision` is the decision that
stands (a person's denial is ``deny``, naming who denied it and why), whatever the policy
first said.

A call_id normally has one attempt. The exception is a result :func:`retry_safe` accepts
(a retryable error from a command that did not start): sending the same call again runs
it, and the failed attempt is kept as an :class:`Attempt` in the record's
``earlier_attempts``, so ``attempts`` counts every time the call was claimed to run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from harness.audit.interruptions import interruption
from harness.core.calls import Action, Decision, ErrorCode, ToolResult

ARGUMENTS_CAP = 64 * 1024
"""Stored arguments are cut at this many UTF-8 bytes (the digest always covers all of them)."""

ACTION_TOOL_PREFIX = "sandbox."
ACTION_CALL_PREFIX = "action-"
"""A sandbox action (``harness.core.actions``) is recorded as a call of the tool
``sandbox.NAME`` with a call id ``action-<hex>``; such records are not tool calls, so the
``max_tool_calls`` budget does not count them."""
EGRESS_TOOL = "egress"
EGRESS_CALL_PREFIX = "egress-"
"""A connection the egress proxy holds for a person (an ``ask`` entry of ``allow_hosts``) is
an approval of the tool ``egress`` with a call id ``egress-<hold id>``; its arguments name
the sandbox, the destination and the call that was running (:mod:`harness.core.egress_ask`)."""
EGRESS_SCOPES = ("once", "sandbox")
"""What approving an egress approval allows: this connection only, or the destination for
the rest of the sandbox's life."""

# --------------------------------------------------------------------------- serialization


def _json_default(value: object) -> object:
    """Never let an odd value in ``meta`` break the audit write (it is stored as text)."""
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def result_to_json(result: ToolResult) -> str:
    """The full ToolResult as JSON; ``result_from_json`` gives back an equal ToolResult for
    JSON-typed ``structured``/``meta`` values (a tuple comes back as a list)."""
    return json.dumps(
        {
            "call_id": result.call_id,
            "text": result.text,
            "is_error": result.is_error,
            "error": None if result.error is None else result.error.value,
            "structured": result.structured,
            "meta": result.meta,
        },
        ensure_ascii=False,
        separators=(",", ":"),
        default=_json_default,
    )


def result_from_json(payload: str) -> ToolResult:
    data = json.loads(payload)
    meta: dict[str, Any] = data.get("meta") or {}
    raw_error = data.get("error")
    error: ErrorCode | None = None
    if raw_error is not None:
        try:
            error = ErrorCode(raw_error)
        except ValueError:  # written by a newer callbox
            error = ErrorCode.INTERNAL
            meta = {**meta, "stored_error_code": raw_error}
    return ToolResult(
        call_id=data["call_id"],
        text=data["text"],
        is_error=bool(data["is_error"]),
        error=error,
        structured=data.get("structured"),
        meta=meta,
    )


def _storable(text: str) -> str:
    """SQLite needs valid UTF-8: lone surrogates become visible escapes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def canonical_json(value: object) -> str:
    """Sorted keys, no whitespace, UTF-8 kept: equal argument objects give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_json_default)


def arguments_digest(arguments: str | Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of the arguments (of the raw text when it is not JSON)."""
    return _prepare_arguments(arguments).digest


@dataclass(frozen=True)
class _Args:
    text: str
    digest: str
    truncated: bool
    size: int


def _prepare_arguments(arguments: str | Mapping[str, Any]) -> _Args:
    if isinstance(arguments, str):
        text = arguments
        try:
            canonical = canonical_json(json.loads(arguments))
        except (ValueError, RecursionError):  # invalid JSON is still recorded, digest of the raw text
            canonical = arguments
    else:
        try:
            canonical = canonical_json(arguments)
        except (TypeError, ValueError, RecursionError):
            canonical = repr(arguments)
        text = canonical
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
    text = _storable(text)
    raw = text.encode("utf-8")
    truncated = len(raw) > ARGUMENTS_CAP
    if truncated:
        text = raw[:ARGUMENTS_CAP].decode("utf-8", "ignore")
    return _Args(text, digest, truncated, len(raw))


def retry_safe(result: ToolResult | None) -> bool:
    """Whether a recorded result may be superseded by running the same call again: its
    error is retryable and the result says the command did not start
    (``structured["command_started"] is False``; the shell tool reports it, and the
    dispatcher sets it when the tool never got a sandbox). Anything else (a success, a
    command that started, a result that does not say) is final for its call_id."""
    if result is None or result.error is None or not result.error.retryable:
        return False
    return (result.structured or {}).get("command_started") is False


# --------------------------------------------------------------------------- records


def _every_field(record: Any) -> dict[str, Any]:
    """A record's fields by name, in order (for ``to_dict``)."""
    return {f.name: getattr(record, f.name) for f in fields(record)}


def _decision_dict(decision: Decision | None, *, with_reason: bool) -> dict[str, Any]:
    """A recorded decision as ``decision`` (its action), ``rule`` and, ``with_reason``, ``reason``."""
    out = {"decision": None if decision is None else decision.action.value,
           "rule": None if decision is None else decision.rule}
    if with_reason:
        out["reason"] = None if decision is None else decision.reason
    return out


@dataclass(frozen=True)
class Attempt:
    """An earlier, superseded attempt of a call: the retry-safe failure it ended with."""

    attempt: int
    """1 for the first attempt of the call_id."""
    owner: str
    started: float
    finished: float | None
    duration_ms: float | None
    decision: Decision | None
    error_code: str | None
    result_text: str | None
    result: ToolResult | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "owner": self.owner,
            "started": self.started,
            "finished": self.finished,
            "duration_ms": self.duration_ms,
            **_decision_dict(self.decision, with_reason=False),
            "error_code": self.error_code,
            "result_text": self.result_text,
        }


@dataclass(frozen=True)
class RunRecord:
    id: str
    created: float
    ended: float | None
    end_reason: str | None
    meta: dict[str, Any]
    calls: int
    """Calls recorded for this run (any state, any outcome)."""

    def to_dict(self) -> dict[str, Any]:
        return _every_field(self)


@dataclass(frozen=True)
class CallRecord:
    run_id: str
    call_id: str
    tool: str
    args_digest: str
    arguments: str
    """The arguments as received (cut at ARGUMENTS_CAP bytes when ``arguments_truncated``)."""
    arguments_truncated: bool
    bytes_in: int
    state: str
    """claimed | running | done"""
    decision: Decision | None
    authorized: bool
    owner: str
    """host/pid/start-time of the process that claimed it, or that ran it once a person approved
    it (see ``harness.engine.docker.labels.Owner`` and :mod:`harness.audit.owners`)."""
    started: float
    finished: float | None = None
    duration_ms: float | None = None
    exit_code: int | None = None
    is_error: bool | None = None
    error_code: str | None = None
    bytes_out: int | None = None
    truncated: bool | None = None
    result_text: str | None = None
    result: ToolResult | None = field(default=None, compare=False)
    """The stored ToolResult once ``state == "done"``; a replay returns exactly this."""
    earlier_attempts: tuple[Attempt, ...] = ()
    """Attempts superseded by a retry (see :func:`retry_safe`), oldest first; the fields
    above are those of the latest attempt."""

    @property
    def attempts(self) -> int:
        """How many times this call_id was claimed to run (1 unless it was retried)."""
        return len(self.earlier_attempts) + 1

    @property
    def redactions(self) -> dict[str, Any] | None:
        """The secrets taken out of the result (count, kinds, where; never the secrets), kept in
        the stored result's meta; None when there were none."""
        found = None if self.result is None else self.result.meta.get("redactions")
        return found if isinstance(found, dict) else None

    @property
    def images(self) -> list[dict[str, Any]]:
        """The pictures of the result as its meta names them (media type, size, label, sha256:
        the key of their bytes in the store's ``image_blobs``); empty when it had none."""
        found = None if self.result is None else self.result.meta.get("images")
        return [entry for entry in found if isinstance(entry, dict)] if isinstance(found, list) else []

    @property
    def origin(self) -> str | None:
        """Who sent the call when not the model or a client: ``acceptance`` for an acceptance
        check the agent loop ran on a final answer (the result's ``meta["origin"]``); None otherwise."""
        found = None if self.result is None else self.result.meta.get("origin")
        return found if isinstance(found, str) and found else None

    @property
    def interrupted(self) -> dict[str, Any] | None:
        """For a call whose harness process stopped before it recorded a result: what the
        interrupted result says (:mod:`harness.audit.interruptions`); None for any other call."""
        return interruption(self.result)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for ``callbox audit --json`` (without the duplicate full result)."""
        return {
            "run_id": self.run_id,
            "call_id": self.call_id,
            "tool": self.tool,
            "origin": self.origin,
            "args_digest": self.args_digest,
            "arguments": self.arguments,
            "arguments_truncated": self.arguments_truncated,
            "bytes_in": self.bytes_in,
            "state": self.state,
            **_decision_dict(self.decision, with_reason=True),
            "authorized": self.authorized,
            "owner": self.owner,
            "started": self.started,
            "finished": self.finished,
            "duration_ms": self.duration_ms,
            "exit_code": self.exit_code,
            "is_error": self.is_error,
            "error_code": self.error_code,
            "bytes_out": self.bytes_out,
            "truncated": self.truncated,
            "result_text": self.result_text,
            "redactions": self.redactions,
            "images": self.images,
            "interrupted": self.interrupted,
            "attempts": self.attempts,
            "earlier_attempts": [a.to_dict() for a in self.earlier_attempts],
        }


@dataclass(frozen=True)
class Claim:
    """The answer to ``claim_call``.

    ``fresh=True``: this caller owns the execution and must end it with ``finish_call``:
    the call_id is new, or its recorded result was a retry-safe failure (``attempt`` > 1,
    the failure kept in ``record.earlier_attempts``).
    ``fresh=False``: the call_id was already claimed; ``record`` is what is stored (when
    ``state == "done"``, ``result`` is the recorded result to return without executing).
    """

    fresh: bool
    record: CallRecord
    conflict: bool = False
    """Not fresh, and the stored tool or arguments digest differ from this claim's."""

    @property
    def state(self) -> str:
        return self.record.state

    @property
    def result(self) -> ToolResult | None:
        return self.record.result

    @property
    def decision(self) -> Decision | None:
        return self.record.decision

    @property
    def attempt(self) -> int:
        return self.record.attempts


@dataclass(frozen=True)
class CheckpointRecord:
    """A paused run's saved state (``save_checkpoint``)."""

    run_id: str
    saved: float
    status: str
    """paused (waiting to be resumed) | resumed (claimed by ``owner``)"""
    owner: str
    """host/pid/start-time of the process that saved or claimed it."""
    state: str
    """The loop's state as JSON text (``harness.loop.checkpoint.Checkpoint``)."""


@dataclass(frozen=True)
class Approval:
    id: str
    run_id: str
    call_id: str
    tool: str
    args_digest: str
    arguments: str
    arguments_truncated: bool
    rule: str
    reason: str
    state: str
    """pending | approved | denied | consumed"""
    created: float
    resolved: float | None
    resolved_by: str | None
    resolution_reason: str | None
    consumed: float | None
    scope: str | None = None
    """An approved egress approval's scope (:data:`EGRESS_SCOPES`); None for a call's."""

    def to_dict(self) -> dict[str, Any]:
        return _every_field(self)


# --------------------------------------------------------------------------- rows


def _decision_from(action: str | None, rule: str | None, reason: str | None) -> Decision | None:
    if action is None:
        return None
    return Decision(Action(action), rule or "", reason or "")


def _call_from_row(row: tuple[Any, ...], earlier: tuple[Attempt, ...] = ()) -> CallRecord:
    (run_id, call_id, tool, digest, arguments, args_truncated, bytes_in, state, decision, rule, reason,
     authorized, owner, started, finished, duration_ms, exit_code, is_error, error_code, bytes_out,
     truncated, result_text, result_json) = row  # fmt: skip
    return CallRecord(
        run_id=run_id,
        call_id=call_id,
        tool=tool,
        args_digest=digest,
        arguments=arguments,
        arguments_truncated=bool(args_truncated),
        bytes_in=bytes_in,
        state=state,
        decision=_decision_from(decision, rule, reason),
        authorized=bool(authorized),
        owner=owner,
        started=started,
        finished=finished,
        duration_ms=duration_ms,
        exit_code=exit_code,
        is_error=None if is_error is None else bool(is_error),
        error_code=error_code,
        bytes_out=bytes_out,
        truncated=None if truncated is None else bool(truncated),
        result_text=result_text,
        result=None if result_json is None else result_from_json(result_json),
        earlier_attempts=earlier,
    )


def _attempt_from_row(row: tuple[Any, ...]) -> Attempt:
    """A row of ``ATTEMPT_COLUMNS`` (after run_id and call_id)."""
    (attempt, owner, started, finished, duration_ms, decision, rule, reason, error_code, result_text,
     result_json) = row  # fmt: skip
    return Attempt(
        attempt=attempt, owner=owner, started=started, finished=finished, duration_ms=duration_ms,
        decision=_decision_from(decision, rule, reason), error_code=error_code, result_text=result_text,
        result=None if result_json is None else result_from_json(result_json),
    )  # fmt: skip


ATTEMPT_COLUMNS = (
    "attempt, owner, started, finished, duration_ms, decision, rule, reason, error_code, result_text, result_json"
)
"""The columns of an earlier attempt, in the order :func:`_attempt_from_row` reads them."""


APPROVAL_COLUMNS = ", ".join(f.name for f in fields(Approval))
"""The columns of an approval: its fields, in order (the ``approvals`` table names them alike)."""


def _approval_from_row(row: tuple[Any, ...]) -> Approval:
    """A row of ``APPROVAL_COLUMNS``."""
    values = dict(zip(APPROVAL_COLUMNS.split(", "), row, strict=True))
    return Approval(**{**values, "arguments_truncated": bool(values["arguments_truncated"])})


def _run_from_row(row: tuple[Any, ...]) -> RunRecord:
    rid, created, ended, end_reason, meta, calls = row
    return RunRecord(id=rid, created=created, ended=ended, end_reason=end_reason, meta=json.loads(meta), calls=calls)


# --------------------------------------------------------------------------- what stands


def final_decision(recorded: Decision | None, approval: Approval | None) -> Decision | None:
    """The decision that stands for a call: the policy's, unless it asked a person, whose
    answer then decides (a denial is ``deny`` with the person's reason; a pending one is
    still ``ask``). The rule names the policy rule that asked, who answered and the approval."""
    if approval is None:
        return recorded
    if approval.state == "denied":
        why = f": {approval.resolution_reason}" if approval.resolution_reason else ""
        return Decision(Action.DENY, f"{approval.rule}; denied by {approval.resolved_by} (approval {approval.id}){why}",
                        approval.resolution_reason or "")
    if approval.state in ("approved", "consumed"):
        return Decision(Action.ALLOW, f"{approval.rule}; approved by {approval.resolved_by} (approval {approval.id})",
                        approval.resolution_reason or approval.reason)
    return Decision(Action.ASK, f"{approval.rule}; waiting for a person (approval {approval.id})", approval.reason)


def call_view(record: CallRecord, approval: Approval | None) -> dict[str, Any]:
    """A call as ``callbox audit --run`` shows it: its record, with the decision that stands
    (:func:`final_decision`) and its approval, if it had one."""
    view = record.to_dict()
    decision = final_decision(record.decision, approval)
    if decision is not None:
        view.update(decision=decision.action.value, rule=decision.rule, reason=decision.reason)
    view["approval"] = None if approval is None else {
        "id": approval.id, "state": approval.state, "resolved_by": approval.resolved_by,
        "resolution_reason": approval.resolution_reason,
    }
    return view
