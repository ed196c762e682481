"""Argument rules: ``[tools.NAME]`` entries, their patterns, and the decision they give a call.

How patterns match is documented with the policy file (:mod:`harness.core.policy`): command
rules are globs (or ``regex:``) over the whole whitespace-normalised command; path rules are
globs over each path argument, made absolute against the sandbox workdir. Patterns are
compiled once, when a rule is validated, so evaluating them is a few regex matches.
"""

from __future__ import annotations

import fnmatch
import json
import os
import posixpath
import re
from collections.abc import Mapping
from functools import cached_property, lru_cache
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, model_validator

from harness.core.calls import Action, Decision
from harness.core.validation import render_path

__all__ = [
    "PolicyTarget",
    "Rule",
    "ToolPolicy",
    "apply_rules",
    "glob_to_regex",
    "not_allowed_decision",
    "takes_command",
    "tool_decision",
]

_RANK = {Action.ALLOW: 1, Action.ASK: 2, Action.DENY: 3}
_REGEX_PREFIX = "regex:"


class PolicyTarget(Protocol):
    """What the policy needs of a tool definition (``harness.core.registry.ToolDefinition``)."""

    @property
    def name(self) -> str: ...

    @property
    def command_field(self) -> str | None: ...

    @property
    def path_fields(self) -> tuple[str, ...]: ...



class Rule(BaseModel):
    """One ``[[tools.NAME.rules]]`` entry: an action for calls whose arguments match."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: Action
    """``allow``, ``ask`` or ``deny`` when the rule applies."""
    command: str | None = None
    """Glob over the whole (whitespace-normalised) command, or ``regex:PATTERN`` (fullmatch)."""
    path: str | None = None
    """Path glob (``**`` spans directories; relative means under the sandbox workdir)."""
    reason: str | None = None
    """Why, in a sentence; shown to the model on deny and to the approver on ask."""

    @model_validator(mode="after")
    def _check(self) -> Rule:
        if (self.command is None) == (self.path is None):
            raise ValueError('give exactly one of command = "PATTERN" or path = "GLOB" in each rule')
        _ = self.compiled  # compile now, so a bad pattern is an error at load, not at a call
        return self

    @cached_property
    def compiled(self) -> tuple[re.Pattern[str], bool]:
        """(the pattern as a regex for ``fullmatch``, whether it is a path relative to the workdir).

        Compiled once per rule (a plain attribute afterwards: decide() stays cheap)."""
        if self.command is not None:
            if not self.command.strip():
                raise ValueError("command pattern is empty")
            if self.command.startswith(_REGEX_PREFIX):
                expr = self.command[len(_REGEX_PREFIX) :]
                try:
                    return re.compile(expr), False
                except re.error as exc:
                    raise ValueError(f"command {self.command!r} is not a valid regular expression: {exc}") from None
            return re.compile(fnmatch.translate(_normalize_command(self.command))), False
        normalized, relative = _normalize_pattern(self.path or "")
        return re.compile(glob_to_regex(normalized)), relative

    def describe(self) -> str:
        """``deny command "rm -rf *"`` / ``ask path "/etc/**"``."""
        if self.command is not None:
            return f"{self.action} command {_quote(self.command)}"
        return f"{self.action} path {_quote(self.path or '')}"


class ToolPolicy(BaseModel):
    """``[tools.NAME]``: the decision for one tool and rules on its arguments."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    decision: Action | None = None
    """``allow``, ``ask`` or ``deny`` for calls no rule applies to; unset means ``default_decision``."""
    rules: tuple[Rule, ...] = ()
    """``[[tools.NAME.rules]]``: the most restrictive applicable rule overrides ``decision``."""

    def decision_without_rules(self, tool: str, default: Action) -> Decision:
        """The decision for a call of ``tool`` that no rule applies to (``default``: the
        policy's ``default_decision``, for an entry without ``decision``)."""
        return tool_decision(tool, self.decision or default, from_tool=self.decision is not None)


# --- evaluating rules -----------------------------------------------------------------------------


