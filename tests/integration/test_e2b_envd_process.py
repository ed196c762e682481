"""envd's process.Process of the E2B door, its handlers called directly on the real engine.

An ExecutorService and E2bSandboxes as ``callbox serve --e2b`` builds them, one sandbox of the
module (created with envVars) shared by the tests: foreground commands with both streams and
exit codes (envd's end event), a background tree reattached from a second call by tag and
killed whole, stdin by SendInput, StreamInput and CloseStdin, a PTY (size, resize, input, exit),
a Start deadline killing its process, a client going away mid-stream (the stream ends, the
process runs on), users, and the policy: a shell rule's deny and an action rule's ask, each
recorded in the sandbox's run, the ask approved and used by repeating the command. Then the
same through the unmodified e2b SDK against serve_e2b on the same sandboxes."""

from __future__ import annotations

import json
import queue
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from harness.audit.store import AuditStore
from harness.doors.e2b.boxes import E2bSandbox, E2bSandboxes
from harness.doors.e2b.envd import process_pb2 as pb
from harness.doors.e2b.envd_process import ProcessDoor, process_service
from harness.doors.e2b.errors import E2bError
from harness.doors.e2b.rpc import EnvdCall
from harness.doors.grpc.overrides import SandboxOverrides
from tests.conftest import IMAGE
from tests.integration.e2b_door import e2b_sandboxes

pytestmark = pytest.mark.docker

WAIT_S = 60.0
API_KEY = "token-of-e2b-alice-0123456"
POLICY = textwrap.dedent(f"""
    [sandbox]
    image = "{IMAGE}"
    memory = "512m"
    ttl_seconds = 900

    [tools.shell]
    decision = "allow"

    [[tools.shell.rules]]
    action = "deny"
    command = "rm -rf *"
    reason = "recursive removal is not allowed in these sandboxes"

    [[actions.process.rules]]
    action = "ask"
    command = "*needs-approval*"
""")


EXITS = "refusals-exit"
EXITS_POLICY = POLICY.replace("ttl_seconds = 900\n", 'ttl_seconds = 900\non_denied_command = "exit"\n')
"""The template whose refused commands end with exit code 126 instead of an error."""


@dataclass
class Door:
    sandboxes: E2bSandboxes
    process: ProcessDoor
    audit: AuditStore
    box: E2bSandbox


@pytest.fixture(scope="module")
def door(engine: Any) -> Iterator[Door]:
    with e2b_sandboxes(engine, POLICY, prefix="cbx-e2b-process-", keys={"alice": API_KEY},
                       templates={EXITS: EXITS_POLICY}) as state:
        sandboxes = state.sandboxes
        box = sandboxes.create("alice", overrides=SandboxOverrides(env={"FROM_CREATE": "c1"}))
        yield Door(sandboxes, ProcessDoor(sandboxes), state.audit, box)


def call_of(door: Door, *, user: str | None = None, deadline_s: float | None = None) -> EnvdCall:
    """An envd call on the module's sandbox; its scope is cancelled after WAIT_S at the latest,
    so a test that goes wrong fails instead of hanging."""
    call = EnvdCall(sandbox=door.box, headers={}, user=user,
                    deadline=None if deadline_s is None else time.monotonic() + deadline_s)
    guard = threading.Timer(WAIT_S, call.scope.cancel)
    guard.daemon = True
    guard.start()
    return call


def bash(script: str, *, stdin: bool = False, tag: str | None = None, **envs: str) -> pb.StartRequest:
    """What the SDK's commands.run sends."""
    request = pb.StartRequest(process=pb.ProcessConfig(cmd="/bin/bash", args=["-l", "-c", script], envs=envs),
                              stdin=stdin)
    if tag is not None:
        request.tag = tag
    return request


@dataclass
class Ran:
    pid: int = 0
    stdout: bytes = b""
    stderr: bytes = b""
    pty: bytes = b""
    end: pb.ProcessEvent.EndEvent | None = None
    kinds: list[str] = field(default_factory=list)

    def add(self, event: pb.ProcessEvent) -> None:
        kind = event.WhichOneof("event")
        assert kind is not None
        self.kinds.append(kind)
        if kind == "start":
            assert self.kinds == ["start"], self.kinds
            self.pid = event.start.pid
        elif kind == "data":
            self.stdout += event.data.stdout
            self.stderr += event.data.stderr
            self.pty += event.data.pty
        elif kind == "end":
            assert self.end is None
            self.end = event.end


