"""Declared tools end to end: the real engine and image, the real CLI, the official MCP client.

A ``command`` tool runs a tiny unittest project mounted at /workspace/project; a ``python``
tool calls functions from a mounted directory. Arguments carrying shell syntax must arrive
as literal text (and leave no trace in the sandbox), a deny rule on the rendered argv must
hold, and errors and timeouts must come back as results.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from harness.audit.store import AuditStore
from harness.core.calls import ErrorCode, ToolCall, ToolResult
from harness.core.policy import load_policy
from harness.core.session import Session
from harness.tools import registry_for
from tests.conftest import IMAGE
from tests.integration.helpers import callbox, grpc_door

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]

TEST_MODULE = '''\
import os
import sys
import unittest


class MathTest(unittest.TestCase):
    def test_add(self):
        print("argv seen by the test:", sys.argv)
        print("TEST_NOTE=[%s]" % os.environ.get("TEST_NOTE"))
        self.assertEqual(1 + 1, 2)
'''

PYTOOLS = '''\
import time


def add(a, b=2):
    return {"sum": a + b, "inputs": [a, b]}


def greet(name):
    print("this goes to stderr, not the result")
    return f"hello, {name}"


def boom(reason):
    helper(reason)


def helper(reason):
    raise ValueError(f"boom: {reason}")


def slow(seconds):
    time.sleep(seconds)
    return "woke up"
'''


def _policy(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_math.py").write_text(TEST_MODULE)
    pytools = tmp_path / "pytools"
    pytools.mkdir()
    (pytools / "tools.py").write_text(PYTOOLS)
    path = tmp_path / "policy.toml"
    path.write_text(textwrap.dedent(f'''
        [sandbox]
        image = "{IMAGE}"

        [[tool]]
        name = "run_tests"
        description = "Run the project's unit tests."
        kind = "command"
        argv = ["python3", "-m", "unittest", "-v", "{{pattern}}"]
        workdir = "/workspace/project"
        env = {{ TEST_NOTE = "{{note}}" }}
        mounts = [{{ source = "project", target = "/workspace/project", mode = "ro" }}]
        [tool.arguments.pattern]
        type = "string"
        description = "A test module or pattern."
        required = true
        [tool.arguments.note]
        type = "string"
        description = "Put in $TEST_NOTE."

        [[tool]]
        name = "add"
        kind = "python"
        function = "tools:add"
        path = "/srv/pytools"
        mounts = [{{ source = "pytools", target = "/srv/pytools", mode = "ro" }}]
        annotations = {{ read_only = true, destructive = false, idempotent = true }}
        [tool.parameters]
        type = "object"
        required = ["a"]
        properties = {{ a = {{ type = "integer" }}, b = {{ type = "integer" }} }}

        [[tool]]
        name = "greet"
        kind = "python"
        function = "tools:greet"
        path = "/srv/pytools"
        mounts = [{{ source = "pytools", target = "/srv/pytools", mode = "ro" }}]
        [tool.arguments.name]
        type = "string"
        required = true

        [[tool]]
        name = "boom"
        kind = "python"
        function = "tools:boom"
        path = "/srv/pytools"
        mounts = [{{ source = "pytools", target = "/srv/pytools", mode = "ro" }}]
        [tool.arguments.reason]
        type = "string"
        required = true

        [[tool]]
        name = "slow"
        kind = "python"
        function = "tools:slow"
        path = "/srv/pytools"
        timeout_s = 1
        mounts = [{{ source = "pytools", target = "/srv/pytools", mode = "ro" }}]
        [tool.arguments.seconds]
        type = "number"
        required = true

        [[tools.run_tests.rules]]
        action = "deny"
        command = "*rm -rf*"
        reason = "no deleting"
    '''))
    return path


@pytest.fixture
def policy_path(tmp_path: Path) -> Path:
    return _policy(tmp_path)


@pytest.fixture
def session(engine: Any, policy_path: Path, tmp_path: Path) -> Iterator[Session]:
    policy = load_policy(policy_path)
    audit = AuditStore(tmp_path / "audit.sqlite3")
    harness = Session(registry_for(policy), policy, audit)
    try:
        yield harness
    finally:
        harness.close()
        audit.close()


def _call(session: Session, name: str, arguments: dict[str, Any], call_id: str) -> ToolResult:
    return session.call(ToolCall(name=name, arguments=json.dumps(arguments), call_id=call_id))


# ---- command ------------------------------------------------------------------------------


def test_run_tests_runs_the_mounted_project(session: Session) -> None:
    result = _call(session, "run_tests", {"pattern": "test_math", "note": "n"}, "c1")
    assert not result.is_error, result.text
    assert result.text.startswith("Exit code: 0\nWall time: ")
    assert "test_add (test_math.MathTest" in result.text and "OK" in result.text
    assert "argv seen by the test: ['python3 -m unittest'" in result.text  # unittest's own argv[0]
    assert result.structured is not None
    assert result.structured["argv"] == ["python3", "-m", "unittest", "-v", "test_math"]


@pytest.mark.parametrize("payload", ["$(touch /tmp/pwned-a)", "x; touch /tmp/pwned-b; #", "`touch /tmp/pwned-c`"])
def test_shell_syntax_in_an_argument_is_literal_text(session: Session, payload: str) -> None:
    result = _call(session, "run_tests", {"pattern": payload, "note": f"$(touch /tmp/pwned-env) {payload}"}, "c1")
    assert result.error is ErrorCode.NONZERO_EXIT, result.text
    assert result.structured is not None and result.structured["argv"][-1] == payload
    # unittest tried to import a module named exactly the argument
    assert f"No module named '{payload}'" in result.text
    check = _call(session, "shell", {"command": "ls /tmp; printf '%s' \"$HOME\""}, "c2")
    assert not check.is_error
    assert "pwned" not in check.text


def test_the_environment_variable_gets_the_argument_as_text(session: Session) -> None:
    note = "$(id) ; `id` 'q\""
    result = _call(session, "run_tests", {"pattern": "test_math", "note": note}, "c1")
    assert not result.is_error, result.text
    assert f"TEST_NOTE=[{note}]" in result.text
    absent = _call(session, "run_tests", {"pattern": "test_math"}, "c2")  # an absent optional: no variable
    assert "TEST_NOTE=[None]" in absent.text


def test_a_deny_rule_on_the_rendered_argv_is_enforced(session: Session) -> None:
    result = _call(session, "run_tests", {"pattern": "; rm -rf /"}, "c1")
    assert result.error is ErrorCode.DENIED
    assert result.text == "denied by policy rule tools.run_tests.rules[0]: no deleting"
    assert result.meta["decision"] == "deny"
    record = session.audit.get_call(session.run_id, "c1")
    assert record is not None and record.decision is not None and record.decision.action.value == "deny"


# ---- python -------------------------------------------------------------------------------


def test_a_python_tool_returns_structured_data(session: Session) -> None:
    result = _call(session, "add", {"a": 40}, "c1")
    assert not result.is_error, result.text
    assert result.structured == {"sum": 42, "inputs": [40, 2]}
    assert json.loads(result.text) == {"sum": 42, "inputs": [40, 2]}
    text = _call(session, "greet", {"name": "$(id)"}, "c2")
    assert not text.is_error and text.text == "hello, $(id)"
    assert text.structured is None


def test_a_python_exception_is_an_error_with_the_traceback_tail(session: Session) -> None:
    result = _call(session, "boom", {"reason": "bad input"}, "c1")
    assert result.error is ErrorCode.TOOL_FAILED
    assert result.text.startswith("tools:boom raised an exception:")
    assert result.text.rstrip().endswith("ValueError: boom: bad input")
    assert 'File "/srv/pytools/tools.py"' in result.text and "in helper" in result.text


def test_a_python_timeout_is_timed_out(session: Session) -> None:
    started = time.monotonic()
    result = _call(session, "slow", {"seconds": 60}, "c1")
    assert time.monotonic() - started < 20
    assert result.error is ErrorCode.TIMED_OUT
    assert result.text.startswith("tools:slow timed out after ")
    assert result.structured is not None and result.structured["timed_out"] is True
    quick = _call(session, "slow", {"seconds": 0}, "c2")  # the sandbox is fine afterwards
    assert quick.text == "woke up"


# ---- the doors ------------------------------------------------------------------------------


def test_the_cli_lists_and_calls_declared_tools(engine: Any, policy_path: Path, tmp_path: Path) -> None:
    env = {"CALLBOX_AUDIT_DB": str(tmp_path / "cli-audit.sqlite3")}
    listed = callbox("tools", "--policy", str(policy_path), "--format", "openai", env=env)
    assert listed.returncode == 0, listed.stderr
    tools = {t["name"]: t for t in json.loads(listed.stdout)}
    assert {"shell", "run_tests", "add", "greet", "boom", "slow"} <= set(tools)
    assert tools["run_tests"]["parameters"]["properties"]["pattern"]["type"] == "string"
    assert tools["run_tests"]["strict"] is True

    added = callbox("call", "--policy", str(policy_path), "add", '{"a": 1, "b": 2}', "--format", "mcp", env=env)
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["structuredContent"] == {"sum": 3, "inputs": [1, 2]}

    denied = callbox("call", "--policy", str(policy_path), "run_tests", '{"pattern": "x; rm -rf /"}', env=env)
    assert denied.returncode == 1
    assert "denied by policy rule tools.run_tests.rules[0]" in json.loads(denied.stdout)["output"]


def test_a_bad_declared_tool_fails_the_cli_at_load(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[[tool]]\nname = "git"\nkind = "mcp"\n')
    proc = callbox("tools", "--policy", str(path))
    assert proc.returncode == 2
    assert b'a kind = "mcp" tool needs command = ["PROGRAM", "ARG", ...]' in proc.stderr
    assert b"Traceback" not in proc.stderr


def test_callbox_mcp_serves_declared_tools(engine: Any, policy_path: Path, tmp_path: Path) -> None:
    env = {**os.environ, "CALLBOX_AUDIT_DB": str(tmp_path / "mcp-audit.sqlite3")}
    params = StdioServerParameters(command=sys.executable, args=["-m", "harness.cli.main", "mcp", "--policy",
                                                                 str(policy_path)], env=env, cwd=str(ROOT))

    async def flow() -> None:
        with anyio.fail_after(120):
            async with Client(params) as client:
                listed = {t.name: t for t in (await client.list_tools()).tools}
                assert listed["add"].input_schema == {
                    "type": "object", "description": "Call the Python function tools:add in the sandbox.",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a"], "additionalProperties": False,
                }
                assert listed["add"].annotations is not None and listed["add"].annotations.read_only_hint is True
                added = await client.call_tool("add", {"a": 5, "b": 6})
                assert added.is_error is False
                assert added.structured_content is not None and added.structured_content["sum"] == 11
                ran = await client.call_tool("run_tests", {"pattern": "$(echo injected)"})
                assert ran.is_error is True
                text = "".join(getattr(block, "text", "") for block in ran.content)
                assert "No module named '$(echo injected)'" in text

    anyio.run(flow)


def test_callbox_run_calls_declared_tools(engine: Any, policy_path: Path, tmp_path: Path) -> None:
    transcript = tmp_path / "transcript.jsonl"
    transcript.write_text("".join(json.dumps(turn) + "\n" for turn in [
        {"text": "adding, then testing", "tool_calls": [
            {"call_id": "r1", "name": "add", "arguments": {"a": 2, "b": 40}},
            {"call_id": "r2", "name": "run_tests", "arguments": {"pattern": "test_math"}},
        ]},
        {"text": "the sum is 42 and the tests pass"},
    ]))
    env = {"CALLBOX_AUDIT_DB": str(tmp_path / "run-audit.sqlite3")}
    proc = callbox("run", str(transcript), "--json", "--policy", str(policy_path), env=env)
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    results = {e["call_id"]: e for e in events if e["event"] == "tool_result"}
    assert set(results) == {"r1", "r2"}
    assert results["r1"]["decision"] == "allow" and results["r2"]["decision"] == "allow"
    assert results["r1"]["result"]["structured"] == {"sum": 42, "inputs": [2, 40]}
    assert "OK" in results["r2"]["result"]["text"] and not results["r2"]["result"]["is_error"]
    assert events[-1]["reason"] == "final"


def test_the_grpc_door_serves_the_policys_declared_tools(engine: Any, policy_path: Path, tmp_path: Path) -> None:
    audit = AuditStore(tmp_path / "grpc-audit.sqlite3")
    try:
        with grpc_door(load_policy(policy_path), audit) as client:
            listed = {t["name"]: t for t in client.list_tools("openai")}
            assert {"run_tests", "add", "greet"} <= set(listed)
            assert listed["add"]["parameters"]["required"] == ["a", "b"]  # strict mode: every key required
            box = client.create_sandbox()
            try:
                added = client.call(box, "add", {"a": 1, "b": 2})
                assert not added.is_error, added.text
                assert added.structured == {"sum": 3, "inputs": [1, 2]}
                denied = client.call(box, "run_tests", {"pattern": "x; rm -rf /"})
                assert denied.is_error and denied.error_code == "denied"
            finally:
                client.delete_sandbox(box)
    finally:
        audit.close()
