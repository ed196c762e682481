"""What a client may ask of its sandbox, and the server's policy tightened by it.

Overrides only tighten: ``memory_bytes``, ``cpus``, ``pids``, ``ttl_seconds`` at most the
server's; ``network`` the server's own or ``none``; ``network_request`` (allow and deny
lists, E2B's internet flag) narrows the server's network as
:mod:`harness.core.network_request` says; ``allowed_tools`` a subset of what the
server exposes; ``mounts`` only under the server policy's ``allowed_mount_roots`` (checked
lexically before the host path is even resolved); ``env`` is added. Looser is
PERMISSION_DENIED naming the field; out of range is INVALID_ARGUMENT.
"""

from __future__ import annotations

import logging
import math
import posixpath
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness.core.errors import CallboxError, ErrorCode
from harness.core.network_request import NetworkRequest, grant_network
from harness.core.policy import MountSetting, Policy, PolicyError, SandboxSettings
from harness.core.problems import describe_validation_error
from harness.core.units import format_size
from harness.doors.grpc.errors import ServiceError, denied, invalid
from harness.engine.spec import Mount
from harness.v1 import executor_pb2

__all__ = ["MountRequest", "SandboxOverrides", "sandbox_policy"]

log = logging.getLogger("callbox.executor")


@dataclass(frozen=True)
class MountRequest:
    source: str
    target: str
    read_write: bool = False