def collect(responses: Iterator[Any]) -> Ran:
    ran = Ran()
    for response in responses:
        ran.add(response.event)
    return ran


class Follower:
    """A stream's events gathered by a thread, to wait on while the test sends input."""

    def __init__(self, responses: Iterator[Any]) -> None:
        self.ran = Ran()
        self._events: queue.Queue[pb.ProcessEvent | None] = queue.Queue()
        self._responses = responses
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        try:
            for response in self._responses:
                self._events.put(response.event)
        except BaseException as error:
            self.error = error
        finally:
            self._events.put(None)

    def until(self, text: bytes | None = None, *, end: bool = False) -> Ran:
        """Wait until ``text`` is in the output (stdout + pty) or, with ``end``, for the end event."""
        deadline = time.monotonic() + WAIT_S
        while not ((end and self.ran.end is not None) or (text is not None and text in self.ran.stdout + self.ran.pty)):
            event = self._events.get(timeout=max(0.0, deadline - time.monotonic()))
            if event is None:
                break
            self.ran.add(event)
        return self.ran

    def join(self) -> None:
        """Wait until the stream has ended, which it must have done without an error."""
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive()
        assert self.error is None, repr(self.error)


def refused(code: str, responses: Any) -> E2bError:
    with pytest.raises(E2bError) as failure:
        for _ in responses:
            pass
    assert failure.value.connect_code == code, failure.value
    return failure.value


def pkill_count(door: Door, pattern: str) -> int:
    ran = collect(door.process.start(bash(f"pgrep -c -f '^{pattern}$' || true"), call_of(door)))
    return int(ran.stdout.strip() or 0)


def actions(door: Door, tool: str = "sandbox.process") -> list[dict[str, Any]]:
    """The sandbox's recorded actions of ``tool``, their arguments parsed."""
    found = [c for c in door.audit.calls_for_run(door.box.sandbox_id) if c["tool"] == tool]
    return [{**c, "arguments": json.loads(c["arguments"])} for c in found]


# ---- the tests ------------------------------------------------------------------------------------


def test_the_service_has_envd_methods(door: Door) -> None:
    service = process_service(door.sandboxes)
    assert service.name == "process.Process"
    assert sorted(service.methods) == sorted(["Start", "Connect", "List", "SendInput", "StreamInput", "CloseStdin",
                                              "SendSignal", "Update"])
    assert service.methods["Start"].kind == "server_stream"
    keepalive = service.methods["Start"].keepalive
    assert keepalive is not None
    ping = keepalive()
    assert isinstance(ping, pb.StartResponse) and ping.event.HasField("keepalive")
    assert service.methods["StreamInput"].kind == "client_stream"


def test_foreground_command_both_streams_env_and_cwd(door: Door) -> None:
    script = "echo out; echo err >&2; echo $FROM_CREATE $FROM_REQUEST; pwd; id -un"
    ran = collect(door.process.start(bash(script, FROM_REQUEST="r1"), call_of(door)))
    assert ran.pid > 0 and ran.kinds[0] == "start" and ran.kinds[-1] == "end"
    assert ran.stdout == b"out\nc1 r1\n/home/user\nuser\n"
    assert ran.stderr == b"err\n"
    assert ran.end is not None
    assert (ran.end.exit_code, ran.end.exited, ran.end.status) == (0, True, "exit status 0")
    assert not ran.end.HasField("error")  # the SDK's CommandResult.error is then None

    request = bash("pwd")
    request.process.cwd = "/tmp"
    assert collect(door.process.start(request, call_of(door))).stdout == b"/tmp\n"

    done = [c for c in actions(door) if c["arguments"].get("command") == script]
    assert len(done) == 1, done
    assert done[0]["state"] == "done" and done[0]["decision"] == "allow", done[0]


