"""envd's ``process.Process`` service, on the sandbox's background jobs.

Every process the e2b SDK starts is a job of the sandbox's agent (:mod:`harness.engine.jobs`),
the same jobs ``callbox sandbox exec``, the gRPC door and ``exec_command`` start: there is no
second way to run a command. A process is named by its job's pid in the sandbox (or by the
``tag`` it was started with).

* ``Start`` starts the job (argv ``[cmd, *args]``; the SDK sends ``/bin/bash -l -c CMD``, and
  ``/bin/bash -i -l`` on a terminal of the size it asks for, for ``pty.create``) and streams
  its events: ``start`` with the pid, ``data`` (``stdout``/``stderr``, or ``pty`` for a
  terminal), then ``end``. The environment is the sandbox's (its ``envVars`` from create
  included) plus the request's ``envs``; the working directory defaults to the sandbox
  workdir. ``stdin`` keeps a pipe to its stdin open (absent: open, as envd does for old
  clients; the SDK always says).
* ``end`` is what envd sends (Go's ``os.ProcessState``): ``exit_code`` the status (-1 when a
  signal ended it), ``exited`` whether it exited by itself, ``status`` ``"exit status N"`` or
  ``"signal: killed"``, and ``error`` the same text when the process failed (absent after an
  exit status of 0). The SDK's ``CommandHandle.wait`` raises ``CommandExitException`` with
  that ``error`` for a non-zero ``exit_code``.
* ``Connect`` streams a process by pid or tag (the newest with that tag): ``start``, what the
  job's output buffer still holds (1 MiB per job), then live output and ``end``. Output the
  buffer dropped before a reader got it is never dropped silently: a line
  ``[callbox: N bytes (chunks ...) dropped]`` takes its place (on stderr, or the terminal).
  A process that has ended replays its output and its ``end``.
* ``List`` the running processes, with the config they were started with; ``SendInput`` and
  ``StreamInput`` (``stdin`` bytes to a pipe, ``pty`` bytes to a terminal; the other kind is
  ``invalid_argument``), ``CloseStdin`` (end of input; a terminal gets ^D), ``SendSignal``
  (``SIGKILL`` kills every process of the job however it forked, and waits until it ended;
  ``SIGTERM`` goes to every process of it), ``Update`` (a terminal's size). A process that
  has ended is ``not_found`` for these (the SDK's ``kill`` then returns False).

Lifetime, as in envd: a process does not end with the stream that started it. A client that
goes away (its Start stream closed, the SDK's ``disconnect``) leaves it running, so
``commands.connect`` can reattach. What bounds it is the Start request's deadline
(``Connect-Timeout-Ms``, the SDK's ``timeout``, 60 s unless it says otherwise; 0 is none):
when it passes, the process is killed, foreground or background, as envd does. A process
started without a deadline runs until it exits, is killed, or the sandbox goes. What a
process leaves behind when it exits (a daemon, ``cmd &``) lives on with the sandbox, as
under envd (Inspect AI's sandbox tools start their server so); killing the process while
it runs kills them too. At most 64
jobs run in a sandbox, and at most 16 streams (Start or Connect) follow its jobs at once
(the agent's limits): one more Start is ``resource_exhausted``, and its process is killed
rather than left running unseen. A Start counts as a tool call of the client's
``calls_per_minute`` quota; over it, the Start is refused with 429 and ``Retry-After``.

Policy: a started command is both a call of the ``shell`` tool (its ``[tools.shell]`` rules,
``default_decision`` and ``allowed_tools`` apply to the command string: for ``bash -l -c CMD``
that is ``CMD``, for another argv the argv joined) and the ``process`` sandbox action
(``[actions.process]``); the more restrictive decision wins, and it is recorded once, as the
action, in the sandbox's run (actor ``e2b:CLIENT``). ``Connect`` is the ``attach`` action
(mode ``attach``). A denial is ``permission_denied`` with the policy's reason (the SDK raises
it); ``ask`` is ``failed_precondition`` naming the approval: once a person approves it
(``callbox approvals approve ID``), the same command started again uses the approval (once).
Under ``[sandbox] on_denied_command = "exit"`` a refused command (not a terminal) is answered
instead as a shell answers one it may not run: started as pid 0 (nothing runs), the reason
on stderr, and an end with exit code 126 (:func:`refused_as_exit`), so an agent harness
hands its model a result to read rather than raising.
What is typed into a terminal or written to stdin later is not seen by the policy. Input,
signals, resizes and listings are not actions of the policy.

Users: the sandbox runs commands as its one unprivileged user (``user``, uid 1000). A
request as that user (or ``sandbox``, its earlier name) or as nobody in particular runs as
it. A request as ``root`` (``commands.run(..., user="root")``, ``pty.create`` likewise) runs
as root when the policy sets ``[sandbox] root_commands = true`` (see
:mod:`harness.core.root_commands`), and its record says ``"user": "root"``; under the default
policy it is ``permission_denied`` naming that key, and recorded as refused. Any other user
is ``permission_denied``.

Agent streams are made under ``call.scope`` (:func:`~harness.engine.cancel.current_scope`):
a client that goes away, or a deadline that passes, ends them.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import posixpath
import shlex
import signal
import threading
import time
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass

from harness.core.errors import AgentCallError, CallboxError, ErrorCode, short_reason
from harness.core.root_commands import ROOT_COMMANDS_KEY, ROOT_USER, root_refusal
from harness.doors.e2b.boxes import DOOR, E2bSandbox, E2bSandboxes, e2b_errors
from harness.doors.e2b.envd import process_pb2 as pb
from harness.doors.e2b.errors import E2bError, invalid
from harness.doors.e2b.rpc import EnvdCall, Method, Service
from harness.engine.base import LivingSandbox
from harness.engine.cancel import current_scope
from harness.engine.jobs import JobChunk, JobEnded, JobEvent, JobGap, JobInfo, gap_text
from harness.tools.shell import SHELL

__all__ = ["SANDBOX_USER", "ProcessDoor", "end_event", "policy_command", "process_service", "shell_script"]

log = logging.getLogger("callbox.e2b")

SANDBOX_USER = "user"
"""The sandbox's one unprivileged user (uid 1000, images/Dockerfile), named as E2B's default user."""
DEFAULT_USERS = frozenset({SANDBOX_USER, "sandbox"})
"""Users a request may name and still run as the sandbox's user (``sandbox``: its earlier name)."""
_USER_VARIABLES = frozenset({"HOME", "USER", "LOGNAME"})
"""The sandbox's environment variables that name its user: a root command gets root's instead."""
SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ash", "ksh"})
_OPTIONS_WITH_VALUE = frozenset({"-o", "+o", "-O", "+O", "--rcfile", "--init-file"})
PAUSED_RETRY_S = 5.0
"""How long a deadline of a paused sandbox's process waits before it is tried again."""

