"""The operator's ``callbox sandbox`` on the sandboxes of ``callbox serve --e2b``, by the id the
unmodified e2b SDK shows (``sandbox.sandbox_id``).

One server for the module. The CLI runs as the operator runs it, on the same host (the same
runtime directory) and on the server's audit store, so its actions land in the sandbox's run.
``ls`` lists the SDK's sandbox with that id; ``exec`` and ``cp`` reach it by it; ``rm`` removes
it, after which the server answers the SDK as E2B does for a sandbox that is gone (not found,
not running) and goes on serving.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2b import Sandbox, SandboxNotFoundException

from harness.core.actions import action_tool
from tests.interop.e2b_server import E2bServer, sdk_environment, serve_e2b, without_e2b

pytestmark = [pytest.mark.interop, pytest.mark.docker]

CALLBOX = str(Path(sys.executable).parent / "callbox")


@pytest.fixture(scope="module")
def server(engine: Any) -> Iterator[E2bServer]:
    with serve_e2b(engine) as served:
        yield served


def callbox(server: E2bServer, *args: str) -> subprocess.CompletedProcess[bytes]:
    """The installed CLI on the server's audit store (what an operator on its host gets by default)."""
    env = {**without_e2b(os.environ), "CALLBOX_AUDIT_DB": str(server.directory / "audit.sqlite3")}
    return subprocess.run([CALLBOX, *args], capture_output=True, env=env, timeout=120, check=False)


def ok(proc: subprocess.CompletedProcess[bytes]) -> bytes:
    assert proc.returncode == 0, (proc.args, proc.returncode, proc.stderr.decode(errors="replace"))
    return proc.stdout


def run_record(server: E2bServer, run_id: str) -> tuple[Any, Any]:
    """``(ended, end_reason)`` of the run ``run_id`` in the server's audit store."""
    with sqlite3.connect(server.directory / "audit.sqlite3") as db:
        row = db.execute("SELECT ended, end_reason FROM runs WHERE id = ?", (run_id,)).fetchone()
    assert row is not None, f"no run {run_id}"
    return row[0], row[1]


def test_ls_exec_and_cp_reach_a_server_sandbox_by_its_e2b_id(server: E2bServer, tmp_path: Path) -> None:
    with sdk_environment(server):
        sandbox = Sandbox.create()
        try:
            sid = sandbox.sandbox_id
            rows = json.loads(ok(callbox(server, "sandbox", "ls", "--json")))
            (row,) = [r for r in rows if r["run_id"] == sid]
            assert row["owner"] == f"run:{sid}" and row["state"] == "running", row
            assert f"run:{sid}" in ok(callbox(server, "sandbox", "ls")).decode()

            assert ok(callbox(server, "sandbox", "exec", sid, "--", "echo", "hi")) == b"hi\n"
            sandbox.files.write("/home/user/note.txt", "written through the SDK")
            shown = ok(callbox(server, "sandbox", "exec", f"run:{sid}", "--", "cat", "/home/user/note.txt"))
            assert shown == b"written through the SDK"  # the same sandbox, by its owner string too
            ok(callbox(server, "sandbox", "cp", f"{sid}:/home/user/note.txt", str(tmp_path / "note.txt")))
            assert (tmp_path / "note.txt").read_text() == "written through the SDK"
            with sqlite3.connect(server.directory / "audit.sqlite3") as db:  # the copy is in the sandbox's run
                tools = {r[0] for r in db.execute("SELECT tool FROM calls WHERE run_id = ?", (sid,))}
            assert action_tool("copy_out") in tools, tools

            assert sandbox.commands.run("echo still served").stdout == "still served\n"
        finally:
            sandbox.kill()


def test_a_server_sandbox_the_operator_removes_is_gone_for_its_client(server: E2bServer) -> None:
    with sdk_environment(server):
        sandbox = Sandbox.create()
        sid = sandbox.sandbox_id
        try:
            removed = json.loads(ok(callbox(server, "sandbox", "rm", sid, "--json")))
            assert removed["removed"] != sid and removed["name"] == sid, removed  # its engine id, by its E2B id
            # its run ends `removed`: by the CLI, or by the server when its reaper saw it first
            assert run_record(server, sid)[1] == "removed"

            assert sandbox.is_running() is False
            with pytest.raises(SandboxNotFoundException):
                Sandbox.connect(sid)
            with pytest.raises(SandboxNotFoundException):
                Sandbox.get_info(sid)
            assert sid not in [info.sandbox_id for info in Sandbox.list().next_items()]
            assert Sandbox.kill(sid) is False
            assert callbox(server, "sandbox", "exec", sid, "--", "true").returncode != 0

            other = Sandbox.create()  # the server goes on serving
            try:
                assert other.commands.run("echo next").stdout == "next\n"
            finally:
                other.kill()
        finally:
            Sandbox.kill(sid)
