"""Sandbox actions: what may be done with a living sandbox besides tool calls, what the policy
says about each, and the audit record of each.

The actions (:data:`ACTIONS`), each one name in the policy and the audit store:

``process``       start a background process in a sandbox
``attach``        read or join a process's output (logs, attach, a terminal)
``port_forward``  forward a sandbox port to the host's loopback
``copy_in``       copy files from the host into a sandbox
``copy_out``      copy files out of a sandbox to the host
``snapshot``      save a sandbox's contents as a snapshot
``fork``          start a sandbox from another one (or from its snapshot)
``pause``         pause or resume a sandbox
``network``       change a running sandbox's network rules (within its policy's network)
``revert``        put a run's files back as they were before one of its calls (see the undo docs)

Policy: ``[actions.NAME]`` with ``decision = "allow" | "ask" | "deny"``. ``port_forward``
is ``deny`` unless the policy says otherwise (off by default: it opens a sandbox service to
the host); every other action is ``allow``. ``default_decision`` is for tools and does not
apply here. ``[[actions.NAME.rules]]`` refine the decision on the details the caller passes,
with the tools' rule semantics (the most restrictive applicable rule wins and replaces the
decision; deny and ask rules apply when ANY path matches, allow rules when EVERY path does;
a rule about a detail the action does not give does not apply). Each rule has ``action``,
an optional ``reason`` and exactly one of:

* ``ports = [8000, "9000-9100"]`` (``port_forward``): the sandbox port, ``details["port"]``;
  an entry is a port or an inclusive ``"LOW-HIGH"`` range.
* ``path = "GLOB"`` (``copy_in``, ``copy_out``): the sandbox-side path, ``details["path"]``
  (the destination of a copy in, the source of a copy out; a string or a list), matched like
  a tool's path rule (relative to the sandbox workdir, ``**`` spans directories).
* ``command = "PATTERN"`` (``process``): the command, ``details["command"]`` (a string or an
  argv list, joined with spaces), matched like a tool's command rule (a glob over the whole
  whitespace-collapsed command, or ``regex:...``).

A rule of a kind the action cannot be matched on is refused when the policy loads. Allowing
or asking about ``port_forward`` (its decision or one of its rules) is a loosening
(:meth:`ActionsPolicy.loosened`, logged with the policy's other loosenings).

The gate (:class:`ActionGate`) is what the doors call around each action::

    gate = ActionGate(policy, audit, run_id=sandbox_run_id, actor="cli:alice")
    ticket = gate.authorize("port_forward", {"sandbox": "web", "port": 8000}, approval_id=flag)
    ...forward...
    gate.finish(ticket, ok=True, detail={"connections": 3})

Each action is recorded in the audit store like a call of the tool ``sandbox.NAME`` with the call id ``action-<hex>``,
the arguments being the details plus ``actor``; its decision, rule, timing and outcome (a result that is an error when
it failed) are the call's, so ``callbox audit --run RUN`` lists it among the run's calls. ``deny`` is recorded as done
and raises :class:`ActionDenied`; ``ask`` records a pending approval and raises :class:`ApprovalPending` (approve with
``callbox approvals approve ID``, then repeat the action with the approval: an approval is for one run, action, actor
and details, and is used once). Sandbox actions are not tool calls: budgets do not apply to them and they do not count
toward ``budgets.max_tool_calls``.

The details a door passes (JSON values): ``sandbox`` (its name or id) and, per action, ``process``: ``command``,
``tag``, ``pty``; ``attach``: ``pid``, ``mode`` (``logs`` | ``attach`` | ``terminal``); ``port_forward``: ``port``,
``host_port``; ``copy_in`` / ``copy_out``: ``path`` (in the sandbox), ``host_path``; ``snapshot``: ``name``; ``fork``:
``name``, ``from_snapshot``; ``pause``: ``op`` (``pause`` | ``resume``); ``network``: ``internet``, ``allow``, ``deny``;
``revert``: ``to_call``, ``mounts_only``. Only ``port``, ``path`` and ``command`` are read by rules; the rest identify
the action in the record.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from harness.audit.errors import AuditError
from harness.audit.records import ACTION_CALL_PREFIX, ACTION_TOOL_PREFIX, arguments_digest, final_decision
from harness.core.action_details import detail_command, detail_paths, detail_port, path_hit, port_range, show_ports
from harness.core.calls import Action, Decision, ErrorCode, ToolResult
from harness.core.errors import CallboxError, short_reason
from harness.core.rules import Rule

if TYPE_CHECKING:
    from harness.audit.store import AuditStore
    from harness.core.policy import Policy

log = logging.getLogger("callbox.actions")

__all__ = [
    "ACTIONS",
    "ActionDenied",
    "ActionGate",
    "ActionPolicy",
    "ActionRule",
    "ActionTicket",
    "ActionsPolicy",
    "ApprovalPending",
    "action_tool",
]

ACTIONS = ("process", "attach", "port_forward", "copy_in", "copy_out", "snapshot", "fork", "pause", "network",
           "revert")
"""Every sandbox action, as named in ``[actions.NAME]`` and in the audit (``sandbox.NAME``)."""

DEFAULT_DECISIONS: dict[str, Action] = {name: Action.ALLOW for name in ACTIONS} | {"port_forward": Action.DENY}
"""The decision of an action whose ``[actions.NAME]`` sets none."""

RULE_KINDS: dict[str, str] = {"port_forward": "ports", "copy_in": "path", "copy_out": "path", "process": "command"}
"""The one kind of rule each action can be matched on (the others take no rules)."""

_RULE_EXAMPLES = {"ports": "ports = [8000]", "path": 'path = "GLOB"', "command": 'command = "PATTERN"'}

_WHAT = {
    "process": "starting a background process in a sandbox",
    "attach": "attaching to a sandbox process (logs, attach, terminal)",
    "port_forward": "forwarding a sandbox port to the host",
    "copy_in": "copying files into a sandbox",
    "copy_out": "copying files out of a sandbox",
    "snapshot": "snapshotting a sandbox",
    "fork": "forking a sandbox",
    "pause": "pausing or resuming a sandbox",
    "network": "changing a sandbox's network rules",
    "revert": "reverting a run's files to before one of its calls",
}
_RANK = {Action.ALLOW: 1, Action.ASK: 2, Action.DENY: 3}


def action_tool(action: str) -> str:
    """The tool name an action is recorded under (``sandbox.port_forward``); ValueError for an
    unknown action, naming the known ones."""
    if action not in DEFAULT_DECISIONS:
        raise ValueError(f"unknown sandbox action {action!r}; the actions are {', '.join(ACTIONS)}")
    return ACTION_TOOL_PREFIX + action


# --- the policy's [actions] table ---------------------------------------------------------------


class ActionRule(BaseModel):
    """One ``[[actions.NAME.rules]]`` entry: a decision for actions whose details match."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: Action
    """``allow``, ``ask`` or ``deny`` when the rule applies."""
    ports: tuple[StrictInt | StrictStr, ...] | None = None
    """Sandbox ports (``port_forward``): each a port or an inclusive ``"LOW-HIGH"`` range."""
    path: str | None = None
    """A path glob over the sandbox-side path (``copy_in``, ``copy_out``), as in a tool's path rule."""
    command: str | None = None
    """A glob (or ``regex:``) over the whole command (``process``), as in a tool's command rule."""
    reason: str | None = None
    """Why, in a sentence; shown with a denial and to the approver on ask."""

    @model_validator(mode="after")
    def _check(self) -> ActionRule:
        given = [kind for kind in ("ports", "path", "command") if getattr(self, kind) is not None]
        if len(given) != 1:
            raise ValueError('give exactly one of ports = [PORT, "LOW-HIGH"], path = "GLOB" or '
                             'command = "PATTERN" in each rule')
        _ = self.port_ranges, self.pattern  # compile now: a bad pattern is an error at load, not later
        return self

    @property
    def kind(self) -> str:
        """``ports``, ``path`` or ``command``: what the rule matches."""
        return "ports" if self.ports is not None else "path" if self.path is not None else "command"

    @cached_property
    def port_ranges(self) -> tuple[tuple[int, int], ...]:
        """``ports`` as inclusive (low, high) ranges."""
        if self.ports is None:
            return ()
        if not self.ports:
            raise ValueError("ports is empty; list the ports the rule is about, e.g. ports = [8000, \"9000-9100\"]")
        return tuple(port_range(entry) for entry in self.ports)

    @cached_property
    def pattern(self) -> Rule | None:
        """The path or command pattern as a tool rule (so it matches exactly as one does)."""
        if self.ports is not None:
            return None
        try:
            return Rule(action=self.action, path=self.path, command=self.command)
        except ValidationError as exc:
            raise ValueError(str(exc.errors()[0]["msg"]).removeprefix("Value error, ")) from None

    def describe(self) -> str:
        """``allow ports [8000, "9000-9100"]`` / ``deny path "/etc/**"``."""
        if self.pattern is not None:
            return self.pattern.describe()
        return f"{self.action} ports {show_ports(self.ports or ())}"

    def match(self, details: Mapping[str, Any], workdir: str) -> str | None:
        """What of ``details`` made the rule apply (``the port 8000``), or None if it does not."""
        if self.ports is not None:
            port = detail_port(details.get("port"))
            if port is None:
                return None
            return f"the port {port}" if any(lo <= port <= hi for lo, hi in self.port_ranges) else None
        rule = self.pattern
        assert rule is not None  # a ports rule returned above
        matcher, anchored = rule.compiled
        if self.command is not None:
            command = detail_command(details.get("command"))
            return "the command" if command is not None and matcher.fullmatch(command) else None
        paths = detail_paths(details.get("path"), workdir)
        if not paths:
            return None
        hits = [p for p, relative in paths if path_hit(matcher, anchored, p, relative)]
        if self.action is Action.ALLOW:
            return "every path" if len(hits) == len(paths) else None
        return f"the path {hits[0]!r}" if hits else None