def test_nonzero_exit_is_envds_end_event(door: Door) -> None:
    ran = collect(door.process.start(bash("echo partial; exit 3"), call_of(door)))
    assert ran.stdout == b"partial\n"
    assert ran.end is not None
    assert (ran.end.exit_code, ran.end.exited, ran.end.status, ran.end.error) == \
        (3, True, "exit status 3", "exit status 3")


def test_background_tree_connect_by_tag_list_and_kill(door: Door) -> None:
    script = "sleep 1001 & sleep 1001 & echo ready; wait"
    first = door.process.start(bash(script, tag="tree", FROM_REQUEST="bg"), call_of(door))
    started = next(first)
    pid = started.event.start.pid
    seen = b""
    while b"ready" not in seen:
        seen += next(first).event.data.stdout
    first.close()  # the SDK's disconnect: the process runs on

    listed = {p.pid: p for p in door.process.list(pb.ListRequest(), call_of(door)).processes}
    assert pid in listed
    info = listed[pid]
    assert info.tag == "tree"
    assert (info.config.cmd, list(info.config.args)) == ("/bin/bash", ["-l", "-c", script])
    assert dict(info.config.envs) == {"FROM_REQUEST": "bg"} and info.config.cwd == "/home/user"
    assert pkill_count(door, "sleep 1001") == 2

    again = Follower(door.process.connect(pb.ConnectRequest(process=pb.ProcessSelector(tag="tree")), call_of(door)))
    assert again.until(b"ready").pid == pid  # replayed from the job's buffer
    door.process.send_signal(pb.SendSignalRequest(process=pb.ProcessSelector(pid=pid), signal=pb.SIGNAL_SIGKILL),
                             call_of(door))
    ran = again.until(end=True)
    assert ran.end is not None
    assert (ran.end.exit_code, ran.end.exited, ran.end.status, ran.end.error) == \
        (-1, False, "signal: killed", "signal: killed")
    again.join()
    assert pkill_count(door, "sleep 1001") == 0  # the whole tree
    assert pid not in {p.pid for p in door.process.list(pb.ListRequest(), call_of(door)).processes}

    with pytest.raises(E2bError) as gone:  # the SDK's kill then says False
        door.process.send_signal(pb.SendSignalRequest(process=pb.ProcessSelector(pid=pid),
                                                      signal=pb.SIGNAL_SIGKILL), call_of(door))
    assert gone.value.connect_code == "not_found"
    assert [c["arguments"]["mode"] for c in actions(door, "sandbox.attach") if c["arguments"]["pid"] == pid] == \
        ["attach"]


def test_sigterm_reaches_the_process(door: Door) -> None:
    follower = Follower(door.process.start(bash("trap 'echo term; exit 9' TERM; echo up; while :; do sleep 0.1; done"),
                                           call_of(door)))
    pid = follower.until(b"up").pid
    door.process.send_signal(pb.SendSignalRequest(process=pb.ProcessSelector(pid=pid), signal=pb.SIGNAL_SIGTERM),
                             call_of(door))
    ran = follower.until(end=True)
    assert ran.end is not None and ran.end.exit_code in (9, -1), ran.end
    with pytest.raises(E2bError) as wrong:
        door.process.send_signal(pb.SendSignalRequest(process=pb.ProcessSelector(pid=pid),
                                                      signal=pb.SIGNAL_UNSPECIFIED), call_of(door))
    assert wrong.value.connect_code == "invalid_argument"


