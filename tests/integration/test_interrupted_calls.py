"""A harness process stopped in the middle of a call, end to end: real `callbox` processes,
the real engine, a real audit store. Ctrl-C and SIGTERM record the call as interrupted before
the process exits; after SIGKILL the next process sending the call_id finds the owner gone and
records it. Either way the audit shows the call interrupted, a re-send answers at once with
that record, and the command (which appends a line to a file in a mounted directory) never
runs a second time. Also: `exec --json` stopped still prints its object, `sandbox rm` ends the
sandbox's run, `run --resume` of an unknown run names the store."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.audit.store import AuditStore
from harness.engine.docker import labels
from tests.conftest import IMAGE
from tests.integration.helpers import callbox

pytestmark = pytest.mark.docker

COMMAND = "echo started >> /data/count; echo command-is-running; sleep 30"
ARGS = json.dumps({"command": COMMAND})
RESEND_S = 15.0
"""A re-send answers from the record: well under the 30 s the command would take (most of
this is the interpreter starting)."""


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    directory = tmp_path / "shared"
    directory.mkdir()
    if os.geteuid() == 0:
        os.chown(directory, 1000, 1000)
    return directory


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}


def _default_sigint() -> None:
    # A shell without job control starts background commands with SIGINT ignored, and an
    # ignored signal stays ignored across exec: a suite started that way (`.ci/run &`) would
    # test the parent's disposition instead of callbox's handling of Ctrl-C.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(*args: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "harness.cli.main", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **env},
                            preexec_fn=_default_sigint)


def _wait_until(what: Callable[[], bool], proc: subprocess.Popen[bytes], timeout: float = 90) -> None:
    """Until ``what`` holds (checked every 50 ms); fails at once if ``proc`` ended first."""
    deadline = time.monotonic() + timeout
    while not what():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the process ended ({proc.returncode}) first: {out!r} {err!r}")
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _started(shared: Path) -> Callable[[], bool]:
    return lambda: (shared / "count").exists() and (shared / "count").read_text() == "started\n"


def _remove_sandboxes_of(engine: Any, pid: int) -> None:
    """Destroy what the (stopped) callbox process ``pid`` left on the engine."""
    for container in engine.client.containers.list(all=True, filters={"label": labels.MANAGED}, ignore_removed=True):
        owner = labels.Owner.parse(container.labels.get(labels.OWNER, ""))
        if owner is not None and owner.pid == pid and labels.SANDBOX_ID in container.labels:
            engine.destroy(container.labels[labels.SANDBOX_ID])
    engine.drain(30)


@pytest.fixture
def stopped(engine: Any) -> Iterator[list[subprocess.Popen[bytes]]]:
    """The callbox processes a test starts: killed if still running, their sandboxes removed."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
            _remove_sandboxes_of(engine, proc.pid)


def _call(shared: Path, *extra: str) -> list[str]:
    return ["call", "shell", ARGS, "--run-id", "r", "--call-id", "x1", "--image", IMAGE,
            "--mount", f"{shared}:/data:rw", *extra]


def _resent(shared: Path, env: dict[str, str], run_id: str = "r", call_id: str = "x1") -> dict[str, Any]:
    """Send the call again; it must answer promptly with the interrupted record (exit 125:
    callbox's own failure: the error table gives interrupted exit status 125)."""
    began = time.monotonic()
    proc = callbox("call", "shell", ARGS, "--run-id", run_id, "--call-id", call_id, "--image", IMAGE,
                   "--mount", f"{shared}:/data:rw", env=env, timeout=120)
    assert time.monotonic() - began < RESEND_S
    assert proc.returncode == 125, (proc.stdout, proc.stderr)
    item = json.loads(proc.stdout)
    assert f"call '{call_id}' was interrupted" in item["output"] and "not run again" in item["output"]
    assert b"Traceback" not in proc.stderr
    return item


