"""What the ``callbox sandbox ...`` commands share: who acts, opening a living sandbox, the
policy gate around sandbox actions, JSON output and the way times and sizes are shown.

Policy and audit. Each action the policy knows (:mod:`harness.core.actions`) goes through an
:class:`~harness.core.actions.ActionGate` built from ``--policy`` (default: the packaged
policy) and ``--audit-db`` (default ``$CALLBOX_AUDIT_DB`` or the state directory). The run
an action is recorded under is the id of the sandbox it is about (``callbox audit --run ID``
lists a sandbox's actions; a name reused later is another sandbox, another run), or, for a
server's sandbox, the run it serves (its E2B or gRPC id: :func:`run_of`), the actor
``user:<uid>``. A denial ends the command with 1 and the policy's reason; ``ask`` ends it with
1 and the approval's id, to approve with ``callbox approvals approve ID`` and repeat the same
command with ``--approval ID``. With ``--json`` either also prints one object on stdout:
``{"error": "approval_pending" | "denied" | "approval_denied" | ..., "action", "rule",
"message", "approval_id"}``. Removing a sandbox (``rm``) ends its run in the audit store
(``removed``), when the store holds one still open (:func:`end_sandbox_run`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.cli.options import UsageParser
from harness.core.errors import CallboxError, ErrorCode
from harness.core.times import clock

if TYPE_CHECKING:
    from harness.core.actions import ActionTicket
    from harness.engine.docker.engine import DockerEngine
    from harness.engine.docker.sandbox import Sandbox

__all__ = [
    "CommandParser",
    "actor",
    "age",
    "connect",
    "end_sandbox_run",
    "gate_options",
    "guarded",
    "json_errors",
    "known_job",
    "load_gate_policy",
    "new_name",
    "opened",
    "print_json",
    "run_of",
    "sandbox_json",
    "say_sandbox",
    "size",
    "until",
]


class CommandParser(UsageParser):
    """The parser of a verb taking ``NAME [OPTIONS] -- CMD [ARG...]``: the words after the first
    ``--`` are the command (``cmd``), whatever they look like, and the options may sit between
    NAME and ``--``. argparse alone cannot: a REMAINDER positional swallows the options after
    NAME, and ``nargs="*"`` is matched empty before ``--`` is reached."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        words = list(sys.argv[1:] if args is None else args)
        if "--" not in words or not any(action.dest == "cmd" for action in self._actions):
            return super().parse_known_args(words, namespace)
        split = words.index("--")
        parsed, extras = super().parse_known_args(words[:split], namespace)
        if parsed.cmd:
            self.error(f"unexpected {parsed.cmd[0]!r} before --: the options go between NAME and --, the "
                       "command after it")
        parsed.cmd = words[split + 1:]
        return parsed, extras


def actor() -> str:
    """Who acts from this command line: ``user:<uid>`` (also the owner of what it creates)."""
    return f"user:{os.getuid()}"


def new_name() -> str:
    """A name for a sandbox created without ``--name`` (a name is what keeps it alive after
    the command: an unnamed sandbox ends with the process that created it)."""
    return f"sb-{secrets.token_hex(3)}"


def gate_options(parser: argparse.ArgumentParser) -> None:
    """``--policy``, ``--audit-db`` and ``--approval`` of a command that does a sandbox action."""
    group = parser.add_argument_group("policy")
    group.add_argument("--policy", type=Path, help="policy file (default: the packaged default policy)")
    group.add_argument("--audit-db", type=Path, help="audit store (default $CALLBOX_AUDIT_DB or the state dir)")
    group.add_argument("--approval", metavar="ID",
                       help="repeat an action a person approved (`callbox approvals approve ID`)")


def load_gate_policy(args: argparse.Namespace) -> Any:
    """The policy of ``--policy``, read before any engine is contacted (a bad file fails fast)."""
    from harness.core.policy import load_policy

    return load_policy(args.policy)


def run_of(sandbox: Sandbox) -> str:
    """The run the actions on ``sandbox`` are recorded under: the run it serves (a server's
    sandbox, owner ``run:<run id>``: its E2B or gRPC id), else its own id."""
    from harness.engine.base import owner_run

    return owner_run(sandbox.owner) or sandbox.id


@contextlib.contextmanager
def guarded(args: argparse.Namespace, policy: Any, sandbox_id: str, action: str, details: Mapping[str, Any], *,
            workdir: str | None = None) -> Iterator[ActionTicket]:
    """Authorize ``action`` on the sandbox ``sandbox_id`` and record its outcome when the block
    ends (see the module docstring); facts added to ``ticket.outcome`` are recorded with it."""
    from harness.audit.store import AuditStore
    from harness.core.actions import ActionGate

    with AuditStore(args.audit_db) as audit:
        gate = ActionGate(policy, audit, run_id=sandbox_id, actor=actor(), workdir=workdir)
        with gate.guard(action, details, approval_id=args.approval) as ticket:
            yield ticket