def test_stdin_send_stream_and_close(door: Door) -> None:
    follower = Follower(door.process.start(bash("echo listening; cat", stdin=True), call_of(door)))
    pid = follower.until(b"listening").pid
    selector = pb.ProcessSelector(pid=pid)
    door.process.send_input(pb.SendInputRequest(process=selector, input=pb.ProcessInput(stdin=b"hello ")),
                            call_of(door))
    door.process.stream_input(iter([
        pb.StreamInputRequest(start=pb.StreamInputRequest.StartEvent(process=selector)),
        pb.StreamInputRequest(data=pb.StreamInputRequest.DataEvent(input=pb.ProcessInput(stdin=b"world"))),
        pb.StreamInputRequest(keepalive=pb.StreamInputRequest.KeepAlive()),
        pb.StreamInputRequest(data=pb.StreamInputRequest.DataEvent(input=pb.ProcessInput(stdin=b"!\n"))),
    ]), call_of(door))
    assert b"hello world!\n" in follower.until(b"hello world!\n").stdout
    with pytest.raises(E2bError) as wrong_kind:
        door.process.send_input(pb.SendInputRequest(process=selector, input=pb.ProcessInput(pty=b"x")), call_of(door))
    assert wrong_kind.value.connect_code == "invalid_argument" and "stdin" in wrong_kind.value.message
    door.process.close_stdin(pb.CloseStdinRequest(process=selector), call_of(door))
    ran = follower.until(end=True)
    assert ran.stdout == b"listening\nhello world!\n"
    assert ran.end is not None and ran.end.exit_code == 0

    with pytest.raises(E2bError) as no_start:
        door.process.stream_input(iter([pb.StreamInputRequest(
            data=pb.StreamInputRequest.DataEvent(input=pb.ProcessInput(stdin=b"x")))]), call_of(door))
    assert no_start.value.connect_code == "invalid_argument"

    closed = Follower(door.process.start(bash("echo up; sleep 30"), call_of(door)))  # stdin=False, as the SDK's default
    closed_pid = closed.until(b"up").pid
    with pytest.raises(E2bError) as no_stdin:
        door.process.send_input(pb.SendInputRequest(process=pb.ProcessSelector(pid=closed_pid),
                                                    input=pb.ProcessInput(stdin=b"x")), call_of(door))
    assert no_stdin.value.connect_code == "invalid_argument", no_stdin.value
    door.process.send_signal(pb.SendSignalRequest(process=pb.ProcessSelector(pid=closed_pid),
                                                  signal=pb.SIGNAL_SIGKILL), call_of(door))
    assert closed.until(end=True).end is not None


def test_pty_size_resize_input_and_exit(door: Door) -> None:
    request = pb.StartRequest(process=pb.ProcessConfig(cmd="/bin/bash", args=["-i", "-l"],
                                                       envs={"TERM": "xterm-256color", "LANG": "C.UTF-8"}),
                              pty=pb.PTY(size=pb.PTY.Size(rows=24, cols=80)))
    follower = Follower(door.process.start(request, call_of(door)))
    selector = pb.ProcessSelector(pid=follower.until(b"$").pid)

    def typed(text: bytes) -> None:
        door.process.send_input(pb.SendInputRequest(process=selector, input=pb.ProcessInput(pty=text)),
                                call_of(door))

    typed(b"stty size\n")
    assert b"24 80" in follower.until(b"24 80").pty
    door.process.update(pb.UpdateRequest(process=selector, pty=pb.PTY(size=pb.PTY.Size(rows=40, cols=100))),
                        call_of(door))
    typed(b"stty size\n")
    follower.until(b"40 100")
    with pytest.raises(E2bError) as wrong_kind:
        door.process.send_input(pb.SendInputRequest(process=selector, input=pb.ProcessInput(stdin=b"x")),
                                call_of(door))
    assert wrong_kind.value.connect_code == "invalid_argument" and "pty" in wrong_kind.value.message
    typed(b"exit 7\n")
    ran = follower.until(end=True)
    assert ran.stdout == b"" and ran.stderr == b""  # a terminal's output is all pty data
    assert ran.end is not None and (ran.end.exit_code, ran.end.status) == (7, "exit status 7")
    assert [c["arguments"]["pty"] for c in actions(door) if c["arguments"].get("command") ==
            ["/bin/bash", "-i", "-l"]] == [True]


def test_a_start_deadline_kills_its_process(door: Door) -> None:
    stream = door.process.start(bash("sleep 1003", tag="deadline"), call_of(door, deadline_s=1.5))
    pid = next(stream).event.start.pid
    stream.close()  # gone before its deadline: the process lives until then
    assert pid in {p.pid for p in door.process.list(pb.ListRequest(), call_of(door)).processes}
    ran = collect(door.process.connect(pb.ConnectRequest(process=pb.ProcessSelector(pid=pid)), call_of(door)))
    assert ran.end is not None and ran.end.status == "signal: killed"


