"""The result of a call whose harness process stopped before it recorded one.

Whoever records it (the process itself on Ctrl-C or SIGTERM, a later process that finds the
owner gone, a restarted server adopting its sandboxes) records the same shape: a
``interrupted`` error (retryable only when ``command_started`` is false) whose ``structured`` says

* ``interrupted``: ``process_stopped`` (a harness process: ``callbox call``, ``callbox run``,
  a program using the Python API) or ``server_stopped`` (``callbox serve``);
* ``command_started``: true (it had started: it may have had effects), false (it had not:
  the call may be sent again and then runs, as any retry-safe failure), null (unknown);
* ``signal`` (``SIGINT``, ``SIGTERM``) when the process recorded its own stop, ``owner``
  (``host/pid/start`` of the process that ran it) and ``noticed_by`` (the one that recorded
  it; the same as ``owner`` when the process recorded itself).

A call whose command may have started is never run again under its call_id: a re-send
returns this result.
"""

from __future__ import annotations

from typing import Any

from harness.core.calls import ErrorCode, ToolResult
from harness.engine.docker.labels import Owner

__all__ = ["PROCESS_STOPPED", "SERVER_STOPPED", "audit_line", "interrupted_result", "interruption"]

PROCESS_STOPPED = "process_stopped"
SERVER_STOPPED = "server_stopped"


def interrupted_result(call_id: str, *, cause: str, command_started: bool | None, owner: str | None = None,
                       noticed_by: str | None = None, signal: str | None = None) -> ToolResult:
    """The recorded result of call ``call_id`` interrupted by ``cause`` (see the module docstring)."""
    structured: dict[str, Any] = {"command_started": command_started, "interrupted": cause}
    if signal is not None:
        structured["signal"] = signal
    if owner is not None:
        structured["owner"] = owner
    if noticed_by is not None:
        structured["noticed_by"] = noticed_by
    return ToolResult(call_id=call_id, text=_model_text(call_id, structured), is_error=True,
                      error=ErrorCode.INTERRUPTED, structured=structured)


def interruption(result: ToolResult | None) -> dict[str, Any] | None:
    """The structured content of an interrupted call's result; None for any other result."""
    structured = None if result is None else result.structured
    if not structured or structured.get("interrupted") not in (PROCESS_STOPPED, SERVER_STOPPED):
        return None
    return structured


def _cause(structured: dict[str, Any]) -> str:
    if structured.get("interrupted") == SERVER_STOPPED:
        return "the server stopped"
    signal = structured.get("signal")
    return f"its harness process stopped on {signal}" if signal else "its harness process stopped"


def _model_text(call_id: str, structured: dict[str, Any]) -> str:
    started = structured.get("command_started")
    lead = f"call {call_id!r} was interrupted ({_cause(structured)})"
    if started is False:
        return f"{lead} before its command started. Send the same call again to run it."
    ran = ("its command had started and may have had effects" if started
           else "whether its command ran to the end is unknown")
    return (f"{lead} before its result was recorded; {ran}. It is not run again under this call_id: "
            "send a new call_id to run it again.")


def _pid(label: object) -> str:
    owner = Owner.parse(str(label or ""))
    return f"pid {owner.pid} on {owner.host}" if owner is not None else "a process"


def audit_line(call_id: str, structured: dict[str, Any]) -> str:
    """One line for a person reading the audit: what stopped, who recorded it, what follows."""
    owner, noticed = structured.get("owner"), structured.get("noticed_by")
    if structured.get("interrupted") == SERVER_STOPPED:
        what = "the server running it stopped"
    else:
        signal = structured.get("signal")
        what = f"its harness process ({_pid(owner)}) stopped" + (f" on {signal}" if signal else "")
    if noticed is not None and noticed != owner:
        what += f"; {_pid(noticed)} found it gone and recorded it"
    started = structured.get("command_started")
    if started is False:
        then = "its command had not started; sending it again runs it"
    else:
        ran = "its command had started" if started else "whether its command ran is unknown"
        then = f"{ran}; it is not run again under this call_id"
    return f"{call_id} was interrupted: {what}; {then}"