@dataclass(frozen=True)
class SandboxOverrides:
    """What a client asks of its sandbox (``CreateSandboxRequest``); None keeps the server's."""

    memory_bytes: int | None = None
    cpus: float | None = None
    pids: int | None = None
    network: str | None = None
    mounts: tuple[MountRequest, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    ttl_seconds: int | None = None
    allowed_tools: tuple[str, ...] = ()
    network_request: NetworkRequest | None = None
    """Allow and deny lists within the server's network (and E2B's internet flag)."""

    @classmethod
    def from_request(cls, request: executor_pb2.CreateSandboxRequest) -> SandboxOverrides:
        return cls(
            memory_bytes=request.memory_bytes if request.HasField("memory_bytes") else None,
            cpus=request.cpus if request.HasField("cpus") else None,
            pids=request.pids if request.HasField("pids") else None,
            network=request.network if request.HasField("network") else None,
            mounts=tuple(MountRequest(m.source, m.target, m.read_write) for m in request.mounts),
            env=dict(request.env),
            ttl_seconds=request.ttl_seconds if request.HasField("ttl_seconds") else None,
            allowed_tools=tuple(request.allowed_tools),
            network_request=NetworkRequest(allow=tuple(request.network_allow), deny=tuple(request.network_deny)),
        )


def _above(field_name: str, asked: str, limit: str, key: str) -> ServiceError:
    return denied(
        f"{field_name}: {asked} is above this server's limit of {limit} (sandbox.{key} in its policy); "
        "ask for at most that, or leave it unset"
    )


def _under_root(path: str, roots: Sequence[Path]) -> bool:
    for root in roots:
        base = posixpath.normpath(str(root.expanduser()))
        if path == base or path.startswith(base.rstrip("/") + "/"):
            return True
    return False


def _under(key: str) -> Callable[[str], str]:
    """Names a Mount's field by its place in the request (``mounts[1].target``)."""
    return lambda path: f"{key}.{path}"


def _client_mounts(settings: SandboxSettings, requests: Sequence[MountRequest]) -> list[MountSetting]:
    roots = settings.allowed_mount_roots
    if not roots:
        raise denied(
            "mounts: this server allows no client mounts (its policy sets no sandbox.allowed_mount_roots)"
        )
    taken = {posixpath.normpath(m.target) for m in settings.mounts}
    out: list[MountSetting] = []
    for index, req in enumerate(requests):
        key = f"mounts[{index}]"
        if not req.source.startswith("/"):
            raise invalid(f"{key}.source {req.source!r} must be an absolute host path")
        lexical = posixpath.normpath(req.source)
        listed = ", ".join(str(r) for r in roots)
        if not _under_root(lexical, roots):
            raise denied(f"{key}.source {req.source} is outside the server's allowed mount roots ({listed})")
        try:
            mount = Mount(source=Path(lexical), target=req.target, read_only=not req.read_write)
        except ValidationError as exc:
            raise invalid(describe_validation_error(exc, Mount, name=_under(key))[0]) from None
        try:
            mount.canonical(roots)
        except ValueError as exc:
            text = str(exc)
            if "outside" in text or "system path" in text or "socket" in text:
                raise denied(f"{key}: {text}") from None
            raise invalid(f"{key}: {text}") from None
        if mount.target in taken:
            raise invalid(f"{key}.target {mount.target} is already mounted; choose another target")
        taken.add(mount.target)
        out.append(MountSetting(source=Path(lexical), target=mount.target, mode="rw" if req.read_write else "ro"))
    return out


def sandbox_policy(policy: Policy, overrides: SandboxOverrides, exposed: Sequence[str]) -> Policy:
    """The server's ``policy`` tightened by a client's ``overrides`` (``exposed``: the tools the
    server exposes). ServiceError PERMISSION_DENIED naming the field for anything looser,
    INVALID_ARGUMENT for a value out of range."""
    s = policy.sandbox
    updates: dict[str, Any] = {}
    o = overrides
    if o.memory_bytes is not None:
        if o.memory_bytes > s.memory:
            raise _above("memory_bytes", f"{o.memory_bytes} ({format_size(o.memory_bytes)})",
                         f"{s.memory} ({format_size(s.memory)})", "memory")
        updates["memory"] = o.memory_bytes
    if o.cpus is not None:
        if not math.isfinite(o.cpus) or o.cpus <= 0:
            raise invalid(f"cpus: {o.cpus:g} is not a positive number of cores")
        if o.cpus > s.cpus:
            raise _above("cpus", f"{o.cpus:g}", f"{s.cpus:g}", "cpus")
        updates["cpus"] = o.cpus
    if o.pids is not None:
        if o.pids > s.pids:
            raise _above("pids", str(o.pids), str(s.pids), "pids")
        updates["pids"] = o.pids
    if o.network is not None and o.network != s.network:
        if o.network != "none":
            raise denied(f"network: {o.network!r} is looser than this server allows; "
                          f"only {s.network!r} or 'none' may be asked for")
        updates["network"] = "none"
        updates["allow_hosts"] = ()
        updates["egress_allow"] = updates["egress_deny"] = ()
    if o.network_request is not None and o.network_request.asked and updates.get("network") != "none":
        try:
            granted = grant_network(s, o.network_request, s.on_internet_request)
        except CallboxError as error:
            raise (denied(error.message) if error.code is ErrorCode.PERMISSION_DENIED
                   else ServiceError(error.code, error.message)) from None
        if granted.note:
            log.info("a client's sandbox network request: %s", granted.note)
        updates.update(granted.updates())
    if o.ttl_seconds is not None:
        if o.ttl_seconds > s.ttl_seconds:
            raise _above("ttl_seconds", str(o.ttl_seconds), str(s.ttl_seconds), "ttl_seconds")
        updates["ttl_seconds"] = o.ttl_seconds
    if o.mounts:
        updates["mounts"] = (*s.mounts, *_client_mounts(s, o.mounts))
    if o.env:
        updates["env"] = {**s.env, **o.env}
    allowed: tuple[str, ...] | None = policy.allowed_tools
    if o.allowed_tools:
        for name in o.allowed_tools:
            if name not in exposed:
                raise denied(
                    f"allowed_tools: {name!r} is not a tool this server exposes ({', '.join(exposed) or 'none'})"
                )
        allowed = tuple(dict.fromkeys(o.allowed_tools))
    if not updates and allowed == policy.allowed_tools:
        return policy
    try:
        settings = SandboxSettings.model_validate({**s.model_dump(), **updates})
    except ValidationError as exc:
        problem = describe_validation_error(exc, SandboxSettings, noun="key")[0]
        raise invalid(f"sandbox overrides: {problem}") from None
    tightened = policy.model_copy(update={"sandbox": settings, "allowed_tools": allowed})
    try:
        tightened.sandbox_spec()
    except PolicyError as exc:
        raise invalid(exc.message.replace("sandbox.", "")) from None
    for note in tightened.loosened():
        if note not in policy.loosened():
            log.warning("a client's sandbox loosens a hardened default: %s", note)
    return tightened