def test_a_client_going_away_ends_the_stream_not_the_process(door: Door) -> None:
    call = call_of(door)
    follower = Follower(door.process.start(bash("echo up; sleep 1004"), call))
    pid = follower.until(b"up").pid
    call.scope.cancel()  # what the server does when the client disconnects
    follower.join()  # the stream ended, with no end event
    assert follower.until(end=True).end is None
    assert pid in {p.pid for p in door.process.list(pb.ListRequest(), call_of(door)).processes}
    door.process.send_signal(pb.SendSignalRequest(process=pb.ProcessSelector(pid=pid), signal=pb.SIGNAL_SIGKILL),
                             call_of(door))
    ended = [c for c in actions(door) if c["arguments"].get("command") == "echo up; sleep 1004"]
    assert len(ended) == 1 and ended[0]["state"] == "done", ended


def test_streams_past_the_agents_limit_and_a_cancel_giving_one_back(door: Door) -> None:
    """The agent follows at most 16 jobs' output at once: one more Start is refused and its
    process killed; a client going away gives its stream back."""
    calls = [call_of(door) for _ in range(16)]
    followers = [Follower(door.process.start(bash(f"echo up; sleep {2000 + n}"), call)) for n, call in enumerate(calls)]
    pids = [follower.until(b"up").pid for follower in followers]
    try:
        busy = refused("resource_exhausted", door.process.start(bash("echo one-too-many; sleep 2100"), call_of(door)))
        assert "killed rather than left running" in busy.message
        running = door.process.list(pb.ListRequest(), call_of(door)).processes
        assert not [p for p in running if "sleep 2100" in " ".join(p.config.args)], running
        calls[0].scope.cancel()
        followers[0].join()
        # The agent frees the slot when the cancel reaches it, a moment after the client's end.
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                fits = collect(door.process.start(bash("echo fits"), call_of(door)))
                break
            except E2bError as error:
                if error.connect_code != "resource_exhausted" or time.monotonic() > deadline:
                    raise
        assert fits.stdout == b"fits\n"
    finally:
        for pid in pids:
            door.process.send_signal(pb.SendSignalRequest(process=pb.ProcessSelector(pid=pid),
                                                          signal=pb.SIGNAL_SIGKILL), call_of(door))
    for follower in followers[1:]:
        assert follower.until(end=True).end is not None
        follower.join()


def test_users(door: Door) -> None:
    for user in (None, "user", "sandbox"):
        assert collect(door.process.start(bash("id -un"), call_of(door, user=user))).stdout == b"user\n"
    denied = refused("permission_denied", door.process.start(bash("id -un"), call_of(door, user="root")))
    assert "unprivileged user 'user'" in denied.message and "'root'" in denied.message


def test_a_shell_rule_denies_with_its_reason_and_is_audited(door: Door) -> None:
    denied = refused("permission_denied", door.process.start(bash("rm -rf /workspace/x"), call_of(door)))
    assert "recursive removal is not allowed" in denied.message
    record = [c for c in actions(door) if c["arguments"].get("command") == "rm -rf /workspace/x"]
    assert len(record) == 1 and record[0]["decision"] == "deny", record
    assert "tools.shell.rules[0]" in record[0]["rule"], record[0]
    # the same command as a plain argv is the same shell command to the policy
    argv = pb.StartRequest(process=pb.ProcessConfig(cmd="rm", args=["-rf", "/workspace/x"]))
    refused("permission_denied", door.process.start(argv, call_of(door)))


