"""``callbox sandbox exec | ps | logs | kill``: commands and background jobs in a living sandbox.

``exec NAME -- CMD`` runs CMD in the foreground like ``callbox exec`` (streamed, piped stdin,
its exit code; not a policy action, as ``callbox exec`` is not); with ``--background`` it
starts a job (the ``process`` action) and prints its pid. ``ps`` lists the jobs of one
sandbox, or of every running named one (paused ones are skipped: their agent is frozen). ``logs``
(the ``attach`` action) replays a job's held output, a marker line on stdout where older
output was dropped (``[callbox: N bytes (chunks A-B) dropped]``); with ``--follow`` it then
streams live output until the job ends and exits with the job's code (128+N when signal N
ended it, 137 for SIGKILL and the OOM killer); without, it exits 0 once the held output is
printed, whatever the job's state. ``kill`` ends a job (SIGKILL to every process of it) or
sends it ``--signal`` (not a policy action: it only stops what runs).
"""

from __future__ import annotations

import argparse
import base64
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from harness.cli.foreground import DEFAULT_TIMEOUT_S, command_of, foreground_options, output_cap, run_foreground
from harness.cli.options import read_stdin, say
from harness.cli.sandbox_common import (
    age,
    connect,
    gate_options,
    guarded,
    known_job,
    load_gate_policy,
    opened,
    print_json,
    run_of,
)
from harness.core.errors import CallboxError, ErrorCode, UsageError
from harness.core.units import format_size

if TYPE_CHECKING:
    from harness.engine.docker.sandbox import Sandbox
    from harness.engine.jobs import JobEvent, JobInfo


def add_verbs(verbs: Any) -> None:
    ex = verbs.add_parser("exec", help="run a command in a living sandbox (or start it as a background job)")
    ex.add_argument("name", help="sandbox name or id (a server's sandbox: also its E2B or run id)")
    ex.add_argument("--background", action="store_true",
                    help="start CMD as a background job and print its pid (see `logs`, `ps`, `kill`)")
    ex.add_argument("--tag", default="", help="a label for the background job, shown by `ps`")
    foreground_options(ex, timeout_default=None, remainder=False,
                       json_help="print one JSON result object (with --background: the job's info)")
    gate_options(ex)

    ps = verbs.add_parser("ps", help="the jobs of a sandbox (of every living sandbox without NAME)")
    ps.add_argument("name", nargs="?", help="sandbox name or id (a server's sandbox: also its E2B or run id)")
    ps.add_argument("--json", action="store_true",
                    help="print a JSON list of {sandbox, sandbox_id, pid, tag, command, state, exit_code, signal, "
                         "pty, started_at, duration_s, next_seq, output_bytes, dropped_bytes, oom_killed}")

    logs = verbs.add_parser("logs", help="a job's output: the held part, then live with --follow")
    logs.add_argument("name", help="sandbox name or id (a server's sandbox: also its E2B or run id)")
    logs.add_argument("pid", metavar="PID|TAG", help="the job's pid, or the tag of its newest job (see `ps`)")
    logs.add_argument("--from-seq", type=_seq, default=0, metavar="N",
                      help="start at output chunk N (default 0: the oldest still held)")
    logs.add_argument("--follow", "-f", action="store_true",
                      help="stream live output until the job ends, then exit with its code")
    logs.add_argument("--json", action="store_true",
                      help="print JSON lines: {seq, stream, data[, data_base64]}, {gap: {first_seq, end_seq, "
                           "dropped_bytes}}, {live: job}, {ended: job}")
    gate_options(logs)

    kill = verbs.add_parser("kill", help="end a job (SIGKILL to each of its processes) or signal it")
    kill.add_argument("name", help="sandbox name or id (a server's sandbox: also its E2B or run id)")
    kill.add_argument("pid", metavar="PID|TAG", help="the job's pid, or the tag of its newest job (see `ps`)")
    kill.add_argument("--signal", "-s", type=_signal, metavar="SIG",
                      help="send this signal (TERM, SIGINT, 15, ...) instead of killing")
    kill.add_argument("--json", action="store_true",
                      help="print the job's final info (with --signal: {pid, signal, delivered})")


