"""The ``bash`` tool in a real sandbox: a persistent session with Anthropic ``bash_20250124`` semantics.

Every test calls the real handler with a real ToolContext whose provider returns a live
sandbox (and one goes through ``harness.core.session.Session``). Synchronisation inside the
sandbox uses FIFOs opened through the agent's Exec service, never sleeps.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from harness.audit.store import AuditStore
from harness.core.calls import ErrorCode, ToolCall
from harness.core.context import OutputSink, ToolContext
from harness.core.policy import Budgets, Policy
from harness.core.registry import ToolRegistry
from harness.core.session import Session
from harness.engine.spec import SandboxSpec
from harness.tools.bash import BASH, NO_COMMAND, RESTARTED, BashArgs
from tests.conftest import IMAGE
from tests.integration.helpers import run

pytestmark = pytest.mark.docker

TIMED_OUT_1S = "timed out: bash has not returned in 1.0 seconds and must be restarted"


class _Provider:
    def __init__(self, box: Any) -> None:
        self.box = box

    def sandbox(self) -> Any:
        return self.box


def _ctx(box: Any, *, timeout_s: float = 30.0, on_output: OutputSink | None = None) -> ToolContext:
    return ToolContext(run_id="bash-tool", call_id="c1", provider=_Provider(box), default_timeout_s=timeout_s,
                       timeout_ceiling_s=60.0, output_budget=30_000, on_output=on_output)


def _bash(box: Any, command: str | None = None, restart: bool | None = None, **kwargs: Any) -> Any:
    return BASH.handler(_ctx(box, **kwargs), BashArgs(command=command, restart=restart))


def _ok(box: Any, command: str, **kwargs: Any) -> str:
    out = _bash(box, command, **kwargs)
    assert not out.is_error, out.text
    return str(out.text)


@pytest.fixture
def box(clean_sandbox):  # type: ignore[no-untyped-def]
    """The module's shared sandbox, with no bash session yet (as in a fresh sandbox)."""
    return clean_sandbox


def test_cd_survives_between_calls(box):
    assert _ok(box, "cd /tmp") == ""
    assert _ok(box, "pwd") == "/tmp"


def test_exported_variables_and_functions_survive(box):
    _ok(box, "export X=1; greet() { echo \"hello $1\"; }")
    assert _ok(box, "echo $X") == "1"
    assert _ok(box, "greet model") == "hello model"


def test_runs_as_the_tool_user_in_the_workspace(box):
    assert _ok(box, "id -u; pwd") == "1000\n/workspace"


def test_the_sandbox_env_reaches_the_session(make_sandbox):
    box = make_sandbox(env={"PROJECT": "callbox"})  # a spec of its own
    assert _ok(box, "echo $PROJECT") == "callbox"
    _bash(box, restart=True)
    assert _ok(box, "echo $PROJECT") == "callbox"


def test_restart_clears_the_session(box):
    _ok(box, "cd /tmp; export X=1; f() { echo fn; }")
    out = _bash(box, restart=True)
    assert (out.text, out.is_error) == (RESTARTED, False)
    assert out.text == "tool has been restarted."
    assert _ok(box, "pwd; echo \"X=${X:-}\"; type f >/dev/null 2>&1 || echo no-f") == "/workspace\nX=\nno-f"


def test_restart_wins_over_a_command_sent_with_it(box):
    out = _bash(box, command="touch /tmp/should-not-exist", restart=True)
    assert out.text == RESTARTED
    assert _ok(box, "ls /tmp/should-not-exist 2>/dev/null || echo absent") == "absent"


def test_neither_command_nor_restart_is_an_error_naming_the_fix(box):
    out = _bash(box)
    assert out.is_error and out.error == ErrorCode.INVALID_ARGUMENTS
    assert out.text == NO_COMMAND
    assert out.text.startswith("no command provided.") and "restart" in out.text
    out = _bash(box, restart=False)
    assert out.is_error and out.text == NO_COMMAND


