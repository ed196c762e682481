"""The E2B door's sandboxes: sessions of the executor, with what the E2B API adds to them.

An E2B sandbox is a session of the :class:`~harness.doors.grpc.service.ExecutorService` (one
registry for every door: the same limits per client and in total, the same TTL reaper, the
same policy, audit store and engine), made with ``door="e2b"``, so its id is its run's id
(``e2b-...``). The door keeps beside it what E2B clients give and get: the template, the
metadata, the environment variables, and the envd access token.

Who may do what:

* **Control plane** (REST): the client named by the request's API key (``X-API-KEY``, a
  token of the server's token file) sees and controls only its own sandboxes; anyone
  else's, like one that never existed, is ``not_found`` with the same words.
* **envd** (the sandbox's own API): requests name the sandbox (``E2b-Sandbox-Id``) and carry
  its access token (``X-Access-Token``), returned only to its owner by create and connect.
  A missing or wrong token is ``unauthenticated``; an unknown sandbox ``not_found``.
* **Actions**: each is gated by the sandbox's policy with the actor ``e2b:CLIENT``
  (:meth:`E2bSandboxes.acting`), recorded in the sandbox's run like the gRPC door's.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import secrets
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.audit.store import AuditError
from harness.core.actions import ActionDenied, ActionGate, ActionTicket, ApprovalPending
from harness.core.errors import CallboxError, short_reason
from harness.core.policy import Policy
from harness.doors.e2b.errors import E2bError, from_callbox, from_service_error, not_found
from harness.doors.grpc.errors import ServiceError
from harness.doors.grpc.overrides import SandboxOverrides
from harness.doors.grpc.service import ExecutorService
from harness.doors.grpc.sessions import ClientSession
from harness.engine.docker.sandbox import Sandbox as DockerSandbox

__all__ = ["DEFAULT_TEMPLATE", "DOOR", "E2bSandbox", "E2bSandboxes", "e2b_errors"]

log = logging.getLogger("callbox.e2b")

DOOR = "e2b"
DEFAULT_TEMPLATE = "base"
"""The template the SDK asks for when its caller names none: the server's own policy and image."""


@dataclass
class E2bSandbox:
    """One E2B sandbox: its executor session and what the E2B API keeps with it."""

    session: ClientSession
    template_id: str
    access_token: str
    metadata: dict[str, str] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)

    @property
    def sandbox_id(self) -> str:
        return self.session.sandbox_id

    @property
    def client(self) -> str:
        return self.session.client

    @property
    def closed(self) -> bool:
        return self.session.closed

    @property
    def box(self) -> DockerSandbox:
        """The engine sandbox (paused or running)."""
        box = self.session.harness.active_sandbox
        if not isinstance(box, DockerSandbox):
            raise E2bError("unavailable", f"sandbox {self.sandbox_id} has no running container")
        return box

    def running(self) -> DockerSandbox:
        """The engine sandbox, for what needs its agent: ``failed_precondition`` while paused
        (the SDK's ``Sandbox.connect`` resumes it)."""
        box = self.box
        if self.session.paused or box.paused:
            raise E2bError("failed_precondition",
                           f"sandbox {self.sandbox_id} is paused; resume it with Sandbox.connect first")
        return box

    @property
    def state(self) -> str:
        """``running`` or ``paused``, as the E2B API names them."""
        return "paused" if self.session.paused else "running"

    def end_at(self, now: float | None = None) -> float:
        """When its timeout removes it (while paused: if it were resumed now)."""
        return self.session.expires_at(time.time() if now is None else now)


