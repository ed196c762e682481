"""`callbox sandbox ...` through the installed `callbox` script, as a user runs it: one named
sandbox for the module (created with `sandbox new`, removed with `sandbox rm`), every verb
with --json, a web server in a network-none sandbox reached from the host through `port`
after an approval, and `attach` on a real pseudo-terminal (raw mode, size, resize, exit code)
and on a pipe (detach, join again)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import secrets
import select
import signal
import struct
import subprocess
import sys
import termios
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IMAGE

pytestmark = pytest.mark.docker

CALLBOX = str(Path(sys.executable).parent / "callbox")
ASK_PORTS = '[actions.port_forward]\ndecision = "ask"\n'


class Cli:
    """The installed CLI with this module's audit store and snapshot directory."""

    def __init__(self, state: Path) -> None:
        self.env = {**os.environ, "CALLBOX_AUDIT_DB": str(state / "audit.sqlite3"),
                    "CALLBOX_SNAPSHOT_DIR": str(state / "snapshots")}
        self.state = state

    def __call__(self, *args: str, stdin: bytes = b"", timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([CALLBOX, *args], input=stdin, capture_output=True, env=self.env, timeout=timeout,
                              check=False)

    def json(self, *args: str, code: int = 0, stdin: bytes = b"") -> Any:
        """Run with --json (before a ``--``) and the exit code ``code``; the JSON printed."""
        words = list(args)
        words.insert(words.index("--") if "--" in words else len(words), "--json")
        proc = self(*words, stdin=stdin)
        assert proc.returncode == code, (args, proc.returncode, proc.stderr)
        return json.loads(proc.stdout)

    def popen(self, *args: str, **options: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen([CALLBOX, *args], env=self.env, **options)


@pytest.fixture(scope="module")
def cli(engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Cli:
    return Cli(tmp_path_factory.mktemp("cli-sandbox"))


@pytest.fixture(scope="module")
def web(cli: Cli) -> Iterator[dict[str, Any]]:
    """The module's sandbox (network none, the default), as `sandbox new --json` shows it."""
    name = f"cli-{secrets.token_hex(3)}"
    created = cli.json("sandbox", "new", "--image", IMAGE, "--name", name, "--ttl", "900")
    try:
        yield created
    finally:
        cli("sandbox", "rm", name)


def lines(data: bytes) -> list[Any]:
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def test_new_ls_and_exec(cli: Cli, web: dict[str, Any]) -> None:
    assert web["owner"] == f"user:{os.getuid()}" and web["network"] == "none"
    assert 880 < web["expires_in_s"] <= 900 and len(web["sandbox_id"]) == 12
    again = cli("sandbox", "new", "--image", IMAGE, "--name", web["name"])
    assert again.returncode == 5 and b"already exists" in again.stderr

    (row,) = [r for r in cli.json("sandbox", "ls") if r["name"] == web["name"]]
    assert row["state"] == "running" and row["owner"] == web["owner"] and row["sandbox_id"] == web["sandbox_id"]
    assert row["cpu_usage_s"] > 0 and row["memory_bytes"] > 0

    result = cli.json("sandbox", "exec", web["name"], "--", "sh", "-c", "cat; exit 3", code=3, stdin=b"piped")
    assert result["stdout"] == "piped" and result["exit_code"] == 3
    streamed = cli("sandbox", "exec", web["name"], "--", "sh", "-c", "echo out; echo err >&2; exit 5")
    assert (streamed.returncode, streamed.stdout, streamed.stderr) == (5, b"out\n", b"err\n")


def test_background_job_ps_and_logs(cli: Cli, web: dict[str, Any]) -> None:
    job = cli.json("sandbox", "exec", web["name"], "--background", "--tag", "two-lines", "--",
                   "sh", "-c", "echo one; echo two >&2; exit 4")
    assert job["state"] == "running" and job["tag"] == "two-lines" and job["sandbox"] == web["name"]
    pid = str(job["pid"])

    followed = cli("sandbox", "logs", web["name"], pid, "--follow", "--json")
    assert followed.returncode == 4, followed.stderr
    events = lines(followed.stdout)
    assert [(e["stream"], e["data"]) for e in events if "seq" in e] == [("stdout", "one\n"), ("stderr", "two\n")]
    assert events[-1]["ended"]["exit_code"] == 4

    replayed = cli("sandbox", "logs", web["name"], pid)
    assert (replayed.returncode, replayed.stdout, replayed.stderr) == (0, b"one\n", b"two\n")
    mine = [j for j in cli.json("sandbox", "ps", web["name"]) if j["pid"] == job["pid"]]
    assert [(j["state"], j["exit_code"], j["tag"]) for j in mine] == [("exited", 4, "two-lines")]
    assert any(j["pid"] == job["pid"] and j["sandbox_id"] == web["sandbox_id"] for j in cli.json("sandbox", "ps"))
    unknown = cli("sandbox", "logs", web["name"], "99999")
    assert unknown.returncode == 4 and b"callbox sandbox ps" in unknown.stderr


def test_cp_both_ways(cli: Cli, web: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "proj" / "sub").mkdir(parents=True)
    (tmp_path / "proj" / "a.txt").write_text("alpha\n")
    (tmp_path / "proj" / "sub" / "b.bin").write_bytes(os.urandom(300_000))
    copied = cli.json("sandbox", "cp", str(tmp_path / "proj"), f"{web['name']}:")
    assert (copied["direction"], copied["sandbox_path"], copied["files"], copied["bytes"]) == \
        ("in", "/workspace", 2, 300_006)
    assert copied["mb_per_s"] >= 0
    listed = cli("sandbox", "exec", web["name"], "--", "cat", "proj/a.txt")
    assert listed.stdout == b"alpha\n"

    (tmp_path / "out").mkdir()
    back = cli.json("sandbox", "cp", f"{web['name']}:proj", str(tmp_path / "out"))
    assert (back["direction"], back["sandbox_path"], back["files"]) == ("out", "/workspace/proj", 2)
    original = (tmp_path / "proj" / "sub" / "b.bin").read_bytes()
    assert (tmp_path / "out" / "proj" / "sub" / "b.bin").read_bytes() == original
    text = cli("sandbox", "cp", f"{web['name']}:proj/a.txt", str(tmp_path / "a-copy.txt"))
    assert text.returncode == 0 and b"MB/s" in text.stdout
    assert (tmp_path / "a-copy.txt").read_text() == "alpha\n"


def _read_until(stream: Any, needle: str, deadline_s: float = 30) -> list[Any]:
    """JSON lines from ``stream`` until one contains ``needle`` (the process is waited on, not slept on)."""
    seen: list[Any] = []
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        line = stream.readline()
        if not line:
            break
        seen.append(json.loads(line))
        if needle in line.decode():
            return seen
    raise AssertionError(f"no line with {needle!r}: {seen}")


def test_port_forward_asks_then_serves_a_network_none_sandbox(cli: Cli, web: dict[str, Any], tmp_path: Path) -> None:
    name = web["name"]
    cli("sandbox", "exec", name, "--", "sh", "-c", "mkdir -p site && echo served > site/hello.txt")
    server = cli.json("sandbox", "exec", name, "--background", "--tag", "web", "--",
                      "python3", "-u", "-m", "http.server", "8000", "--bind", "127.0.0.1", "--directory", "site")
    logs = cli.popen("sandbox", "logs", name, str(server["pid"]), "--follow", "--json", stdout=subprocess.PIPE)
    try:
        _read_until(logs.stdout, "Serving HTTP")
    finally:
        logs.terminate()
        logs.wait(10)

    denied = cli("sandbox", "port", name, "8000")
    assert denied.returncode == 6 and b"actions.port_forward" in denied.stderr
    policy = tmp_path / "ask.toml"
    policy.write_text(ASK_PORTS)
    pending = cli.json("sandbox", "port", name, "8000", "--policy", str(policy), code=3)
    assert pending["error"] == "approval_pending" and pending["action"] == "port_forward"
    approved = cli("approvals", "approve", pending["approval_id"])
    assert approved.returncode == 0 and f"--approval {pending['approval_id']}".encode() in approved.stdout

    forward = cli.popen("sandbox", "port", name, "8000", "--policy", str(policy), "--approval",
                        pending["approval_id"], "--json", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert forward.stdout is not None
        first = json.loads(forward.stdout.readline())
        assert first["host"] == "127.0.0.1" and first["sandbox_port"] == 8000 and first["host_port"] > 0
        with urllib.request.urlopen(f"{first['url']}/hello.txt", timeout=30) as response:
            assert response.read() == b"served\n"
        assert json.loads(forward.stdout.readline())["connection"] == 1
        forward.send_signal(signal.SIGTERM)
        rest, err = forward.communicate(timeout=30)
    finally:
        if forward.poll() is None:
            forward.kill()
            forward.wait()
    assert forward.returncode == 0, err
    assert lines(rest)[-1] == {"closed": True, "connections": 1}
    used = cli("sandbox", "port", name, "8000", "--policy", str(policy), "--approval", pending["approval_id"])
    assert used.returncode == 5 and b"already used" in used.stderr

    audit = json.loads(cli("audit", "--run", web["sandbox_id"], "--json").stdout)
    forwards = [c for c in audit if c["tool"] == "sandbox.port_forward" and c["approval"]]
    assert [(c["state"], c["is_error"]) for c in forwards] == [("done", False)]
    killed = cli.json("sandbox", "kill", name, str(server["pid"]))
    assert killed["state"] == "killed"


def test_pause_and_resume(cli: Cli, web: dict[str, Any]) -> None:
    name = web["name"]
    # a runc sandbox cannot be paused to disk: refused with the reason (test_memory_snapshots.py
    # checks it is not frozen instead)
    to_disk = cli("sandbox", "pause", name, "--to-disk")
    assert to_disk.returncode != 0 and b"CRIU" in to_disk.stderr and b"runsc" in to_disk.stderr
    assert cli.json("sandbox", "pause", name)["state"] == "paused"
    try:
        assert [r["state"] for r in cli.json("sandbox", "ls") if r["name"] == name] == ["paused"]
        frozen = cli("sandbox", "exec", name, "--", "true")
        assert frozen.returncode == 5 and b"is paused" in frozen.stderr
    finally:
        resumed = cli.json("sandbox", "resume", name)
    assert resumed["state"] == "running"
    assert cli("sandbox", "exec", name, "--", "true").returncode == 0
    kept = cli.json("sandbox", "keep-alive", name, "--ttl", "600")
    assert 590 < kept["expires_in_s"] <= 600


def test_snapshot_fork_and_rm(cli: Cli, web: dict[str, Any]) -> None:
    name, snap = web["name"], f"snap-{secrets.token_hex(3)}"
    cli("sandbox", "exec", name, "--", "sh", "-c", "echo kept > /workspace/mark")
    forks: list[str] = []
    try:
        info = cli.json("sandbox", "snapshot", name, snap)
        assert info["name"] == snap and "/workspace" in info["captured"] and info["source_name"] == name
        assert [s["name"] for s in cli.json("sandbox", "snapshots")] == [snap]
        again = cli("sandbox", "snapshot", name, snap)
        assert again.returncode == 5 and b"--replace" in again.stderr

        live = cli.json("sandbox", "fork", name, "--name", f"{name}-f")
        forks.append(live["name"])
        from_snap = cli.json("sandbox", "fork", "--from-snapshot", snap)
        forks.append(from_snap["name"])
        assert from_snap["name"].startswith("sb-") and from_snap["owner"] == web["owner"]
        for fork in forks:
            assert cli("sandbox", "exec", fork, "--", "cat", "/workspace/mark").stdout == b"kept\n"
    finally:
        for fork in forks:
            assert cli.json("sandbox", "rm", fork)["name"] == fork
        cli("sandbox", "rm-snapshot", snap)
    assert cli.json("sandbox", "snapshots") == []
    gone = cli("sandbox", "exec", forks[0], "--", "true")
    assert gone.returncode == 4 and b"no sandbox named" in gone.stderr


def test_restore_of_a_running_sandbox_says_it_runs_and_what_to_do(cli: Cli) -> None:
    name, snap = f"rst-{secrets.token_hex(3)}", f"rsnap-{secrets.token_hex(3)}"
    cli.json("sandbox", "new", "--image", IMAGE, "--name", name, "--ttl", "600")
    lead = (f"callbox: sandbox {name} is running, not gone: restore recreates a gone sandbox (its container stopped "
            f"or removed, e.g. when the Docker engine restarted) from its latest snapshot, and {name} still has its "
            "files; ")
    fork = f"; `callbox sandbox fork {name} --name NEW` starts a copy of it\n"
    try:
        assert cli("sandbox", "exec", name, "--", "sh", "-c", "echo kept > /workspace/mark").returncode == 0
        bare = cli("sandbox", "restore", name)
        assert bare.returncode == 5  # a state that does not allow it
        assert bare.stderr.decode() == (
            f"{lead}it has no snapshot (`callbox sandbox snapshot {name} SNAPSHOT` takes one){fork}")
        cli.json("sandbox", "snapshot", name, snap)
        assert cli("sandbox", "exec", name, "--", "rm", "/workspace/mark").returncode == 0
        with_snapshot = cli("sandbox", "restore", name)
        assert with_snapshot.returncode == 5
        assert with_snapshot.stderr.decode() == (
            f"{lead}to take it back to its latest snapshot ({snap}), remove it (`callbox sandbox rm {name}`), "
            f"then restore it{fork}")
        # The advice holds: removed, the sandbox comes back from its snapshot with the file.
        cli.json("sandbox", "rm", name)
        assert cli.json("sandbox", "restore", name)["name"] == name
        assert cli("sandbox", "exec", name, "--", "cat", "/workspace/mark").stdout == b"kept\n"
    finally:
        cli("sandbox", "rm", name)
        cli("sandbox", "rm-snapshot", snap)
    nothing = cli("sandbox", "restore", name)
    assert nothing.returncode == 125
    assert nothing.stderr.decode() == (f"callbox: there is no sandbox named {name}, nor a snapshot of one, to "
                                       "restore; `callbox sandbox ls` lists the sandboxes, `callbox sandbox "
                                       "snapshots` the snapshots\n")


def _until(master: int, needle: bytes, seen: bytearray, deadline_s: float = 30) -> None:
    end = time.monotonic() + deadline_s
    while needle not in seen:
        ready, _, _ = select.select([master], [], [], max(0.0, end - time.monotonic()))
        if not ready:
            raise AssertionError(f"no {needle!r} on the terminal: {bytes(seen)!r}")
        seen += os.read(master, 4096)


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def test_attach_on_a_real_terminal(cli: Cli, web: dict[str, Any]) -> None:
    master, slave = pty.openpty()
    _set_size(slave, 30, 100)
    before = termios.tcgetattr(slave)
    script = 'trap "stty size; exit 3" WINCH; tty; stty size; echo ready; while :; do sleep 0.05; done'
    proc = cli.popen("sandbox", "attach", web["name"], "--", "bash", "-c", script, stdin=slave, stdout=slave,
                     stderr=slave, start_new_session=True)
    seen = bytearray()
    try:
        _until(master, b"ready", seen)
        assert b"/dev/pts/" in seen and b"30 100\r\n" in seen
        assert not termios.tcgetattr(slave)[3] & (termios.ICANON | termios.ECHO)  # raw while attached
        _set_size(slave, 40, 120)
        proc.send_signal(signal.SIGWINCH)
        _until(master, b"40 120", seen)
        assert proc.wait(30) == 3
        assert termios.tcgetattr(slave) == before  # restored
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
        os.close(slave)


def test_attach_from_a_pipe_detaches_and_joins_again(cli: Cli, web: dict[str, Any]) -> None:
    plain = cli("sandbox", "attach", web["name"], "--json", "--", "sh", "-c", "tty; stty size; exit 6")
    assert plain.returncode == 6
    *output, end = plain.stdout.splitlines()
    assert output[0].startswith(b"/dev/pts/") and output[1] == b"24 80"
    assert json.loads(end)["exit_code"] == 6

    left = cli("sandbox", "attach", web["name"], "--json", "--", "cat", stdin=b"hello\n\x1d")
    assert left.returncode == 0 and b"detached" in left.stderr
    job = json.loads(left.stdout.splitlines()[-1])
    assert job["detached"] is True and job["state"] == "running"
    joined = cli("sandbox", "attach", web["name"], "--pid", str(job["pid"]), "--json")  # stdin ends: ^D
    assert joined.returncode == 0, joined.stderr
    assert b"hello" in joined.stdout
    assert json.loads(joined.stdout.splitlines()[-1]) | {"pid": 0} == \
        {"sandbox": web["name"], "sandbox_id": web["sandbox_id"], "pid": 0, "detached": False, "state": "exited",
         "exit_code": 0, "signal": 0}
