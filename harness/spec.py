"""What a sandbox is allowed: resources, mounts, network, environment (validated by pydantic).

Every default here is the secure one from DESIGN 4; the engine turns a spec into
container settings. A spec that loosens a default says so in ``loosened()`` so the
engine can log it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from harness.units import ByteSize

DEFAULT_IMAGE = "callbox-sandbox:latest"
AGENT_DIR = "/run/callbox"
TOOL_UID = 1000
TOOL_GID = 1000

# Host paths that are never mounted into a sandbox, whatever the policy says: these
# system trees and anything under them, and these directories themselves.
FORBIDDEN_HOST_TREES = ("/proc", "/sys", "/dev", "/run", "/var/run", "/boot", "/etc")
FORBIDDEN_HOST_DIRS = ("/", "/root", "/home", "/usr", "/var", "/opt", "/bin", "/sbin", "/lib", "/lib64")
# Container paths a mount may not cover.
RESERVED_TARGETS = ("/", "/proc", "/sys", "/dev", AGENT_DIR, "/etc", "/usr", "/bin", "/sbin", "/lib", "/opt")

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Mount(BaseModel):
    """A host directory or file bind-mounted into the sandbox."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: Path
    """Host path; canonicalized (symlinks resolved) and checked before use."""
    target: str
    """Absolute path inside the sandbox."""
    read_only: bool = True
    """Mounted read-only unless the policy says ``rw``."""

    @classmethod
    def parse(cls, text: str) -> Mount:
        """Parse ``HOST:CONTAINER[:ro|rw]`` (the ``--mount`` flag)."""
        parts = text.split(":")
        mode = "ro"
        if len(parts) == 3:
            mode = parts.pop()
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise ValueError(f"--mount {text!r}: use HOST:CONTAINER[:ro|rw]")
        if mode not in ("ro", "rw"):
            raise ValueError(f"--mount {text!r}: the mode must be ro or rw, not {mode!r}")
        return cls(source=Path(parts[0]), target=parts[1], read_only=mode == "ro")

    @field_validator("target")
    @classmethod
    def _target_ok(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"mount target {value!r} must be an absolute path inside the sandbox")
        # normpath keeps a leading "//" (POSIX allows it); Docker does not: "//proc" is "/proc".
        norm = "/" + os.path.normpath(value).lstrip("/")
        for reserved in RESERVED_TARGETS:
            if norm == reserved or (reserved != "/" and norm.startswith(reserved + "/")):
                raise ValueError(f"mount target {value!r} would cover {reserved}, which the sandbox needs")
        return norm

    def canonical(self, allowed_roots: tuple[Path, ...] | None) -> Mount:
        """Resolve the host path and refuse dangerous or unlisted ones."""
        try:
            source = self.source.expanduser().resolve(strict=True)
        except (FileNotFoundError, NotADirectoryError):
            raise ValueError(f"mount source {self.source} does not exist on the host") from None
        except (OSError, RuntimeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ValueError(f"mount source {self.source} cannot be used: {reason}") from None
        text = str(source)
        if text in FORBIDDEN_HOST_DIRS or any(text == p or text.startswith(p + "/") for p in FORBIDDEN_HOST_TREES):
            raise ValueError(f"mount source {source} is a system path and is never mounted into a sandbox")
        if source.is_socket() or "docker.sock" in text:
            raise ValueError(f"mount source {source} is a socket; sockets are never mounted into a sandbox")
        if allowed_roots is not None and not any(
            source.is_relative_to(r.expanduser().resolve()) for r in allowed_roots
        ):
            roots = ", ".join(str(r) for r in allowed_roots)
            raise ValueError(f"mount source {source} is outside the allowed mount roots ({roots})")
        return self.model_copy(update={"source": source})


class SandboxSpec(BaseModel):
    """Settings of one sandbox; the defaults are the hardened ones."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str = DEFAULT_IMAGE
    """Local image to run (there is no registry: build it with ``callbox image build``)."""
    memory: ByteSize = Field(default=512 << 20, ge=32 << 20)
    """Memory limit in bytes; swap is set equal to it (no swap)."""
    cpus: float = Field(default=1.0, gt=0, le=64)
    """CPU quota in cores."""
    pids: int = Field(default=256, ge=8, le=65536)
    """Maximum number of processes and threads."""
    network: Literal["none", "allowlist", "open"] = "none"
    """Network mode: ``none`` (no network at all), ``allowlist`` (HTTP(S) egress only through
    callbox's filtering proxy, to the hosts in ``allow_hosts``), ``open`` (a bridge of its own
    with outside access; the host, other sandboxes and link-local metadata stay unreachable)."""
    allow_hosts: tuple[str, ...] = ()
    """Egress allowlist for ``network = allowlist``: ``HOST[:PORT]`` entries, ``*.example.com``
    wildcards (subdomains, not the apex), case-insensitive; without a port, 80 and 443."""
    mounts: tuple[Mount, ...] = ()
    """Bind mounts, each read-only unless marked rw."""
    allowed_mount_roots: tuple[Path, ...] | None = None
    """If set, every mount source must lie under one of these host directories."""
    workdir: str = "/workspace"
    """Working directory of commands (a scratch tmpfs unless a mount covers it)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment for commands; nothing from the host is passed."""
    tmp_size: ByteSize | None = None
    """Size of /tmp (tmpfs); default an eighth of the memory limit."""
    workspace_size: ByteSize | None = None
    """Size of the scratch workspace (tmpfs); default a quarter of the memory limit."""
    nofile: int = Field(default=1024, ge=64)
    """Open files per process."""
    fsize: ByteSize = Field(default=1 << 30, ge=1 << 20)
    """Largest file a process may write, in bytes."""
    ttl_seconds: int = Field(default=3600, ge=10)
    """After this the sandbox is expired and ``callbox gc`` removes it."""

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name, val in value.items():
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"environment variable name {name!r} is not valid")
            if "\0" in val:
                raise ValueError(f"environment variable {name} contains a NUL byte")
        return value

    @field_validator("workdir")
    @classmethod
    def _workdir_abs(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"workdir {value!r} must be an absolute path inside the sandbox")
        return os.path.normpath(value)

    @field_validator("allow_hosts")
    @classmethod
    def _allow_hosts_valid(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from sandbox.egress import Allowlist  # the proxy's own parser: one syntax on both sides

        Allowlist.parse(value)
        return value

    @model_validator(mode="after")
    def _network_consistent(self) -> SandboxSpec:
        if self.network == "allowlist" and not self.allow_hosts:
            raise ValueError(
                "network 'allowlist' needs at least one allowed host (--allow-host HOST[:PORT], "
                "or allow_hosts in the policy); with none, use network 'none'"
            )
        if self.allow_hosts and self.network != "allowlist":
            raise ValueError(
                f"allow_hosts only apply to network 'allowlist', but the network is {self.network!r}; "
                "set network = 'allowlist' (--network allowlist) or drop the hosts"
            )
        for size_name in ("tmp_size", "workspace_size"):
            size = getattr(self, size_name)
            if size is not None and size >= self.memory:
                raise ValueError(
                    f"{size_name} must be smaller than the memory limit (tmpfs pages count against it)"
                )
        if self.tmpfs_total > self.memory // 2:
            raise ValueError(
                f"the tmpfs mounts would take {self.tmpfs_total >> 20} MiB of the {self.memory >> 20} MiB "
                "memory limit (tmpfs pages count against it); keep tmp_size + workspace_size under half "
                "of memory, or raise memory"
            )
        return self

    @property
    def effective_tmp_size(self) -> int:
        return self.tmp_size if self.tmp_size is not None else self.memory // 8

    @property
    def effective_workspace_size(self) -> int:
        return self.workspace_size if self.workspace_size is not None else self.memory // 4

    @property
    def small_tmpfs_size(self) -> int:
        """Size of the home directory tmpfs and of /dev/shm each."""
        return min(16 << 20, self.memory // 16)

    @property
    def tmpfs_total(self) -> int:
        """Memory all tmpfs mounts can pin: /tmp, the workspace, the home directory, /dev/shm.
        Filling them must leave room for the agent, or the OOM killer has nothing to free."""
        return self.effective_tmp_size + self.effective_workspace_size + 2 * self.small_tmpfs_size

    def loosened(self) -> list[str]:
        """Settings that are looser than the DESIGN 4 defaults (the engine logs them)."""
        notes = []
        if any(not m.read_only for m in self.mounts):
            notes.append("read-write mount(s): " + ", ".join(m.target for m in self.mounts if not m.read_only))
        if self.network == "allowlist":
            notes.append(f"network allowlist ({', '.join(self.allow_hosts)})")
        elif self.network != "none":
            notes.append(f"network {self.network}")
        return notes


