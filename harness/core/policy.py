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

``[runtime]``
    The weakest OCI runtime a sandbox of this policy may run under (``runc`` < ``runsc``):
    ``require`` for every sandbox, in whichever door is served with this policy, and
    ``tools = { NAME = "runsc" }`` for a sandbox in which the tool is exposed (listed in
    ``allowed_tools``, or any tool when that is absent). ``[sandbox] runtime`` must meet
    them: a weaker one is a PolicyError naming both keys, when the policy loads and
    wherever a spec is made from it (a door's tightened policy, :meth:`Policy.sandbox_spec`);
    the command line's ``--runtime`` may not be weaker than the policy's runtime either.
    Nothing is ever moved to a stronger runtime on its own. ``runsc`` runs every network
    mode, on gVisor's own network stack (``make runsc``).

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
    returned to the model, ``default_call_timeout_s`` and ``call_timeout_ceiling_s``; the
    pictures a result may carry: ``max_image_bytes``, ``max_image_pixels``,
    ``max_images_per_result`` (:mod:`harness.core.images`). A
    call asking for a longer timeout than the ceiling is not refused: it runs with the
    ceiling, and its result tells the model (:class:`~harness.core.budgets.CallTimeout`).

``[actions.NAME]``
    Sandbox actions besides tool calls (:mod:`harness.core.actions`): ``process``,
    ``attach``, ``port_forward``, ``copy_in``, ``copy_out``, ``snapshot``, ``fork``,
    ``pause``, each with ``decision = "allow" | "ask" | "deny"`` (``port_forward`` is
    ``deny`` by default, the rest ``allow``; ``default_decision`` does not apply) and
    ``[[actions.NAME.rules]]`` on the action's details: ``ports`` for ``port_forward``,
    ``path`` for ``copy_in``/``copy_out``, ``command`` for ``process``. Letting ports be
    forwarded is a logged loosening. Each action is recorded in the audit store.

``[redaction]``
    Secrets taken out of every tool result before the model, a door or the audit store
    sees it (:mod:`harness.core.redaction`): ``builtin_patterns`` (the common token
    formats; on by default, turning them off is a logged loosening), ``secret_env`` (names
    of environment variables whose values are redacted; values under 8 characters are
    ignored) and ``patterns`` (regular expressions, checked when the policy loads).

``[checkpoints]``
    ``mode = "changes"`` records what each call of a tool not annotated read-only changes in
    the sandbox's writable places, for ``callbox diff`` and ``callbox revert``; ``max_bytes``
    caps the content a run's records hold (:mod:`harness.core.change_recorder`). Off by default.

``[acceptance]``
    Checks an agent run's final answer must pass, and ``max_rejections`` (:mod:`harness.core.acceptance`).

``engine`` and ``[ray]``
    Where the sandboxes run (:mod:`harness.engine.select`): absent or ``"docker"``, this
    machine's Docker engine; ``"ray"``, the Ray cluster ``[ray]`` describes. A command's
    ``--engine`` and a server configuration's ``engine`` win over the policy's.

:meth:`Policy.decide` is on every call's path: patterns are compiled once, when the
policy is validated, and the common case (no rules for the tool) is two dict lookups.
"""

from __future__ import annotations

import fnmatch
import logging
import posixpath
import re
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harness.audit.records import ACTION_TOOL_PREFIX
from harness.core.acceptance import AcceptancePolicy
from harness.core.actions import ActionsPolicy
from harness.core.budgets import Budgets, CallTimeout
from harness.core.calls import TOOL_NAME_PATTERN, Action, Decision
from harness.core.change_recorder import CheckpointSettings
from harness.core.declared import DeclaredTool
from harness.core.errors import CallboxError, ErrorCode
from harness.core.memory import MemorySettings
from harness.core.redaction import RedactionSettings
from harness.core.rules import (
    PolicyTarget,
    Rule,
    ToolPolicy,
    apply_rules,
    glob_to_regex,
    not_allowed_decision,
    takes_command,
    tool_decision,
)
from harness.core.sandbox_settings import MountSetting, PoolSettings, SandboxSettings
from harness.core.secrets import SecretSpec, sandbox_secrets, secret_problems
from harness.core.units import format_size
from harness.core.validation import describe_validation_error, parse_toml_model, render_path
from harness.engine.select import EngineName, RayTable
from harness.engine.spec import HostLimits, Mount, SandboxSpec, SpecError

__all__ = [
    "DEFAULT_POLICY_RESOURCE", "RUNTIME_STRENGTH",
    "Budgets",
    "CallTimeout",
    "MountSetting",
    "Policy",
    "PolicyError",
    "PolicyTarget",
    "Rule",
    "RuntimeRequirement",
    "SandboxSettings",
    "ToolPolicy",
    "glob_to_regex",
    "load_policy",
    "parse_policy",
]

log = logging.getLogger("callbox.policy")

DEFAULT_POLICY_RESOURCE = "data/default-policy.toml"


class PolicyError(CallboxError):
    """The policy cannot be loaded or used; the message names the file, the key and the fix."""

    code = ErrorCode.INVALID_CONFIG


def _spec_default(name: str) -> Any:
    return SandboxSpec.model_fields[name].default


RuntimeName = Literal["runc", "runsc"]
RUNTIME_STRENGTH: dict[str, int] = {"runc": 0, "runsc": 1}
"""How much each OCI runtime isolates the host from a tool: runc's namespaces and seccomp
on the host's kernel, then gVisor's user-space kernel in front of it."""


def weaker_runtime(asked: str, required: str) -> bool:
    """Whether runtime ``asked`` isolates less than ``required``."""
    return RUNTIME_STRENGTH[asked] < RUNTIME_STRENGTH[required]


class RuntimeRequirement(BaseModel):
    """``[runtime]``: the weakest OCI runtime this policy's sandboxes may run under."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    require: RuntimeName = "runc"
    """Every sandbox of this policy, in whichever door serves it (``runc``: no requirement)."""
    tools: dict[str, RuntimeName] = Field(default_factory=dict)
    """Per tool name: the runtime a sandbox needs in which that tool is exposed."""

    @field_validator("tools")
    @classmethod
    def _tool_names(cls, value: dict[str, RuntimeName]) -> dict[str, RuntimeName]:
        for name in value:
            _check_tool_name(name)
        return value


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
    redaction: RedactionSettings = Field(default_factory=RedactionSettings)
    """``[redaction]``: the secrets taken out of every tool result."""
    tool: tuple[DeclaredTool, ...] = ()
    """``[[tool]]``: the tools this policy declares (see :mod:`harness.core.declared`)."""
    secret: tuple[SecretSpec, ...] = ()
    """``[[secret]]``: carried by the egress proxy, the sandbox holding placeholders (:mod:`harness.engine.secrets`)."""
    actions: ActionsPolicy = Field(default_factory=ActionsPolicy)
    """``[actions.NAME]``: what may be done with a living sandbox (see :mod:`harness.core.actions`)."""
    pool: PoolSettings = Field(default_factory=PoolSettings)
    """``[pool]``: pre-started sandboxes a server's creates claim (off unless ``size`` > 0)."""
    runtime: RuntimeRequirement = Field(default_factory=RuntimeRequirement)
    """``[runtime]``: the weakest OCI runtime a sandbox may run under, for all or per tool."""
    checkpoints: CheckpointSettings = Field(default_factory=CheckpointSettings)
    """``[checkpoints]``: records of what each call changes in the writable places (off by default)."""
    memory: MemorySettings = Field(default_factory=MemorySettings)
    """``[memory]``: the memory tool's scope, kept on this host, and its caps (:mod:`harness.core.memory`)."""
    engine: EngineName | None = None
    """Where the sandboxes run: ``docker`` (this machine) or ``ray`` (``[ray]``); absent: docker."""
    ray: RayTable = None
    """``[ray]``: the Ray cluster of ``engine = "ray"`` (:mod:`harness.engine.ray.settings`)."""
    acceptance: AcceptancePolicy = Field(default_factory=AcceptancePolicy)
    """``[acceptance]``: checks every run's final answer must pass (:mod:`harness.core.acceptance`)."""

    @field_validator("allowed_tools")
    @classmethod
    def _tool_names(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for name in value or ():
            _check_tool_name(name)
        return value

    @field_validator("tool")
    @classmethod
    def _declared_names(cls, value: tuple[DeclaredTool, ...]) -> tuple[DeclaredTool, ...]:
        first: dict[str, int] = {}
        for index, declared in enumerate(value):
            if declared.name.startswith(ACTION_TOOL_PREFIX):
                raise ValueError(f"tool[{index}] is named {declared.name!r}, but names starting with "
                                 f"{ACTION_TOOL_PREFIX!r} are the audit's sandbox actions; give it another name")
            if declared.name in first:
                raise ValueError(f"tool[{first[declared.name]}] and tool[{index}] are both named "
                                 f"{declared.name!r}; give one of them another name")
            first[declared.name] = index
        return value

    @model_validator(mode="after")
    def _declared_paths(self) -> Policy:
        """A python tool's ``path`` must lie in a read-only mount (its code is not the model's to edit)."""
        mounts = [*self.sandbox.mounts, *(m for t in self.tool for m in t.mounts)]
        for index, declared in enumerate(self.tool):
            if declared.path is None:
                continue
            covering = [m for m in mounts if _within(declared.path, m.target)]
            if not covering:
                raise ValueError(f"key 'tool[{index}].path': {declared.path} is in no mount; provide it with "
                                 f'mounts = [{{ source = "HOST_DIR", target = "{declared.path}", mode = "ro" }}]')
            mount = max(covering, key=lambda m: len(m.target))
            if mount.mode != "ro":
                raise ValueError(f"key 'tool[{index}].path': {declared.path} is in the read-write mount at "
                                 f'{mount.target}; mount the code of a python tool with mode = "ro"')
        return self

    @field_validator("tools")
    @classmethod
    def _tool_keys(cls, value: dict[str, ToolPolicy]) -> dict[str, ToolPolicy]:
        for name in value:
            # A glob (``git__*``) names the tools it matches, an mcp server's tools.
            _check_tool_name(_GLOB_CHARS.sub("x", name) if _is_glob(name) else name)
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
        the sandbox with another one). Budgets are checked separately (:meth:`Budgets.check`).
        """
        name = definition.name
        if self.allowed_tools is not None and name not in self.allowed_tools:
            return not_allowed_decision(name, self.allowed_tools)
        entry = self.tool_entry(name)
        if entry is None:
            return tool_decision(name, self.default_decision, from_tool=False)
        key, tool = entry
        if not tool.rules:
            return tool.decision_without_rules(key, self.default_decision)
        return apply_rules(definition, tool, args, workdir=workdir or self.sandbox.workdir,
                           default=self.default_decision, entry=key)

    def tool_entry(self, name: str) -> tuple[str, ToolPolicy] | None:
        """The ``[tools.KEY]`` entry for the tool ``name``: its own, else the longest glob key
        (``git__*``, over an mcp server's tools) matching it (the first listed among equals)."""
        own = self.tools.get(name)
        if own is not None:
            return name, own
        globs = [key for key in self.tools if _is_glob(key) and fnmatch.fnmatchcase(name, key)]
        if not globs:
            return None
        key = max(globs, key=len)
        return key, self.tools[key]

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
            if _is_glob(name):
                matching = [d for tool_name, d in by_name.items() if fnmatch.fnmatchcase(tool_name, name)]
                if not matching:
                    problems.append(f"[{key}] is a glob that matches no registered tool")
                    continue
            elif name in by_name:
                matching = [by_name[name]]
            else:
                problems.append(f"[{key}] is for {name!r}, which is not a registered tool")
                continue
            for definition in matching:
                for index, rule in enumerate(tool.rules):
                    if rule.command is not None and not takes_command(definition):
                        problems.append(f"{key}.rules[{index}] is a command rule, but {definition.name!r} "
                                        "takes no command")
                    if rule.path is not None and not definition.path_fields:
                        problems.append(f"{key}.rules[{index}] is a path rule, but {definition.name!r} takes "
                                        "no paths")
        if problems:
            known = ", ".join(sorted(by_name)) or "none"
            raise PolicyError(f"policy: {'; '.join(problems)} (registered tools: {known}); fix or remove these keys")

    # -- sandbox --

    def required_runtime(self) -> tuple[RuntimeName, str | None]:
        """The strongest runtime ``[runtime]`` asks of this policy's sandboxes, and the key
        that asks it (None: nothing beyond runc is required)."""
        best: tuple[RuntimeName, str | None] = ("runc", None)
        if self.runtime.require != "runc":
            best = (self.runtime.require, "runtime.require")
        for name, runtime in self.runtime.tools.items():
            if self.tool_allowed(name) and weaker_runtime(best[0], runtime):
                best = (runtime, f"runtime.tools.{name}")
        return best

    def check_runtime(self, runtime: str, network: str = "none", *, asked_by: str = "sandbox.runtime") -> None:
        """Refuse a sandbox under ``runtime`` (with ``network``) that this policy does not
        allow: a runtime weaker than ``[runtime]`` requires.
        ``asked_by`` names what asked for it in the message (``--runtime``). A PolicyError;
        the runtime is never raised on the caller's behalf."""
        required, key = self.required_runtime()
        if key is not None and weaker_runtime(runtime, required):
            raise PolicyError(f"{asked_by} {runtime!r} is weaker than {required!r}, which {key} requires of "
                              f"this policy's sandboxes; use runtime {required!r} (set sandbox.runtime = "
                              f"\"{required}\" or pass --runtime {required}), or change {key}")

    def sandbox_spec(self) -> SandboxSpec:
        """The :class:`SandboxSpec` these settings describe; a bad value is a PolicyError naming its key."""
        mounts: list[Mount] = []
        for key, setting in self.mount_settings():
            try:
                mounts.append(setting.mount())
            except ValidationError as exc:
                raise _spec_error(exc, Mount, key) from None
        try:
            spec = self.sandbox.spec(tuple(mounts), sandbox_secrets(self))
        except ValidationError as exc:
            raise _spec_error(exc, SandboxSpec, "sandbox") from None
        self.check_runtime(spec.runtime, spec.network)
        return spec

    def host_checked_spec(self, host: HostLimits | None = None) -> SandboxSpec:
        """:meth:`sandbox_spec` checked against ``host`` (default this machine): mounts exist,
        are allowed and writable by the tool user, cpus and memory fit; a PolicyError names the key."""
        try:
            return self.sandbox_spec().for_host(host)
        except SpecError as exc:
            raise PolicyError(f"key '{self._spec_key(exc.key)}': {exc.problem}") from None

    def mount_settings(self) -> list[tuple[str, MountSetting]]:
        """Every mount of the run's sandbox with its key: ``[sandbox] mounts``, then the mounts
        of the declared tools ``allowed_tools`` exposes (one mount two tools share counts once).
        Two different mounts at one target are a PolicyError naming both keys."""
        out = [(f"sandbox.mounts[{i}]", m) for i, m in enumerate(self.sandbox.mounts)]
        for i, declared in enumerate(self.tool):
            # An mcp table is needed when allowed_tools exposes one of its server's tools.
            prefix = declared.name + "__"
            served = declared.kind == "mcp" and any(a.startswith(prefix) for a in self.allowed_tools or ())
            if not self.tool_allowed(declared.name) and not served:
                continue
            for j, mount in enumerate(declared.mounts):
                same = next(((key, m) for key, m in out if m.target.rstrip("/") == mount.target.rstrip("/")), None)
                if same is None:
                    out.append((f"tool[{i}].mounts[{j}]", mount))
                elif same[1] != mount:
                    raise PolicyError(f"tool[{i}].mounts[{j}] and {same[0]} both mount at {mount.target}, "
                                      "differently; a sandbox path takes one mount: use the same mount or "
                                      "another target")
        return out

    def _spec_key(self, key: str) -> str:
        """A SandboxSpec key (``mounts[3].source``) as the policy key that set it."""
        if key.startswith("mounts["):
            index, _, rest = key.removeprefix("mounts[").partition("]")
            keys = [k for k, _ in self.mount_settings()]
            if index.isdigit() and int(index) < len(keys):
                return keys[int(index)] + rest
        return f"sandbox.{key}"

    def loosened(self) -> list[str]:
        """One note per setting looser than the hardened defaults, naming its key."""
        s = self.sandbox
        notes = [
            f"{key} mounts {m.source} read-write at {m.target}"
            for key, m in self.mount_settings()
            if m.mode == "rw"
        ]
        if s.network != "none":
            notes.append(f'sandbox.network = "{s.network}" (the default is "none")')
        for key, show in (("memory", format_size), ("cpus", _PLAIN), ("pids", _PLAIN), ("nofile", _PLAIN),
                          ("fsize", format_size)):
            value, default = getattr(s, key), _spec_default(key)
            if value > default:
                notes.append(f"sandbox.{key} = {show(value)} is above the default {show(default)}")
        notes.extend(s.opt_ins())
        if not self.redaction.builtin_patterns:
            notes.append("redaction.builtin_patterns = false: tool results keep cloud keys, tokens, private keys "
                         "and JWTs (the default is true)")
        notes.extend(self.actions.loosened())
        return notes + (self.ray.loosened() if self.ray is not None else [])


def _within(path: str, target: str) -> bool:
    target = "/" + posixpath.normpath(target).strip("/")
    return target in (path, "/") or path.startswith(target + "/")


def _spec_error(exc: ValidationError, model: type[BaseModel], prefix: str) -> PolicyError:
    """``exc`` (of the spec's ``model``) as a PolicyError whose keys are under ``prefix``."""
    return PolicyError("; ".join(_under(prefix, p) for p in describe_validation_error(exc, model, noun="key")))


def _under(prefix: str, problem: str) -> str:
    """Put a problem's key path (relative to a SandboxSpec or Mount) under ``prefix``."""
    for lead in ("key '", "missing required key '", "unexpected key '"):
        if problem.startswith(lead):
            return f"{lead}{prefix}." + problem.removeprefix(lead)
    return f"{prefix}: {problem}"


_GLOB_CHARS = re.compile(r"[*?]")
_PLAIN = "{:g}".format


def _is_glob(key: str) -> bool:
    """A ``[tools.KEY]`` key with ``*`` or ``?``: a glob over tool names (:func:`fnmatch.fnmatchcase`)."""
    return _GLOB_CHARS.search(key) is not None


def _check_tool_name(name: str) -> None:
    if TOOL_NAME_PATTERN.fullmatch(name) is None:
        raise ValueError(f"{name!r} is not a tool name (1 to 64 letters, digits, '_', '.', '-'; see `callbox tools`)")


# --- loading -------------------------------------------------------------------------------------


def _default_policy_where() -> str:
    return str(resources.files("harness").joinpath(DEFAULT_POLICY_RESOURCE))


def load_policy(path: Path | None = None, *, host: HostLimits | None = None) -> Policy:
    """Read and validate a policy file (None: the packaged default), check its sandbox
    against ``host`` (default this machine) and its secrets, and log its loosenings."""
    if path is None:
        data = resources.files("harness").joinpath(DEFAULT_POLICY_RESOURCE).read_bytes()
        label, base_dir = f"default policy {_default_policy_where()}", None
    else:
        path = Path(path)
        label = f"policy file {path}"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise PolicyError(f"{label} does not exist; pass an existing TOML file to --policy, "
                              "or leave --policy out to use the default policy") from None
        except IsADirectoryError:
            raise PolicyError(f"{label} is a directory; pass the policy's TOML file") from None
        except OSError as exc:
            raise PolicyError(f"{label} cannot be read: {exc.strerror or exc}") from None
        base_dir = path.parent
    policy = parse_policy(data, source=label, base_dir=base_dir, host=host)
    if (problem := secret_problems(policy)) is not None:  # a value that cannot be read fails now, not at a call
        raise PolicyError(_problems_message(label, [problem]))
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
    policy = parse_toml_model(text, Policy, source=source, error=PolicyError, message=_problems_message)
    try:
        policy = _anchor_paths(policy, base_dir) if base_dir is not None else policy
        policy.host_checked_spec(host)
    except (PolicyError, ValueError) as exc:  # ValueError: the [ray] token file, once anchored
        raise PolicyError(_problems_message(source, [str(exc)])) from None
    return policy


def _problems_message(source: str, problems: list[str]) -> str:
    where = _default_policy_where()
    head = f"{source}: " if len(problems) == 1 else f"{source} has {len(problems)} problems: "
    return f"{head}{'; '.join(problems)} (every key is documented in the default policy, {where})"


def _anchor_paths(policy: Policy, base_dir: Path) -> Policy:
    def anchor(p: Path) -> Path:
        p = p.expanduser()
        return p if p.is_absolute() else base_dir / p

    if policy.ray is not None:
        policy = policy.model_copy(update={"ray": policy.ray.anchored(base_dir)})

    if policy.tool:
        tools = tuple(t.model_copy(update={"mounts": tuple(
            m.model_copy(update={"source": anchor(m.source)}) for m in t.mounts)}) for t in policy.tool)
        policy = policy.model_copy(update={"tool": tools})
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
