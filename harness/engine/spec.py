"""What a sandbox is allowed: resources, mounts, network, environment (validated by pydantic).

Every default here is the hardened one; the engine turns a spec into container settings.
A spec that loosens a default says so in ``loosened()`` so the engine can log it.

A ``SandboxSpec`` on its own checks only what needs no host. ``for_host`` checks it
against the machine that will run it (before any container starts): cpus and memory
within the host's, every mount source existing, canonical, allowed and no system path,
and every read-write mount writable by the tool user (``tool_identity``). Problems are
``SpecError``: a ``ValueError`` (so pydantic and flag parsing treat it as bad input) and
a ``CallboxError`` (one line, no traceback, wherever it surfaces).

Scratch places and mounts. ``/workspace``, ``/tmp`` and the home directory
(``/home/sandbox``) are size-limited tmpfs, ``nosuid,nodev`` and executable unless
``noexec``. A mount whose target is one of them, or a parent of one (a mount at
``/home``), replaces the tmpfs there: the mount wins, no tmpfs is mounted over it nor
inside it (with a mount at ``/home`` the home directory is whatever the host directory
holds at ``sandbox/``, possibly nothing). A mount below a scratch place
(``/workspace/project``) is mounted on top of the tmpfs, which stays around it.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from harness.core.errors import CallboxError, ErrorCode
from harness.core.units import ByteSize, format_size
from harness.engine.host_files import can_write, describe_owner, mount_fixes

# Re-exported: the host a spec is checked against, and whether its engine is local, are imported from here.
from harness.engine.host_limits import HostLimits as HostLimits  # noqa: PLC0414
from harness.engine.host_limits import docker_host_dirs
from harness.engine.host_limits import engine_is_local as engine_is_local  # noqa: PLC0414
from harness.engine.placement import Placement
from harness.engine.runsc_network import networked_refusal
from harness.engine.scratch_dirs import checked_scratch_dirs
from harness.engine.secrets import SecretSpec, secrets_problem

DEFAULT_IMAGE = "callbox-sandbox:latest"
AGENT_DIR = "/run/callbox"
TOOL_UID = 1000
TOOL_GID = 1000
WORKSPACE = "/workspace"
TMP = "/tmp"
HOME = "/home/sandbox"
SCRATCH_PLACES = (WORKSPACE, TMP, HOME)
"""Container paths that get a scratch tmpfs unless a mount covers them."""

MIN_CPUS = 0.01
"""The smallest CPU quota Docker accepts."""
MAX_ID = (1 << 32) - 2

# Host paths that are never mounted into a sandbox, whatever the policy says: these
# system trees and anything under them, and these directories themselves.
FORBIDDEN_HOST_TREES = ("/proc", "/sys", "/dev", "/run", "/var/run", "/boot", "/etc")
FORBIDDEN_HOST_DIRS = ("/", "/root", "/home", "/usr", "/var", "/opt", "/bin", "/sbin", "/lib", "/lib64")
# The container engine's own state and sockets: never mounted, nor anything under them,
# nor a directory holding them (mounting /var/lib would expose /var/lib/docker). The
# engine adds its data root (``docker info``) and DOCKER_HOST's socket directory.
DOCKER_TREES = ("/var/lib/docker", "/var/lib/containerd", "/run/docker", "/run/containerd", "/var/run/docker")
# Container paths a mount may not cover.
RESERVED_TARGETS = ("/", "/proc", "/sys", "/dev", AGENT_DIR, "/etc", "/usr", "/bin", "/sbin", "/lib", "/opt")

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MOUNT_SYNTAX = "HOST:CONTAINER[:ro|rw[,uid=N][,gid=N]]"


class SpecError(CallboxError, ValueError):
    """A spec that cannot run (on this host); ``key`` names the setting (``mounts[1].source``).
    The message stands alone (``memory 1t is more than ...``); :attr:`problem` is it for a
    caller that names the setting its own way (``--memory: 1t is more than ...``)."""

    code = ErrorCode.INVALID_REQUEST

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key

    @property
    def problem(self) -> str:
        """The message without the setting's name it starts with, if it does."""
        word = self.key.partition(".")[0].partition("[")[0]
        return self.message.removeprefix(f"{word} ")


