"""`callbox serve --grpc ... --mcp-http ...` as a user starts it: one process, both doors, clean stop."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from harness.client import ExecutorClient, ExecutorError

pytestmark = pytest.mark.docker


def test_serve_both_doors_then_sigterm_destroys_sandboxes(engine, tmp_path):
    tokens = _token_file(tmp_path, "a" * 32)
    sock = tmp_path / "executor.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli.main", "serve", "--grpc", f"unix:{sock}", "--mcp-http", "127.0.0.1:0",
         "--token-file", str(tokens), "--audit-db", str(tmp_path / "audit.sqlite3")],
        stderr=subprocess.PIPE, text=True, env={**os.environ},
    )
    try:
        assert proc.stderr is not None
        lines = [proc.stderr.readline(), proc.stderr.readline()]
        assert any("gRPC executor listening" in line for line in lines), lines
        assert any(re.search(r"MCP server \(streamable HTTP\) on http://127\.0\.0\.1:\d+", line) for line in lines)
        with ExecutorClient(f"unix:{sock}", token="a" * 32) as client:
            box = client.create_sandbox()
            result = client.call(box, "shell", '{"command": "echo served"}', call_id="c1")
            assert "served" in result.text and not result.is_error
        assert len(_owned_by(engine, proc.pid)) == 1
        # Only the main thread may take SIGTERM/SIGINT: one the kernel gave another thread
        # would never wake the main thread's wait, and the server would not stop.
        blocked = _stop_signals_blocked(proc.pid)
        assert blocked.pop(proc.pid) is False, "the main thread blocks the stop signals"
        assert len(blocked) >= 3 and all(blocked.values()), blocked
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert _owned_by(engine, proc.pid) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _token_file(directory, token: str):  # type: ignore[no-untyped-def]
    """A token file for client alice, mode 0600, in ``directory``."""
    tokens = directory / "tokens"
    tokens.write_text(f"alice:{token}\n")
    tokens.chmod(0o600)
    return tokens


def _owned_by(engine, pid: int) -> list[str]:  # type: ignore[no-untyped-def]
    return [c["Id"] for c in engine.client.api.containers(all=True, filters={"label": "callbox.managed=1"})
            if f"/{pid}/" in c["Labels"].get("callbox.owner", "")]


def _stop_signals_blocked(pid: int) -> dict[int, bool]:
    """Per thread of ``pid``: whether it blocks both SIGTERM and SIGINT (SigBlk in its status)."""
    wanted = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGINT - 1))
    found = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/status") as status:
            mask = next(int(line.split()[1], 16) for line in status if line.startswith("SigBlk:"))
        found[int(task)] = mask & wanted == wanted
    return found


def test_serve_with_a_config_file_takes_its_doors_tokens_and_limits(engine, tmp_path):
    _token_file(tmp_path, "b" * 32)
    sock = tmp_path / "executor.sock"
    config = tmp_path / "callbox.toml"
    config.write_text(f'[doors.grpc]\nlisten = "unix:{sock}"\n[auth]\ntoken_file = "tokens"\n'
                      '[audit]\ndb = "audit.sqlite3"\n[limits]\nmax_per_client = 1\n'
                      '[service]\nkeep_sandboxes = false\n')  # this one checks that a stop destroys
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli.main", "serve", "--config", str(config)],
                            stderr=subprocess.PIPE, text=True, env={**os.environ})
    try:
        assert proc.stderr is not None
        line = _line_with(proc.stderr, "listening on")
        assert f"gRPC executor listening on unix:{sock}" in line, line
        with ExecutorClient(f"unix:{sock}", token="b" * 32) as client:
            box = client.create_sandbox()
            result = client.call(box, "shell", '{"command": "echo configured"}', call_id="c1")
            assert "configured" in result.text and not result.is_error
            # max_per_client = 1 came from the file: a second live sandbox is refused
            with pytest.raises(Exception, match=r"has 1 live sandbox, its quota live_sandboxes \(1\); it frees up "
                                                r"when one of its sandboxes ends"):
                client.create_sandbox()
        assert (tmp_path / "audit.sqlite3").exists()  # the audit path, relative to the file
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert _owned_by(engine, proc.pid) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _serve_notified(config, tmp_path, *, timeout: float):  # type: ignore[no-untyped-def]
    """``callbox serve --config CONFIG`` as a child process whose systemd notifications come to a
    socket of the test's (read with ``timeout``): the socket and the process."""
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    notify.settimeout(timeout)
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli.main", "serve", "--config", str(config)],
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify.sock"),
                                 "PYTHONFAULTHANDLER": "1"})  # SIGABRT dumps every thread's stack
    return notify, proc