class ActionPolicy(BaseModel):
    """``[actions.NAME]``: the decision for one action and rules on its details."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    decision: Action | None = None
    """``allow``, ``ask`` or ``deny`` when no rule applies; unset means the action's default."""
    rules: tuple[ActionRule, ...] = ()
    """``[[actions.NAME.rules]]``: the most restrictive applicable rule overrides ``decision``."""


class ActionsPolicy(BaseModel):
    """``[actions]``: one :class:`ActionPolicy` per sandbox action (unknown names are refused)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    process: ActionPolicy = Field(default_factory=ActionPolicy)
    """Starting a background process in a sandbox; ``allow`` by default, rules on ``command``."""
    attach: ActionPolicy = Field(default_factory=ActionPolicy)
    """Reading or joining a process's output (logs, attach, a terminal); ``allow`` by default, no rules."""
    port_forward: ActionPolicy = Field(default_factory=ActionPolicy)
    """Forwarding a sandbox port to the host's loopback; ``deny`` by default, rules on ``ports``."""
    copy_in: ActionPolicy = Field(default_factory=ActionPolicy)
    """Copying files from the host into a sandbox; ``allow`` by default, rules on ``path``."""
    copy_out: ActionPolicy = Field(default_factory=ActionPolicy)
    """Copying files out of a sandbox to the host; ``allow`` by default, rules on ``path``."""
    snapshot: ActionPolicy = Field(default_factory=ActionPolicy)
    """Saving a sandbox's contents as a snapshot; ``allow`` by default, no rules."""
    fork: ActionPolicy = Field(default_factory=ActionPolicy)
    """Starting a sandbox from another one or from its snapshot; ``allow`` by default, no rules."""
    pause: ActionPolicy = Field(default_factory=ActionPolicy)
    """Pausing or resuming a sandbox; ``allow`` by default, no rules."""
    network: ActionPolicy = Field(default_factory=ActionPolicy)
    """Changing a running sandbox's network rules (within its policy's); ``allow`` by default, no rules."""
    revert: ActionPolicy = Field(default_factory=ActionPolicy)
    """Putting a run's files back as they were before one of its calls; ``allow`` by default, no rules."""

    @field_validator(*ACTIONS)
    @classmethod
    def _rule_kinds(cls, value: ActionPolicy, info: ValidationInfo) -> ActionPolicy:
        """A rule must be of the kind its action can be matched on (a typo never switches a rule off)."""
        name = str(info.field_name)
        kind = RULE_KINDS.get(name)
        for index, rule in enumerate(value.rules):
            if rule.kind == kind:
                continue
            takes = (f"a {name} rule takes {_RULE_EXAMPLES[kind]}" if kind is not None
                     else f"{name} takes no rules, only decision")
            used_by = ", ".join(a for a, k in RULE_KINDS.items() if k == rule.kind)
            raise ValueError(f"rules[{index}] is a {rule.kind} rule ({rule.kind} rules are for {used_by}); {takes}")
        return value

    def entry(self, action: str) -> ActionPolicy:
        """The ``[actions.NAME]`` entry of ``action`` (ValueError for an unknown action)."""
        action_tool(action)
        entry: ActionPolicy = getattr(self, action)
        return entry

    def decision_of(self, action: str) -> Action:
        """The action's decision before rules: its own, else its default."""
        return self.entry(action).decision or DEFAULT_DECISIONS[action]

    def decide(self, action: str, details: Mapping[str, Any], *, workdir: str) -> Decision:
        """The decision for one ``action`` with ``details`` (relative paths taken against ``workdir``).

        The rule names the policy key (``actions.port_forward.decision``,
        ``actions.copy_out.rules[1] (deny path "/etc/**")``) and the reason says how to change it."""
        entry = self.entry(action)
        best: tuple[int, ActionRule, str] | None = None
        for index, rule in enumerate(entry.rules):
            if best is not None and _RANK[rule.action] <= _RANK[best[1].action]:
                continue
            what = rule.match(details, workdir)
            if what is None:
                continue
            best = (index, rule, what)
            if rule.action is Action.DENY:
                break
        if best is not None:
            return _rule_decision(action, *best)
        return _entry_decision(action, entry.decision)

    def loosened(self) -> list[str]:
        """One note per setting that lets a sandbox port reach the host (``port_forward`` is off
        by default), naming its key; empty for a policy that leaves it off."""
        entry, key = self.port_forward, "actions.port_forward"
        if entry.decision in (Action.ALLOW, Action.ASK):
            how = "" if entry.decision is Action.ALLOW else " once a person approves"
            return [f'{key}.decision = "{entry.decision}": sandbox ports can be forwarded to the host{how} '
                    '(the default is "deny")']
        return [f"{key}.rules[{index}] {'allows' if rule.action is Action.ALLOW else 'asks before'} forwarding "
                f'sandbox ports {show_ports(rule.ports or ())} to the host (the default is "deny")'
                for index, rule in enumerate(entry.rules) if rule.action is not Action.DENY]


