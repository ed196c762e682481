"""`callbox exec`, `ps` and `gc` through the real CLI, as a user runs them."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import IMAGE
from tests.integration.helpers import callbox

pytestmark = pytest.mark.docker


def test_exec_json_prints_the_result_object(engine):
    proc = callbox("exec", "--image", IMAGE, "--json", "--", "echo", "hi")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert {"exit_code", "signal", "timed_out", "oom_killed", "duration_ms", "stdout", "stderr",
            "stdout_truncated", "stderr_truncated"} <= result.keys()
    assert result["stdout"] == "hi\n"
    assert result["exit_code"] == 0
    assert result["timed_out"] is False


def test_exec_streams_and_exits_with_the_command_code(engine):
    proc = callbox("exec", "--image", IMAGE, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert proc.returncode == 7
    assert proc.stdout == b"out\n"
    assert proc.stderr == b"err\n"


def test_exec_pipes_stdin(engine):
    proc = callbox("exec", "--image", IMAGE, "--", "tr", "a-z", "A-Z", stdin=b"hello sandbox\n")
    assert proc.returncode == 0
    assert proc.stdout == b"HELLO SANDBOX\n"


def test_exec_timeout_exits_124(engine):
    proc = callbox("exec", "--image", IMAGE, "--timeout", "1", "--json", "--", "sleep", "60")
    assert proc.returncode == 124
    assert json.loads(proc.stdout)["timed_out"] is True


def test_exec_oom_exits_137(engine):
    proc = callbox("exec", "--image", IMAGE, "--memory", "96m", "--", "python3", "-c",
                   "b = bytearray(b'x') * (200 << 20)")
    assert proc.returncode == 137
    assert b"OOM" in proc.stderr


def test_exec_binary_output_is_exact_when_streaming_and_in_json(engine):
    proc = callbox("exec", "--image", IMAGE, "--", "printf", "\\377\\000\\001")
    assert proc.stdout == b"\xff\x00\x01"
    proc = callbox("exec", "--image", IMAGE, "--json", "--", "printf", "\\377\\000\\001")
    result = json.loads(proc.stdout)
    assert base64.b64decode(result["stdout_base64"]) == b"\xff\x00\x01"


def test_bad_flag_is_one_line_and_exit_2():
    proc = callbox("exec", "--memroy", "1g", "--", "true")
    assert proc.returncode == 2
    lines = proc.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("callbox:"), proc.stderr
    assert b"Traceback" not in proc.stderr


def test_missing_image_is_a_clear_error(engine):
    proc = callbox("exec", "--image", "callbox-no-such-image:latest", "--", "true")
    assert proc.returncode == 125
    assert b"not found" in proc.stderr and b"callbox image build" in proc.stderr
    assert b"Traceback" not in proc.stderr


def test_unreachable_engine_is_a_clear_error():
    proc = callbox("exec", "--", "true", env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert proc.returncode == 125
    assert b"cannot reach the Docker engine" in proc.stderr
    assert b"Traceback" not in proc.stderr


def test_gc_removes_sandbox_whose_owner_was_sigkilled(engine):
    owner = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from harness.engine.docker.engine import DockerEngine
            from harness.engine.spec import SandboxSpec
            box = DockerEngine.connect().create(SandboxSpec(image={IMAGE!r}))
            print(box.id, flush=True)
            time.sleep(600)
        """)],
        stdout=subprocess.PIPE, text=True,
    )
    sandbox_id = ""
    try:
        assert owner.stdout is not None
        sandbox_id = owner.stdout.readline().strip()
        assert len(sandbox_id) == 12, "owner did not create a sandbox"
        listed = callbox("ps")
        assert sandbox_id.encode() in listed.stdout
        # while the owner lives, gc leaves it alone
        assert sandbox_id.encode() not in callbox("gc").stdout
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        gc = callbox("gc")
        assert gc.returncode == 0
        assert f"removed {sandbox_id}".encode() in gc.stdout
        assert sandbox_id.encode() not in callbox("ps").stdout
        # (the low-level listing: containers of tests running beside this one may go meanwhile)
        assert not engine.client.api.containers(all=True, filters={"name": f"callbox-{sandbox_id}"})
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        if sandbox_id:
            engine.destroy(sandbox_id)


def test_sigterm_to_callbox_exec_destroys_its_sandbox(engine):
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli.main", "exec", "--image", IMAGE, "--", "sh", "-c", "echo ready; sleep 60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"  # the sandbox exists and the command runs
        assert _owned_by(engine, proc.pid), "no sandbox found for the CLI process"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _owned_by(engine, proc.pid) == [], "the sandbox was leaked"


