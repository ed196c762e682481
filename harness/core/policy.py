"""The policy: what a run's sandboxes may do and which tool calls may run.

A policy is a TOML file (``--policy FILE``; without it the packaged, commented
``harness/data/default-policy.toml``), read with :mod:`tomllib` and validated by the
pydantic models below, which refuse unknown keys everywhere. Any problem (a missing file,
a TOML syntax error with its line and column, an unknown key, a bad value) is a
:class:`PolicyError` (exit code 2) naming the file, the key path and the fix.

Sections:

``[sandbox]``
    The :class:`~harness.engine.spec.SandboxSpec` settings a policy may set, with the same
    secure defaults; ``[[sandbox.mounts]]`` (``source``, ``target``, ``mode = "ro"|"rw"``,
    and for a rw mount ``uid``/``gid``: the tool user, never 0) and ``allowed_mount_roots``.
    Relative mount sources and roots are taken against the policy file's directory. Sizes
    take ``"512m"`` or bytes. Loading a policy also checks it against this host
    (:meth:`~harness.engine.spec.SandboxSpec.for_host`): every mount source exists, is no system
    path, lies under ``allowed_mount_roots`` and, if rw, is writable by the tool user;
    cpus and memory fit the host. Loosening a hardened default (a ``rw`` mount, network
    other than ``none``, memory/cpus/pids/nofile/fsize above the default) is logged as a
    warning on ``callbox.policy`` naming the key (:meth:`Policy.loosened`); ``noexec``
    is a tightening.

``allowed_tools``
    The tools exposed to the model in this run (absent: all registered tools). A call
    of any other tool is denied with the rule ``allowed_tools``.

``default_decision`` and ``[tools.NAME]``
    ``decision = "allow" | "ask" | "deny"`` per tool; a tool without an entry (or whose
    entry has no ``decision``) gets ``default_decision`` (default ``"allow"``).
    ``[[tools.NAME.rules]]`` refine it on the call's arguments; each rule has
    ``action`` and exactly one of:

    * ``command``: matched against the tool's command argument (``command_field``),
      after leading/trailing whitespace is stripped and every run of whitespace
      (newlines included) is collapsed to one space. A plain pattern is a shell-style
      glob over the *whole* command (:mod:`fnmatch`, case-sensitive: ``*`` matches any
      characters, spaces and ``/`` included; ``?`` one character; ``[abc]`` a set), so
      ``"rm -rf *"`` matches ``rm -rf /tmp`` but not ``sudo rm -rf /``: write
      ``"*rm -rf*"`` to match anywhere. ``regex:PATTERN`` is a Python regular
      expression that must match the whole command (``re.fullmatch``).
    * ``path``: a glob matched against each path argument (``path_fields``). Call paths
      are made absolute against the sandbox workdir and normalised lexically (``.``,
      ``..`` and repeated ``/`` resolved; symlinks are not, the sandbox confines those).
      Relative patterns are likewise anchored at the workdir, except that one starting
      with ``**`` means any depth anywhere (``**/.env`` is ``/**/.env``: a deny rule
      written that way also covers ``/tmp/.env``). In a pattern ``*`` and
      ``?`` match within one path component (dotfiles included) and ``[...]`` is a
      character set; ``**`` as a whole component matches any number of directories:
      ``**/x`` matches ``x`` at any depth, ``a/**/b`` matches ``a/b`` and ``a/x/y/b``,
      and a trailing ``a/**`` matches ``a`` itself and everything under it. ``**``
      inside a component (``a**``) is a plain ``*``. ``..`` is not allowed in patterns.

    A ``deny`` or ``ask`` path rule applies when ANY path of the call matches; an
    ``allow`` path rule applies only when EVERY path of the call matches (so one allowed
    path cannot carry an unlisted one along). Rules about an argument the call did not
    give (null or absent) do not apply. Among the rules that apply, the most restrictive
    action wins (deny > ask > allow; between equals, the first listed names the
    decision); a rule that applies replaces the tool's ``decision``, so an ``allow``
    rule can exempt ``git status`` from ``decision = "ask"``. With no applicable rule the
    tool's decision applies. Rules are indexed from 0 (``tools.shell.rules[0]``), as in
    every key path callbox prints.

    Command and path rules are guard rails for the model's benefit and the audit log,
    not the security boundary: a shell can spell a command many ways. The sandbox is the
    boundary.

``[budgets]``
    Per run: ``max_tool_calls``, ``max_wall_time_s``; per call: ``max_output_bytes``
    returned to the model, ``default_call_timeout_s`` and ``call_timeout_ceiling_s``. A
    call asking for a longer timeout than the ceiling is not refused: it runs with the
    ceiling, and :meth:`Budgets.call_timeout` reports the clamp for the result's meta.

:meth:`Policy.decide` is on every call's path: patterns are compiled once, when the
policy is validated, and the common case (no rules for the tool) is two dict lookups.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import posixpath
import re
import tomllib
from collections.abc import Iterable, Mapping
from functools import cached_property, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harness.core.calls import TOOL_NAME_PATTERN, Action, Decision
from harness.core.errors import CallboxError
from harness.core.units import ByteSize, format_size
from harness.core.validation import describe_validation_error, render_path
from harness.engine.spec import DEFAULT_IMAGE, HostLimits, Mount, SandboxSpec, SpecError

__all__ = [
    "DEFAULT_POLICY_RESOURCE",
    "Budgets",
    "CallTimeout",
    "MountSetting",
    "Policy",
    "PolicyError",
    "PolicyTarget",
    "Rule",
    "SandboxSettings",
    "ToolPolicy",
    "glob_to_regex",
    "load_policy",
    "parse_policy",
]

log = logging.getLogger("callbox.policy")

DEFAULT_POLICY_RESOURCE = "data/default-policy.toml"
_RANK = {Action.ALLOW: 1, Action.ASK: 2, Action.DENY: 3}
_REGEX_PREFIX = "regex:"


class PolicyError(CallboxError):
    """The policy cannot be loaded or used; the message names the file, the key and the fix."""

    exit_code = 2


class PolicyTarget(Protocol):
    """What the policy needs of a tool definition (``harness.core.registry.ToolDefinition``)."""

    @property
    def name(self) -> str: ...

    @property
    def command_field(self) -> str | None: ...

    @property
    def path_fields(self) -> tuple[str, ...]: ...


def _spec_default(name: str) -> Any:
    return SandboxSpec.model_fields[name].default


# --- [sandbox] ---------------------------------------------------------------------------------


class MountSetting(BaseModel):
    """One ``[[sandbox.mounts]]`` entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Path
    """Host path (``~`` expanded; relative to the policy file's directory); canonicalized and
    checked against ``allowed_mount_roots`` and the forbidden system paths before use."""
    target: str
    """Absolute path inside the sandbox, e.g. ``/workspace``."""
    mode: Literal["ro", "rw"] = "ro"
    """``ro`` (default) or ``rw``; a ``rw`` mount loosens a default and is logged."""
    uid: int | None = None
    """rw only: the uid tool processes run as (never 0); default the owner of the first rw
    mount not owned by root, else 1000. Every rw mount must be writable by it."""
    gid: int | None = None
    """rw only, with ``uid``: the gid tool processes run as (never 0); default ``uid``'s number."""