def _within(path: str, parent: str) -> bool:
    """Whether container path ``path`` is ``parent`` or below it."""
    return parent in (path, "/") or path.startswith(parent + "/")


def _tree_conflict(source: str, tree: str) -> bool:
    """Whether mounting ``source`` exposes ``tree``: it is the tree, inside it, or holds it."""
    return _within(source, tree) or _within(tree, source)


class Mount(BaseModel):
    """A host directory or file bind-mounted into the sandbox."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: Path
    """Host path; canonicalized (symlinks resolved) and checked before use."""
    target: str
    """Absolute path inside the sandbox."""
    read_only: bool = True
    """Mounted read-only unless the policy says ``rw``."""
    uid: int | None = None
    """For a rw mount: the uid tool processes run as (never 0); default the owner of the
    first rw mount not owned by root, else 1000. Every rw mount must be writable by it."""
    gid: int | None = None
    """With ``uid``: the gid tool processes run as (never 0); default the same number as ``uid``."""

    @classmethod
    def parse(cls, text: str) -> Mount:
        """Parse ``HOST:CONTAINER[:ro|rw[,uid=N][,gid=N]]`` (the ``--mount`` flag)."""
        parts = text.split(":")
        options = parts.pop().split(",") if len(parts) == 3 else ["ro"]
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise ValueError(f"--mount {text!r}: use {_MOUNT_SYNTAX}")
        mode, ids = "ro", {}
        for option in options:
            name, sep, value = option.partition("=")
            if not sep and option in ("ro", "rw"):
                mode = option
            elif sep and name in ("uid", "gid") and value.isdigit():
                ids[name] = int(value)
            elif option in ("uid", "gid") or (sep and name in ("uid", "gid")):
                raise ValueError(f"--mount {text!r}: {name} takes a number, e.g. {name}=1001")
            else:
                raise ValueError(f"--mount {text!r}: the mode must be ro or rw, not {option!r} (use {_MOUNT_SYNTAX})")
        return cls(source=Path(parts[0]), target=parts[1], read_only=mode == "ro", **ids)

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

    @field_validator("uid", "gid")
    @classmethod
    def _id_ok(cls, value: int | None) -> int | None:
        if value is not None and value == 0:
            raise ValueError("tool processes never run as root: pick a uid/gid of 1 or more, not 0")
        if value is not None and not 0 < value <= MAX_ID:
            raise ValueError(f"{value} is not a uid/gid (1 to {MAX_ID})")
        return value

    @model_validator(mode="after")
    def _ids_for_rw(self) -> Mount:
        if self.read_only and (self.uid is not None or self.gid is not None):
            raise ValueError(f"uid/gid apply to rw mounts only (the tool user writes there); {self.target} is ro")
        if self.gid is not None and self.uid is None:
            raise ValueError(f"gid={self.gid} needs uid= as well (the tool user's uid)")
        return self

    @property
    def tool_ids(self) -> tuple[int, int] | None:
        """The uid and gid this mount asks tool processes to run as, if any."""
        if self.uid is None:
            return None
        return self.uid, self.gid if self.gid is not None else self.uid

    def canonical(self, allowed_roots: tuple[Path, ...] | None, *, engine_paths: tuple[str, ...] = ()) -> Mount:
        """Resolve the host path and refuse dangerous or unlisted ones (``engine_paths``:
        more container-engine directories to refuse, e.g. its data root)."""
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
        for tree in (*DOCKER_TREES, *docker_host_dirs(), *engine_paths):
            if _tree_conflict(text, os.path.realpath(tree)):
                raise ValueError(
                    f"mount source {source} is a system path (it exposes the container engine's {tree}) "
                    "and is never mounted into a sandbox"
                )
        if source.is_socket() or "docker.sock" in text:
            raise ValueError(f"mount source {source} is a socket; sockets are never mounted into a sandbox")
        if allowed_roots is not None and not any(
            source.is_relative_to(r.expanduser().resolve()) for r in allowed_roots
        ):
            roots = ", ".join(str(r) for r in allowed_roots)
            raise ValueError(f"mount source {source} is outside the allowed mount roots ({roots})")
        return self.model_copy(update={"source": source})


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n >> 20} MiB"


MountT = TypeVar("MountT", bound=BaseModel)


class SandboxFields(BaseModel, Generic[MountT]):
    """The settings of a sandbox: each one's type, default (the hardened one), bounds and
    meaning, written once. ``SandboxSpec`` is them with their mounts as ``Mount`` and every
    check; the policy's ``[sandbox]`` table (``harness.core.sandbox_settings``) is them as
    a policy spells its mounts, checked when the spec is built from it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str = DEFAULT_IMAGE
    """Local image to run (there is no registry: build it with ``callbox image build``)."""
    runtime: Literal["runc", "runsc"] = "runc"
    """OCI runtime of the container: ``runc`` (Linux namespaces, cgroups and seccomp on the
    host kernel) or ``runsc`` (gVisor: the tools' system calls go to a user-space kernel,
    which must be installed as a Docker runtime, ``make runsc``; every network mode works
    there, on gVisor's own network stack)."""
    memory: ByteSize = Field(default=512 << 20, ge=32 << 20)
    """Memory limit in bytes; swap is set equal to it (no swap). ``for_host`` refuses more
    than the host has."""
    cpus: float = 1.0
    """CPU quota in cores: at least 0.01 (Docker's smallest quota); ``for_host`` refuses more
    than the host's CPU count."""
    pids: int = Field(default=256, ge=8, le=65536)
    """Maximum number of processes and threads."""
    network: Literal["none", "allowlist", "open"] = "none"
    """Network mode: ``none`` (no network at all), ``allowlist`` (HTTP(S) egress only through
    callbox's filtering proxy, to the hosts in ``allow_hosts``), ``open`` (a bridge of its own
    with outside access; the host, other sandboxes and link-local metadata stay unreachable)."""
    allow_hosts: tuple[str, ...] = ()
    """Egress allowlist for ``network = allowlist``: ``HOST[:PORT]`` entries, ``*.example.com``
    wildcards (subdomains, not the apex), IP literals and CIDR networks (``10.1.0.0/16[:PORT]``),
    case-insensitive; without a port, 80 and 443. An entry may start with an action:
    ``ask *.github.com`` holds each connection until a person answers (or ``ask_timeout``
    passes), ``deny 10.0.0.0/8`` refuses; with such entries the first entry that matches
    decides."""
    ask_timeout: float = Field(default=120.0, gt=0.0, le=3600.0)
    """Seconds a connection to an ``ask`` entry waits for a person's answer before it is
    refused (never longer than the call running when it came)."""
    egress_allow: tuple[str, ...] = ()
    """With ``network = allowlist``: a narrowing within ``allow_hosts`` (what a client asks for,
    E2B's ``allow_out``; changeable while the sandbox runs), same syntax. A destination one of
    these names is allowed (if ``allow_hosts`` allows it), else one ``egress_deny`` names is
    refused, else it is allowed. Both empty: no narrowing."""
    egress_deny: tuple[str, ...] = ()
    """With ``network = allowlist``: destinations refused unless ``egress_allow`` names them
    (E2B's ``deny_out``); same syntax, but an entry without a port denies every port, and
    ``0.0.0.0/0`` (or ``::/0``) denies everything."""
    mounts: tuple[MountT, ...] = ()
    """Bind mounts, each read-only unless marked rw; one per container path. A mount at a
    scratch place (or a parent of one) replaces its tmpfs; one below it sits on top of it."""
    allowed_mount_roots: tuple[Path, ...] | None = None
    """If set, every mount source must lie under one of these host directories."""
    workdir: str = WORKSPACE
    """Working directory of commands (a scratch tmpfs unless a mount covers it)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment for commands; nothing from the host is passed."""
    tmp_size: ByteSize | None = None
    """Size of /tmp (tmpfs); default an eighth of the memory limit."""
    workspace_size: ByteSize | None = None
    """Size of the scratch workspace (tmpfs); default a quarter of the memory limit."""
    home_size: ByteSize | None = None
    """Size of the home directory /home/sandbox (tmpfs; caches such as pip's and git's
    config live there); default a sixteenth of the memory limit (32 MiB of 512m)."""
    scratch_dirs: tuple[str, ...] = ()
    """More scratch directories: an empty tmpfs of ``tmp_size`` at each absolute path, made like
    /tmp (sticky, world-writable: root commands and the tool user both write there), e.g.
    Harbor's ``/logs``, ``/tests``, ``/solution``. Not under a system directory, not in
    another scratch place."""
    noexec: bool = False
    """Mount /workspace, /tmp and the home directory ``noexec``. Off by default: agents run
    what they build (``./run.sh``, a compiled binary, a venv's ``bin/python``). Turning it on
    is a tightening that buys little in a sandbox that already has an interpreter:
    ``python3 script``, ``sh script`` and ``/lib64/ld-linux-x86-64.so.2 binary`` still run;
    only direct execution of files there fails (exit 126). ``nosuid,nodev`` apply either
    way; bind mounts keep the host's flags."""
    nofile: int = Field(default=1024, ge=64)
    """Open files per process."""
    fsize: ByteSize = Field(default=1 << 30, ge=1 << 20)
    """Largest file a process may write, in bytes."""
    ttl_seconds: int = Field(default=3600, ge=10)
    """After this the sandbox is expired and ``callbox gc`` removes it."""
    paused_ttl_seconds: int = Field(default=86400, ge=10, le=30 * 86400)
    """How long a paused sandbox is kept, counted from its pause (its ``ttl_seconds`` clock
    stands still meanwhile); then it is removed. Also how long the E2B door keeps a sandbox
    its timeout paused (``lifecycle.on_timeout = "pause"``). 24 h by default, at most 30 days."""
    placement: Placement = Field(default_factory=Placement)
    """Where it may run on a multi-node engine (the Ray engine): strategy, node affinity and
    anti-affinity, a group kept apart. A one-node engine (Docker's) ignores it."""


