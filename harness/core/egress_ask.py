"""Egress a person approves: while a call runs, held connections become approvals.

When the first ``allow_hosts`` entry naming a destination is an ``ask`` entry, the sandbox's
egress proxy holds the connection (:mod:`sandbox.egress_hold`) and logs a hold. While a call
runs in such a sandbox, an :class:`EgressAskWatch` looks for new holds every
``POLL_S`` and, for each:

* creates an approval (tool ``egress``, call id ``egress-<hold id>``) whose arguments name
  the sandbox, the destination, the method and the call that was running; its reason says
  the same in words, for ``callbox approvals list`` and the console;
* tells the call's output stream (stderr) that the call waits and for what, and later what
  became of it, so a door streaming the call (MCP progress, gRPC output events) shows it;
* hands the proxy the answer once a person gives one (``callbox approvals approve ID
  [--scope sandbox]``, ``deny ID``, the gRPC door's ``ResolveApproval``, the console): allowed
  once, allowed for the sandbox (the proxy's approved list), or denied;
* refuses it itself (the approval denied ``by callbox``) when the policy's ``ask_timeout``
  passes, or the call's timeout ceiling comes first, or the call ends with it still held.

A connection held while no call runs gets no approval and is refused by the proxy after
``ask_timeout``. Each answer is in the approval (who, when, why, scope) and in the egress
decision the proxy logs for the connection (its reason names the approval and who answered).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

from harness.audit.errors import AuditError
from harness.audit.records import EGRESS_CALL_PREFIX, EGRESS_TOOL
from harness.core.calls import ToolCall
from harness.core.context import OutputSink
from harness.core.errors import CallboxError
from harness.engine.spec import SandboxSpec

__all__ = ["POLL_S", "EgressAskWatch", "asks_egress", "egress_meta", "watch_egress"]

log = logging.getLogger("callbox.egress")

POLL_S = 0.05
"""How often a running call's watch looks for new holds and for answers."""
TIMEOUT_BY = "callbox"
"""Who an approval is denied by when nobody answered in time, or its call ended."""


class HoldLike(Protocol):
    hold: str
    sandbox_id: str
    method: str
    timeout_s: float

    @property
    def destination(self) -> str: ...


class AskChannel(Protocol):
    """What a sandbox whose proxy can hold connections offers (Docker: ``EgressAskChannel``)."""

    def new_holds(self) -> list[Any]: ...

    def answer(self, hold: Any, *, allow: bool, approval: str | None, by: str, scope: str,
               reason: str | None = None) -> None: ...


class AuditLike(Protocol):
    def create_approval(self, run_id: str, call_id: str, tool: str, arguments_json: Any, rule: str,
                        reason: str) -> Any: ...

    def take_egress_answer(self, approval_id: str) -> Any: ...

    def resolve_approval(self, approval_id: str, approve: bool, *, by: str, reason: str | None,
                         scope: str | None = None) -> Any: ...


def asks_egress(spec: SandboxSpec) -> bool:
    """Whether a sandbox of ``spec`` may hold connections for a person (an ``ask`` entry)."""
    return spec.network == "allowlist" and any(entry.startswith("ask ") for entry in spec.allow_hosts)


def ask_channel(sandbox: object) -> AskChannel | None:
    """The sandbox's channel to its proxy's holds, if its engine has one and it asks."""
    get = getattr(sandbox, "egress_ask_channel", None)
    channel = get() if callable(get) else None
    return channel if channel is not None else None


@dataclass
class _Waiting:
    hold: Any
    approval: str
    deadline: float


