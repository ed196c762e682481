"""``[memory]``: where the ``memory`` tool keeps a run's memories on this host, and how much.

The memory tool (:mod:`harness.tools.memory`, Anthropic's ``memory_20250818``) stores files
under ``/memories`` as the model sees them; on the host they live in one directory per
**memory scope**, under the state directory (``$XDG_STATE_HOME/callbox/memory``, see
:mod:`harness.core.state_dirs`) or ``[memory] root``, never in the disposable sandbox, so a
later run of the same scope reads what an earlier one wrote. The tool is served only to a
policy that names it (``allowed_tools``, or a ``[tools.memory]`` table); this table then says
which scope its runs share:

``scope = "project"`` (the default)
    Every run under a policy naming the same ``project`` shares one memory, whichever
    client or command started it: ``projects/<project>/``. ``project`` is a name the policy
    gives (default ``"default"``), so a project's runs find their memories however they are
    started; two policies that want separate memories give different names.
``scope = "client"``
    Each client has a memory of its own per project: ``clients/<client>/<project>/``. The
    client is the authenticated client of the door the run came through (the name of its
    gRPC, MCP or E2B bearer token); a run without a door (``callbox run``, ``callbox call``)
    is the client ``local``. A server serving several clients should use this scope: with
    ``project`` they all share one memory.

A scope directory holds ``memories/`` (the tree the model sees), ``tmp/`` (where a write is
made before it is renamed into place) and ``lock`` (taken by every command, so concurrent runs
of one scope, in any process, never interleave their changes). Names are made safe for a
directory by :func:`dir_name`. Caps: ``max_file_bytes`` per file, ``max_scope_bytes`` and
``max_entries`` (files and directories) per scope; a write that would pass one is refused and
the memory is left as it was.
"""

from __future__ import annotations

import hashlib
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from harness.core.state_dirs import state_dir
from harness.core.units import ByteSize

__all__ = ["LOCAL_CLIENT", "MemoryScope", "MemorySettings", "dir_name", "memory_root"]

LOCAL_CLIENT = "local"
"""The client of a run that came through no door (the command line)."""
_SAFE = frozenset(string.ascii_letters + string.digits + "_-")
_MAX_DIR_NAME = 200


class MemorySettings(BaseModel):
    """``[memory]``: the memory tool's scope, where it is kept, and its size caps."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scope: Literal["project", "client"] = "project"
    """Who shares a memory: ``project`` (every run of the policy's ``project``) or ``client``
    (each door client apart, per project; the command line's runs are the client ``local``)."""
    project: str = Field(default="default", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    """The name of the memory the policy's runs use (letters, digits, ``_``, ``.``, ``-``)."""
    root: Path | None = None
    """An absolute directory on this host holding the memories; absent: ``memory`` under the
    state directory (``$XDG_STATE_HOME/callbox``, else ``~/.local/state/callbox``)."""
    max_file_bytes: ByteSize = Field(default=256 << 10, ge=1)
    """The largest memory file a command may leave (``"256k"`` or bytes)."""
    max_scope_bytes: ByteSize = Field(default=16 << 20, ge=1)
    """The most file content one scope may hold, all its files together (``"16m"`` or bytes)."""
    max_entries: int = Field(default=1000, ge=1)
    """The most files and directories one scope may hold."""

    @field_validator("root")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        if value is not None and not value.expanduser().is_absolute():
            raise ValueError(f"{str(value)!r} is relative; give an absolute directory (or leave root out to "
                             "use the state directory)")
        return None if value is None else value.expanduser()


@dataclass(frozen=True)
class MemoryScope:
    """One resolved memory scope: its host directory, its name as the audit shows it, its caps."""

    directory: Path
    """The scope's directory (holding ``memories/``, ``tmp/`` and ``lock``); made on first use."""
    label: str
    """``project:NAME`` or ``client:CLIENT/NAME``: which memory a result was read from."""
    max_file_bytes: int
    max_scope_bytes: int
    max_entries: int

    @classmethod
    def of(cls, settings: MemorySettings, client: str | None) -> MemoryScope:
        """The scope ``settings`` give a run of ``client`` (None: the command line's, ``local``)."""
        root = memory_root(settings)
        project = dir_name(settings.project)
        if settings.scope == "client":
            who = client or LOCAL_CLIENT
            directory, label = root / "clients" / dir_name(who) / project, f"client:{who}/{settings.project}"
        else:
            directory, label = root / "projects" / project, f"project:{settings.project}"
        return cls(directory, label, settings.max_file_bytes, settings.max_scope_bytes, settings.max_entries)


def memory_root(settings: MemorySettings) -> Path:
    """The directory holding every scope of ``settings``."""
    return settings.root if settings.root is not None else state_dir() / "memory"


def dir_name(name: str) -> str:
    """``name`` as one safe, distinct directory name: letters, digits, ``_`` and ``-`` kept,
    every other byte as ``%XX`` (so ``.`` and ``..`` cannot be one), a long result hashed."""
    encoded = "".join(chr(b) if chr(b) in _SAFE else f"%{b:02X}" for b in name.encode("utf-8"))
    if not encoded:
        return "%"
    if len(encoded) > _MAX_DIR_NAME:
        return "sha256-" + hashlib.sha256(name.encode("utf-8")).hexdigest()
    return encoded
