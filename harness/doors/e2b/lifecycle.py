"""What an E2B sandbox does when its timeout passes, and when a request reaches it paused.

E2B's create request says it (``lifecycle`` in the SDK, sent as ``autoPause``,
``autoPauseMemory`` and ``autoResume: {"enabled": ...}``; older SDKs send ``autoPause``
alone):

* ``on_timeout = "kill"`` (the default): the timeout removes the sandbox, as before.
* ``on_timeout = "pause"``: the executor's TTL reaper offers the sandbox to
  :func:`pause_at_timeout` (the session's ``on_expiry`` hook) instead of removing it: the
  engine's pause, as the policy's ``pause`` action (``op: pause, by: timeout``, recorded in
  the sandbox's run). The paused sandbox is kept for its policy's
  ``sandbox.paused_ttl_seconds`` (24 h by default), counted from the pause, then removed
  (its run ends ``paused_expired``). A policy that does not allow the ``pause`` action
  refuses such a create, so a sandbox is never removed where its creator asked to keep it.
  The engine's own clock (which its agent obeys) runs :data:`PAUSE_GRACE_S` behind the
  door's, so the reaper pauses the sandbox before its agent would stop on its own.
* A sandbox under gVisor with network ``none`` (on a server running as root) is paused to
  disk (:func:`pauses_to_disk`): its processes saved, its container stopped, its memory
  freed; any other is frozen in memory. Either way its processes come back on resume.
* ``auto_resume``: an envd request (a command, a file, a watch) or a ``connect`` to a paused
  sandbox resumes it first (:func:`wake`), the ``pause`` action's ``op: resume``; it then has
  a fresh timeout of its original length, at least :data:`RESUME_TIMEOUT_S` (as E2B's auto-resume
  gives), within the policy's limit. Without it, such a request is answered as E2B's proxy
  answers a paused sandbox: 502 "was not found" (the SDK raises ``SandboxNotRunningException``),
  with a sentence saying it is paused and that ``Sandbox.connect`` resumes it.

A filesystem-only auto-pause (``autoPauseMemory: false``, the SDK's ``mode: "filesystem"``)
is refused: a pause here keeps the processes and their memory, and a sandbox created asking
for a cold boot would not get one.

The choice is kept in the sandbox's run meta (``lifecycle``), so a sandbox adopted after a
server restart (:mod:`harness.doors.e2b.restart`) keeps it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from harness.core.calls import Action
from harness.core.errors import ErrorCode
from harness.core.policy import Policy
from harness.doors.e2b.errors import E2bError, invalid
from harness.doors.grpc.sessions import ClientSession
from harness.engine.base import LivingSandbox
from harness.engine.docker.sandbox import Sandbox as DockerSandbox

__all__ = ["KILL", "LIFECYCLE_META", "PAUSE_GRACE_S", "RESUME_TIMEOUT_S", "Lifecycle", "Sandbox", "Sandboxes",
           "check_allowed",
           "lifecycle_of_meta", "parse_lifecycle", "pause_at_timeout", "pause_box", "pauses_to_disk", "wake"]

log = logging.getLogger("callbox.e2b")

LIFECYCLE_META = "lifecycle"
"""The run meta key of a sandbox's lifecycle (``{"on_timeout": ..., "auto_resume": ...}``)."""
PAUSE_GRACE_S = 30.0
"""How much later than the door's timeout the engine's clock of a pause-on-timeout sandbox
ends: the reaper (every few seconds) pauses it first, so its agent never stops on its own."""
RESUME_TIMEOUT_S = 300
"""The shortest timeout a sandbox gets when a request resumes it (E2B's five minutes)."""


@dataclass(frozen=True)
class Lifecycle:
    """What the timeout does to a sandbox, and whether a request resumes it when paused."""

    on_timeout: Literal["kill", "pause"] = "kill"
    auto_resume: bool = False

    @property
    def pauses(self) -> bool:
        return self.on_timeout == "pause"

    def meta(self) -> dict[str, Any]:
        return {"on_timeout": self.on_timeout, "auto_resume": self.auto_resume}

    def body(self) -> dict[str, Any]:
        """``SandboxDetail.lifecycle``."""
        return {"onTimeout": self.on_timeout, "autoResume": self.auto_resume}


KILL = Lifecycle()


class Sandbox(Protocol):
    """What this module reads of a door's sandbox (:class:`~harness.doors.e2b.boxes.E2bSandbox`)."""

    @property
    def sandbox_id(self) -> str: ...
    @property
    def client(self) -> str: ...
    @property
    def template_id(self) -> str: ...
    @property
    def lifecycle(self) -> Lifecycle: ...
    @property
    def session(self) -> ClientSession: ...
    @property
    def state(self) -> str: ...


class Sandboxes(Protocol):
    """What this module does with the door's sandboxes (:class:`~harness.doors.e2b.boxes.E2bSandboxes`)."""

    def pause(self, sandbox: Any, *, by: str | None = None) -> None: ...
    def connect(self, sandbox: Any, seconds: int) -> bool: ...
    def timeout_limit(self, template_id: str, client: str | None = None) -> int: ...