_GO_SIGNALS = {
    1: "hangup", 2: "interrupt", 3: "quit", 4: "illegal instruction", 5: "trace/breakpoint trap",
    6: "aborted", 7: "bus error", 8: "floating point exception", 9: "killed", 10: "user defined signal 1",
    11: "segmentation fault", 12: "user defined signal 2", 13: "broken pipe", 14: "alarm clock",
    15: "terminated",
}
"""Signal names as envd (Go's os.ProcessState) writes them in an end event's status."""


# ---- what envd says -----------------------------------------------------------------------------


def end_event(info: JobInfo) -> pb.ProcessEvent.EndEvent:
    """envd's end event for a job that ended (see the module docstring)."""
    if info.state == "exited" and info.exit_code is not None:
        status = f"exit status {info.exit_code}"
        end = pb.ProcessEvent.EndEvent(exit_code=info.exit_code, exited=True, status=status)
        if info.exit_code != 0:
            end.error = status
        return end
    status = f"signal: {_GO_SIGNALS.get(info.signal, f'signal {info.signal}')}"
    end = pb.ProcessEvent.EndEvent(exit_code=-1, exited=False, status=status, error=status)
    if info.oom_killed:
        end.error = f"{status} (the sandbox ran out of memory)"
    return end


REFUSED_EXIT_CODE = 126
"""The exit code of a command the policy refused, under ``sandbox.on_denied_command = "exit"``:
a shell's for a command it found but may not run."""
REFUSALS = frozenset({ErrorCode.ACTION_DENIED, ErrorCode.ALREADY_RESOLVED, ErrorCode.APPROVAL_PENDING})
"""The authorization's refusals (denied, its approval used or pending) that policy can answer as an exit."""