def _rule_decision(action: str, index: int, rule: ActionRule, what: str) -> Decision:
    key = f"actions.{action}.rules[{index}]"
    lead = {Action.DENY: "denied by policy rule", Action.ASK: "approval required by policy rule",
            Action.ALLOW: "allowed by policy rule"}[rule.action]
    why = rule.reason or f"{what} matches {rule.describe().split(' ', 1)[1]}"
    return Decision(rule.action, f"{key} ({rule.describe()})", f"{lead} {key}: {why}")


def _entry_decision(action: str, decision: Action | None) -> Decision:
    key = f"actions.{action}.decision"
    resolved = decision or DEFAULT_DECISIONS[action]
    setting = f'{key} = "{resolved}"' + ("" if decision is not None else ", the default")
    what = _WHAT[action]
    if resolved is Action.DENY and action == "port_forward":
        return Decision(Action.DENY, key, f"denied by policy: {what} is off ({setting}); to enable it set "
                        '[actions.port_forward] decision = "allow" (or "ask"), or allow some ports with '
                        '[[actions.port_forward.rules]] action = "allow", ports = [PORT], in the policy')
    reason = {
        Action.DENY: f'denied by policy: {what} is not allowed ({setting}); set [actions.{action}] decision = '
                     '"allow" (or "ask") in the policy to permit it',
        Action.ASK: f"approval required by policy: {what} needs a person's approval ({setting})",
        Action.ALLOW: f"allowed by policy ({setting})",
    }[resolved]
    return Decision(resolved, key, reason)