def apply_rules(
    definition: PolicyTarget,
    tool: ToolPolicy,
    args: Mapping[str, Any] | BaseModel,
    *,
    workdir: str,
    default: Action,
    entry: str | None = None,
) -> Decision:
    """The decision of ``tool``'s rules for one call (``default``: the policy's ``default_decision``;
    ``entry``: the ``[tools.ENTRY]`` key when it is a glob rather than the tool's name).

    The most restrictive applicable rule wins (deny > ask > allow; the first listed among
    equals); a deny ends the search. The command and paths are read from ``args`` only when
    a rule needs them. With no applicable rule, the tool's own decision stands."""
    best_rank = 0
    best: tuple[int, Rule, str | None] | None = None
    command: str | None = None
    command_read = False
    paths: list[tuple[str, str | None]] | None = None
    for index, rule in enumerate(tool.rules):
        rank = _RANK[rule.action]
        if rank <= best_rank:
            continue
        matched_path: str | None = None
        if rule.command is not None:
            if not command_read:
                command = _command_of(definition, args)
                command_read = True
            if command is None or rule.compiled[0].fullmatch(command) is None:
                continue
        else:
            if paths is None:
                paths = _paths_of(definition, args, workdir)
            if not paths:
                continue
            if rule.action is Action.ALLOW:
                if not all(_path_matches(rule, p) for p in paths):
                    continue
            else:
                hit = next((p for p in paths if _path_matches(rule, p)), None)
                if hit is None:
                    continue
                matched_path = hit[0]
        best_rank, best = rank, (index, rule, matched_path)
        if rule.action is Action.DENY:
            break
    if best is None:
        return tool.decision_without_rules(entry or definition.name, default)
    return _rule_decision(entry or definition.name, *best)


def _get(args: Mapping[str, Any] | BaseModel, field: str) -> Any:
    if isinstance(args, BaseModel):
        return getattr(args, field, None)
    return args.get(field)


def _normalize_command(command: str) -> str:
    return " ".join(command.split())


def takes_command(definition: PolicyTarget) -> bool:
    """Whether command rules can apply to ``definition``: it has a command argument, or builds
    its command from its arguments (``command_of``, as a declared command tool does)."""
    return definition.command_field is not None or getattr(definition, "command_of", None) is not None


def _command_of(definition: PolicyTarget, args: Mapping[str, Any] | BaseModel) -> str | None:
    render = getattr(definition, "command_of", None)
    if render is not None:
        rendered = render(args)
        return None if rendered is None else _normalize_command(rendered)
    field = definition.command_field
    if field is None:
        return None
    value = _get(args, field)
    if isinstance(value, str):
        return _normalize_command(value)
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return _normalize_command(" ".join(value))
    return None


def _paths_of(
    definition: PolicyTarget, args: Mapping[str, Any] | BaseModel, workdir: str
) -> list[tuple[str, str | None]]:
    """Each path argument as (absolute normalised path, path relative to workdir or None)."""
    out: list[tuple[str, str | None]] = []
    for field in definition.path_fields:
        value = _get(args, field)
        if value is None:
            continue
        items = value if isinstance(value, list | tuple) else (value,)
        for item in items:
            if isinstance(item, str | os.PathLike):
                out.append(_normalize_call_path(os.fspath(item), workdir))
    return out


def _normalize_call_path(path: str | bytes, workdir: str) -> tuple[str, str | None]:
    text = path if isinstance(path, str) else os.fsdecode(path)
    norm = posixpath.normpath(posixpath.join(workdir, text))
    if norm.startswith("//"):
        norm = "/" + norm.lstrip("/")
    if norm == workdir:
        return norm, ""
    base = workdir.rstrip("/") + "/"
    return norm, norm[len(base) :] if norm.startswith(base) else None