def refused_as_exit(reason: str) -> Iterator[pb.StartResponse]:
    """A refused command's events under ``sandbox.on_denied_command = "exit"``: started (pid 0:
    no process ran), the reason on stderr, and an end with :data:`REFUSED_EXIT_CODE`, so an agent
    harness hands the model a result to read instead of raising (the refusal is recorded as one)."""
    status = f"exit status {REFUSED_EXIT_CODE}"
    yield pb.StartResponse(event=_started(0))
    stderr = f"callbox: {reason}\n".encode()
    yield pb.StartResponse(event=pb.ProcessEvent(data=pb.ProcessEvent.DataEvent(stderr=stderr)))
    end = pb.ProcessEvent.EndEvent(exit_code=REFUSED_EXIT_CODE, exited=True, status=status, error=status)
    yield pb.StartResponse(event=pb.ProcessEvent(end=end))


def shell_script(argv: Sequence[str]) -> str | None:
    """``CMD`` of ``SHELL [-FLAGS] -c CMD [ARGS]`` (the SDK's ``/bin/bash -l -c CMD``), else None."""
    if not argv or posixpath.basename(argv[0]) not in SHELLS:
        return None
    index = 1
    while index < len(argv):
        arg = argv[index]
        if arg in _OPTIONS_WITH_VALUE:
            index += 2
            continue
        if arg.startswith("--"):
            index += 1
            continue
        if not arg.startswith(("-", "+")) or len(arg) < 2:
            return None
        if arg.startswith("-") and "c" in arg[1:]:
            return argv[index + 1] if index + 1 < len(argv) else None
        index += 1
    return None


def policy_command(argv: Sequence[str]) -> str:
    """The command string the ``shell`` tool's rules see: the script of a ``SHELL -c``, else
    the argv joined as a shell would read it."""
    script = shell_script(argv)
    return script if script is not None else shlex.join(argv)


def _started(pid: int) -> pb.ProcessEvent:
    return pb.ProcessEvent(start=pb.ProcessEvent.StartEvent(pid=pid))


def _keepalive_start() -> pb.StartResponse:
    return pb.StartResponse(event=pb.ProcessEvent(keepalive=pb.ProcessEvent.KeepAlive()))


def _keepalive_connect() -> pb.ConnectResponse:
    return pb.ConnectResponse(event=pb.ProcessEvent(keepalive=pb.ProcessEvent.KeepAlive()))


# ---- the processes the door started ---------------------------------------------------------------


@dataclass(frozen=True)
class _Started:
    """What a Start asked for, for List (the agent keeps only the argv)."""

    sandbox: E2bSandbox
    config: pb.ProcessConfig
    tag: str
    pty: bool
    started_at: float