def end_sandbox_run(audit_db: Path | None, sandbox_id: str, reason: str = "removed") -> bool:
    """End the run of the sandbox ``sandbox_id`` (its run id is the sandbox's id) with
    ``reason``, if the audit store (``audit_db``, default ``$CALLBOX_AUDIT_DB`` or the state
    directory) has it still open; whether it did. A store that does not exist is not made;
    one that cannot be used is said on stderr (the sandbox is gone all the same)."""
    from harness.audit.database import default_audit_path
    from harness.audit.store import AuditError, AuditStore
    from harness.cli.options import say

    path = audit_db if audit_db is not None else default_audit_path()
    if not path.exists():
        return False
    try:
        with AuditStore(path) as audit:
            try:
                run = audit.get_run(sandbox_id)
            except AuditError:  # no run: nothing was ever recorded for this sandbox
                return False
            if run.ended is not None:
                return False
            audit.end_run(sandbox_id, reason)
            return True
    except AuditError as error:
        say(f"the run of sandbox {sandbox_id} was not ended in the audit store: {error.message}")
        return False


@contextlib.contextmanager
def json_errors(args: argparse.Namespace) -> Iterator[None]:
    """With ``--json``, a refused or pending action also prints its JSON object on stdout
    (the one-line message on stderr and the exit code stay the CLI's)."""
    from harness.core.actions import ActionDenied, ApprovalPending

    try:
        yield
    except (ActionDenied, ApprovalPending) as error:
        if getattr(args, "json", False):
            pending = error.approval_id if isinstance(error, ApprovalPending) else None
            code = "approval_pending" if isinstance(error, ApprovalPending) else error.denial
            print_json({"error": code, "action": error.action, "rule": error.rule, "message": error.message,
                        "approval_id": pending})
        raise


def connect(args: argparse.Namespace) -> DockerEngine:
    """The engine of the command's ``--engine`` (Docker without it; its SDK, or ray, is loaded
    only now)."""
    from harness.cli.options import connect_engine

    return connect_engine(args)


@contextlib.contextmanager
def opened(engine: DockerEngine, name_or_id: str) -> Iterator[Sandbox]:
    """The living sandbox ``name_or_id`` (a paused one too); its agent connection is closed
    when the block ends, the sandbox lives on."""
    sandbox = engine.open(name_or_id)
    try:
        yield sandbox
    finally:
        sandbox.agent.close()


@contextlib.contextmanager
def known_job(sandbox: Sandbox, pid: int) -> Iterator[None]:
    """The agent's "no such process" for ``pid`` as one line naming ``callbox sandbox ps`` (exit 1)."""
    from harness.core.errors import AgentCallError

    try:
        yield
    except AgentCallError as error:
        if error.reason != "NO_SUCH_PROCESS":
            raise
        raise CallboxError(f"sandbox {sandbox.label} has no job with pid {pid}; "
                           f"`callbox sandbox ps {sandbox.label}` lists its jobs", code=ErrorCode.NOT_FOUND) from None


def print_json(value: Any, *, listing: bool = False) -> None:
    """One JSON value on one line (a stream of them is JSON lines); a ``listing`` (``ls``,
    ``ps``, ``snapshots``) indented like ``callbox ps --json``."""
    print(json.dumps(value, indent=2 if listing else None), flush=True)


def sandbox_json(sandbox: Sandbox, *, now: float | None = None) -> dict[str, Any]:
    """``new``, ``fork`` and ``restore``'s object: who it is and when it expires."""
    now = time.time() if now is None else now
    return {
        "name": sandbox.name, "sandbox_id": sandbox.id, "owner": sandbox.owner,
        "created_at": round(sandbox.created_at, 3), "expires_at": round(sandbox.expires, 3),
        "expires_in_s": round(sandbox.expires - now), "image": sandbox.spec.image,
        "network": sandbox.spec.network, "workdir": sandbox.spec.workdir,
    }


def say_sandbox(verb: str, sandbox: Sandbox) -> None:
    """``created sandbox web (id 0123abcd4567), expires in 59m 59s at 14:03:10``."""
    print(f"{verb} sandbox {sandbox.label} (id {sandbox.id}), expires {until(sandbox.expires)}")


def age(seconds: float) -> str:
    """``42s``, ``5m 03s``, ``2h 05m``, ``3d 04h``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


def until(when: float, *, now: float | None = None) -> str:
    """``in 59m 59s at 14:03:10 UTC`` (local time and zone; the date too when it is not
    today), ``5s ago`` once passed."""
    now = time.time() if now is None else now
    left = when - now
    if left < 0:
        return f"{age(-left)} ago"
    return f"in {age(left)} at {clock(when, now=now)}"


def size(n: float | None) -> str:
    """``812B``, ``4.0K``, ``38.2M``, ``1.5G``; ``-`` when unknown."""
    if n is None:
        return "-"
    for unit in ("B", "K", "M", "G"):
        if n < 1024 or unit == "G":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}T"  # pragma: no cover - the loop returns at G