def test_output_is_stdout_then_stderr_and_nonzero_exit_is_not_an_error(box):
    out = _bash(box, "echo to-err >&2; echo to-out; exit_code() { return 3; }; exit_code")
    assert (out.text, out.is_error, out.error) == ("to-out\nto-err", False, None)
    assert out.structured["exit_code"] == 3
    assert out.structured["cwd"] == "/workspace"


def test_empty_output_is_an_empty_result(box):
    out = _bash(box, "true")
    assert (out.text, out.is_error) == ("", False)


def test_timeout_gives_the_published_text_and_needs_a_restart(box):
    started = time.monotonic()
    out = _bash(box, "echo before; sleep 30", timeout_s=1.0)
    assert time.monotonic() - started < 10
    assert (out.text, out.is_error, out.error) == (TIMED_OUT_1S, True, ErrorCode.TIMED_OUT)
    later = _bash(box, "echo after")
    assert later.is_error
    assert later.text == TIMED_OUT_1S  # the reference repeats the timeout until restarted
    assert "must be restarted" in later.text
    assert _bash(box, restart=True).text == RESTARTED
    assert _ok(box, "echo recovered") == "recovered"
    # The sleep was killed with the session.
    assert "sleep 30" not in run(box, ["ps", "-eo", "args"]).stdout.data().decode()


def test_exit_ends_the_session_until_restart(box):
    out = _bash(box, "echo bye; exit 3")
    assert out.is_error
    assert out.text == "bye\nbash has exited with returncode 3 and must be restarted"
    again = _bash(box, "echo x")
    assert (again.text, again.is_error) == ("bash has exited with returncode 3 and must be restarted", True)
    _bash(box, restart=True)
    assert _ok(box, "echo back") == "back"


def test_fake_sentinels_and_prompts_come_back_verbatim(box):
    command = (
        "printf '0\\0/tmp\\0'; printf '$ '; echo '<<exit>>'; printf 'bash-5.2$ \\n'; "
        "printf '1\\0/\\0' >&2; echo last"
    )
    out = _bash(box, command)
    assert not out.is_error
    assert out.text == "0\x00/tmp\x00$ <<exit>>\nbash-5.2$ \nlast\n1\x00/\x00"
    assert out.structured["cwd"] == "/workspace"
    assert _ok(box, "echo next") == "next"


def test_background_job_keeps_running_between_calls(box):
    started = time.monotonic()
    pid = _ok(box, "sleep 30 & echo $!")
    assert time.monotonic() - started < 5  # the call did not wait for the job
    assert "Running" in _ok(box, "jobs")
    # $! is the forked shell until it has exec'd sleep, which a loaded machine may not have
    # scheduled yet: wait (bounded) for the exec, then look.
    exec_done = f'for i in $(seq 200); do [ "$(ps -o args= -p {pid})" = "sleep 30" ] && break; sleep 0.05; done'
    assert _ok(box, f"{exec_done}; ps -o args= -p {pid}") == "sleep 30"
    _bash(box, restart=True)
    # Killed with the session; until its new parent reaps it, the job is a zombie (state Z),
    # dead all the same: wait (bounded) for it to be gone or a zombie.
    dead = (f"for i in $(seq 200); do ps -o stat= -p {pid} | grep -qv '^Z' || {{ echo gone; exit 0; }}; "
            "sleep 0.05; done; ps -o stat=,args= -p " + pid)
    assert run(box, dead).stdout.data() == b"gone\n"


def test_output_of_a_background_job_arrives_with_the_next_call(box):
    assert run(box, "mkfifo /tmp/go /tmp/written").exit_code == 0
    _ok(box, "(read x < /tmp/go; echo late-$x; echo ok > /tmp/written) &")
    assert run(box, "echo output > /tmp/go; cat /tmp/written").stdout.data() == b"ok\n"
    assert _ok(box, "echo now") == "late-output\nnow"


def test_non_utf8_output_becomes_replacement_characters(box):
    out = _bash(box, "printf 'a\\377b\\n'")
    assert out.text == "a\ufffdb"
    assert not out.is_error