class _Deadlines:
    """Kills each process whose Start deadline passed (one thread, started when first needed)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, E2bSandbox, int, float]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, when: float, sandbox: E2bSandbox, pid: int, started_at: float) -> None:
        """Kill job ``pid`` (the one started at ``started_at``) at ``when`` (time.monotonic())."""
        with self._cond:
            heapq.heappush(self._heap, (when, next(self._order), sandbox, pid, started_at))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="callbox-e2b-deadlines", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._cond.wait(None if not self._heap else max(0.0, self._heap[0][0] - time.monotonic()))
                _, _, sandbox, pid, started_at = heapq.heappop(self._heap)
            self._expire(sandbox, pid, started_at)

    def _expire(self, sandbox: E2bSandbox, pid: int, started_at: float) -> None:
        if sandbox.closed:
            return
        try:
            box = sandbox.box
            if box.paused:
                self.add(time.monotonic() + PAUSED_RETRY_S, sandbox, pid, started_at)
                return
            info = box.jobs.get(pid)
            if info.state == "running" and info.started_at == started_at:
                box.jobs.kill(pid)
                log.info("killed process %d of sandbox %s: its Start deadline passed", pid, sandbox.sandbox_id)
        except (CallboxError, E2bError) as error:  # ended, forgotten, or the sandbox went meanwhile
            log.debug("deadline of process %d of sandbox %s: %s", pid, sandbox.sandbox_id, short_reason(error))


class ProcessDoor:
    """The handlers of ``process.Process`` over :class:`E2bSandboxes`; see the module docstring."""

    def __init__(self, sandboxes: E2bSandboxes) -> None:
        self.sandboxes = sandboxes
        registered = sandboxes.executor.registry.get(SHELL.name)
        self.shell = (registered or SHELL).definition
        self._lock = threading.Lock()
        self._started: dict[tuple[str, int], _Started] = {}
        self._deadlines = _Deadlines()

    def service(self) -> Service:
        methods = [
            Method("Start", "server_stream", pb.StartRequest, self.start, _keepalive_start),
            Method("Connect", "server_stream", pb.ConnectRequest, self.connect, _keepalive_connect),
            Method("List", "unary", pb.ListRequest, self.list),
            Method("SendInput", "unary", pb.SendInputRequest, self.send_input),
            Method("StreamInput", "client_stream", pb.StreamInputRequest, self.stream_input),
            Method("CloseStdin", "unary", pb.CloseStdinRequest, self.close_stdin),
            Method("SendSignal", "unary", pb.SendSignalRequest, self.send_signal),
            Method("Update", "unary", pb.UpdateRequest, self.update),
        ]
        return Service("process.Process", {method.name: method for method in methods})

    # ---- Start and Connect -------------------------------------------------------------------

    def start(self, request: pb.StartRequest, call: EnvdCall) -> Generator[pb.StartResponse, None, None]:
        sandbox = call.sandbox
        as_root = _as_root(call.user)
        config = request.process
        if not config.cmd:
            raise invalid("StartRequest.process.cmd is empty; name the program to run (the SDK sends /bin/bash)")
        argv = [config.cmd, *config.args]
        pty = request.HasField("pty")
        rows, cols = (request.pty.size.rows, request.pty.size.cols) if pty else (0, 0)
        if pty and (not rows or not cols):
            raise invalid("a PTY needs a size of at least one row and one column (PTY.size.rows, .cols)")
        tag = request.tag if request.HasField("tag") else ""
        stdin = request.stdin if request.HasField("stdin") else True
        with e2b_errors(sandbox):
            self.sandboxes.executor.quotas.start_call(sandbox.client, door=DOOR)  # a command is a tool call
            box = sandbox.running()
            cwd = config.cwd if config.HasField("cwd") and config.cwd else box.spec.workdir
            script = shell_script(argv)
            floor = sandbox.session.policy.decide(self.shell, {"command": policy_command(argv), "workdir": cwd})
            details: dict[str, object] = {"command": argv if script is None else script, "tag": tag, "pty": pty}
            if as_root:
                details["user"] = ROOT_USER
                if not sandbox.session.policy.sandbox.root_commands:
                    floor = root_refusal(SANDBOX_USER)
            authorized = False
            try:
                with self.sandboxes.acting(sandbox, "process", details, floor=floor) as ticket:
                    authorized = True
                    own = {k: v for k, v in box.spec.env.items() if not (as_root and k in _USER_VARIABLES)}
                    env = {**own, **sandbox.env_vars, **config.envs}  # root keeps the agent's HOME, USER, LOGNAME
                    info = box.jobs.start(argv, tag=tag, cwd=cwd, env=env, pty=pty, rows=rows, cols=cols,
                                          stdin=stdin or pty, as_root=as_root, keep_leftovers=True,
                                          hold_output=True)
                    ticket.outcome["pid"] = info.pid
                    self._remember(sandbox, info, config, tag, pty, cwd)
                    if call.deadline is not None:
                        self._deadlines.add(call.deadline, sandbox, info.pid, info.started_at)
                    events = self._follow(box, sandbox, info, call, kill_if_busy=True)
                    yield pb.StartResponse(event=_started(info.pid))
                    for event in events:
                        if event.HasField("end"):
                            ticket.outcome.update(exit_code=event.end.exit_code, status=event.end.status)
                        yield pb.StartResponse(event=event)
                    if call.scope.cancelled:
                        ticket.outcome["ended"] = "the client went away; the process runs on"
                return
            except E2bError as error:
                if authorized or pty or sandbox.session.policy.sandbox.on_denied_command != "exit" \
                        or error.error not in REFUSALS:
                    raise
                refusal = error.message
            yield from refused_as_exit(refusal)

    def connect(self, request: pb.ConnectRequest, call: EnvdCall) -> Generator[pb.ConnectResponse, None, None]:
        sandbox = call.sandbox
        with e2b_errors(sandbox):
            box = sandbox.running()
            info = _select(box, request.process, running_only=False)
            with self.sandboxes.acting(sandbox, "attach", {"pid": info.pid, "mode": "attach"}):
                events = self._follow(box, sandbox, info, call, kill_if_busy=False)
                yield pb.ConnectResponse(event=_started(info.pid))
                for event in events:
                    yield pb.ConnectResponse(event=event)

    def _follow(self, box: LivingSandbox, sandbox: E2bSandbox, info: JobInfo, call: EnvdCall, *,
                kill_if_busy: bool) -> Iterator[pb.ProcessEvent]:
        """The job's events as envd's, from the oldest output held; the agent's stream is
        opened now (under the call's scope), so a refusal comes before the start event."""
        events = box.jobs.attach(info.pid, follow=True)
        try:
            with current_scope(call.scope):
                first = next(events, None)  # makes the agent's call, tracked by the scope
        except AgentCallError as error:
            if call.scope.cancelled:
                return iter(())
            if error.reason == "BUSY" and kill_if_busy:
                with contextlib.suppress(CallboxError):
                    box.jobs.kill(info.pid)
                raise E2bError(ErrorCode.LIMIT_REACHED, f"{error.message}; process {info.pid} was killed rather "
                               "than left running unseen") from None
            raise
        return self._relay(first, events, sandbox, info, call)

    def _relay(self, first: JobEvent | None, events: Generator[JobEvent, None, None], sandbox: E2bSandbox,
               info: JobInfo, call: EnvdCall) -> Iterator[pb.ProcessEvent]:
        pty = info.pty
        try:
            for event in itertools.chain(() if first is None else (first,), events):
                if isinstance(event, JobChunk):
                    if pty:
                        yield pb.ProcessEvent(data=pb.ProcessEvent.DataEvent(pty=event.data))
                    elif event.stream == "stderr":
                        yield pb.ProcessEvent(data=pb.ProcessEvent.DataEvent(stderr=event.data))
                    else:
                        yield pb.ProcessEvent(data=pb.ProcessEvent.DataEvent(stdout=event.data))
                elif isinstance(event, JobGap):
                    marker = gap_text(event)
                    data = pb.ProcessEvent.DataEvent(pty=marker) if pty else pb.ProcessEvent.DataEvent(stderr=marker)
                    yield pb.ProcessEvent(data=data)
                elif isinstance(event, JobEnded):
                    self._forget(sandbox, info.pid, info.started_at)
                    yield pb.ProcessEvent(end=end_event(event.info))
                    return
        except AgentCallError:
            if call.scope.cancelled:
                return
            raise
        finally:
            events.close()  # cancels the agent's stream
        if not call.scope.cancelled:
            raise E2bError(ErrorCode.SANDBOX_UNAVAILABLE,
                f"the output of process {info.pid} ended before the process did "
                           f"(sandbox {sandbox.sandbox_id} stopped answering); Connect to it again")

    # ---- unary calls ---------------------------------------------------------------------------

    def list(self, request: pb.ListRequest, call: EnvdCall) -> pb.ListResponse:
        sandbox = call.sandbox
        with e2b_errors(sandbox):
            jobs = [info for info in sandbox.running().jobs.list() if info.state == "running"]
        live = {(sandbox.sandbox_id, info.pid) for info in jobs}
        with self._lock:
            for key in [k for k in self._started if k[0] == sandbox.sandbox_id and k not in live]:
                del self._started[key]
            known = {info.pid: self._started.get((sandbox.sandbox_id, info.pid)) for info in jobs}
        response = pb.ListResponse()
        for info in jobs:
            started = known[info.pid]
            entry = response.processes.add(pid=info.pid)
            if started is not None and started.started_at == info.started_at:
                entry.config.CopyFrom(started.config)
            else:  # started by another door or tool: the agent knows its argv only
                entry.config.cmd = info.command[0] if info.command else ""
                entry.config.args.extend(info.command[1:])
            if info.tag:
                entry.tag = info.tag
        return response

    def send_input(self, request: pb.SendInputRequest, call: EnvdCall) -> pb.SendInputResponse:
        sandbox = call.sandbox
        with e2b_errors(sandbox):
            box = sandbox.running()
            info = _select(box, request.process)
            self._write(box, info, request.input)
        return pb.SendInputResponse()

    def stream_input(self, requests: Iterable[pb.StreamInputRequest], call: EnvdCall) -> pb.StreamInputResponse:
        sandbox = call.sandbox
        box: LivingSandbox | None = None
        info: JobInfo | None = None
        with e2b_errors(sandbox):
            for message in requests:
                kind = message.WhichOneof("event")
                if kind == "start":
                    if info is not None:
                        raise invalid("StreamInput got a second start event; a stream writes to one process")
                    box = sandbox.running()
                    info = _select(box, message.start.process)
                elif kind == "data":
                    if box is None or info is None:
                        raise invalid("StreamInput must begin with a start event naming the process (pid or tag)")
                    self._write(box, info, message.data.input)
        if info is None:
            raise invalid("StreamInput ended without a start event naming the process (pid or tag)")
        return pb.StreamInputResponse()

    def close_stdin(self, request: pb.CloseStdinRequest, call: EnvdCall) -> pb.CloseStdinResponse:
        sandbox = call.sandbox
        with e2b_errors(sandbox):
            box = sandbox.running()
            info = _select(box, request.process)
            box.jobs.write(info.pid, b"", close=True)
        return pb.CloseStdinResponse()

    def send_signal(self, request: pb.SendSignalRequest, call: EnvdCall) -> pb.SendSignalResponse:
        sandbox = call.sandbox
        if request.signal not in (pb.SIGNAL_SIGKILL, pb.SIGNAL_SIGTERM):
            raise invalid(f"signal {request.signal} is not one envd sends; use SIGNAL_SIGTERM (15) or "
                          "SIGNAL_SIGKILL (9)")
        with e2b_errors(sandbox):
            box = sandbox.running()
            info = _select(box, request.process)
            if request.signal == pb.SIGNAL_SIGKILL:
                box.jobs.kill(info.pid)  # every process of the job, however it forked; waits for its end
            else:
                box.jobs.signal(info.pid, signal.SIGTERM)
        return pb.SendSignalResponse()

    def update(self, request: pb.UpdateRequest, call: EnvdCall) -> pb.UpdateResponse:
        sandbox = call.sandbox
        with e2b_errors(sandbox):
            box = sandbox.running()
            info = _select(box, request.process)
            if request.HasField("pty"):
                size = request.pty.size
                if not info.pty:
                    raise invalid(f"process {info.pid} has no terminal to resize; start it with a PTY (pty.create)")
                box.jobs.resize(info.pid, size.rows, size.cols)
        return pb.UpdateResponse()

    @staticmethod
    def _write(box: LivingSandbox, info: JobInfo, data: pb.ProcessInput) -> None:
        kind = data.WhichOneof("input")
        if kind is None:
            return
        if kind == "pty" and not info.pty:
            raise invalid(f"process {info.pid} has no terminal; send its input as stdin (commands.send_stdin)")
        if kind == "stdin" and info.pty:
            raise invalid(f"process {info.pid} runs on a terminal; send its input as pty (pty.send_stdin)")
        box.jobs.write(info.pid, data.pty if kind == "pty" else data.stdin)

    # ---- bookkeeping ----------------------------------------------------------------------------

    def _remember(self, sandbox: E2bSandbox, info: JobInfo, config: pb.ProcessConfig, tag: str, pty: bool,
                  cwd: str) -> None:
        kept = pb.ProcessConfig()
        kept.CopyFrom(config)
        kept.cwd = cwd
        with self._lock:
            for key in [k for k, started in self._started.items() if started.sandbox.closed]:
                del self._started[key]  # of the sandboxes that went
            self._started[(sandbox.sandbox_id, info.pid)] = _Started(sandbox, kept, tag, pty, info.started_at)

    def _forget(self, sandbox: E2bSandbox, pid: int, started_at: float) -> None:
        with self._lock:
            started = self._started.get((sandbox.sandbox_id, pid))
            if started is not None and started.started_at == started_at:
                del self._started[(sandbox.sandbox_id, pid)]


def _as_root(user: str | None) -> bool:
    """Whether the request asks for root; ``permission_denied`` for a user that is neither
    root nor the sandbox's own (whether root may run is the policy's: see ``start``)."""
    if user is None or user in DEFAULT_USERS:
        return False
    if user == ROOT_USER:
        return True
    raise E2bError(ErrorCode.PERMISSION_DENIED, f"this sandbox runs commands as its one unprivileged user "
                   f"{SANDBOX_USER!r} (uid 1000), or as {ROOT_USER!r} where the policy allows it "
                   f"({ROOT_COMMANDS_KEY}); user {user!r} is not available here: leave user unset "
                   f"(or pass {SANDBOX_USER!r})")


def _select(box: LivingSandbox, selector: pb.ProcessSelector, *, running_only: bool = True) -> JobInfo:
    """The job a selector names: by pid, or the newest with the tag (``not_found`` if none, or if
    it has ended and ``running_only``)."""
    kind = selector.WhichOneof("selector")
    if kind is None:
        raise invalid("the request names no process; give its pid (or its tag) in ProcessSelector")
    jobs = box.jobs.list()
    if kind == "pid":
        found = [info for info in jobs if info.pid == selector.pid]
        what = f"process {selector.pid}"
    else:
        found = [info for info in jobs if info.tag == selector.tag]
        what = f"process tagged {selector.tag!r}"
    running = [info for info in found if info.state == "running"]
    if running:
        return running[-1]
    if found and not running_only:
        return found[-1]
    if found:
        raise E2bError(ErrorCode.NOT_FOUND, f"{what} has ended; `commands.list()` shows the running processes")
    raise E2bError(ErrorCode.NOT_FOUND, f"{what} not found; `commands.list()` shows the running processes")


def process_service(sandboxes: E2bSandboxes) -> Service:
    """envd's ``process.Process`` over ``sandboxes``."""
    return ProcessDoor(sandboxes).service()