def parse_lifecycle(body: Mapping[str, Any]) -> Lifecycle:
    """The lifecycle a create request's body asks for (see the module docstring)."""
    pause = body.get("autoPause")
    if pause is not None and not isinstance(pause, bool):
        raise invalid(f"autoPause must be true or false, not {pause!r}")
    memory = body.get("autoPauseMemory")
    if memory is not None and not isinstance(memory, bool):
        raise invalid(f"autoPauseMemory must be true or false, not {memory!r}")
    resume = body.get("autoResume")
    if resume is None:
        enabled = False
    elif isinstance(resume, dict) and isinstance(resume.get("enabled", False), bool):
        enabled = bool(resume.get("enabled", False))
    else:
        raise invalid(f'autoResume must be an object {{"enabled": true|false}}, not {resume!r}')
    if enabled and not pause:
        raise invalid("lifecycle.auto_resume can be true only when lifecycle.on_timeout is 'pause' (autoPause)")
    if pause and memory is False:
        raise E2bError(ErrorCode.NOT_SUPPORTED,
                       "lifecycle.on_timeout mode 'filesystem' (autoPauseMemory false) is not supported: this server's "
                       "pause keeps the sandbox's processes and memory; leave the mode unset")
    return Lifecycle("pause" if pause else "kill", enabled)


def lifecycle_of_meta(meta: Mapping[str, Any]) -> Lifecycle:
    """The lifecycle a run meta recorded (none recorded: :data:`KILL`)."""
    recorded = meta.get(LIFECYCLE_META)
    if not isinstance(recorded, dict):
        return KILL
    return Lifecycle("pause" if recorded.get("on_timeout") == "pause" else "kill",
                     recorded.get("auto_resume") is True)


def check_allowed(lifecycle: Lifecycle, policy: Policy) -> None:
    """``permission_denied`` if ``policy`` would not let the timeout pause the sandbox (its
    ``pause`` action is not ``allow``): the creator asked to keep it, so refuse now rather
    than remove it at its timeout."""
    if not lifecycle.pauses:
        return
    decision = policy.actions.decide("pause", {"op": "pause", "by": "timeout"}, workdir=policy.sandbox.workdir)
    if decision.action is not Action.ALLOW:
        raise E2bError(ErrorCode.PERMISSION_DENIED,
                       f"lifecycle.on_timeout 'pause': this server's policy does not allow pausing a sandbox without a "
                       f"person ({decision.rule}: {decision.action.value}); create it without on_timeout 'pause'")


def pause_at_timeout(sandboxes: Sandboxes, sandbox: Sandbox) -> bool:
    """Pause ``sandbox`` because its timeout passed (the reaper's ``on_expiry``); whether it
    is paused now (False: the reaper removes it)."""
    if sandbox.session.closed:
        return False
    try:
        sandboxes.pause(sandbox, by="timeout")
    except E2bError as error:
        if error.error is ErrorCode.ALREADY_EXISTS:  # paused already (by its client, meanwhile)
            return True
        log.warning("sandbox %s: its timeout could not pause it (%s); it is removed", sandbox.sandbox_id,
                    error.message)
        return False
    keep = sandbox.session.policy.sandbox.paused_ttl_seconds
    log.info("sandbox %s of client %s paused at its timeout; kept paused for up to %d s", sandbox.sandbox_id,
             sandbox.client, keep)
    return True


def pauses_to_disk(box: object) -> bool:
    """Whether the door's pause of ``box`` goes to disk: a Docker sandbox under gVisor with no
    network, on a server running as root, whose processes can be saved and its memory freed
    (:mod:`harness.engine.docker.disk_pause`). Any other is frozen in memory: E2B's pause keeps
    the processes either way."""
    return (isinstance(box, DockerSandbox) and box.spec.runtime == "runsc" and box.spec.network == "none"
            and os.geteuid() == 0)


def pause_box(box: LivingSandbox) -> None:
    """The door's pause of ``box``: to disk where :func:`pauses_to_disk`, else frozen."""
    box.pause(to_disk=pauses_to_disk(box))


def wake(sandboxes: Sandboxes, sandbox: Sandbox) -> None:
    """Before an envd request: resume a paused ``sandbox`` that allows it (auto-resume),
    else refuse as E2B's proxy refuses a paused sandbox (see the module docstring)."""
    if sandbox.state != "paused":
        return
    if not sandbox.lifecycle.auto_resume:
        raise E2bError(ErrorCode.SANDBOX_UNAVAILABLE,
                       f"sandbox {sandbox.sandbox_id!r} was not found running: it is paused and was created without "
                       "lifecycle auto_resume; resume it with Sandbox.connect", status=502)
    limit = sandboxes.timeout_limit(sandbox.template_id, sandbox.client)
    seconds = min(limit, max(sandbox.session.ttl_seconds, RESUME_TIMEOUT_S))
    if sandboxes.connect(sandbox, seconds):
        log.info("sandbox %s of client %s resumed by a request (auto_resume)", sandbox.sandbox_id, sandbox.client)