def _path_matches(rule: Rule, path: tuple[str, str | None]) -> bool:
    matcher, anchored = rule.compiled
    absolute, relative = path
    if anchored:
        return relative is not None and matcher.fullmatch(relative) is not None
    return matcher.fullmatch(absolute) is not None


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _rule_decision(tool: str, index: int, rule: Rule, matched_path: str | None) -> Decision:
    key = f"{render_path(('tools', tool, 'rules'))}[{index}]"
    if rule.reason:
        why = rule.reason
    elif rule.command is not None:
        why = f"the command matches {_quote(rule.command)}"
    else:
        target = f"the path {matched_path!r}" if matched_path is not None else "every path"
        why = f"{target} matches {_quote(rule.path or '')}"
    lead = {
        Action.DENY: "denied by policy rule",
        Action.ASK: "approval required by policy rule",
        Action.ALLOW: "allowed by policy rule",
    }[rule.action]
    return Decision(rule.action, f"{key} ({rule.describe()})", f"{lead} {key}: {why}")


@lru_cache(maxsize=1024)
def tool_decision(tool: str, action: Action, *, from_tool: bool) -> Decision:
    if from_tool:
        key = f"{render_path(('tools', tool))}.decision"
        setting = f'{key} = "{action}"'
    else:
        key = "default_decision"
        setting = f'default_decision = "{action}"'
    reason = {
        Action.DENY: f"denied by policy: the tool {tool!r} may not be used ({setting})",
        Action.ASK: f"approval required by policy: every call of {tool!r} needs approval ({setting})",
        Action.ALLOW: f"allowed by policy ({setting})",
    }[action]
    return Decision(action, key, reason)


def not_allowed_decision(tool: str, allowed: tuple[str, ...]) -> Decision:
    listed = ", ".join(allowed) or "none"
    return Decision(
        Action.DENY,
        "allowed_tools",
        f"denied by policy: the tool {tool!r} is not enabled in this run (allowed_tools: {listed})",
    )


# --- path globs ----------------------------------------------------------------------------------


def _normalize_pattern(pattern: str) -> tuple[str, bool]:
    """(pattern without ``.`` or empty components, is it anchored at the workdir); refuses ``..``."""
    if not pattern.strip():
        raise ValueError("path pattern is empty")
    if "\0" in pattern:
        raise ValueError("path pattern contains a NUL character")
    relative = not pattern.startswith("/")
    parts = [p for p in pattern.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"path pattern {pattern!r} contains '..'; write the path it means without it")
    joined = "/".join(parts)
    if relative and parts and parts[0] == "**":  # "**/x" means at any depth, not only under workdir
        relative = False
    return (joined if relative else "/" + joined), relative


def glob_to_regex(pattern: str) -> str:
    """A regex (for ``re.fullmatch``) equivalent to a normalised path glob.

    ``*`` -> ``[^/]*``; ``?`` -> ``[^/]``; ``[...]`` -> a set that never matches ``/``
    (``[!...]`` negates); ``**`` as a whole component: leading or inner ``**/`` ->
    ``(?:.*/)?`` (zero or more directories), trailing ``/**`` -> ``(?:/.*)?`` (the
    directory itself and everything under it), alone -> ``.*``; elsewhere ``**`` is ``*``.
    """
    parts = pattern.split("/")
    out: list[str] = []
    sep = ""
    last = len(parts) - 1
    for index, part in enumerate(parts):
        if part == "**":
            if index == last:
                out.append("(?:/.*)?" if index > 0 else ".*")
            else:
                out.append(re.escape(sep) + "(?:.*/)?")
                sep = ""
                continue
        else:
            out.append(re.escape(sep) + _component_regex(part))
        sep = "/"
    return "".join(out)


def _component_regex(part: str) -> str:
    out: list[str] = []
    i, n = 0, len(part)
    while i < n:
        ch = part[i]
        if ch == "*":
            while i + 1 < n and part[i + 1] == "*":
                i += 1
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[":
            j = i + 1
            if j < n and part[j] == "!":
                j += 1
            if j < n and part[j] == "]":
                j += 1
            while j < n and part[j] != "]":
                j += 1
            if j >= n:
                out.append(re.escape(ch))
            else:
                body = part[i + 1 : j]
                negate = body.startswith("!")
                if negate:
                    body = body[1:]
                body = body.replace("\\", "\\\\")
                if body.startswith("^"):
                    body = "\\" + body
                out.append(f"(?:(?!/)[{'^' if negate else ''}{body}])")
                i = j
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out)