class EgressAskWatch:
    """Watches the holds of the sandbox ``sandbox()`` returns (None: not started yet) while
    call ``call_id`` (of tool ``tool``) of run ``run_id`` runs; ``notify`` gets the lines
    that say what waits. Use as a context manager around the call's handler."""

    def __init__(self, audit: AuditLike, run_id: str, call_id: str, tool: str,
                 sandbox: Callable[[], object | None], notify: OutputSink | None, call_timeout_s: float,
                 poll_s: float = POLL_S) -> None:
        self.audit, self.run_id, self.call_id, self.tool = audit, run_id, call_id, tool
        self.sandbox, self.notify, self.poll_s = sandbox, notify, poll_s
        self.call_deadline = time.monotonic() + call_timeout_s
        self._waiting: list[_Waiting] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"callbox-egress-ask-{call_id}", daemon=True)

    def __enter__(self) -> EgressAskWatch:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        channel = self._channel()
        if channel is not None:
            self.look(channel)  # a last answer, and holds that came at the very end
            for waiting in list(self._waiting):
                self._refuse(channel, waiting, "ended", "the call ended before an answer")

    def _channel(self) -> AskChannel | None:
        sandbox = self.sandbox()
        return None if sandbox is None else ask_channel(sandbox)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s / 5 if self._waiting else self.poll_s):  # quicker while one waits
            try:
                channel = self._channel()
                if channel is not None:
                    self.look(channel)
            except Exception:  # the call goes on; its held connections time out at the proxy
                log.exception("watching the egress holds of run %s failed", self.run_id)

    def look(self, channel: AskChannel) -> None:
        """One look: new holds become approvals; answered ones (or late ones) are settled."""
        for hold in channel.new_holds():
            self._open(hold)
        now = time.monotonic()
        for waiting in list(self._waiting):
            try:
                approval = self.audit.take_egress_answer(waiting.approval)
            except CallboxError as error:
                log.error("egress approval %s: %s", waiting.approval, error.message)
                continue
            if approval.state in ("consumed", "approved", "denied"):
                allow = approval.state != "denied"
                scope = (approval.scope or "once") if allow else "once"
                channel.answer(waiting.hold, allow=allow, approval=approval.id, by=approval.resolved_by or "?",
                               scope=scope, reason=approval.resolution_reason)
                self._waiting.remove(waiting)
                what = ("allowed for this sandbox" if scope == "sandbox" else "allowed once") if allow else "denied"
                why = f": {approval.resolution_reason}" if approval.resolution_reason else ""
                self._say(f"approval {approval.id}: egress to {waiting.hold.destination} {what} by "
                          f"{approval.resolved_by}{why}")
            elif now >= waiting.deadline:
                self._refuse(channel, waiting, "timeout", "no answer in time")

    def _open(self, hold: Any) -> None:
        arguments = {"sandbox_id": hold.sandbox_id, "destination": hold.destination, "method": hold.method,
                     "call_id": self.call_id, "tool": self.tool}
        reason = (f"call {self.call_id} ({self.tool}) in sandbox {hold.sandbox_id} connects to {hold.destination} "
                  f"({hold.method}); an ask entry of allow_hosts names it")
        approval = self.audit.create_approval(self.run_id, f"{EGRESS_CALL_PREFIX}{hold.hold}", EGRESS_TOOL,
                                              arguments, "sandbox.allow_hosts: ask", reason)
        deadline = min(time.monotonic() + hold.timeout_s, self.call_deadline)
        self._waiting.append(_Waiting(hold, approval.id, deadline))
        self._say(f"waiting for a person: egress to {hold.destination} ({hold.method}) is held as approval "
                  f"{approval.id} (`callbox approvals approve {approval.id} [--scope sandbox]` or "
                  f"`callbox approvals deny {approval.id}`); refused in {max(0.0, deadline - time.monotonic()):.0f} s "
                  "without an answer")

    def _refuse(self, channel: AskChannel, waiting: _Waiting, scope: str, why: str) -> None:
        try:
            self.audit.resolve_approval(waiting.approval, False, by=TIMEOUT_BY, reason=why)
        except AuditError:
            return  # answered meanwhile: the next look delivers that answer
        channel.answer(waiting.hold, allow=False, approval=waiting.approval, by=TIMEOUT_BY, scope=scope, reason=why)
        self._waiting.remove(waiting)
        self._say(f"approval {waiting.approval}: egress to {waiting.hold.destination} refused: {why}")

    def _say(self, line: str) -> None:
        if self.notify is not None:
            try:
                self.notify("stderr", f"callbox: {line}\n".encode())
            except Exception:  # a door that stopped listening must not stop the watch
                log.debug("could not tell the call's stream: %s", line)


class SessionLike(Protocol):
    run_id: str
    spec: SandboxSpec

    @property
    def audit(self) -> Any: ...

    @property
    def policy(self) -> Any: ...

    @property
    def active_sandbox(self) -> Any: ...


@contextmanager
def watch_egress(session: SessionLike, call: ToolCall, notify: OutputSink | None) -> Iterator[None]:
    """Watch the session's sandbox's holds while the body (the call's handler) runs, when
    its spec has an ``ask`` entry; otherwise nothing (no thread)."""
    sandbox = session.active_sandbox
    if not asks_egress(getattr(sandbox, "spec", None) or session.spec):
        yield
        return
    timeout = float(session.policy.budgets.call_timeout_ceiling_s)
    with EgressAskWatch(session.audit, session.run_id, call.call_id, call.name, lambda: session.active_sandbox,
                        notify, timeout):
        yield


def egress_meta(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A call's egress decisions as its result's meta lists them: decision, method,
    destination, and the reason when there is one (a refusal's, or who allowed a held one)."""
    out = []
    for record in records:
        item: dict[str, Any] = {"decision": record.get("decision"), "method": record.get("method"),
                                "host": record.get("host"), "port": record.get("port")}
        if record.get("reason"):
            item["reason"] = record["reason"]
        out.append(item)
    return out