def _audited(env: dict[str, str], run_id: str, call_id: str) -> dict[str, Any]:
    listed = callbox("audit", "--run", run_id, "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    return next(c for c in json.loads(listed.stdout) if c["call_id"] == call_id)


class _Stderr:
    """Reads a process's stderr as it comes; ``seen`` is set once ``needle`` has arrived."""

    def __init__(self, proc: subprocess.Popen[bytes], needle: bytes) -> None:
        self.data = b""
        self.seen = threading.Event()
        self._proc, self._needle = proc, needle
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._proc.stderr is not None
        while chunk := self._proc.stderr.read1(4096):
            self.data += chunk
            if self._needle in self.data:
                self.seen.set()

    def all(self, timeout: float) -> bytes:
        self._thread.join(timeout)
        return self.data


@pytest.mark.parametrize(("signum", "code", "name"), [(signal.SIGINT, 130, "SIGINT"),
                                                       (signal.SIGTERM, 143, "SIGTERM")])
def test_a_stopped_callbox_call_records_its_call_interrupted_and_a_resend_runs_nothing(
        shared, env, stopped, signum, code, name):
    # With --stream the call copies the command's output to stderr as it comes: the output
    # follows the agent's Started event in its stream, so once its line is on stderr, the
    # harness process knows the command started (the file alone could come first).
    proc = _start(*_call(shared, "--stream"), env=env)
    stopped.append(proc)
    stderr = _Stderr(proc, b"command-is-running")
    _wait_until(stderr.seen.is_set, proc)  # the command runs, and the harness has seen it start
    proc.send_signal(signum)
    proc.wait(timeout=60)
    out, err = proc.stdout.read() if proc.stdout else b"", stderr.all(timeout=10)
    assert proc.returncode == code, (out, err)
    assert b"Traceback" not in err
    call = _audited(env, "r", "x1")
    assert call["state"] == "done" and call["error_code"] == "interrupted"
    assert call["interrupted"]["signal"] == name and call["interrupted"]["command_started"] is True
    assert call["interrupted"]["owner"] == call["interrupted"]["noticed_by"]
    shown = callbox("audit", "--run", "r", env=env).stdout.decode()
    assert "interrupted" in shown.splitlines()[1]
    assert f"x1 was interrupted: its harness process (pid {proc.pid} on " in shown
    assert f"stopped on {name}; its command had started; it is not run again under this call_id" in shown
    item = _resent(shared, env)
    assert "its command had started" in item["output"]
    assert (shared / "count").read_text() == "started\n"  # it ran once


def test_after_sigkill_the_next_process_finds_the_owner_gone(shared, env, stopped):
    proc = _start(*_call(shared), env=env)
    stopped.append(proc)
    _wait_until(_started(shared), proc)
    proc.kill()
    proc.communicate(timeout=60)
    assert _audited(env, "r", "x1")["state"] == "running"  # nothing could be written
    item = _resent(shared, env)
    assert "(its harness process stopped)" in item["output"] and "is unknown" in item["output"]
    call = _audited(env, "r", "x1")
    assert call["state"] == "done" and call["interrupted"]["command_started"] is None
    assert f"/{proc.pid}/" in call["interrupted"]["owner"]
    assert call["interrupted"]["noticed_by"] != call["interrupted"]["owner"]
    assert "found it gone and recorded it" in callbox("audit", "--run", "r", env=env).stdout.decode()
    _resent(shared, env)  # and again: the same record
    assert (shared / "count").read_text() == "started\n"


def test_ctrl_c_of_callbox_run_ends_the_run_and_its_call(shared, env, stopped, tmp_path):
    transcript = tmp_path / "transcript.jsonl"
    transcript.write_text("".join(json.dumps(turn) + "\n" for turn in [
        {"text": "counting", "tool_calls": [{"call_id": "w1", "name": "shell", "arguments": {"command": COMMAND}}]},
        {"text": "counted"},
    ]))
    proc = _start("run", str(transcript), "--json", "--image", IMAGE, "--mount", f"{shared}:/data:rw", env=env)
    stopped.append(proc)
    _wait_until(_started(shared), proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    with AuditStore(Path(env["CALLBOX_AUDIT_DB"])) as audit:
        (run,) = audit.list_runs()
    assert run.end_reason == "error:interrupted"
    call = _audited(env, run.id, "w1")
    assert call["state"] == "done" and call["interrupted"]["signal"] == "SIGINT"
    _resent(shared, env, run.id, "w1")
    assert (shared / "count").read_text() == "started\n"


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_exec_json_stopped_still_prints_its_object(shared, stopped, signum, code):
    proc = _start("exec", "--json", "--image", IMAGE, "--mount", f"{shared}:/data:rw", "--", "sh", "-c",
                  "echo started >> /data/count; sleep 30", env={})
    stopped.append(proc)
    _wait_until(_started(shared), proc)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, (out, err)
    printed = json.loads(out)  # exactly one object
    assert printed["interrupted"] is True and printed["exit_code"] == code and printed["signal"] == signum
    assert printed["timed_out"] is False and "error" not in printed and printed["duration_ms"] > 0
    assert b"Traceback" not in err


def test_sandbox_rm_ends_the_sandbox_run(engine, env):
    name = f"rm-{secrets.token_hex(3)}"
    created = callbox("sandbox", "new", "--image", IMAGE, "--name", name, "--ttl", "600", "--json", env=env)
    assert created.returncode == 0, created.stderr
    sandbox_id = json.loads(created.stdout)["sandbox_id"]
    try:
        assert callbox("sandbox", "pause", name, env=env).returncode == 0  # an action: the sandbox's run
        with AuditStore(Path(env["CALLBOX_AUDIT_DB"])) as audit:
            assert audit.get_run(sandbox_id).ended is None
        removed = callbox("sandbox", "rm", name, "--json", env=env)
        assert removed.returncode == 0, removed.stderr
        assert json.loads(removed.stdout) == {"removed": sandbox_id, "name": name, "run_ended": True}
    finally:
        callbox("sandbox", "rm", name, env=env)
    with AuditStore(Path(env["CALLBOX_AUDIT_DB"])) as audit:
        assert audit.get_run(sandbox_id).end_reason == "removed"
    listed = callbox("audit", env=env).stdout.decode()
    assert any(line.startswith(sandbox_id) and line.rstrip().endswith("removed") for line in listed.splitlines())


def test_resume_of_an_unknown_run_names_the_store(env, tmp_path):
    transcript = tmp_path / "transcript.jsonl"
    transcript.write_text(json.dumps({"text": "done"}) + "\n")
    proc = callbox("run", str(transcript), "--resume", "NO_SUCH_RUN", env=env)
    assert proc.returncode == 4  # not found
    assert proc.stderr.decode().splitlines() == [
        f"callbox: no run NO_SUCH_RUN in the audit store {env['CALLBOX_AUDIT_DB']} (`callbox audit` lists its runs; "
        "a run of another store needs --audit-db)"]