def _seq(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a chunk number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative; chunks are numbered from 0")
    return value


def _signal(text: str) -> int:
    name = text.upper()
    if name.isdigit():
        number = int(name)
        if not 1 <= number < signal.NSIG:
            raise argparse.ArgumentTypeError(f"{text} is not a signal number (1 to {signal.NSIG - 1})")
        return number
    try:
        return int(signal.Signals[name if name.startswith("SIG") else f"SIG{name}"])
    except KeyError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a signal; use a name like TERM or a number") from None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def job_exit_code(info: JobInfo) -> int:
    """The code a shell would report for an ended job: its status, 128+N for signal N."""
    if info.state == "exited" and info.exit_code is not None:
        return info.exit_code
    return 128 + info.signal if info.signal else 1


def job_json(sandbox: Sandbox, info: JobInfo) -> dict[str, Any]:
    return {"sandbox": sandbox.label, "sandbox_id": sandbox.id, **info.to_json()}


# ---- verbs --------------------------------------------------------------------------------------


def _exec(args: argparse.Namespace) -> int:
    cmd = command_of(args, "callbox sandbox exec NAME [--background] -- CMD [ARG...]")
    if args.background:
        if args.timeout is not None:
            raise UsageError("--timeout is for a foreground command; a background job runs until it ends or "
                             "`callbox sandbox kill` ends it")
        return _background(args, cmd)
    if args.tag:
        raise UsageError("--tag names a background job: add --background")
    cap = output_cap(args)
    stdin = read_stdin()
    engine = connect(args)
    with opened(engine, args.name) as sandbox:
        sandbox.require_running()
        return run_foreground(sandbox.agent, cmd, cwd=sandbox.spec.workdir, env=sandbox.spec.env, stdin=stdin,
                              timeout=args.timeout or DEFAULT_TIMEOUT_S, cap=cap, as_json=args.json,
                              memory=format_size(sandbox.spec.memory))


def _background(args: argparse.Namespace, cmd: list[str]) -> int:
    policy = load_gate_policy(args)
    engine = connect(args)
    with opened(engine, args.name) as sandbox:
        details = {"sandbox": args.name, "command": cmd, "tag": args.tag, "pty": False}
        with guarded(args, policy, run_of(sandbox), "process", details, workdir=sandbox.spec.workdir) as ticket:
            info = sandbox.jobs.start(cmd, tag=args.tag, cwd=sandbox.spec.workdir, env=sandbox.spec.env)
            ticket.outcome.update(pid=info.pid)
    if args.json:
        print_json(job_json(sandbox, info))
    else:
        print(f"started pid {info.pid} in sandbox {sandbox.label}; its output: "
              f"`callbox sandbox logs {sandbox.label} {info.pid} --follow`")
    return 0


def _ps(args: argparse.Namespace) -> int:
    engine = connect(args)
    rows: list[dict[str, Any]] = []
    if args.name is not None:
        with opened(engine, args.name) as sandbox:
            rows += [job_json(sandbox, info) for info in sandbox.jobs.list()]
    else:
        for found in engine.list_sandboxes(stats=False):
            if found.state != "running" or found.name is None:
                continue
            try:
                with opened(engine, found.sandbox_id) as sandbox:
                    rows += [job_json(sandbox, info) for info in sandbox.jobs.list()]
            except CallboxError as error:  # it went away or was paused meanwhile
                say(f"skipping sandbox {found.name}: {error.message}")
    if args.json:
        print_json(rows, listing=True)
        return 0
    box_w = max([9, *(len(r["sandbox"]) + 2 for r in rows)])
    print(f"{'SANDBOX':<{box_w}}{'PID':<8}{'TAG':<12}{'STATE':<9}{'EXIT':<7}{'AGE':<9}COMMAND")
    now = time.time()
    for r in rows:
        status = "-" if r["state"] == "running" else str(r["exit_code"]) if r["state"] == "exited" else \
            f"sig{r['signal']}"
        command = " ".join(r["command"])
        print(f"{r['sandbox']:<{box_w}}{r['pid']:<8}{r['tag'] or '-':<12}{r['state']:<9}{status:<7}"
              f"{age(now - r['started_at']):<9}{command if len(command) <= 60 else command[:57] + '...'}")
    return 0


def job_pid(sandbox: Sandbox, ref: str) -> int:
    """The pid ``ref`` names: digits are a pid, anything else the tag of the newest job with it."""
    if ref.isdigit():
        return int(ref)
    tagged = [job for job in sandbox.jobs.list() if job.tag == ref]
    if not tagged:
        raise CallboxError(f"sandbox {sandbox.label} has no job tagged {ref!r}; "
                           f"`callbox sandbox ps {sandbox.label}` lists its jobs", code=ErrorCode.NOT_FOUND)
    return max(tagged, key=lambda job: job.started_at).pid


def _logs(args: argparse.Namespace) -> int:
    policy = load_gate_policy(args)
    engine = connect(args)
    with opened(engine, args.name) as sandbox:
        pid = job_pid(sandbox, args.pid)
        with known_job(sandbox, pid):
            jobs = sandbox.jobs
            details = {"sandbox": args.name, "pid": pid, "mode": "logs"}
            with guarded(args, policy, run_of(sandbox), "attach", details, workdir=sandbox.spec.workdir) as ticket:
                jobs.get(pid)  # an unknown pid is NO_SUCH_PROCESS before anything is printed
                ended = _print_events(jobs.attach(pid, from_seq=args.from_seq, follow=args.follow), args.json)
                ticket.outcome.update(pid=pid, follow=args.follow)
    if args.follow and ended is not None:
        return job_exit_code(ended)
    return 0


def _print_events(events: Any, as_json: bool) -> JobInfo | None:
    """Print a job's events (raw bytes, or JSON lines); the job's final info if it ended."""
    from harness.engine.jobs import JobChunk, JobEnded, JobGap, JobLive, gap_text

    ended: JobInfo | None = None
    event: JobEvent
    for event in events:
        if isinstance(event, JobChunk):
            if as_json:
                print_json(_chunk_json(event.seq, event.stream, event.data))
            else:
                out = sys.stdout.buffer if event.stream == "stdout" else sys.stderr.buffer
                out.write(event.data)
                out.flush()
        elif isinstance(event, JobGap):
            if as_json:
                print_json({"gap": {"first_seq": event.first_seq, "end_seq": event.end_seq,
                                    "dropped_bytes": event.dropped_bytes}})
            else:
                sys.stdout.buffer.write(gap_text(event))
                sys.stdout.buffer.flush()
        elif isinstance(event, JobLive):
            if as_json:
                print_json({"live": event.info.to_json()})
        elif isinstance(event, JobEnded):
            ended = event.info
            if as_json:
                print_json({"ended": event.info.to_json()})
    return ended


def _chunk_json(seq: int, stream: str, data: bytes) -> dict[str, Any]:
    """One chunk as JSON: ``data`` as text; ``data_base64`` too when it is not UTF-8 (a chunk
    may also end inside a character: the exact bytes are then in ``data_base64``)."""
    out: dict[str, Any] = {"seq": seq, "stream": stream}
    try:
        out["data"] = data.decode("utf-8")
    except UnicodeDecodeError:
        out["data"] = data.decode("utf-8", errors="replace")
        out["data_base64"] = base64.b64encode(data).decode("ascii")
    return out


def _kill(args: argparse.Namespace) -> int:
    engine = connect(args)
    with opened(engine, args.name) as sandbox:
        pid = job_pid(sandbox, args.pid)
        with known_job(sandbox, pid):
            jobs = sandbox.jobs
            if args.signal is not None:
                delivered = jobs.signal(pid, args.signal)
                if args.json:
                    print_json({"pid": pid, "signal": args.signal, "delivered": delivered})
                else:
                    print(f"sent {_signal_name(args.signal)} to {delivered} process(es) of job {pid}")
                return 0
            info = jobs.kill(pid)
    if args.json:
        print_json(job_json(sandbox, info))
    else:
        print(f"killed job {info.pid} in sandbox {sandbox.label} ({info.state})")
    return 0


VERBS: dict[str, Callable[[argparse.Namespace], int]] = {"exec": _exec, "ps": _ps, "logs": _logs, "kill": _kill}