# --- the gate -----------------------------------------------------------------------------------


class ActionDenied(CallboxError):
    """The policy (or a person) refused a sandbox action; the message names the policy key."""

    code = ErrorCode.ACTION_DENIED

    def __init__(self, message: str, *, action: str, rule: str, denial: str) -> None:
        super().__init__(message, code=ErrorCode.ALREADY_RESOLVED if denial == "approval_used" else None)
        self.action = action
        self.rule = rule
        """The policy key that decided (``actions.port_forward.decision``), or the approval's."""
        self.denial = denial
        """``denied`` (the policy), ``approval_denied`` (a person), ``approval_mismatch`` (the
        approval is for another run, action, actor or details) or ``approval_used``."""


class ApprovalPending(CallboxError):
    """The policy says ``ask``: the action waits for ``callbox approvals approve ID``, then a repeat."""

    code = ErrorCode.APPROVAL_PENDING

    def __init__(self, message: str, *, approval_id: str, action: str, rule: str) -> None:
        super().__init__(message)
        self.approval_id = approval_id
        self.action = action
        self.rule = rule


@dataclass(frozen=True)
class ActionTicket:
    """An authorized action, until :meth:`ActionGate.finish` records its outcome."""

    action: str
    run_id: str
    call_id: str
    """The audit record's call id (``action-<hex>``; the asking one's, for an approved action)."""
    decision: Decision
    details: Mapping[str, Any]
    approval_id: str | None = None
    started: float = field(default_factory=time.monotonic, compare=False)
    outcome: dict[str, Any] = field(default_factory=dict, compare=False)
    """Facts the action adds as it goes (``connections``, ``bytes``); :meth:`ActionGate.guard` records them."""

    @property
    def tool(self) -> str:
        return ACTION_TOOL_PREFIX + self.action