def _stopped(proc, timeout: float) -> str:  # type: ignore[no-untyped-def]
    """What a server wrote on stderr until it exited after SIGTERM; one that does not exit in
    ``timeout`` is aborted, and the failure shows where each of its threads was waiting."""
    proc.send_signal(signal.SIGTERM)
    try:
        return str(proc.communicate(timeout=timeout)[1])
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        rest = proc.communicate(timeout=30)[1]
        raise AssertionError(f"the server did not stop within {timeout:.0f} s of SIGTERM; its threads:\n"
                             f"{rest[-20000:]}") from None


def _line_with(stream, text: str) -> str:
    """The next line of ``stream`` that holds ``text`` (a server started with --config logs at
    info level, so other lines come between); the last line read if the stream ends first."""
    line = stream.readline()
    while line and text not in line:
        line = stream.readline()
    return line


def test_sighup_reloads_the_config_and_the_tokens_keeping_sandboxes_and_systemd_hears_each_step(engine, tmp_path):
    tokens = _token_file(tmp_path, "c" * 32)
    sock = tmp_path / "executor.sock"
    config = tmp_path / "callbox.toml"

    def write(max_per_client: int, audit: str = "audit.sqlite3", extra: str = "") -> None:
        config.write_text(f'[doors.grpc]\nlisten = "unix:{sock}"\n[auth]\ntoken_file = "tokens"\n'
                          f'[audit]\ndb = "{audit}"\n[limits]\nmax_per_client = {max_per_client}\n'
                          f'[service]\nkeep_sandboxes = false\n{extra}')

    write(1)
    notify, proc = _serve_notified(config, tmp_path, timeout=60)
    try:
        assert proc.stderr is not None
        assert "gRPC executor listening" in _line_with(proc.stderr, "listening")
        assert "no operator token in token file" in _line_with(proc.stderr, "operator")  # an older file: all clients
        assert notify.recv(4096).decode().split("\n") == ["READY=1", "STATUS=serving"]
        with ExecutorClient(f"unix:{sock}", token="c" * 32) as client, \
                ExecutorClient(f"unix:{sock}", token="o" * 32) as ops:
            first = client.create_sandbox()
            with pytest.raises(Exception, match=r"has 1 live sandbox, its quota live_sandboxes \(1\)"):
                client.create_sandbox()
            # a live change (the limit) and one that waits for a restart (the audit store)
            write(2, audit="elsewhere.sqlite3")
            tokens.write_text(f"alice:{'c' * 32}\nops:{'o' * 32} operator\n")  # a person's token, added live
            with pytest.raises(ExecutorError, match="not valid"):
                ops.list_runs()
            proc.send_signal(signal.SIGHUP)
            assert notify.recv(4096).decode().startswith("RELOADING=1\nMONOTONIC_USEC=")
            reread = _line_with(proc.stderr, "re-read")
            assert "2 token(s), 1 operator(s); added: ops" in reread and "o" * 32 not in reread
            notes = [_line_with(proc.stderr, "audit.db"), _line_with(proc.stderr, "limits.max_per_client")]
            assert notify.recv(4096).decode().split("\n") == ["READY=1", "STATUS=serving"]
            assert any("limits.max_per_client: 1 -> 2, applied" in line for line in notes), notes
            assert any("audit.db:" in line and "takes effect when the server restarts" in line for line in notes)
            second = client.create_sandbox()  # the raised limit applies at once ...
            result = client.call(first, "shell", '{"command": "echo kept"}', call_id="c1")
            assert "kept" in result.text and not result.is_error  # ... and the first sandbox lived through it
            assert ops.get_run(first).run_id == first  # an operator reads any client's run
            # a broken file is refused whole: nothing of it applies, the server goes on; a removed
            # token stops working (a leaked key revoked without a restart)
            write(1, extra="[limits.typo]\n")
            tokens.write_text(f"alice:{'c' * 32}\n")
            proc.send_signal(signal.SIGHUP)
            assert notify.recv(4096).decode().startswith("RELOADING=1")
            refused = _line_with(proc.stderr, "reload refused")
            assert "reload refused, the running configuration stays" in refused and "limits.typo" in refused
            assert notify.recv(4096).decode().startswith("READY=1")
            assert not client.call(second, "shell", '{"command": "true"}', call_id="c2").is_error
            with pytest.raises(ExecutorError, match="not valid"):
                ops.list_runs()
        assert not (tmp_path / "elsewhere.sqlite3").exists()  # not applied: it waits for a restart
        proc.send_signal(signal.SIGTERM)
        assert notify.recv(4096) == b"STOPPING=1"
        assert proc.wait(60) == 0
        assert _owned_by(engine, proc.pid) == []
    finally:
        notify.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


