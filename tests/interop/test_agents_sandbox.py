"""The OpenAI Agents SDK's ``SandboxAgent`` with its E2B client on ``callbox serve --e2b``.

``openai-agents[e2b]`` 0.24.0 pins ``e2b`` 2.31.0 and ``e2b-code-interpreter`` 2.8.1, not the
project's, so it runs in a virtualenv of its own (tests/interop/harness_venvs.py,
tests/interop/requirements/openai-agents-sandbox.txt) as a driver program,
tests/interop/agents_sandbox_program.py, with only the three variables a user sets. The SDK
is unmodified and used as its sandbox example writes it; ``agents.testing.ScriptedModel``
plays the model. The program runs once for the module (one server, five sandboxes: the
default options', the one its resume makes from the snapshot, the paused one, the code
interpreter's and the refused ``run_as`` one) and reports, per step, what the model received
and what the sandbox held (read back through the e2b SDK itself); the tests check each part,
and the server's audit store for the commands the model ran.
"""

from __future__ import annotations

import base64
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.engine.image.build import default_repo_root
from harness.engine.image.variants import build_variant
from tests.interop.e2b_server import DENIED_COMMAND_REASON, E2bServer, policy_text, serve_e2b
from tests.interop.harness_venvs import run_driver

pytestmark = [pytest.mark.interop, pytest.mark.docker, pytest.mark.agents_sandbox]

HARNESS = "openai-agents-sandbox"
PROGRAM = Path(__file__).with_name("agents_sandbox_program.py")
NOTE = "written by the model through apply_patch"
DOT = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"  # the program's 1x1 PNG
                    "1f15c4890000000d49444154789c6360f8cfc0f01f0005000201a5f2a0"
                    "a40000000049454e44ae426082")
# The SDK asks for public ports (``allow_public_traffic``) for a session's ``exposed_ports``;
# callbox serves them so only where the policy says so, and forwards them where it allows it.
# The SDK ends its run on any error of its sandbox: a command the policy denies is answered
# as an exit (126, the reason on stderr), for the model to read.
POLICY = policy_text(f"""
public_ports = true
on_denied_command = "exit"

[actions.port_forward]
decision = "allow"

[tools.shell]
[[tools.shell.rules]]
action = "deny"
command = "*git push*"
reason = "{DENIED_COMMAND_REASON}"
""")


@pytest.fixture(scope="module")
def server(engine: Any) -> Iterator[E2bServer]:
    build_variant(engine.client, "code-interpreter", repo_root=default_repo_root(), progress=lambda _line: None)
    with serve_e2b(engine, policy=POLICY) as served:
        yield served