class SandboxSettings(BaseModel):
    """``[sandbox]``: the sandbox a call runs in; every default is the hardened one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str = DEFAULT_IMAGE
    """Local image to run (``callbox image build`` makes the default one)."""
    memory: ByteSize = _spec_default("memory")
    """Memory limit (``"512m"`` or bytes); swap is set equal to it. Default 512m."""
    cpus: float = _spec_default("cpus")
    """CPU quota in cores. Default 1."""
    pids: int = _spec_default("pids")
    """Maximum number of processes and threads. Default 256."""
    network: Literal["none", "allowlist", "open"] = _spec_default("network")
    """Network mode: ``none`` (default), ``allowlist`` (egress through the filtering proxy to
    ``allow_hosts`` only) or ``open``; anything but ``none`` is logged as loosening."""
    allow_hosts: tuple[str, ...] = ()
    """Egress allowlist (``HOST[:PORT]``, ``*.example.com``) for ``network = "allowlist"``;
    an entry without a port allows 80 and 443."""
    mounts: tuple[MountSetting, ...] = ()
    """Bind mounts (``[[sandbox.mounts]]``), each read-only unless ``mode = "rw"``."""
    allowed_mount_roots: tuple[Path, ...] | None = None
    """If set, every mount source must lie under one of these host directories."""
    workdir: str = _spec_default("workdir")
    """Working directory of commands; relative paths in calls and rules are taken against it."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for commands; nothing from the host is passed."""
    tmp_size: ByteSize | None = None
    """Size of the /tmp tmpfs; default an eighth of the memory limit."""
    workspace_size: ByteSize | None = None
    """Size of the scratch workspace tmpfs; default a quarter of the memory limit."""
    home_size: ByteSize | None = None
    """Size of the home directory tmpfs; default a sixteenth of the memory limit."""
    noexec: bool = _spec_default("noexec")
    """Mount /workspace, /tmp and the home directory noexec (a tightening; see SandboxSpec.noexec)."""
    nofile: int = _spec_default("nofile")
    """Open files per process. Default 1024."""
    fsize: ByteSize = _spec_default("fsize")
    """Largest file a process may write (``"1g"`` or bytes). Default 1g."""
    ttl_seconds: int = _spec_default("ttl_seconds")
    """After this many seconds the sandbox is expired and ``callbox gc`` removes it."""

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"workdir {value!r} must be an absolute path inside the sandbox")
        return "/" + posixpath.normpath(value).lstrip("/")