BAD_FILES = {
    "grpc-tcp-without-tls": '[doors.grpc]\nlisten = "0.0.0.0:0"\n',
    "e2b-off-loopback-without-tls": '[doors.e2b]\nlisten = "0.0.0.0:0"\n',
    "mcp-off-loopback": '[doors.mcp_http]\nlisten = "0.0.0.0:0"\n',
    "http-off-loopback-without-tls": '[doors.grpc]\nlisten = "unix:{dir}/executor.sock"\n'
                                     '[http]\nlisten = "0.0.0.0:0"\n',
    "pool-over-max-sandboxes": '[doors.grpc]\nlisten = "unix:{dir}/executor.sock"\n[limits]\nmax_sandboxes = 2\n'
                               '[pool]\nsize = 3\n',
    "policy-names-an-unknown-tool": '[doors.e2b]\nlisten = "127.0.0.1:0"\n[policy]\nfile = "typo-policy.toml"\n',
    "socket-directory-cannot-be-made": '[doors.grpc]\nlisten = "unix:{dir}/tokens/executor.sock"\n',
    "token-client-unknown": '[doors.grpc]\nlisten = "unix:{dir}/executor.sock"\n[clients.mallory]\n',
    "no-door": '[limits]\nmax_sandboxes = 2\n',
}


def _bad_config(tmp_path, text: str):  # type: ignore[no-untyped-def]
    """``text`` as callbox.toml with a token file and a fresh audit path, beside a policy naming an unknown tool."""
    _token_file(tmp_path, "d" * 32)
    (tmp_path / "typo-policy.toml").write_text('[tools.shel]\ndecision = "deny"\n')
    config = tmp_path / "callbox.toml"
    config.write_text(text.format(dir=tmp_path) + '[auth]\ntoken_file = "tokens"\n[audit]\ndb = "fresh/audit.db"\n'
                      '[service]\nkeep_sandboxes = false\n')
    return config


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_config_check_and_serve_refuse_a_bad_file_alike_and_serve_writes_nothing(tmp_path, name: str):
    config = _bad_config(tmp_path, BAD_FILES[name])
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}  # where a default token file would go
    env.pop("CALLBOX_AUDIT_DB", None)
    before = sorted(tmp_path.rglob("*"))
    command = [sys.executable, "-m", "harness.cli.main"]
    checked = subprocess.run([*command, "config", "check", str(config)], capture_output=True, text=True, env=env,
                             timeout=120, check=False)
    assert checked.returncode == 2 and checked.stdout == "", checked
    (verdict,) = checked.stderr.splitlines()  # one line, no traceback
    assert verdict.startswith(f"callbox: config file {config}: ")
    served = subprocess.run([*command, "serve", "--config", str(config)], capture_output=True, text=True, env=env,
                            timeout=120, check=False)  # exits before any door listens
    assert served.returncode == 2, served
    assert served.stderr.splitlines() == [verdict]  # the same words as config check, and nothing before them
    assert not (tmp_path / "fresh").exists()  # the audit store was never opened
    assert sorted(tmp_path.rglob("*")) == before  # nor a token file, log file or socket made