def test_on_denied_command_exit_answers_a_refusal_as_exit_code_126(door: Door) -> None:
    """Under ``sandbox.on_denied_command = "exit"`` (what the OpenAI Agents SDK's SandboxAgent
    needs: it ends its run on any error of the sandbox) a denied or asked command ends at once
    with 126 and the reason on stderr; nothing runs, the refusal is recorded; a terminal is
    still refused."""
    assert 'on_denied_command = "exit"' in EXITS_POLICY
    box = door.sandboxes.create("alice", template_id=EXITS)
    try:
        call = EnvdCall(sandbox=box, headers={}, user=None, deadline=None)
        denied = collect(door.process.start(bash("rm -rf /tmp/witness; touch /tmp/ran"), call))
        assert denied.kinds == ["start", "data", "end"] and denied.pid == 0
        assert denied.end is not None and denied.end.exit_code == 126 and denied.end.exited
        assert denied.end.status == denied.end.error == "exit status 126"
        assert denied.stderr.startswith(b"callbox: denied by policy rule tools.shell.rules[0]: recursive removal")
        asked = collect(door.process.start(bash("echo needs-approval"), call))
        assert asked.end is not None and asked.end.exit_code == 126 and asked.stdout == b""
        assert b"callbox approvals approve" in asked.stderr
        assert collect(door.process.start(bash("ls /tmp/ran || echo none"), call)).stdout == b"none\n"
        as_root = collect(door.process.start(bash("id -un"), EnvdCall(sandbox=box, headers={}, user="root",
                                                                          deadline=None)))
        assert as_root.end is not None and as_root.end.exit_code == 126 and b"root_commands" in as_root.stderr
        terminal = pb.StartRequest(process=pb.ProcessConfig(cmd="/bin/bash", args=["-i", "-l"]),
                                   pty=pb.PTY(size=pb.PTY.Size(rows=24, cols=80)))
        with pytest.raises(E2bError):  # a terminal is never "run" as an exit
            for _ in door.process.start(terminal, EnvdCall(sandbox=box, headers={}, user="root", deadline=None)):
                pass
        recorded = [c for c in door.audit.calls_for_run(box.sandbox_id) if c["tool"] == "sandbox.process"]
        decisions = {str(json.loads(c["arguments"])["command"]): c["decision"] for c in recorded}
        assert decisions["rm -rf /tmp/witness; touch /tmp/ran"] == "deny"
        assert decisions["echo needs-approval"] == "ask"
    finally:
        door.sandboxes.kill("alice", box.sandbox_id)


def test_an_ask_waits_for_approval_then_the_repeat_runs_once(door: Door) -> None:
    script = "echo needs-approval"
    asked = refused("failed_precondition", door.process.start(bash(script), call_of(door)))
    pending = door.audit.list_approvals("pending", run_id=door.box.sandbox_id)
    assert len(pending) == 1
    approval = pending[0].id
    assert approval in asked.message and f"callbox approvals approve {approval}" in asked.message
    again = refused("failed_precondition", door.process.start(bash(script), call_of(door)))
    assert approval in again.message  # the same approval, not a second one
    assert len(door.audit.list_approvals("pending", run_id=door.box.sandbox_id)) == 1

    door.audit.resolve_approval(approval, True, by="test", reason=None)
    ran = collect(door.process.start(bash(script), call_of(door)))
    assert ran.stdout == b"needs-approval\n"
    refused("failed_precondition", door.process.start(bash(script), call_of(door)))  # used once: asks anew
    assert door.audit.get_approval(approval).state == "consumed"
    assert len(door.audit.list_approvals("pending", run_id=door.box.sandbox_id)) == 1


def test_unknown_processes_are_not_found(door: Door) -> None:
    refused("not_found", door.process.connect(pb.ConnectRequest(process=pb.ProcessSelector(pid=999999)),
                                              call_of(door)))
    refused("not_found", door.process.connect(pb.ConnectRequest(process=pb.ProcessSelector(tag="no-such-tag")),
                                              call_of(door)))
    with pytest.raises(E2bError) as missing:
        door.process.close_stdin(pb.CloseStdinRequest(process=pb.ProcessSelector(pid=999999)), call_of(door))
    assert missing.value.connect_code == "not_found"
    refused("invalid_argument", door.process.start(pb.StartRequest(process=pb.ProcessConfig()), call_of(door)))


# ---- through the unmodified e2b SDK ---------------------------------------------------------------


