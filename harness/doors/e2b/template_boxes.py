"""Sandboxes of a built template: its image, env and workdir under the policy, its start and ready commands.

:class:`BuiltTemplates` is what :class:`~harness.doors.e2b.boxes.E2bSandboxes` asks about a
template id that is not one of the server's own (``base``): the template the client sees by
that id or name in the :class:`~harness.engine.templates.store.TemplateStore`.

* **Policy.** The client's ``base`` policy with the template's image, its ENV steps' values
  under the policy's own ``env`` (the policy's win), its workdir (else ``/home/user``) and
  the CPUs and memory its build asked (``cpu_count``, ``memory_mb``), never beyond the
  policy's (the build's log says what its sandboxes get). Every other setting (limits,
  network, mounts, TTL, tool rules) is the policy's; a client's create options tighten it
  as for ``base``.
* **Start.** When the sandbox is up, the files the image holds in places the sandbox covers
  with scratch tmpfs are put back (:mod:`harness.engine.templates.build`'s seeds), then the
  start command starts as a background job (``/bin/sh -c CMD`` in the workdir), and the
  ready command runs every :data:`READY_POLL_S` until it exits 0, for at most
  :data:`READY_TIMEOUT_S`. Both are the policy's ``process`` action and ``shell`` tool call,
  authorized and recorded in the sandbox's run like any command a client starts (actor
  ``e2b:CLIENT``); a denied or failing start, or a ready command that never succeeds, fails
  the create with the reason (and the sandbox is removed): never a sandbox half started.
  Without a ready command the sandbox is ready once the start command has started.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from harness.core.errors import CallboxError, ErrorCode
from harness.core.policy import Policy
from harness.core.sandbox_settings import SandboxSettings
from harness.doors.e2b.errors import E2bError
from harness.engine.jobs import JobEnded
from harness.engine.templates.store import Built, Template, TemplateStore
from harness.tools.shell import SHELL

if TYPE_CHECKING:
    from harness.doors.e2b.boxes import E2bSandbox, E2bSandboxes

__all__ = ["READY_POLL_S", "READY_TIMEOUT_S", "START_TAG", "BuiltTemplates"]

log = logging.getLogger("callbox.e2b")

READY_TIMEOUT_S = 120.0
READY_POLL_S = 0.25
READY_CHECK_S = 10.0
"""How long one run of the ready command may take."""
START_TAG = "start_cmd"
"""The tag of a template's start command (``commands.connect`` finds it by it)."""


class BuiltTemplates:
    """The store's templates as the E2B door's sandbox templates; see the module docstring."""

    def __init__(self, store: TemplateStore) -> None:
        self.store = store

    def find(self, client: str, ident: str) -> tuple[Template, Built] | None:
        """The built template ``client`` sees by ``ident`` (id or name), with its image."""
        template = self.store.find(client, ident)
        if template is None or not template.key:
            return None
        built = self.store.built(template.key)
        return None if built is None else (template, built)

    def policy(self, base: Policy, client: str, ident: str) -> Policy | None:
        """``base`` (the client's ``base`` template policy) running template ``ident``, or None."""
        found = self.find(client, ident)
        if found is None:
            return None
        template, built = found
        sandbox = base.sandbox
        sized: dict[str, object] = {}
        if template.cpu_count is not None:  # what the build asked, never beyond the policy
            sized["cpus"] = min(float(template.cpu_count), sandbox.cpus)
        if template.memory_mb is not None:
            sized["memory"] = max(32 << 20, min(template.memory_mb << 20, int(sandbox.memory)))
        settings = SandboxSettings.model_validate({**sandbox.model_dump(), "image": built.image,
                                                   "env": {**built.env, **sandbox.env},
                                                   "workdir": built.workdir or sandbox.workdir, **sized})
        return base.model_copy(update={"sandbox": settings})

    def start(self, sandboxes: E2bSandboxes, sandbox: E2bSandbox) -> None:
        """Seed the new ``sandbox`` of a built template, start its start command and wait
        until its ready command succeeds; E2bError (the create fails) otherwise."""
        found = self.find(sandbox.client, sandbox.template_id)
        if found is None:
            raise E2bError(ErrorCode.NOT_FOUND, f"template {sandbox.template_id!r} was removed while its sandbox "
                                                "started")
        template, built = found
        self.store.seed_into(built, sandbox.running())
        if template.start_cmd:
            self._run(sandboxes, sandbox, template.start_cmd, tag=START_TAG, wait=False)
        if template.ready_cmd:
            self._wait_ready(sandboxes, sandbox, template.ready_cmd)

    def _run(self, sandboxes: E2bSandboxes, sandbox: E2bSandbox, command: str, *, tag: str,
             wait: bool) -> int | None:
        """Run ``command`` as a job of ``sandbox`` under its policy (the ``process`` action,
        floored by the ``shell`` tool's decision); its exit status when ``wait``."""
        box = sandbox.running()
        cwd = box.spec.workdir
        shell = (sandboxes.executor.registry.get(SHELL.name) or SHELL).definition
        floor = sandbox.session.policy.decide(shell, {"command": command, "workdir": cwd})
        with sandboxes.acting(sandbox, "process", {"command": command, "tag": tag, "pty": False,
                                                   "template": sandbox.template_id}, floor=floor) as ticket:
            env = {**box.spec.env, **sandbox.env_vars}
            info = box.jobs.start(["/bin/sh", "-c", command], tag=tag, cwd=cwd, env=env)
            ticket.outcome["pid"] = info.pid
            if not wait:
                return None
            code: int | None = None
            for event in box.jobs.attach(info.pid, follow=True, timeout=READY_CHECK_S):
                if isinstance(event, JobEnded):
                    code = event.info.exit_code if event.info.state == "exited" else -1
            if code is None:
                box.jobs.kill(info.pid)
                code = -1
            ticket.outcome["exit_code"] = code
            return code

    def _wait_ready(self, sandboxes: E2bSandboxes, sandbox: E2bSandbox, command: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        tries = 0
        while True:
            tries += 1
            try:
                code = self._run(sandboxes, sandbox, command, tag="ready_cmd", wait=True)
            except CallboxError as error:
                raise E2bError(error.code, f"the template's ready command could not run: {error.message}") from None
            if code == 0:
                log.info("sandbox %s of template %s ready after %d check(s)", sandbox.sandbox_id,
                         sandbox.template_id, tries)
                return
            if time.monotonic() >= deadline:
                raise E2bError(ErrorCode.TIMED_OUT, f"the template's ready command ({command!r}) did not succeed "
                                                    f"within {READY_TIMEOUT_S:.0f} s ({tries} tries, last exit "
                                                    f"status {code}); the sandbox was removed")
            time.sleep(READY_POLL_S)
