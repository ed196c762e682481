"""Errors: one vocabulary of codes, each with its meaning, whether a retry is safe, the fix,
and how every door reports it.

Every failure callbox reports carries an :class:`ErrorCode`. A tool call's failure is a
result the model reads (``ToolResult.error``); a refused request is an exception
(:class:`CallboxError` and its subclasses each name their code) that each door turns into its
own shape with :data:`ERRORS`: the CLI's exit status, the gRPC door's status code and
``ErrorReason``, the HTTP status of the E2B door's control plane and of the console, and how
the MCP door answers. The agent inside the sandbox has reasons of its own on the wire
(``sandbox.v1.ErrorReason``); :data:`AGENT_REASONS` says which code each one is.

The CLI prints ``callbox: <message>`` and exits with the code's status; no traceback.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar, Final


class ErrorCode(enum.StrEnum):
    """Why something failed. The values are stable: they are stored in the audit store and
    sent on the wire (a result's ``error_code``)."""

    # A tool call's result the model reads.
    BAD_CALL_ID = "bad_call_id"
    UNKNOWN_TOOL = "unknown_tool"
    TOOL_NOT_ALLOWED = "tool_not_allowed"
    INVALID_JSON = "invalid_json"
    INVALID_ARGUMENTS = "invalid_arguments"
    ARGUMENTS_TOO_LARGE = "arguments_too_large"
    DENIED = "denied"
    APPROVAL_PENDING = "approval_pending"
    APPROVAL_DENIED = "approval_denied"
    BUDGET_EXCEEDED = "budget_exceeded"
    TIMED_OUT = "timed_out"
    OOM_KILLED = "oom_killed"
    NONZERO_EXIT = "nonzero_exit"
    TOOL_FAILED = "tool_failed"
    INTERRUPTED = "interrupted"
    # Requests a door, the CLI or the engine refuses.
    INVALID_REQUEST = "invalid_request"
    INVALID_CONFIG = "invalid_config"
    UNAUTHENTICATED = "unauthenticated"
    PERMISSION_DENIED = "permission_denied"
    ACTION_DENIED = "action_denied"
    PATH_ESCAPE = "path_escape"
    NOT_FOUND = "not_found"
    WRONG_TYPE = "wrong_type"
    ALREADY_EXISTS = "already_exists"
    PAUSED = "paused"
    ALREADY_RESOLVED = "already_resolved"
    CONFLICT = "conflict"
    SANDBOX_GONE = "sandbox_gone"
    LIMIT_REACHED = "limit_reached"
    TOO_LARGE = "too_large"
    BUSY = "busy"
    SESSION_BROKEN = "session_broken"
    CONNECTION_REFUSED = "connection_refused"
    COMMAND_NOT_FOUND = "command_not_found"
    NOT_EXECUTABLE = "not_executable"
    NOT_SUPPORTED = "not_supported"
    CANCELLED = "cancelled"
    DATA_LOST = "data_lost"
    # callbox, its engine or its environment failed.
    SANDBOX_UNAVAILABLE = "sandbox_unavailable"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    IMAGE_NOT_FOUND = "image_not_found"
    SHUTTING_DOWN = "shutting_down"
    INTERNAL = "internal"

    @property
    def retryable(self) -> bool:
        """Whether the same request, sent again unchanged, may succeed."""
        return ERRORS[self].retry

    @property
    def kind(self) -> ErrorKind:
        return ERRORS[self]


@dataclass(frozen=True)
class ErrorKind:
    """One row of the error table: what a code means and how each door says it."""

    code: ErrorCode
    """The stable code."""
    meaning: str
    """One sentence: what happened."""
    retry: bool
    """True when the same request may succeed if sent again unchanged (after a wait, or once
    a person acted); False when something must change first."""
    fix: str
    """What to do about it."""
    exit_status: int
    """The CLI's exit status for it (see :data:`EXIT_STATUSES`)."""
    grpc_status: str
    """The gRPC door's status code name when it refuses a request with this code; empty when
    the code only ever appears in a tool call's result (the RPC itself succeeds)."""
    grpc_reason: str
    """The ``harness.v1.ErrorReason`` name (without ``ERROR_REASON_``) in the refusal's
    ``ErrorDetail``; empty when it never is a refusal."""
    http_status: int
    """The HTTP status of the E2B door's control plane and the console; for a code that only
    appears in results, the status of the response that carries the result (200). The E2B
    door's envd (Connect protocol) answers ``grpc_status`` in lower case, with the HTTP status
    the Connect protocol gives that code."""
    mcp: str
    """How the MCP door reports it."""
    result: bool
    """Whether a tool call's result (which the model reads) can carry this code."""


@dataclass(frozen=True)
class ExitStatus:
    """One exit status of the ``callbox`` command and what it means."""

    status: int
    meaning: str


EXIT_OK: Final = 0
EXIT_ERROR_RESULT: Final = 1
EXIT_USAGE: Final = 2
EXIT_APPROVAL: Final = 3
EXIT_NOT_FOUND: Final = 4
EXIT_CONFLICT: Final = 5
EXIT_REFUSED: Final = 6
EXIT_LIMIT: Final = 7
EXIT_TIMED_OUT: Final = 124
EXIT_CALLBOX_FAILED: Final = 125
EXIT_NOT_EXECUTABLE: Final = 126
EXIT_COMMAND_NOT_FOUND: Final = 127
EXIT_KILLED: Final = 137

EXIT_STATUSES: Final = (
    ExitStatus(EXIT_OK, "success (`exec`, `sandbox exec`: the command exited 0)"),
    ExitStatus(EXIT_ERROR_RESULT, "a tool call's result is an error the model reads (invalid arguments, denied, "
                                  "a non-zero exit), a run ended by a limit, or a check of `doctor` failed"),
    ExitStatus(EXIT_USAGE, "bad usage: a flag, an argument, or a file (policy, configuration, token file) "
                           "that is not valid"),
    ExitStatus(EXIT_APPROVAL, "waiting for a person: a call or a run is paused for approval"),
    ExitStatus(EXIT_NOT_FOUND, "no such thing: sandbox, snapshot, run, call, approval, job or file"),
    ExitStatus(EXIT_CONFLICT, "the thing is in a state that does not allow this: a name in use, a sandbox "
                              "paused or running, an approval already resolved"),
    ExitStatus(EXIT_REFUSED, "refused: the policy denies it, a path outside the allowed roots, no permission"),
    ExitStatus(EXIT_LIMIT, "a limit or quota is reached; the message says when it frees up"),
    ExitStatus(EXIT_TIMED_OUT, "the command timed out (its process tree was killed)"),
    ExitStatus(EXIT_CALLBOX_FAILED, "callbox itself or its environment failed: no engine answers, the image "
                                    "is missing, a sandbox would not start, an internal error"),
    ExitStatus(EXIT_NOT_EXECUTABLE, "the command cannot run: a directory, or a file that is not executable"),
    ExitStatus(EXIT_COMMAND_NOT_FOUND, "the command was not found in the sandbox"),
    ExitStatus(EXIT_KILLED, "the command was killed (SIGKILL: the OOM killer, or a person); 128+N for "
                            "signal N in general, 130 for Ctrl-C"),
)
"""Every exit status the ``callbox`` command gives. ``exec`` and ``sandbox exec`` end with
the command's own status, which may be any number: callbox's own refusals are told apart
by the ``callbox:`` line on stderr (or by ``--json``)."""

_MCP_RESULT = "a `CallToolResult` with `isError: true`"
_MCP_REFUSAL = "a `CallToolResult` with `isError: true` naming the code"
_E = ErrorCode


def _row(code: ErrorCode, meaning: str, fix: str, *, retry: bool, exit_status: int, grpc: str = "",
         reason: str = "", http: int = 200, result: bool = False, mcp: str = "") -> ErrorKind:
    return ErrorKind(code=code, meaning=meaning, retry=retry, fix=fix, exit_status=exit_status, grpc_status=grpc,
                     grpc_reason=reason, http_status=http,
                     mcp=mcp or (_MCP_RESULT if result else _MCP_REFUSAL), result=result)


_ROWS = (
    # --- a tool call's results ----------------------------------------------------------------------
    _row(_E.BAD_CALL_ID, "The call_id is not valid (1 to 128 of `A-Za-z0-9_.:-`), or it was already used in "
         "this run for a different call.", "Send a new call_id for a new call; resend the same call_id only "
         "for the same call.", retry=False, exit_status=EXIT_ERROR_RESULT, result=True),
    _row(_E.UNKNOWN_TOOL, "No tool has that name.", "Call one of the tools listed (`callbox tools`).",
         retry=False, exit_status=EXIT_ERROR_RESULT, result=True),
    _row(_E.TOOL_NOT_ALLOWED, "The tool exists but the policy does not expose it (`allowed_tools`).",
         "Call a tool that is offered, or allow it in the policy's `allowed_tools`.",
         retry=False, exit_status=EXIT_ERROR_RESULT, result=True),
    _row(_E.INVALID_JSON, "The arguments are not a JSON object.", "Send the arguments as one JSON object.",
         retry=False, exit_status=EXIT_ERROR_RESULT, result=True),
    _row(_E.INVALID_ARGUMENTS, "The arguments do not fit the tool's schema (a missing, unknown or mistyped "
         "argument); the message names it.", "Fix the named argument and call again.",
         retry=False, exit_status=EXIT_ERROR_RESULT, result=True),
    _row(_E.ARGUMENTS_TOO_LARGE, "The arguments are larger than the harness accepts.",
         "Send less (write a large content in parts).", retry=False, exit_status=EXIT_ERROR_RESULT, result=True),
    _row(_E.DENIED, "The policy denies this call; the message names the rule.",
         "Do something else, or change the policy's rule.", retry=False, exit_status=EXIT_ERROR_RESULT,
         result=True),
    _row(_E.APPROVAL_PENDING, "The policy asks a person to approve this; it is pending as the approval named.",
         "Approve or deny it (`callbox approvals approve|deny ID`, the console, or `ResolveApproval`), then send "
         "the same request again.", retry=True, exit_status=EXIT_APPROVAL, grpc="FAILED_PRECONDITION",
         reason="APPROVAL_PENDING", http=409, result=True),
    _row(_E.APPROVAL_DENIED, "A person denied this call; the message gives their reason.",
         "Do something else.", retry=False, exit_status=EXIT_ERROR_RESULT, result=True),
    _row(_E.BUDGET_EXCEEDED, "A budget of the run is spent (tool calls, wall time, output bytes, tokens, "
         "cost).", "Start a new run, or raise the budget in the policy's `[budgets]`.",
         retry=False, exit_status=EXIT_ERROR_RESULT, result=True),
    _row(_E.TIMED_OUT, "The command ran past its timeout and its process tree was killed (or a request ran "
         "past its deadline).", "Give it a longer `timeout_ms` (up to the policy's ceiling), or make it do "
         "less.", retry=True, exit_status=EXIT_TIMED_OUT, grpc="DEADLINE_EXCEEDED", reason="", http=504,
         result=True),
    _row(_E.OOM_KILLED, "The command was killed by the out-of-memory killer at the sandbox's memory limit.",
         "Use less memory, or give the sandbox more (`--memory`, `[sandbox] memory`).",
         retry=False, exit_status=EXIT_KILLED, result=True),
    _row(_E.NONZERO_EXIT, "The command exited with a non-zero status; its output is in the result.",
         "Read the output: it is the command's own failure.", retry=False, exit_status=EXIT_ERROR_RESULT,
         result=True),
    _row(_E.TOOL_FAILED, "The tool could not do what was asked (a file that is not there, a text that does "
         "not match); the message says what.", "Read the message and call again with what it asks for.",
         retry=False, exit_status=EXIT_ERROR_RESULT, result=True),
    _row(_E.INTERRUPTED, "The process that ran the call stopped while it ran (Ctrl-C, SIGTERM, killed, a "
         "server that crashed); the result says whether its command had started.",
         "Check what the command did before running it again under a new call_id: a call that may have run "
         "is never run twice (one whose result says `command_started: false` runs when sent again).",
         retry=True, exit_status=EXIT_CALLBOX_FAILED, result=True),
    # --- refused requests ---------------------------------------------------------------------------
    _row(_E.INVALID_REQUEST, "The request is malformed: a bad flag, argument or value; the message names it "
         "and what is allowed.", "Fix the named value (`--help` lists the options).", retry=False,
         exit_status=EXIT_USAGE, grpc="INVALID_ARGUMENT", reason="INVALID_ARGUMENT", http=400),
    _row(_E.INVALID_CONFIG, "A policy file, server configuration or token file is not valid; the message names "
         "the file and the key.", "Fix the named key (`callbox config check FILE` checks a server "
         "configuration).", retry=False, exit_status=EXIT_USAGE, grpc="INVALID_ARGUMENT",
         reason="INVALID_ARGUMENT", http=400),
    _row(_E.UNAUTHENTICATED, "No bearer token, or one the server does not know.",
         "Send the client's token (`CALLBOX_TOKEN`, or `token=` of the client).", retry=False,
         exit_status=EXIT_REFUSED, grpc="UNAUTHENTICATED", reason="UNAUTHENTICATED", http=401),
    _row(_E.PERMISSION_DENIED, "Not allowed: an override looser than the server's policy, an operation the "
         "server keeps for its operator, or a file the filesystem will not let the tool user touch.",
         "Ask within the policy's limits, or ask the operator.", retry=False, exit_status=EXIT_REFUSED,
         grpc="PERMISSION_DENIED", reason="PERMISSION_DENIED", http=403),
    _row(_E.ACTION_DENIED, "The policy denies this sandbox action (a copy, a port forward, a process, a "
         "snapshot); the message names the rule.", "Change the request, or the policy's `[actions]` rule.",
         retry=False, exit_status=EXIT_REFUSED, grpc="PERMISSION_DENIED", reason="PERMISSION_DENIED", http=403),
    _row(_E.PATH_ESCAPE, "A path leaves the allowed roots (`..`, an absolute symlink, a symlink swapped in).",
         "Use a path inside the sandbox's roots (`/workspace`, the mounts, `/tmp`).", retry=False,
         exit_status=EXIT_REFUSED, grpc="PERMISSION_DENIED", reason="PERMISSION_DENIED", http=403),
    _row(_E.NOT_FOUND, "No such thing: sandbox, snapshot, run, call, approval, job, process or file.",
         "Check the name or id: `callbox sandbox ls`, `sandbox snapshots`, `audit`, `approvals list` list "
         "what exists.", retry=False, exit_status=EXIT_NOT_FOUND, grpc="NOT_FOUND", reason="NOT_FOUND", http=404),
    _row(_E.WRONG_TYPE, "A path has the other type (a directory where a file is meant, or the reverse).",
         "Name a path of the right type.", retry=False, exit_status=EXIT_USAGE, grpc="INVALID_ARGUMENT",
         reason="INVALID_ARGUMENT", http=400),
    _row(_E.ALREADY_EXISTS, "The name is taken (a sandbox, a snapshot), or the file exists and the request "
         "asked not to overwrite it.", "Pick another name, or remove the old one first.", retry=False,
         exit_status=EXIT_CONFLICT, grpc="ALREADY_EXISTS", reason="INVALID_ARGUMENT", http=409),
    _row(_E.PAUSED, "The sandbox is paused; it cannot run anything until it is resumed.",
         "Resume it (`callbox sandbox resume NAME`, `Sandboxes.Resume`, `Sandbox.connect`).", retry=False,
         exit_status=EXIT_CONFLICT, grpc="FAILED_PRECONDITION", reason="PAUSED", http=409),
    _row(_E.ALREADY_RESOLVED, "The approval was already approved, denied or used.",
         "Nothing to do; `callbox approvals list --all` shows how it was resolved.", retry=False,
         exit_status=EXIT_CONFLICT, grpc="FAILED_PRECONDITION", reason="ALREADY_RESOLVED", http=409),
    _row(_E.CONFLICT, "The thing is in a state that does not allow this now (a running sandbox, a run that "
         "already ended, a file that changed while it was read); the message says which.",
         "Do what the message says first (stop it, read it again), then retry.", retry=False,
         exit_status=EXIT_CONFLICT, grpc="FAILED_PRECONDITION", reason="INVALID_ARGUMENT", http=409),
    _row(_E.SANDBOX_GONE, "The sandbox existed but is gone: it expired, was removed, or was lost with its "
         "node.", "Create a new sandbox (or restore it from a snapshot).", retry=False,
         exit_status=EXIT_NOT_FOUND, grpc="FAILED_PRECONDITION", reason="SANDBOX_UNAVAILABLE", http=404),
    _row(_E.LIMIT_REACHED, "A limit or quota is reached (live sandboxes, calls per minute, CPUs, memory); the "
         "message names it and when it frees up.", "Wait until it frees up (gRPC `grpc-retry-pushback-ms`, "
         "HTTP `Retry-After`), or remove a sandbox.", retry=True, exit_status=EXIT_LIMIT,
         grpc="RESOURCE_EXHAUSTED", reason="LIMIT_REACHED", http=429),
    _row(_E.TOO_LARGE, "A read, write or request is larger than its limit.", "Send less, or in parts.",
         retry=False, exit_status=EXIT_LIMIT, grpc="RESOURCE_EXHAUSTED", reason="INVALID_ARGUMENT", http=413),
    _row(_E.BUSY, "The sandbox runs as many processes as it may (its pids limit, or the agent's limit on "
         "commands at once).", "Retry once some of its processes have exited.", retry=True,
         exit_status=EXIT_LIMIT, grpc="RESOURCE_EXHAUSTED", reason="LIMIT_REACHED", http=429),
    _row(_E.SESSION_BROKEN, "The persistent bash session cannot run commands (a command timed out, bash "
         "exited, a call was cancelled mid-command).", "Restart it (`bash` tool with `restart: true`).",
         retry=False, exit_status=EXIT_CONFLICT, grpc="FAILED_PRECONDITION", reason="INVALID_ARGUMENT", http=409),
    _row(_E.CONNECTION_REFUSED, "Nothing in the sandbox listens on that port.",
         "Start the server in the sandbox first, then connect again.", retry=True, exit_status=EXIT_CONFLICT,
         grpc="FAILED_PRECONDITION", reason="", http=502),
    _row(_E.COMMAND_NOT_FOUND, "The program was not found in the sandbox.",
         "Check its name and `PATH`, or install it in the image.", retry=False,
         exit_status=EXIT_COMMAND_NOT_FOUND, grpc="NOT_FOUND", reason="NOT_FOUND", http=404),
    _row(_E.NOT_EXECUTABLE, "The program cannot be run: it is a directory, or a file without execute "
         "permission.", "Name an executable file (or run it through its interpreter).", retry=False,
         exit_status=EXIT_NOT_EXECUTABLE, grpc="PERMISSION_DENIED", reason="PERMISSION_DENIED", http=403),
    _row(_E.NOT_SUPPORTED, "This server does not serve that method, route or option.",
         "Use what the message lists instead.", retry=False, exit_status=EXIT_USAGE, grpc="UNIMPLEMENTED",
         reason="INVALID_ARGUMENT", http=501),
    _row(_E.CANCELLED, "The request was cancelled before it finished (the client went away, or the response "
         "ended first).", "Send it again if it is still wanted.", retry=True, exit_status=EXIT_CALLBOX_FAILED,
         grpc="CANCELLED", reason="INTERNAL", http=499),
    _row(_E.DATA_LOST, "A stream lost data (a watcher's queue overflowed, a download ended short).",
         "Start it again (watch again and list the directory; download again).", retry=True,
         exit_status=EXIT_CALLBOX_FAILED, grpc="DATA_LOSS", reason="INTERNAL", http=500),
    # --- callbox or its environment failed ----------------------------------------------------------
    _row(_E.SANDBOX_UNAVAILABLE, "The sandbox could not be reached or started (its container stopped, or no "
         "engine answered); a command that never started may be retried.",
         "Retry; if it persists, `callbox doctor` says what is wrong with the engine.", retry=True,
         exit_status=EXIT_CALLBOX_FAILED, grpc="UNAVAILABLE", reason="SANDBOX_UNAVAILABLE", http=503,
         result=True),
    _row(_E.ENGINE_UNAVAILABLE, "No container engine answers (Docker, or the Ray cluster); callbox fails "
         "closed and never runs a tool on the host.", "Start the engine (`make engine`, `systemctl start "
         "docker`) or fix `DOCKER_HOST`; `callbox doctor` checks it.", retry=True,
         exit_status=EXIT_CALLBOX_FAILED, grpc="UNAVAILABLE", reason="SANDBOX_UNAVAILABLE", http=503),
    _row(_E.IMAGE_NOT_FOUND, "The sandbox image is not on this machine (there is no registry to pull from).",
         "Build it: `callbox image build` (or `make image`).", retry=False, exit_status=EXIT_CALLBOX_FAILED,
         grpc="FAILED_PRECONDITION", reason="SANDBOX_UNAVAILABLE", http=503),
    _row(_E.SHUTTING_DOWN, "The server is shutting down.", "Retry against the server once it is back.",
         retry=True, exit_status=EXIT_CALLBOX_FAILED, grpc="UNAVAILABLE", reason="SHUTTING_DOWN", http=503),
    _row(_E.INTERNAL, "A bug or a broken environment in callbox; the server's log has the details.",
         "Report it with the log lines; `callbox doctor` checks the environment.", retry=False,
         exit_status=EXIT_CALLBOX_FAILED, grpc="INTERNAL", reason="INTERNAL", http=500, result=True),
)

ERRORS: Final = MappingProxyType({row.code: row for row in _ROWS})
"""The error table: every :class:`ErrorCode`'s row, in the order above."""

AGENT_REASONS: Final = MappingProxyType({
    "INVALID_ARGUMENT": ErrorCode.INVALID_REQUEST,
    "NOT_FOUND": ErrorCode.NOT_FOUND,
    "WRONG_TYPE": ErrorCode.WRONG_TYPE,
    "PATH_ESCAPE": ErrorCode.PATH_ESCAPE,
    "PERMISSION_DENIED": ErrorCode.PERMISSION_DENIED,
    "ALREADY_EXISTS": ErrorCode.ALREADY_EXISTS,
    "TOO_LARGE": ErrorCode.TOO_LARGE,
    "SPAWN_FAILED": ErrorCode.NOT_EXECUTABLE,
    "NO_SUCH_PROCESS": ErrorCode.NOT_FOUND,
    "BUSY": ErrorCode.BUSY,
    "INTERNAL": ErrorCode.INTERNAL,
    "SESSION_BROKEN": ErrorCode.SESSION_BROKEN,
    "CONNECTION_REFUSED": ErrorCode.CONNECTION_REFUSED,
})
"""The in-sandbox agent's ``sandbox.v1.ErrorReason`` names (without ``ERROR_REASON_``) and
the code each one is. A failed agent call without a reason of the agent's own means the
sandbox stopped answering: :data:`ErrorCode.SANDBOX_UNAVAILABLE`."""

if len(ERRORS) != len(ErrorCode):  # pragma: no cover - a row missing is a bug caught at import
    missing = sorted(set(ErrorCode) - set(ERRORS))
    raise AssertionError(f"the error table has no row for {missing}")


class CallboxError(Exception):
    """Base class: a failure callbox explains instead of crashing.

    Each subclass names its :class:`ErrorCode` (``code``); an instance may name another one
    (``CallboxError(message, code=...)``). The CLI's exit status is the code's."""

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL

    def __init__(self, message: str, *, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code  # type: ignore[misc]  # an instance's own code shadows the class's

    @property
    def exit_code(self) -> int:
        return ERRORS[self.code].exit_status


class UsageError(CallboxError):
    """Bad flags or arguments."""

    code = ErrorCode.INVALID_REQUEST


class EngineUnavailable(CallboxError):
    """No container engine answers: fail closed, never run anything on the host."""

    code = ErrorCode.ENGINE_UNAVAILABLE


class ImageNotFound(CallboxError):
    """The sandbox image is not present locally."""

    code = ErrorCode.IMAGE_NOT_FOUND

    @classmethod
    def named(cls, image: str) -> ImageNotFound:
        return cls(f"image {image} not found locally; build it with `callbox image build` "
                   "(there is no registry to pull from)")


class SandboxStartError(CallboxError):
    """The container started but its agent never became ready."""

    code = ErrorCode.SANDBOX_UNAVAILABLE


class SessionClosed(CallboxError):
    """The session has ended: its sandbox is gone and no new one starts for it."""

    code = ErrorCode.SANDBOX_GONE


class AgentCallError(CallboxError):
    """The agent refused or failed an RPC; carries its structured reason (the agent's
    ``ErrorReason`` name, or ``UNSPECIFIED``) and the gRPC status code name."""

    def __init__(self, message: str, *, reason: str, grpc_code: str, retryable: bool) -> None:
        super().__init__(message, code=AGENT_REASONS.get(reason, ErrorCode.SANDBOX_UNAVAILABLE))
        self.reason = reason
        self.grpc_code = grpc_code
        self.retryable = retryable


def short_reason(exc: BaseException) -> str:
    """The first line of an exception's text (at most 300 characters), for one-line messages."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