def test_each_door_says_where_it_listens_once(tmp_path):
    _token_file(tmp_path, "e" * 32)
    sock = tmp_path / "executor.sock"
    config = tmp_path / "callbox.toml"
    config.write_text(f'[doors.grpc]\nlisten = "unix:{sock}"\n[doors.e2b]\nlisten = "127.0.0.1:0"\n'
                      '[doors.mcp_http]\nlisten = "127.0.0.1:0"\n[http]\nlisten = "127.0.0.1:0"\n'
                      '[auth]\ntoken_file = "tokens"\n[audit]\ndb = "audit.sqlite3"\n'
                      '[service]\nkeep_sandboxes = false\n')
    notify, proc = _serve_notified(config, tmp_path, timeout=120)
    try:
        assert proc.stderr is not None
        seen = []
        while not any("HTTP endpoint" in line for line in seen):  # the last door to start
            line = proc.stderr.readline()
            assert line, f"the server ended before listening: {seen}"
            seen.append(line)
        assert notify.recv(4096).decode().split("\n") == ["READY=1", "STATUS=serving"]  # every door started
        rest = _stopped(proc, 60)
        assert proc.returncode == 0
    finally:
        notify.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    started = [line for line in seen + rest.splitlines(keepends=True) if "stopped" not in line]
    addresses = {"gRPC": f"unix:{sock}"}
    for door, pattern in {"E2B": r"E2B API on (http://\S+)", "MCP": r"MCP server \(streamable HTTP\) on (http://\S+)",
                          "HTTP": r"HTTP endpoint \(/metrics, /healthz, console\) on (http://\S+)"}.items():
        found = [m.group(1) for m in map(re.compile(pattern).search, started) if m]
        assert len(found) == 1, (door, started)
        addresses[door] = found[0]
    for door, address in addresses.items():
        said = [line for line in started if re.search(re.escape(address) + r"(?![\d/])", line)]
        assert len(said) == 1, (door, said)


def test_a_reload_refuses_what_serve_would_refuse_with_the_same_words(tmp_path):
    _token_file(tmp_path, "f" * 32)
    sock = tmp_path / "executor.sock"
    config = tmp_path / "callbox.toml"
    good = (f'[doors.grpc]\nlisten = "unix:{sock}"\n[auth]\ntoken_file = "tokens"\n[audit]\ndb = "audit.sqlite3"\n'
            '[service]\nkeep_sandboxes = false\n')
    config.write_text(good)
    notify, proc = _serve_notified(config, tmp_path, timeout=120)
    try:
        assert proc.stderr is not None
        assert notify.recv(4096).decode().split("\n") == ["READY=1", "STATUS=serving"]
        config.write_text(good + '[doors.e2b]\nlisten = "0.0.0.0:0"\n[limits]\nmax_per_client = 3\n')
        checked = subprocess.run([sys.executable, "-m", "harness.cli.main", "config", "check", str(config)],
                                 capture_output=True, text=True, timeout=120, check=False)
        assert checked.returncode == 2
        verdict = checked.stderr.strip().removeprefix("callbox: ")
        assert "[doors.e2b] listen = '0.0.0.0:0': refusing to serve the E2B API" in verdict
        proc.send_signal(signal.SIGHUP)
        assert notify.recv(4096).decode().startswith("RELOADING=1")
        refused = _line_with(proc.stderr, "reload refused")
        assert refused.rstrip("\n") == f"callbox: reload refused, the running configuration stays: {verdict}"
        assert notify.recv(4096).decode().startswith("READY=1")
        with ExecutorClient(f"unix:{sock}", token="f" * 32) as client:
            assert client.list_runs() is not None  # the running doors serve on
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read()
        assert proc.wait(60) == 0
        assert "max_per_client" not in rest  # nothing of the refused file applied
    finally:
        notify.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