@pytest.fixture(scope="module")
def report(server: E2bServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # The program's temporary files (the sessions' snapshots) go where pytest cleans up.
    env = {**server.child_env(), "TMPDIR": str(tmp_path_factory.mktemp("agents-sandbox"))}
    found: dict[str, Any] = run_driver(HARNESS, PROGRAM, env=env, timeout=300)
    return found


def section(report: dict[str, Any], name: str) -> dict[str, Any]:
    """One step's part of the report; a step that raised fails naming the harness and the call."""
    part = report[name]
    assert part["ok"], f"{HARNESS}: step {name!r} raised {part['error']}\n{part['traceback']}"
    return part


def said(part: dict[str, Any], call_id: str) -> tuple[str, str]:
    """What the model received for its call ``call_id`` (and the polls of its process that
    followed, on a slow machine), and a failure message naming the harness, the call and that."""
    outputs: dict[str, str] = part["outputs"]
    output = "".join(text for key, text in outputs.items() if key == call_id or key.startswith(f"{call_id}-poll-"))
    return output, f"{HARNESS}: the model's call {part['calls'].get(call_id)} got {output!r}"


def audited_commands(server: E2bServer, sandbox_id: str) -> list[str]:
    with sqlite3.connect(server.directory / "audit.sqlite3") as db:
        rows = db.execute("SELECT arguments FROM calls WHERE run_id = ? AND tool = 'sandbox.process'",
                          (sandbox_id,)).fetchall()
    return [str(json.loads(arguments)["command"]) for (arguments,) in rows]


def test_the_model_runs_commands_and_reads_their_output(report: dict[str, Any], server: E2bServer) -> None:
    part = section(report, "defaults")
    assert part["tools"] == ["apply_patch", "exec_command", "view_image", "write_stdin"]
    plain, why = said(part, "plain")
    assert "Process exited with code 0" in plain and plain.endswith(
        "Output:\nuser\n/workspace\n# Renewal notes\nno-tty\n"), why
    status, why = said(part, "status")
    assert "Process exited with code 3" in status and status.endswith(NOTE), why
    assert part["final_output"] == "The workspace holds README.md and notes.txt."
    # callbox saw and ran each command under its policy, in that sandbox's record.
    commands = audited_commands(server, part["sandbox_id"])
    assert any("cat notes.txt; exit 3" in command for command in commands), commands
    # A tty command is typed into a terminal's shell: the record (and the policy) sees the shell.
    assert "['/bin/bash', '-i', '-l']" in commands or "/bin/bash -i -l" in commands, commands
    assert not any("tty; echo" in command for command in commands), commands


def test_a_tty_command_gets_a_terminal_and_its_input(report: dict[str, Any]) -> None:
    part = section(report, "defaults")
    tty, why = said(part, "tty")
    assert "Process running with session ID" in tty, why  # the terminal's shell stays open
    assert "/dev/pts/" in tty and "\r\n42\r\n" in tty, why
    typed, why = said(part, "stdin")
    assert "Process exited with code 0" in typed and "logout" in typed, why


def test_the_sdk_writes_and_reads_files_the_sandbox_holds(report: dict[str, Any]) -> None:
    part = section(report, "defaults")
    patched, why = said(part, "patch")
    assert patched == "Created notes.txt", why
    assert part["notes"] == NOTE
    assert part["exec"] == "written by session.write\n"
    assert part["readme"] == "# Renewal notes\n"
    assert part["raw_files"] == {"README.md": "# Renewal notes\n", "notes.txt": NOTE,
                                 "from-sdk.txt": "written by session.write\n"}


def test_the_model_sees_an_image_the_sandbox_holds(report: dict[str, Any]) -> None:
    image, why = said(section(report, "defaults"), "image")
    expected = [{"type": "input_image", "image_url": "data:image/png;base64," + base64.b64encode(DOT).decode()}]
    assert json.loads(image) == expected, why


def test_resume_through_a_new_client_restores_the_workspace_in_a_new_sandbox(report: dict[str, Any]) -> None:
    part = section(report, "defaults")
    assert part["after_exit"] == "gone"  # the default: killed at the session's end
    assert part["resumed_id"] != part["sandbox_id"]
    assert part["restored"] == NOTE and part["restored_sdk_file"] == "written by session.write\n"
    assert part["resumed_after_exit"] == "gone"


def test_an_exposed_port_is_fetched_through_get_host(report: dict[str, Any], server: E2bServer) -> None:
    part = section(report, "paused")
    served, why = said(part, "serve")
    assert "Serving HTTP on 0.0.0.0 port 8000" in served, why
    assert part["endpoint"]["host"].startswith(f"8000-{part['sandbox_id'].lower()}.")
    assert part["page"] == {"status": 200, "body": "hello\n"}
    with sqlite3.connect(server.directory / "audit.sqlite3") as db:
        ports = db.execute("SELECT arguments FROM calls WHERE run_id = ? AND tool = 'sandbox.port_forward'",
                           (part["sandbox_id"],)).fetchall()
    assert [json.loads(arguments)["port"] for (arguments,) in ports] == [8000]


def test_pause_on_exit_and_a_new_client_resume_the_same_sandbox(report: dict[str, Any]) -> None:
    part = section(report, "paused")
    assert part["after_exit"] == "paused"
    assert part["resumed_id"] == part["sandbox_id"] and part["after_resume"] == "running"
    assert part["kept"] == "kept across the pause\n"
    assert part["after_second_exit"] == "paused"


def test_the_code_interpreter_sandbox_type(report: dict[str, Any]) -> None:
    part = section(report, "code_interpreter")
    total, why = said(part, "sum")
    assert total.endswith("Output:\n45\nuser\n"), why  # numpy: the code interpreter's image
    assert part["final_output"] == "45"
    assert part["leftover"] == []  # the runner killed the sandbox it made


def test_a_command_the_policy_denies_is_a_result_the_model_reads(report: dict[str, Any], server: E2bServer) -> None:
    part = section(report, "code_interpreter")
    pushed, why = said(part, "push")
    assert "Process exited with code 126" in pushed, why
    assert pushed.endswith(f"callbox: denied by policy rule tools.shell.rules[0]: {DENIED_COMMAND_REASON}\n"), why
    assert part["final_output"] == "45"  # the run went on to the model's answer
    with sqlite3.connect(server.directory / "audit.sqlite3") as db:
        decisions = [decision for (arguments, decision) in db.execute(
            "SELECT arguments, decision FROM calls WHERE tool = 'sandbox.process'")
            if "git push origin main" in str(json.loads(arguments)["command"])]
    assert decisions == ["deny"]


def test_run_as_fails_before_the_first_model_call(report: dict[str, Any]) -> None:
    """``run_as`` provisions its user with ``useradd`` as the unprivileged command user: the run
    fails at the sandbox's start, naming the command, and nothing is left running."""
    part = section(report, "run_as")
    assert part["raised"].startswith("ExecNonZeroError") and "useradd" in part["raised"], part["raised"]
    assert part["model_calls"] == 0
    assert part["leftover"] == []