def _owned_by(engine, pid: int) -> list[str]:  # type: ignore[no-untyped-def]
    return [
        c["Id"] for c in engine.client.api.containers(all=True, filters={"label": "callbox.managed=1"})
        if f"/{pid}/" in c["Labels"].get("callbox.owner", "")
    ]


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_exec_into_a_closed_pipe_ends_quietly_and_destroys_its_sandbox(engine, stream: str):
    """`callbox exec -- seq 1 100000 | head -1`: the reader leaves; callbox stops reading,
    destroys the sandbox and exits 141 without a traceback."""
    redirect = "" if stream == "stdout" else " >&2"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli.main", "exec", "--image", IMAGE, "--", "sh", "-c",
         f"seq 1 1000000{redirect}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        reader, other = (proc.stdout, proc.stderr) if stream == "stdout" else (proc.stderr, proc.stdout)
        assert reader is not None and other is not None
        assert reader.readline() == b"1\n"
        assert _owned_by(engine, proc.pid), "no sandbox found for the CLI process"
        reader.close()
        assert proc.wait(60) == 141
        rest = other.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert b"Traceback" not in rest and b"Error" not in rest, rest
    if stream == "stdout":
        assert rest == b""
    assert _owned_by(engine, proc.pid) == [], "the sandbox was leaked"


def test_tools_and_audit_into_a_closed_pipe_exit_141_quietly(tmp_path):
    from harness.audit.store import AuditStore

    AuditStore(tmp_path / "audit.sqlite3").close()  # audit reads an existing store
    env = {**os.environ, "CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}
    for argv in (["tools"], ["audit"]):
        read_end, write_end = os.pipe()
        os.close(read_end)  # the reader is gone before callbox writes anything
        try:
            proc = subprocess.run([sys.executable, "-m", "harness.cli.main", *argv], stdout=write_end,
                                  stderr=subprocess.PIPE, env=env, timeout=60, check=False)
        finally:
            os.close(write_end)
        assert (proc.returncode, proc.stderr) == (141, b""), argv


def test_exec_of_a_missing_command_exits_127_like_a_shell(engine):
    proc = callbox("exec", "--image", IMAGE, "--", "nosuchcmd", "--flag")
    assert proc.returncode == 127
    assert proc.stderr == b"callbox: nosuchcmd: command not found\n"
    assert proc.stdout == b""


def test_exec_of_a_file_that_is_not_executable_exits_126(engine):
    proc = callbox("exec", "--image", IMAGE, "--", "/etc/hostname")
    assert proc.returncode == 126
    assert proc.stderr == (b"callbox: /etc/hostname: permission denied: the file is not executable (no x "
                           b"permission); `chmod +x /etc/hostname`, or run it with its interpreter (e.g. "
                           b"`sh /etc/hostname`)\n")


def test_exec_of_a_directory_says_it_is_no_program_and_exits_126(engine):
    proc = callbox("exec", "--image", IMAGE, "--", "/etc")
    assert proc.returncode == 126
    assert proc.stderr == b"callbox: /etc: is a directory, not a program\n"
    assert proc.stdout == b""


def test_exec_of_a_path_to_nothing_exits_127_like_a_shell(engine):
    proc = callbox("exec", "--image", IMAGE, "--json", "--", "./nothing-here")
    assert proc.returncode == 127
    result = json.loads(proc.stdout)
    assert (result["exit_code"], result["error"]) == (127, "./nothing-here: no such file or directory")


def test_exec_json_of_a_missing_command_still_prints_the_result_object(engine):
    proc = callbox("exec", "--image", IMAGE, "--json", "--", "nosuchcmd")
    assert proc.returncode == 127
    assert proc.stderr == b""
    result = json.loads(proc.stdout)
    assert result["exit_code"] == 127
    assert result["stderr"] == "callbox: nosuchcmd: command not found\n"
    assert result["error"] == "nosuchcmd: command not found"
    assert result["stdout"] == "" and result["signal"] == 0 and result["timed_out"] is False


def test_ps_and_gc_json(engine, make_sandbox):
    box = make_sandbox()
    proc = callbox("ps", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert isinstance(rows, list)
    (row,) = [r for r in rows if r["sandbox_id"] == box.id]
    assert set(row) == {"sandbox_id", "container_id", "status", "expires_at", "expires_in_s", "expired", "owner"}
    assert row["status"] == "running" and row["expired"] is False and row["expires_in_s"] > 0
    assert f"/{os.getpid()}/" in row["owner"]
    gc = callbox("gc", "--json")
    assert gc.returncode == 0, gc.stderr
    summary = json.loads(gc.stdout)
    assert set(summary) == {"removed", "count"}
    assert summary["count"] == len(summary["removed"]) and box.id not in summary["removed"]