def test_large_output_is_bounded(box):
    streamed: list[int] = []
    out = _bash(box, "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo END",
                on_output=lambda _stream, data: streamed.append(len(data)))
    assert not out.is_error
    assert out.structured["truncated"] is True
    assert len(out.text) < (1 << 20) + 200
    assert out.text.startswith("xxx") and out.text.endswith("x\nEND")
    assert "bytes dropped" in out.text
    assert sum(streamed) == 1 << 20  # head and tail, never more
    assert out.raw_bytes == 3_000_005


def test_output_streams_while_the_command_runs(box):
    assert run(box, "mkfifo /tmp/gate").exit_code == 0
    first_chunk = threading.Event()
    results: list[Any] = []

    def on_output(_stream: str, data: bytes) -> None:
        if b"early" in data:
            first_chunk.set()

    worker = threading.Thread(
        target=lambda: results.append(_bash(box, "echo early; read x < /tmp/gate; echo late-$x",
                                            on_output=on_output)))
    worker.start()
    try:
        assert first_chunk.wait(20), "no output streamed before the command returned"
        assert not results
    finally:
        run(box, "echo go > /tmp/gate")
        worker.join(30)
    assert results[0].text == "early\nlate-go"


def test_concurrent_calls_are_serialized(box):
    assert run(box, "mkfifo /tmp/gate").exit_code == 0
    started = threading.Event()
    results: dict[str, Any] = {}

    def first() -> None:
        def on_output(_stream: str, data: bytes) -> None:
            if b"first-started" in data:
                started.set()
        results["first"] = _bash(box, "echo first-started; read x < /tmp/gate; "
                                          "test -e /tmp/second-ran && echo second-ran-early; echo first-$x; "
                                          "touch /tmp/first-done",
                                 on_output=on_output)

    def second() -> None:
        # Which of the two threads gets its answer back first is the scheduler's business;
        # what the shell ran in which order is what serialization promises.
        results["second"] = _bash(box, "touch /tmp/second-ran; test -e /tmp/first-done && echo second-after")

    t1 = threading.Thread(target=first)
    t2 = threading.Thread(target=second)
    t1.start()
    try:
        assert started.wait(20)
        t2.start()
    finally:
        run(box, "echo go > /tmp/gate")
        t1.join(30)
        if t2.ident is not None:
            t2.join(30)
    assert results["first"].text == "first-started\nfirst-go"
    assert results["second"].text == "second-after"


def test_cancelled_call_kills_the_session(box):
    events = box.agent.shell_run("echo $$; sleep 60", session_id="default", timeout_ms=30_000)
    shell_pid = int(next(events).output.stdout)
    events.close()  # the client goes away mid-command: the RPC is cancelled
    out = _bash(box, "echo x")
    assert out.is_error and "restarted" in out.text
    assert run(box, f"ps -o args= -p {shell_pid} || echo gone").stdout.data() == b"gone\n"
    _bash(box, restart=True)
    assert _ok(box, "echo fine") == "fine"


def test_through_the_harness(engine, tmp_path):
    policy = Policy(budgets=Budgets(max_output_bytes=3000))
    with AuditStore(tmp_path / "audit.sqlite3") as audit, Session(
        ToolRegistry([BASH]), policy, audit, spec=SandboxSpec(image=IMAGE), engine_factory=lambda: engine
    ) as harness:
        first = harness.call(ToolCall("bash", '{"command": "cd /tmp && export V=7", "restart": null}', "c1"))
        assert (first.text, first.is_error) == ("", False)
        second = harness.call(ToolCall("bash", {"command": "echo $V $(pwd); seq 1 20000"}, "c2"))
        assert second.text.startswith("7 /tmp\n1\n2\n")
        assert len(second.text.encode()) <= 3000 + 200  # the model's output budget
        restarted = harness.call(ToolCall("bash", {"restart": True}, "c3"))
        assert restarted.text == "tool has been restarted."
        neither = harness.call(ToolCall("bash", {}, "c4"))
        assert neither.is_error and neither.text.startswith("no command provided.")


def test_definition_is_truthful_and_strict():
    definition = BASH.definition
    assert definition.name == "bash"
    assert definition.annotations.read_only is False
    assert definition.annotations.destructive is True
    schema = ToolRegistry([BASH]).get("bash").definition.input_model.model_json_schema()
    assert set(schema["properties"]) == {"command", "restart"}