# --- [tools] -----------------------------------------------------------------------------------


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


# --- [budgets] ---------------------------------------------------------------------------------


class CallTimeout(NamedTuple):
    """The timeout a call runs with, and whether the ceiling cut the one it asked for."""

    seconds: float
    requested: float | None
    clamped: bool

    def meta(self) -> dict[str, Any]:
        """For ``ToolResult.meta``: empty unless the request was clamped."""
        if not self.clamped:
            return {}
        return {"timeout_clamped": {"requested_s": self.requested, "ceiling_s": self.seconds}}


class Budgets(BaseModel):
    """``[budgets]``: limits per run and per call."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tool_calls: int = Field(default=200, ge=1)
    """Tool calls per run; call number max_tool_calls + 1 is denied (``budgets.max_tool_calls``)."""
    max_wall_time_s: float = Field(default=3600, gt=0)
    """Seconds per run; once they have passed every further call is denied."""
    call_timeout_ceiling_s: float = Field(default=600, gt=0)
    """Longest timeout a call may have; a call asking more runs with this (clamped, noted in meta)."""
    default_call_timeout_s: float = Field(default=30, gt=0)
    """Timeout of a call that does not ask for one."""
    max_output_bytes: int = Field(default=30000, ge=256)
    """Bytes of result text returned to the model per call (head and tail kept)."""

    @model_validator(mode="after")
    def _default_under_ceiling(self) -> Budgets:
        if self.default_call_timeout_s > self.call_timeout_ceiling_s:
            raise ValueError(
                f"default_call_timeout_s ({self.default_call_timeout_s:g}) is above call_timeout_ceiling_s "
                f"({self.call_timeout_ceiling_s:g}); lower the default or raise the ceiling"
            )
        return self

    def check(self, calls_so_far: int, elapsed_s: float) -> Decision | None:
        """A DENY naming the budget when a run with ``calls_so_far`` calls made and
        ``elapsed_s`` seconds spent may not make another call; else None."""
        if calls_so_far >= self.max_tool_calls:
            return Decision(
                Action.DENY,
                "budgets.max_tool_calls",
                f"denied: this run has used its budget of {self.max_tool_calls} tool calls "
                "(budgets.max_tool_calls); finish with what you have",
            )
        if elapsed_s >= self.max_wall_time_s:
            return Decision(
                Action.DENY,
                "budgets.max_wall_time_s",
                f"denied: this run has used its wall-time budget of {self.max_wall_time_s:g} s "
                "(budgets.max_wall_time_s); finish with what you have",
            )
        return None

    def call_timeout(self, requested_s: float | None) -> CallTimeout:
        """The timeout to run a call with: the default when none is asked, else at most the ceiling."""
        if requested_s is None:
            return CallTimeout(self.default_call_timeout_s, None, clamped=False)
        if requested_s <= 0:
            raise ValueError(f"a call timeout must be positive, got {requested_s}")
        if requested_s > self.call_timeout_ceiling_s:
            return CallTimeout(self.call_timeout_ceiling_s, requested_s, clamped=True)
        return CallTimeout(requested_s, requested_s, clamped=False)


# --- the policy --------------------------------------------------------------------------------


class Policy(BaseModel):
    """A whole policy file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    """``[sandbox]``: resources, mounts, network, environment of each sandbox."""
    allowed_tools: tuple[str, ...] | None = None
    """Tools exposed in the run; absent means every registered tool."""
    default_decision: Action = Action.ALLOW
    """Decision for a tool without ``[tools.NAME] decision``."""
    tools: dict[str, ToolPolicy] = Field(default_factory=dict)
    """``[tools.NAME]``: per-tool decision and argument rules."""
    budgets: Budgets = Field(default_factory=Budgets)
    """``[budgets]``: per-run and per-call limits."""

    @field_validator("allowed_tools")
    @classmethod
    def _tool_names(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for name in value or ():
            _check_tool_name(name)
        return value

    @field_validator("tools")
    @classmethod
    def _tool_keys(cls, value: dict[str, ToolPolicy]) -> dict[str, ToolPolicy]:
        for name in value:
            _check_tool_name(name)
        return value

    # -- authorization --

    def tool_allowed(self, name: str) -> bool:
        """Whether ``allowed_tools`` exposes the tool in this run."""
        return self.allowed_tools is None or name in self.allowed_tools

    def decide(
        self,
        definition: PolicyTarget,
        args: Mapping[str, Any] | BaseModel,
        *,
        workdir: str | None = None,
    ) -> Decision:
        """The decision for one call of ``definition`` with (validated) ``args``.

        ``args`` is the arguments dict or the validated input model (then defaults count).
        ``workdir`` overrides ``sandbox.workdir`` for relative paths (when the caller runs
        the sandbox with another one). Budgets are checked separately (:meth:`authorize`).
        """
        name = definition.name
        if self.allowed_tools is not None and name not in self.allowed_tools:
            return _not_allowed_decision(name, self.allowed_tools)
        tool = self.tools.get(name)
        if tool is None:
            return _tool_decision(name, self.default_decision, from_tool=False)
        if not tool.rules:
            return _tool_decision(name, tool.decision or self.default_decision, from_tool=tool.decision is not None)
        return self._apply_rules(definition, tool, args, workdir or self.sandbox.workdir)

    def authorize(
        self,
        definition: PolicyTarget,
        args: Mapping[str, Any] | BaseModel,
        *,
        calls_so_far: int,
        elapsed_s: float,
        workdir: str | None = None,
    ) -> Decision:
        """Budgets first (a spent budget denies any call), then :meth:`decide`."""
        return self.budgets.check(calls_so_far, elapsed_s) or self.decide(definition, args, workdir=workdir)

    def _apply_rules(
        self, definition: PolicyTarget, tool: ToolPolicy, args: Mapping[str, Any] | BaseModel, workdir: str
    ) -> Decision:
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
            return _tool_decision(
                definition.name, tool.decision or self.default_decision, from_tool=tool.decision is not None
            )
        return _rule_decision(definition.name, *best)

    def check_tools(self, definitions: Iterable[PolicyTarget]) -> None:
        """Refuse a policy that names tools the registry lacks, or whose rules can never apply
        (a command rule for a tool without a command argument, a path rule for one without
        path arguments): a typo must not silently switch a deny rule off."""
        by_name = {d.name: d for d in definitions}
        problems: list[str] = []
        for name in self.allowed_tools or ():
            if name not in by_name:
                problems.append(f"allowed_tools names {name!r}, which is not a registered tool")
        for name, tool in self.tools.items():
            key = render_path(("tools", name))
            definition = by_name.get(name)
            if definition is None:
                problems.append(f"[{key}] is for {name!r}, which is not a registered tool")
                continue
            for index, rule in enumerate(tool.rules):
                if rule.command is not None and definition.command_field is None:
                    problems.append(f"{key}.rules[{index}] is a command rule, but {name!r} takes no command")
                if rule.path is not None and not definition.path_fields:
                    problems.append(f"{key}.rules[{index}] is a path rule, but {name!r} takes no paths")
        if problems:
            known = ", ".join(sorted(by_name)) or "none"
            raise PolicyError(f"policy: {'; '.join(problems)} (registered tools: {known}); fix or remove these keys")

    # -- sandbox --

    def sandbox_spec(self) -> SandboxSpec:
        """The :class:`SandboxSpec` these settings describe; a bad value is a PolicyError naming its key."""
        s = self.sandbox
        mounts: list[Mount] = []
        for index, m in enumerate(s.mounts):
            try:
                mounts.append(Mount(source=m.source, target=m.target, read_only=m.mode == "ro", uid=m.uid, gid=m.gid))
            except ValidationError as exc:
                prefix = f"sandbox.mounts[{index}]"
                problems = [_under(prefix, p) for p in describe_validation_error(exc, Mount, noun="key")]
                raise PolicyError("; ".join(problems)) from None
        try:
            return SandboxSpec(
                image=s.image,
                memory=s.memory,
                cpus=s.cpus,
                pids=s.pids,
                network=s.network,
                allow_hosts=s.allow_hosts,
                mounts=tuple(mounts),
                allowed_mount_roots=s.allowed_mount_roots,
                workdir=s.workdir,
                env=dict(s.env),
                tmp_size=s.tmp_size,
                workspace_size=s.workspace_size,
                home_size=s.home_size,
                noexec=s.noexec,
                nofile=s.nofile,
                fsize=s.fsize,
                ttl_seconds=s.ttl_seconds,
            )
        except ValidationError as exc:
            problems = [_under("sandbox", p) for p in describe_validation_error(exc, SandboxSpec, noun="key")]
            raise PolicyError("; ".join(problems)) from None

    def host_checked_spec(self, host: HostLimits | None = None) -> SandboxSpec:
        """:meth:`sandbox_spec` checked against ``host`` (default this machine): mounts exist,
        are allowed and writable by the tool user, cpus and memory fit; a PolicyError names the key."""
        try:
            return self.sandbox_spec().for_host(host)
        except SpecError as exc:
            raise PolicyError(f"key 'sandbox.{exc.key}': {exc.message}") from None

    def loosened(self) -> list[str]:
        """One note per setting looser than the hardened defaults, naming its key."""
        s = self.sandbox
        notes = [
            f"sandbox.mounts[{i}] mounts {m.source} read-write at {m.target}"
            for i, m in enumerate(s.mounts)
            if m.mode == "rw"
        ]
        if s.network != "none":
            notes.append(f'sandbox.network = "{s.network}" (the default is "none")')
        for key, show in (
            ("memory", format_size),
            ("cpus", _plain),
            ("pids", _plain),
            ("nofile", _plain),
            ("fsize", format_size),
        ):
            value, default = getattr(s, key), _spec_default(key)
            if value > default:
                notes.append(f"sandbox.{key} = {show(value)} is above the default {show(default)}")
        return notes


def _plain(value: float) -> str:
    return f"{value:g}"


def _under(prefix: str, problem: str) -> str:
    """Put a problem's key path (relative to a SandboxSpec or Mount) under ``prefix``."""
    for lead in ("key '", "missing required key '", "unexpected key '"):
        if problem.startswith(lead):
            return f"{lead}{prefix}." + problem.removeprefix(lead)
    return f"{prefix}: {problem}"


def _check_tool_name(name: str) -> None:
    if TOOL_NAME_PATTERN.fullmatch(name) is None:
        raise ValueError(
            f"{name!r} is not a tool name (1 to 64 letters, digits, '_', '.', '-'; see `callbox tools`)"
        )


# --- evaluating rules ----------------------------------------------------------------------------


def _get(args: Mapping[str, Any] | BaseModel, field: str) -> Any:
    if isinstance(args, BaseModel):
        return getattr(args, field, None)
    return args.get(field)


def _normalize_command(command: str) -> str:
    return " ".join(command.split())


def _command_of(definition: PolicyTarget, args: Mapping[str, Any] | BaseModel) -> str | None:
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
def _tool_decision(tool: str, action: Action, *, from_tool: bool) -> Decision:
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


def _not_allowed_decision(tool: str, allowed: tuple[str, ...]) -> Decision:
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


# --- loading -------------------------------------------------------------------------------------


def _default_policy_where() -> str:
    return str(resources.files("harness").joinpath(DEFAULT_POLICY_RESOURCE))


def load_policy(path: Path | None = None, *, host: HostLimits | None = None) -> Policy:
    """Read and validate a policy file (None: the packaged default), check its sandbox
    against ``host`` (default this machine) and log its loosenings."""
    if path is None:
        data = resources.files("harness").joinpath(DEFAULT_POLICY_RESOURCE).read_bytes()
        label, base_dir = f"default policy {_default_policy_where()}", None
    else:
        path = Path(path)
        label = f"policy file {path}"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise PolicyError(
                f"{label} does not exist; pass an existing TOML file to --policy, "
                "or leave --policy out to use the default policy"
            ) from None
        except IsADirectoryError:
            raise PolicyError(f"{label} is a directory; pass the policy's TOML file") from None
        except OSError as exc:
            raise PolicyError(f"{label} cannot be read: {exc.strerror or exc}") from None
        base_dir = path.parent
    policy = parse_policy(data, source=label, base_dir=base_dir, host=host)
    for note in policy.loosened():
        log.warning("%s loosens a hardened default: %s", label, note)
    return policy


def parse_policy(text: str | bytes, *, source: str = "policy", base_dir: Path | None = None,
                 host: HostLimits | None = None) -> Policy:
    """Validate policy TOML and check its sandbox against ``host`` (default this machine);
    ``source`` names it in errors, ``base_dir`` anchors relative mount paths."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PolicyError(
                f"{source} is not UTF-8 text (bad byte at offset {exc.start}); save it as UTF-8"
            ) from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{source} is not valid TOML: {exc}; fix the syntax there") from None
    try:
        policy = Policy.model_validate(raw)
    except ValidationError as exc:
        problems = describe_validation_error(exc, Policy, noun="key", object_word="a table")
        raise PolicyError(_problems_message(source, problems)) from None
    if base_dir is not None:
        policy = _anchor_paths(policy, base_dir)
    try:
        policy.host_checked_spec(host)
    except PolicyError as exc:
        raise PolicyError(_problems_message(source, [exc.message])) from None
    return policy


def _problems_message(source: str, problems: list[str]) -> str:
    where = _default_policy_where()
    head = f"{source}: " if len(problems) == 1 else f"{source} has {len(problems)} problems: "
    return f"{head}{'; '.join(problems)} (every key is documented in the default policy, {where})"


def _anchor_paths(policy: Policy, base_dir: Path) -> Policy:
    def anchor(p: Path) -> Path:
        p = p.expanduser()
        return p if p.is_absolute() else base_dir / p

    s = policy.sandbox
    if not s.mounts and s.allowed_mount_roots is None:
        return policy
    sandbox = s.model_copy(
        update={
            "mounts": tuple(m.model_copy(update={"source": anchor(m.source)}) for m in s.mounts),
            "allowed_mount_roots": None
            if s.allowed_mount_roots is None
            else tuple(anchor(r) for r in s.allowed_mount_roots),
        }
    )
    return policy.model_copy(update={"sandbox": sandbox})