class SandboxSpec(SandboxFields[Mount]):
    """Settings of one sandbox; the defaults are the hardened ones."""

    secrets: tuple[SecretSpec, ...] = ()
    """Secrets its egress proxy carries to their hosts; the sandbox sees placeholders
    (:mod:`harness.engine.secrets`; definitions only, never a value)."""

    @field_validator("cpus")
    @classmethod
    def _cpus_ok(cls, value: float) -> float:
        # The key (cpus) is named by whoever reports the error: the CLI, the policy loader.
        if math.isnan(value) or math.isinf(value):
            raise ValueError(f"{value:g} is not a number of cores (at least {MIN_CPUS:g})")
        if value < MIN_CPUS:
            raise ValueError(f"{value:g} is below the minimum of {MIN_CPUS:g} (the smallest CPU quota Docker accepts)")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name, val in value.items():
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"environment variable name {name!r} is not valid")
            if "\0" in val:
                raise ValueError(f"environment variable {name} contains a NUL byte")
        return value

    @field_validator("scratch_dirs")
    @classmethod
    def _scratch_dirs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return checked_scratch_dirs(value, SCRATCH_PLACES, RESERVED_TARGETS)

    @field_validator("workdir")
    @classmethod
    def _workdir_abs(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"workdir {value!r} must be an absolute path inside the sandbox")
        return os.path.normpath(value)

    @field_validator("allow_hosts", "egress_allow", "egress_deny")
    @classmethod
    def _allow_hosts_valid(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        from sandbox.egress import Allowlist  # the proxy's own parser: one syntax on both sides

        parsed = Allowlist.parse(value)
        if info.field_name != "allow_hosts":
            parsed.without_actions()
        return value

    @field_validator("mounts")
    @classmethod
    def _one_mount_per_target(cls, value: tuple[Mount, ...]) -> tuple[Mount, ...]:
        seen: dict[str, int] = {}
        for index, mount in enumerate(value):
            if mount.target in seen:
                raise ValueError(
                    f"mounts[{seen[mount.target]}] and mounts[{index}] both mount at {mount.target}; "
                    "a container path takes one mount: pick another target for one of them"
                )
            seen[mount.target] = index
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
        if (self.egress_allow or self.egress_deny) and self.network != "allowlist":
            raise ValueError(
                f"egress_allow and egress_deny narrow network 'allowlist' (its egress proxy applies them), but "
                f"the network is {self.network!r}; drop them or use network 'allowlist'"
            )
        if self.secrets and (problem := secrets_problem(self.secrets, self.network, self.allow_hosts, self.env)):
            raise ValueError(problem)
        for size_name in ("tmp_size", "workspace_size", "home_size"):
            size = getattr(self, size_name)
            if size is not None and size >= self.memory:
                raise ValueError(
                    f"{size_name} {format_size(size)} must be smaller than the memory limit, "
                    f"{format_size(self.memory)} (tmpfs pages count against it)"
                )
        if self.tmpfs_total > self.memory // 2:
            raise ValueError(
                f"the tmpfs mounts would take {self.tmpfs_total >> 20}m of the {format_size(self.memory)} "
                "memory limit (tmpfs pages count against it); keep tmp_size + workspace_size + home_size "
                "under half of memory, or raise memory"
            )
        return self

    @property
    def effective_tmp_size(self) -> int:
        return self.tmp_size if self.tmp_size is not None else self.memory // 8

    @property
    def effective_workspace_size(self) -> int:
        return self.workspace_size if self.workspace_size is not None else self.memory // 4

    @property
    def effective_home_size(self) -> int:
        return self.home_size if self.home_size is not None else self.memory // 16

    @property
    def small_tmpfs_size(self) -> int:
        """The home directory tmpfs (the older name of ``effective_home_size``)."""
        return self.effective_home_size

    @property
    def shm_size(self) -> int:
        """Size of /dev/shm."""
        return min(16 << 20, self.memory // 32)

    def _covered(self, place: str) -> bool:
        """Whether a mount replaces the scratch tmpfs at ``place`` (it is at or above it)."""
        return any(_within(place, m.target) for m in self.mounts)

    def scratch_tmpfs(self) -> dict[str, int]:
        """The scratch tmpfs the sandbox gets, container path to size: /workspace, /tmp and
        the home directory unless a mount replaces them, and the workdir when it is none of
        these and no mount covers it."""
        sizes = {WORKSPACE: self.effective_workspace_size, TMP: self.effective_tmp_size,
                 HOME: self.effective_home_size}
        places = {place: size for place, size in sizes.items() if not self._covered(place)}
        if self.workdir not in sizes and not self._covered(self.workdir):
            places[self.workdir] = self.effective_workspace_size
        places.update({place: self.effective_tmp_size for place in self.scratch_dirs if not self._covered(place)})
        return places

    def space_for(self, path: str) -> str:
        """What bounds the space of absolute ``path`` in the sandbox, and how to get more:
        for a message when a write there ran out of space (the policy key of its scratch
        tmpfs, or the mount or filesystem it is on)."""
        keys = {WORKSPACE: "workspace_size", TMP: "tmp_size", HOME: "home_size"}
        places = self.scratch_tmpfs()
        place = max((p for p in places if path == p or path.startswith(p.rstrip("/") + "/")), key=len, default=None)
        if place is not None:
            key = keys.get(place, "workspace_size")
            return (f"{place} is a tmpfs of {format_size(places[place])} in this sandbox (the policy's "
                    f"[sandbox] {key}): remove files there, write elsewhere, or raise {key}")
        mount = next((m for m in self.mounts if path == m.target or path.startswith(m.target.rstrip("/") + "/")),
                     None)
        if mount is not None:
            return f"{mount.target} is the host's {mount.source}: free space there"
        return "the path is on the image's own filesystem, which is read-only; write under /workspace, /tmp or HOME"

    def tmpfs_options(self, place: str, uid: int, gid: int) -> str:
        """Docker's tmpfs options for scratch ``place`` (from ``scratch_tmpfs``); ``exec``
        is explicit because Docker's tmpfs default is noexec."""
        flags = f"rw,nosuid,nodev,{'noexec' if self.noexec else 'exec'},size={self.scratch_tmpfs()[place]}"
        return f"{flags},mode=1777" if place in (TMP, *self.scratch_dirs) else f"{flags},mode=0755,uid={uid},gid={gid}"

    @property
    def tmpfs_total(self) -> int:
        """Memory the tmpfs mounts can pin: /tmp, the workspace, the home directory (those a
        mount does not replace) and /dev/shm. Filling them must leave room for the agent, or
        the OOM killer has nothing to free. (A separate workdir tmpfs is not counted.)"""
        places = self.scratch_tmpfs()
        return sum(size for place, size in places.items() if place in SCRATCH_PLACES) + self.shm_size

    # ---- on a given host --------------------------------------------------------------------

    def for_host(self, host: HostLimits | None = None) -> SandboxSpec:
        """This spec checked against ``host`` (default: this machine, ``HostLimits.local``),
        with canonical mount sources; raises ``SpecError`` naming the setting. Run it before
        any container starts."""
        host = host if host is not None else HostLimits.local()
        if self.runtime == "runsc" and host.runsc_network is not None:
            # an older registration (make runsc before gVisor's netstack): such a sandbox
            # would silently have only lo
            refusal = networked_refusal(self.network, host.runsc_network)
            if refusal is not None:
                raise SpecError("runtime", refusal)
        if host.cpus is not None and self.cpus > host.cpus:
            raise SpecError("cpus", f"cpus {self.cpus:g} is more than the {host.cpus} CPU(s) of {host.where}; "
                                    f"use at most {host.cpus}")
        if host.memory is not None and self.memory > host.memory:
            raise SpecError("memory", f"memory {format_size(self.memory)} is more than the {_gib(host.memory)} "
                                      f"of memory of {host.where}; use at most {host.memory >> 20}m")
        mounts = []
        for index, mount in enumerate(self.mounts):
            try:
                mounts.append(mount.canonical(self.allowed_mount_roots, engine_paths=host.engine_paths))
            except ValueError as exc:
                raise SpecError(f"mounts[{index}].source", str(exc)) from None
        spec = self.model_copy(update={"mounts": tuple(mounts)})
        spec.tool_identity()
        spec._check_workdir_in_mount()
        return spec

    def _check_workdir_in_mount(self) -> None:
        """A working directory inside a mount must exist there: the sandbox cannot make it
        (its root is read-only) and the agent cannot start with a root it cannot open."""
        covering = [m for m in self.mounts if self.workdir == m.target or self.workdir.startswith(m.target + "/")]
        if not covering:
            return
        mount = max(covering, key=lambda m: len(m.target))
        host_path = mount.source / os.path.relpath(self.workdir, mount.target)
        if not host_path.is_dir():
            raise SpecError("workdir", f"workdir {self.workdir} is inside the mount of {mount.source}, where "
                                       f"{host_path} is not a directory; create it on the host or choose "
                                       "another workdir")

    def tool_identity(self) -> tuple[int, int]:
        """The uid and gid tool processes run as, checked against the rw mounts (canonical
        sources, as ``for_host`` makes them): the uid/gid a rw mount asks for, else the owner
        of the first rw mount not owned by root, else 1000:1000; never 0. Every rw mount must
        be writable by it (mode bits, no supplementary groups), else ``SpecError``."""
        rw = [(index, mount) for index, mount in enumerate(self.mounts) if not mount.read_only]
        stats: dict[int, os.stat_result] = {}
        for index, mount in rw:
            try:
                stats[index] = mount.source.stat()
            except OSError as exc:
                raise SpecError(f"mounts[{index}].source",
                                f"mount source {mount.source} cannot be used: {exc.strerror or exc}") from None
        asked = {(index, ids) for index, mount in rw if (ids := mount.tool_ids) is not None}
        if len({ids for _, ids in asked}) > 1:
            shown = ", ".join(f"{self.mounts[i].source} uid={u},gid={g}" for i, (u, g) in sorted(asked))
            raise SpecError("mounts", f"the rw mounts ask for different tool users ({shown}); tool processes "
                                      "run as one uid and gid: give every rw mount the same, or mount the others :ro")
        uid, gid, chosen_by = TOOL_UID, TOOL_GID, None
        if asked:
            chosen_by, (uid, gid) = min(asked)
        else:
            owned = [index for index, _ in rw if stats[index].st_uid != 0]
            if owned:
                chosen_by = owned[0]
                uid, gid = stats[chosen_by].st_uid, stats[chosen_by].st_gid
        for index, mount in rw:
            st = stats[index]
            if can_write(st, uid, gid):
                continue
            if chosen_by is not None and not asked and st.st_uid not in (0, uid):
                first = self.mounts[chosen_by].source
                raise SpecError(f"mounts[{index}].source", (
                    f"rw mounts {first} and {mount.source} have different owners (uid {uid} and uid {st.st_uid}); "
                    f"tool processes run as one user, the owner of {first} (uid {uid}, gid {gid}), which "
                    f"cannot write {mount.source} ({describe_owner(st)}); " + mount_fixes(mount.source, uid, gid)))
            why = (f"asked for by {self.mounts[chosen_by].source}" if asked and chosen_by is not None
                   else f"the owner of {self.mounts[chosen_by].source}" if chosen_by is not None
                   else "the sandbox user; no rw mount is owned by a non-root user")
            raise SpecError(f"mounts[{index}].source", (
                f"rw mount {mount.source} (at {mount.target}) is not writable by the tool user uid {uid}, gid {gid} "
                f"({why}): {describe_owner(st)}; " + mount_fixes(mount.source, uid, gid)))
        return uid, gid

    def network_summary(self) -> str:
        """What the sandbox may reach, in one line: ``none``, ``open``, or ``allowlist (HOSTS)``
        and its narrowing, if any."""
        if self.network != "allowlist":
            return self.network
        text = f"allowlist ({', '.join(self.allow_hosts)})"
        if self.egress_allow or self.egress_deny:
            text += (f" narrowed to allow: {', '.join(self.egress_allow) or 'nothing'}; "
                     f"deny: {', '.join(self.egress_deny) or 'nothing'}")
        return text

    def loosened(self) -> list[str]:
        """Settings that are looser than the hardened defaults (the engine logs them)."""
        notes = []
        if any(not m.read_only for m in self.mounts):
            notes.append("read-write mount(s): " + ", ".join(m.target for m in self.mounts if not m.read_only))
        if self.network == "allowlist":
            notes.append(f"network allowlist ({', '.join(self.allow_hosts)})")
        elif self.network != "none":
            notes.append(f"network {self.network}")
        return notes