@pytest.fixture(scope="module")
def sdk(door: Door) -> Iterator[str]:
    """serve_e2b on the module's sandboxes, and the SDK's environment pointed at it; the URL."""
    from harness.doors.e2b.server import serve_e2b

    server = serve_e2b("127.0.0.1:0", sandboxes=door.sandboxes, announce=None)
    patch = pytest.MonkeyPatch()
    patch.setenv("E2B_API_URL", server.url)
    patch.setenv("E2B_SANDBOX_URL", server.url)
    patch.setenv("E2B_API_KEY", API_KEY)
    try:
        yield server.url
    finally:
        patch.undo()
        server.stop()


def test_sdk_run_background_connect_kill_and_pty(sdk: str) -> None:
    from e2b import CommandExitException, Sandbox
    from e2b.sandbox.commands.command_handle import PtySize

    sandbox = Sandbox.create(envs={"FROM_CREATE": "sdk"}, timeout=300)
    try:
        out: list[str] = []
        err: list[str] = []
        result = sandbox.commands.run("echo out; echo err >&2; echo $FROM_CREATE $X", envs={"X": "x1"},
                                      on_stdout=out.append, on_stderr=err.append)
        assert (result.stdout, result.stderr, result.exit_code, result.error) == ("out\nsdk x1\n", "err\n", 0, None)
        assert "".join(out) == result.stdout and "".join(err) == result.stderr
        with pytest.raises(CommandExitException) as failed:
            sandbox.commands.run("echo bad >&2; exit 3")
        assert (failed.value.exit_code, failed.value.error, failed.value.stderr) == (3, "exit status 3", "bad\n")

        handle = sandbox.commands.run("sleep 1005 & echo ready; wait", background=True)
        other = Sandbox.connect(sandbox.sandbox_id)  # a second client
        assert handle.pid in [p.pid for p in other.commands.list()]
        joined = other.commands.connect(handle.pid)
        assert other.commands.kill(handle.pid) is True
        with pytest.raises(CommandExitException) as killed:
            joined.wait()
        assert (killed.value.exit_code, killed.value.error) == (-1, "signal: killed")
        assert "ready" in (killed.value.stdout or "")
        assert other.commands.kill(handle.pid) is False
        assert sandbox.commands.run("pgrep -c -f '^sleep 1005$' || true").stdout.strip() == "0"
        handle.disconnect()

        reader = sandbox.commands.run("read a; echo got:$a", background=True, stdin=True)
        sandbox.commands.send_stdin(reader.pid, "hello\n")
        assert reader.wait().stdout == "got:hello\n"

        # the size given at creation, then a resize: each terminal is asked only after its
        # size was set (one `stty size` sent before a resize may run after it)
        seen: list[bytes] = []
        terminal = sandbox.pty.create(PtySize(rows=24, cols=80))
        sandbox.pty.send_stdin(terminal.pid, b"stty size; exit 5\n")
        with pytest.raises(CommandExitException) as ended:
            terminal.wait(on_pty=seen.append)
        assert ended.value.exit_code == 5 and b"24 80" in b"".join(seen)
        resized: list[bytes] = []
        terminal = sandbox.pty.create(PtySize(rows=24, cols=80))
        sandbox.pty.resize(terminal.pid, PtySize(rows=40, cols=100))
        sandbox.pty.send_stdin(terminal.pid, b"stty size; exit 6\n")
        with pytest.raises(CommandExitException) as ended:
            terminal.wait(on_pty=resized.append)
        assert ended.value.exit_code == 6 and b"40 100" in b"".join(resized)
    finally:
        sandbox.kill()


def test_sdk_raises_the_policys_refusals(sdk: str) -> None:
    from e2b import Sandbox, SandboxException

    sandbox = Sandbox.create(timeout=300)
    try:
        with pytest.raises(SandboxException, match="recursive removal is not allowed"):
            sandbox.commands.run("rm -rf /workspace/y")
        with pytest.raises(SandboxException, match="callbox approvals approve"):
            sandbox.commands.run("echo needs-approval from the sdk")
        with pytest.raises(SandboxException, match="unprivileged user"):
            sandbox.commands.run("id", user="root")
    finally:
        sandbox.kill()