def _label(decision: Decision) -> str:
    return "approved" if decision.rule.startswith("approval ") else decision.action.value


class ActionGate:
    """Authorizes sandbox actions against the policy and records each in the audit store,
    under ``run_id`` (the sandbox's run; started if missing) and ``actor`` (who acts:
    ``cli:alice``, a door's client). ``workdir`` anchors relative paths (default
    ``[sandbox] workdir``)."""

    def __init__(self, policy: Policy, audit: AuditStore, *, run_id: str, actor: str,
                 workdir: str | None = None) -> None:
        if not actor.strip():
            raise ValueError("an action gate needs an actor: who is acting (e.g. cli:USER)")
        self.policy = policy
        self.audit = audit
        self.actor = actor
        self.workdir = workdir or policy.sandbox.workdir
        self.run_id = audit.start_run(run_id, {"kind": "sandbox"})

    def authorize(self, action: str, details: Mapping[str, Any], *, approval_id: str | None = None,
                  floor: Decision | None = None) -> ActionTicket:
        """Decide and record one action: ``allow`` gives a ticket (end it with :meth:`finish`);
        ``deny`` raises :class:`ActionDenied`; ``ask`` raises :class:`ApprovalPending` unless
        ``approval_id`` names an approved approval of this run, action, actor and details,
        which is then used up (a denied one raises :class:`ActionDenied`).

        ``floor`` is another decision about the same act (a tool's rules, when a door runs a
        command that is also that tool's call): the more restrictive of it and the action's
        own decision is the one decided and recorded (the action's on a tie)."""
        tool = action_tool(action)
        if "actor" in details:
            raise ValueError("'actor' is not a detail: the gate records who acts (ActionGate(actor=...))")
        arguments = {"actor": self.actor, **details}
        decision = self.policy.actions.decide(action, details, workdir=self.workdir)
        if floor is not None and _RANK[floor.action] > _RANK[decision.action]:
            decision = floor
        if decision.action is Action.ASK and approval_id is not None:
            return self._approved(action, details, arguments, decision, approval_id)
        call_id = self._record(tool, arguments, decision)
        if decision.action is Action.DENY:
            self._refused(call_id, decision, ErrorCode.DENIED, decision.reason)
            raise ActionDenied(decision.reason, action=action, rule=decision.rule, denial="denied")
        if decision.action is Action.ASK:
            approval = self.audit.create_approval(self.run_id, call_id, tool, arguments, decision.rule,
                                                  decision.reason)
            raise ApprovalPending(f"{decision.reason}; it is pending as approval {approval.id}: "
                                  f"{_how_to_approve(approval.id)}",
                                  approval_id=approval.id, action=action, rule=decision.rule)
        self.audit.mark_running(self.run_id, call_id)
        return ActionTicket(action, self.run_id, call_id, decision, dict(details))

    def finish(self, ticket: ActionTicket, *, ok: bool, detail: Mapping[str, Any] | None = None) -> None:
        """Record how the action ended (``detail``: JSON facts; ``error`` is shown in the text).
        Once per ticket: a second finish is an AuditError."""
        elapsed_ms = (time.monotonic() - ticket.started) * 1000
        data = dict(detail or {})
        text = f"{ticket.tool}: done" if ok else f"{ticket.tool}: failed"
        if not ok and data.get("error"):
            text += f": {data['error']}"
        exit_code = data.get("exit_code")
        result = ToolResult(
            call_id=ticket.call_id, text=text, is_error=not ok, error=None if ok else ErrorCode.TOOL_FAILED,
            structured=data or None,
            meta={"decision": _label(ticket.decision), "rule": ticket.decision.rule, "actor": self.actor,
                  "duration_ms": round(elapsed_ms, 3)},
        )
        self.audit.finish_call(
            ticket.run_id, ticket.call_id, result, decision=ticket.decision,
            exit_code=exit_code if isinstance(exit_code, int) and not isinstance(exit_code, bool) else None,
            duration_ms=elapsed_ms, bytes_out=len(text.encode()), truncated=False,
        )

    def finish_logged(self, ticket: ActionTicket, *, ok: bool, detail: Mapping[str, Any] | None = None) -> None:
        """:meth:`finish`, logging rather than raising a failure of the audit store: for a door,
        whose answer about the action itself matters more than its record."""
        try:
            self.finish(ticket, ok=ok, detail=detail)
        except AuditError as error:
            log.error("cannot record the outcome of %s in run %s: %s", ticket.tool, ticket.run_id, error.message)

    @contextlib.contextmanager
    def guard(self, action: str, details: Mapping[str, Any], *,
              approval_id: str | None = None) -> Iterator[ActionTicket]:
        """:meth:`authorize`, then :meth:`finish` when the block ends: ok with the ticket's
        ``outcome``, or failed with an exception's first line. An interrupt (Ctrl-C, how a
        person ends a forward or an attach) is an ok end, ``ended: interrupted``."""
        ticket = self.authorize(action, details, approval_id=approval_id)
        try:
            yield ticket
        except Exception as exc:
            self.finish(ticket, ok=False, detail={**ticket.outcome, "error": short_reason(exc)})
            raise
        except BaseException:
            self.finish(ticket, ok=True, detail={**ticket.outcome, "ended": "interrupted"})
            raise
        self.finish(ticket, ok=True, detail=ticket.outcome)

    # -- parts

    def _record(self, tool: str, arguments: Mapping[str, Any], decision: Decision) -> str:
        call_id = f"{ACTION_CALL_PREFIX}{uuid.uuid4().hex}"
        self.audit.claim_call(self.run_id, call_id, tool, arguments)
        self.audit.record_decision(self.run_id, call_id, decision)
        return call_id

    def _refused(self, call_id: str, decision: Decision, code: ErrorCode, text: str) -> None:
        result = ToolResult.failure(call_id, code, text, decision="deny", rule=decision.rule, actor=self.actor)
        self.audit.finish_call(self.run_id, call_id, result, decision=decision, exit_code=None, duration_ms=0.0,
                               bytes_out=len(text.encode()), truncated=False)

    def _approved(self, action: str, details: Mapping[str, Any], arguments: Mapping[str, Any], decision: Decision,
                  approval_id: str) -> ActionTicket:
        """The repeat of an asked action with ``approval_id``: allowed once if a person approved it."""
        tool = action_tool(action)
        try:
            approval = self.audit.get_approval(approval_id)
        except AuditError:
            approval = None

        def refuse(code: str, message: str) -> ActionDenied:
            refused = Decision(Action.DENY, decision.rule, message)
            self._refused(self._record(tool, arguments, refused), refused, ErrorCode.DENIED, message)
            return ActionDenied(message, action=action, rule=decision.rule, denial=code)

        if approval is None or approval.run_id != self.run_id or approval.tool != tool \
                or approval.args_digest != arguments_digest(arguments):
            raise refuse("approval_mismatch", f"approval {approval_id} is not for this {action} (it must be of run "
                         f"{self.run_id}, by {self.actor}, with these details); repeat the action exactly as it "
                         "was asked, or without the approval to ask again")
        if approval.state == "pending":
            raise ApprovalPending(f"approval {approval.id} is still pending: {_how_to_approve(approval.id)}",
                                  approval_id=approval.id, action=action, rule=approval.rule)
        if approval.state == "denied":
            why = f": {approval.resolution_reason}" if approval.resolution_reason else ""
            message = f"a person denied this {action} (approval {approval.id}, by {approval.resolved_by}){why}"
            record = self.audit.get_call(self.run_id, approval.call_id)
            if record is not None and record.state != "done":
                final = final_decision(record.decision, approval) or decision
                with contextlib.suppress(AuditError):  # another process recorded it first
                    self._refused(approval.call_id, final, ErrorCode.APPROVAL_DENIED, message)
            raise ActionDenied(message, action=action, rule=approval.rule, denial="approval_denied")
        if approval.state == "consumed" or not self.audit.consume_approval(approval.id):
            raise refuse("approval_used", f"approval {approval.id} was already used (an approval allows one "
                         f"{action}); repeat the action without it to ask again")
        self.audit.mark_running(self.run_id, approval.call_id)
        approved = Decision(Action.ALLOW, f"approval {approval.id}", approval.reason)
        return ActionTicket(action, self.run_id, approval.call_id, approved, dict(details), approval.id)


def _how_to_approve(approval_id: str) -> str:
    return (f"approve it with `callbox approvals approve {approval_id}`, then repeat the command with the "
            f"approval (--approval {approval_id})")