class E2bSandboxes:
    """The E2B sandboxes of one server, over an :class:`ExecutorService`; see the module docstring."""

    def __init__(self, executor: ExecutorService, templates: Mapping[str, Policy] | None = None) -> None:
        self.executor = executor
        self.audit = executor.audit
        self.templates: dict[str, Policy] = dict(templates or {})
        self.templates.setdefault(DEFAULT_TEMPLATE, executor.policy)
        self._lock = threading.Lock()
        self._boxes: dict[str, E2bSandbox] = {}

    # ---- create, find, remove --------------------------------------------------------------------

    def create(self, client: str, *, template_id: str = DEFAULT_TEMPLATE, overrides: SandboxOverrides | None = None,
               metadata: Mapping[str, str] | None = None) -> E2bSandbox:
        """Start a sandbox of ``template_id`` for ``client`` (``overrides`` tighten its policy:
        the timeout as ``ttl_seconds``, the envVars as ``env``)."""
        base = self.templates.get(template_id or DEFAULT_TEMPLATE)
        if base is None:
            known = ", ".join(sorted(self.templates))
            raise E2bError("not_found", f"template {template_id!r} not found; this server has: {known}")
        wanted = overrides or SandboxOverrides()
        try:
            session = self.executor.create_session(client, wanted, door=DOOR, base_policy=base)
        except ServiceError as error:
            raise from_service_error(error) from None
        sandbox = E2bSandbox(session=session, template_id=template_id or DEFAULT_TEMPLATE,
                             access_token=secrets.token_urlsafe(24), metadata=dict(metadata or {}),
                             env_vars=dict(wanted.env))
        with contextlib.suppress(AuditError):
            self.audit.update_run_meta(sandbox.sandbox_id, {"template": sandbox.template_id,
                                                            "metadata": sandbox.metadata})
        with self._lock:
            self._boxes[sandbox.sandbox_id] = sandbox
        return sandbox

    def _live(self, sandbox_id: str) -> E2bSandbox | None:
        with self._lock:
            sandbox = self._boxes.get(sandbox_id)
            if sandbox is not None and sandbox.closed:  # expired, deleted through another door, shut down
                del self._boxes[sandbox_id]
                return None
            return sandbox

    def get(self, client: str, sandbox_id: str) -> E2bSandbox:
        """``client``'s live sandbox ``sandbox_id``; ``not_found`` for anyone else's or none."""
        sandbox = self._live(sandbox_id)
        if sandbox is None or sandbox.client != client:
            raise not_found("sandbox", sandbox_id)
        return sandbox

    def for_envd(self, sandbox_id: str, access_token: str | None) -> E2bSandbox:
        """The sandbox an envd request names, if it carries that sandbox's access token."""
        sandbox = self._live(sandbox_id)
        if sandbox is None:
            raise not_found("sandbox", sandbox_id)
        if not access_token or not hmac.compare_digest(access_token.encode(), sandbox.access_token.encode()):
            raise E2bError("unauthenticated",
                           f"the X-Access-Token header is missing or not the access token of sandbox {sandbox_id}")
        return sandbox

    def list(self, client: str) -> list[E2bSandbox]:
        """``client``'s live sandboxes, oldest first."""
        with self._lock:
            for sid in [sid for sid, s in self._boxes.items() if s.closed]:
                del self._boxes[sid]
            return sorted((s for s in self._boxes.values() if s.client == client), key=lambda s: s.started_at)

    def kill(self, client: str, sandbox_id: str) -> None:
        """Destroy ``client``'s sandbox (``not_found`` for anyone else's)."""
        sandbox = self.get(client, sandbox_id)
        with self._lock:
            self._boxes.pop(sandbox_id, None)
        self.executor.delete_session(sandbox.session, "deleted")

    # ---- policy and audit of sandbox actions -------------------------------------------------------

    def gate(self, sandbox: E2bSandbox) -> ActionGate:
        """The action gate of the sandbox's policy and run, the actor ``e2b:CLIENT``."""
        return ActionGate(sandbox.session.policy, self.audit, run_id=sandbox.sandbox_id,
                          actor=f"{DOOR}:{sandbox.client}")

    @contextlib.contextmanager
    def acting(self, sandbox: E2bSandbox, action: str, details: Mapping[str, Any]) -> Iterator[ActionTicket]:
        """Authorize ``action`` (``permission_denied`` if the policy denies it;
        ``failed_precondition`` naming the approval if it asks), then record its outcome when
        the block ends: ok, cancelled (the client went away: an ok end), or failed."""
        gate = self.gate(sandbox)
        try:
            ticket = gate.authorize(action, {"sandbox": sandbox.sandbox_id, **details})
        except (ActionDenied, ApprovalPending) as refusal:
            raise from_callbox(refusal) from None
        try:
            yield ticket
        except GeneratorExit:
            self._finish(gate, ticket, ok=True, detail={**ticket.outcome, "ended": "cancelled"})
            raise
        except BaseException as exc:
            self._finish(gate, ticket, ok=False, detail={**ticket.outcome, "error": short_reason(exc)})
            raise
        self._finish(gate, ticket, ok=True, detail=ticket.outcome)

    @staticmethod
    def _finish(gate: ActionGate, ticket: ActionTicket, *, ok: bool, detail: Mapping[str, Any]) -> None:
        try:
            gate.finish(ticket, ok=ok, detail=detail)
        except AuditError as error:  # the action's own result matters more than its record
            log.error("cannot record the outcome of %s in run %s: %s", ticket.tool, ticket.run_id, error.message)


@contextlib.contextmanager
def e2b_errors(sandbox: E2bSandbox | None = None) -> Iterator[None]:
    """callbox errors as E2bError; an operation of a sandbox removed meanwhile is ``not_found``."""
    try:
        yield
    except E2bError:
        raise
    except ServiceError as error:
        raise from_service_error(error) from None
    except CallboxError as error:
        if sandbox is not None and sandbox.closed:
            raise not_found("sandbox", sandbox.sandbox_id) from None
        raise from_callbox(error) from None
