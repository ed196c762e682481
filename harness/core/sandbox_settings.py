"""``[sandbox]``: the sandbox settings a policy writes, and the :class:`SandboxSpec` they make.

The settings are :class:`~harness.engine.spec.SandboxFields`: the spec's own fields, with
the same names, types, defaults and docs, so a setting is written once, in the spec. They
differ from the spec in two ways only:

* mounts are :class:`MountSetting` entries (``mode = "ro" | "rw"``) where the spec has
  :class:`~harness.engine.spec.Mount` (``read_only``);
* nothing beyond the types is checked when the policy is read: the bounds (``memory`` at
  least 32m, ``pids`` at most 65536, ...) and the spec's validators apply when the spec is
  built from the settings (:meth:`SandboxSettings.spec`), where the policy reports a
  problem under its key (``sandbox.pids``), and where a client's overrides of a server's
  settings (the gRPC door) are checked the same way.

The policy's own rules on top: sizes take ``"512m"`` or bytes; ``workdir`` must be an
absolute path (relative paths in calls and rules are taken against it); relative mount
sources and ``allowed_mount_roots`` are taken against the policy file's directory.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import annotated_types
from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator
from pydantic.fields import FieldInfo

from harness.core.root_commands import ROOT_COMMANDS_LOOSENED
from harness.engine.secrets import SecretSpec
from harness.engine.spec import Mount, SandboxFields, SandboxSpec

__all__ = ["MountSetting", "PoolSettings", "SandboxSettings"]


class MountSetting(BaseModel):
    """One ``[[sandbox.mounts]]`` entry: a :class:`~harness.engine.spec.Mount` as a policy
    spells it (``mode`` where the Mount has ``read_only``), checked when it becomes one.

    Not derived from Mount: its keys differ (``mode``) and their order is part of what an
    unknown key's message lists; :meth:`mount` takes every other field across by name,
    and a test holds the two field lists together."""

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

    def mount(self) -> Mount:
        """The Mount this entry describes; a value it refuses is a ``ValidationError`` of Mount."""
        same = {name: getattr(self, name) for name in type(self).model_fields if name != "mode"}
        return Mount(**same, read_only=self.mode == "ro")


def _unbounded(info: FieldInfo) -> tuple[Any, FieldInfo]:
    """A field's type and default without its bounds (``ge``, ``le``, ...); validators that
    parse a value (a size's ``"512m"``) are kept."""
    kept = [m for m in info.metadata if not isinstance(m, annotated_types.BaseMetadata)]
    annotation = Annotated[(info.annotation, *kept)] if kept else info.annotation
    if info.default_factory is not None:
        return annotation, Field(default_factory=info.default_factory)
    return annotation, Field(default=info.default)


if TYPE_CHECKING:
    # The type checker sees the fields as SandboxFields declares them; at run time they are
    # the same fields, without their bounds.
    _SettingsFields = SandboxFields[MountSetting]
else:
    _SettingsFields = create_model(
        "_SettingsFields",
        __config__=SandboxFields.model_config,
        __module__=__name__,
        **{name: _unbounded(info) for name, info in SandboxFields[MountSetting].model_fields.items()},
    )

_NOT_COPIED = frozenset({"mounts", "on_internet_request", "public_ports", "root_commands"})
"""Settings the spec does not take as written: ``mounts`` (converted by MountSetting.mount).
A setting only a policy has would be listed here too."""


class SandboxSettings(_SettingsFields):
    """``[sandbox]``: the sandbox a call runs in; every default is the hardened one. The
    fields and their docs are :class:`~harness.engine.spec.SandboxFields`'."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    on_internet_request: Literal["grant-policy", "refuse"] = "grant-policy"
    """What a client's request for more network than ``network`` gives gets (E2B's
    ``allow_internet_access = true`` when the network is ``none`` or ``allowlist``, an allowed
    destination when it is ``none``): ``grant-policy`` creates the sandbox with the policy's
    network and says so (in the server's log and the sandbox's info); ``refuse`` refuses the
    request, naming this key (see :mod:`harness.core.network_request`)."""
    public_ports: bool = False
    """Whether a sandbox's ports may be public: served through the E2B door to any client that
    reaches the server and names the sandbox and port, without its traffic access token (E2B's
    ``allow_public_traffic``, which E2B grants by default and the OpenAI Agents SDK asks for
    its exposed ports). ``false`` (the default) serves every port to its sandbox's owner only,
    whatever the client asks; ``true`` is a logged loosening, and a client may still keep its
    ports private (``allow_public_traffic = false``). Either way each request is the policy's
    ``port_forward`` action, authorized and audited."""
    root_commands: bool = False
    """Whether a client may start a command as ``root`` (E2B's ``user="root"``, which Harbor
    sends for every command) instead of the sandbox's unprivileged tool user; ``false`` (the
    default) refuses it naming this key, ``true`` is a logged loosening. Root here is uid 0
    with only the container's capabilities (CAP_SETUID, CAP_SETGID, CAP_KILL: no
    CAP_DAC_OVERRIDE, so file permissions apply to it as to any uid): the read-only root
    filesystem, the network mode, the memory, CPU and pids limits and the container's
    isolation from the host stay as they are. What it loosens is inside the sandbox: a root
    command can become any uid, kill or (where the kernel's ptrace rules let it) trace the
    sandbox's own agent, and leave its job's process group, so that sandbox's replies
    (output, exit codes, files) are only as trustworthy as the commands run in it. File
    operations act as the tool user: where this is true, one asked for as root is served as
    the tool user's, except a read that only root may do (a root-only file, a path outside
    the tool user's places), which a root command does with root's rights (see
    docs/security.md)."""

    def opt_ins(self) -> list[str]:
        """The logged loosenings among the settings only a policy has, one note each."""
        notes = []
        if self.root_commands:
            notes.append(ROOT_COMMANDS_LOOSENED)
        if self.public_ports:
            notes.append("sandbox.public_ports = true: a sandbox's ports are served through the E2B door to any "
                         "client that names them, without its traffic access token, unless its creator keeps them "
                         "private (the default is false: the owner only)")
        return notes

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"workdir {value!r} must be an absolute path inside the sandbox")
        return "/" + posixpath.normpath(value).lstrip("/")

    def spec(self, mounts: tuple[Mount, ...], secrets: tuple[SecretSpec, ...] = ()) -> SandboxSpec:
        """The SandboxSpec of these settings with ``mounts`` (these settings' mounts, each
        made by :meth:`MountSetting.mount`) and ``secrets``; a value the spec refuses is a
        ``ValidationError``."""
        values = {name: getattr(self, name) for name in type(self).model_fields if name not in _NOT_COPIED}
        return SandboxSpec(**values, mounts=mounts, secrets=secrets)


class PoolSettings(BaseModel):
    """``[pool]``: pre-started sandboxes of the ``[sandbox]`` spec that a server's creates
    claim (:mod:`harness.engine.docker.pool`). Off by default (``size = 0``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    size: int = Field(default=0, ge=0, le=1000)
    """The floor: how many never-used sandboxes are kept ready (0: no pool)."""
    max: int | None = Field(default=None, ge=0, le=1000)
    """The ceiling: creates that find the pool empty raise its target up to this (default: ``size``)."""
    pause_s: float = Field(default=0.05, ge=0.0, le=60.0)
    """Seconds the refill waits between two starts, and after a claim, before the next start."""
    code_interpreter: int = Field(default=0, ge=0, le=1000)
    """The E2B door only: how many ``code-interpreter-v1`` sandboxes are kept ready, their code
    interpreter's server and kernel started (0: none). Needs the code-interpreter image variant;
    without it the door says so once and creates them cold."""

    @property
    def ceiling(self) -> int:
        return self.size if self.max is None else self.max

    @property
    def enabled(self) -> bool:
        """Whether any sandbox is pooled (``size`` or ``code_interpreter`` above 0)."""
        return self.size > 0 or self.code_interpreter > 0

    def model_post_init(self, context: Any, /) -> None:
        if self.ceiling < self.size:
            raise ValueError(f"pool.max ({self.max}) must be at least pool.size ({self.size})")
