"""The code interpreter's server in a sandbox of the code-interpreter image variant, seen from the host.

The server (``images/code-interpreter/server.py``: ``/execute``, ``/contexts``, ``/health``, a
Python kernel per context) runs in the sandbox as a job of the tool user, tagged
``code-interpreter@DIGEST`` (a digest of the environment it was started with), and listens on
127.0.0.1:49999 there. The host reaches it over the agent's tunnel (:mod:`harness.engine.ports`),
so no sandbox network is needed. Both the E2B door (which forwards its SDK's requests) and the
``python`` tool (which runs cells itself, :func:`execute`) start and find it with the functions
here; what each records about it (audit, errors in its own vocabulary) is theirs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from harness.core.errors import AgentCallError, CallboxError
from harness.engine.agent_client import AgentClient
from harness.engine.exec_result import collect
from harness.engine.jobs import JobChunk

__all__ = ["PORT", "SERVER_ARGV", "SERVER_TAG", "CellEnded", "env_digest", "execute", "has_server",
           "kernel_ready", "listening", "request", "restart_default_kernel", "server_alive", "server_output",
           "start_server", "stop_foreign", "wait_listening"]

PORT = 49999
SERVER_TAG = "code-interpreter"
SERVER_ARGV = ("/usr/bin/python3", "/opt/callbox/code-interpreter/server.py")
MAX_LINE_BYTES = 64 << 20
"""The longest NDJSON line :func:`execute` accepts (a result's PNG, base64, is one line)."""


def env_digest(env: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(dict(env), sort_keys=True).encode()).hexdigest()[:16]


def has_server(agent: AgentClient) -> bool:
    """Whether the sandbox's image has the server (the code-interpreter variant's file is there;
    asked with ``test -f``, as the agent's file calls see only the sandbox's writable roots)."""
    try:
        return collect(agent.exec_buffered(["test", "-f", SERVER_ARGV[1]], timeout_ms=10_000)).exit_code == 0
    except AgentCallError as error:
        if error.reason == "SPAWN_FAILED":  # an image without even `test` has no server either
            return False
        raise


def start_server(agent: AgentClient, env: Mapping[str, str], workdir: str) -> int:
    """Start the server with ``env`` (and its own settings) in ``workdir``, tagged with the env's
    digest; its job's pid."""
    full = {**env, "CALLBOX_CI_PORT": str(PORT), "CALLBOX_CI_CWD": workdir}
    return agent.jobs.start(list(SERVER_ARGV), tag=f"{SERVER_TAG}@{env_digest(env)}", cwd=workdir, env=full).pid


def stop_foreign(agent: AgentClient, env: Mapping[str, str]) -> bool:
    """Kill a running server started (by a warm pool) with another env than ``env``; whether one was."""
    mine = f"{SERVER_TAG}@{env_digest(env)}"
    foreign = [job for job in agent.jobs.list()
               if job.state == "running" and job.tag.startswith(f"{SERVER_TAG}@") and job.tag != mine]
    for job in foreign:
        with contextlib.suppress(CallboxError):
            agent.jobs.kill(job.pid)
    return bool(foreign)


def listening(agent: AgentClient) -> bool:
    """Whether something listens on the server's port in the sandbox (a connection opened and closed)."""
    try:
        agent.ports.connect(PORT).close()
    except AgentCallError as error:
        if error.reason == "CONNECTION_REFUSED":
            return False
        raise
    return True


def wait_listening(agent: AgentClient, pid: int, timeout_s: float) -> None:
    """Wait until the server started as job ``pid`` listens; CallboxError saying why when it
    exited first (with the end of its output) or did not listen within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not listening(agent):
        if not server_alive(agent, pid):
            raise CallboxError(f"the code interpreter's server exited at its start: {server_output(agent, pid)}")
        if time.monotonic() > deadline:
            raise CallboxError(f"the code interpreter's server did not listen within {timeout_s:g} s of its start")
        time.sleep(0.05)  # the server binds its port within a second of its start; nothing to wait on but the port


def request(agent: AgentClient, method: str, path: str) -> tuple[int, Any]:
    """One bodiless request to the server: its status and its JSON answer (None when not JSON)."""
    with agent.ports.connect(PORT) as tunnel:
        tunnel.send(f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n"
                    "Connection: close\r\n\r\n".encode())
        answer = b"".join(tunnel.recv())
    head, _, body = answer.partition(b"\r\n\r\n")
    words = head.split(b"\r\n", 1)[0].split()
    status = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
    try:
        return status, json.loads(body)
    except ValueError:
        return status, None


def kernel_ready(agent: AgentClient) -> bool:
    """Whether the server lists a context (the default one is listed once its kernel answers)."""
    try:
        status, contexts = request(agent, "GET", "/contexts")
    except AgentCallError as error:
        if error.reason == "CONNECTION_REFUSED":
            return False
        raise
    return status == 200 and bool(contexts)


def restart_default_kernel(agent: AgentClient) -> None:
    """A fresh kernel for the default Python context (the first Python one the server made: a
    sandbox whose server only runs cells without a context has no other); CallboxError when the
    server has none or refuses."""
    status, contexts = request(agent, "GET", "/contexts")
    found = [c for c in contexts or () if isinstance(c, dict) and c.get("language") == "python"]
    if status != 200 or not found:
        raise CallboxError("the code interpreter has no Python context to restart")
    status, answer = request(agent, "POST", f"/contexts/{found[0]['id']}/restart")
    if status != 200:
        raise CallboxError(f"the code interpreter did not restart its kernel: {answer}")


def server_alive(agent: AgentClient, pid: int) -> bool:
    try:
        return agent.jobs.get(pid).state == "running"
    except CallboxError:
        return False


def server_output(agent: AgentClient, pid: int) -> str:
    """The end of what the server's job printed (why it exited at its start)."""
    with contextlib.suppress(CallboxError):
        text = "".join(event.data.decode(errors="replace") for event in agent.jobs.attach(pid, follow=False)
                       if isinstance(event, JobChunk))
        return text.strip()[-500:] or "no output"
    return "its output could not be read"


class CellEnded(Exception):
    """How :func:`execute`'s stream stopped early: ``timed_out`` (the connection was closed at
    the deadline, so the server interrupted the cell) or the server's refusal (``status``, ``message``)."""

    def __init__(self, message: str, *, timed_out: bool = False, status: int = 0) -> None:
        super().__init__(message)
        self.timed_out = timed_out
        self.status = status


def execute(agent: AgentClient, code: str, *, timeout_s: float, context_id: str | None = None,
            env_vars: Mapping[str, str] | None = None) -> Iterator[dict[str, Any]]:
    """Run ``code`` in the server's context ``context_id`` (default: the default Python one) and
    yield its NDJSON events as they come (``stdout``, ``stderr``, ``result``, ``error``,
    ``number_of_executions``, ``end_of_execution``). At ``timeout_s`` the connection is closed,
    which makes the server interrupt the cell (the kernel and its state stay), and
    :class:`CellEnded` (``timed_out``) is raised; a refused request raises it with the status."""
    doc: dict[str, Any] = {"code": code}
    if context_id:
        doc["context_id"] = context_id
    if env_vars:
        doc["env_vars"] = dict(env_vars)
    body = json.dumps(doc).encode()
    tunnel = agent.ports.connect(PORT)
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        tunnel.close()

    timer = threading.Timer(timeout_s, expire)
    timer.daemon = True
    timer.start()
    try:
        tunnel.send(b"POST /execute HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                    b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        buffer = bytearray()
        head: bytes | None = None
        status = 0
        for chunk in tunnel.recv():
            buffer += chunk
            if head is None:
                head_end = buffer.find(b"\r\n\r\n")
                if head_end < 0:
                    continue
                head = bytes(buffer[:head_end])
                del buffer[:head_end + 4]
                words = head.split(b"\r\n", 1)[0].split()
                status = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
            if status != 200:
                continue  # a refusal's body is one JSON object, read whole at the end
            while (newline := buffer.find(b"\n")) >= 0:
                line = bytes(buffer[:newline])
                del buffer[:newline + 1]
                if line.strip():
                    yield _event(line)
            if len(buffer) > MAX_LINE_BYTES:
                raise CellEnded(f"the code interpreter sent a line longer than {MAX_LINE_BYTES} bytes")
        if expired.is_set():
            raise CellEnded(f"the cell did not end within {timeout_s:g} s", timed_out=True)
        if status != 200:
            raise CellEnded(_refusal(bytes(buffer), status), status=status)
        if buffer.strip():
            yield _event(bytes(buffer))
    finally:
        timer.cancel()
        tunnel.close()


def _event(line: bytes) -> dict[str, Any]:
    try:
        event = json.loads(line)
    except ValueError:
        event = None
    if not isinstance(event, dict):
        raise CellEnded(f"the code interpreter sent a line that is not a JSON object: {line[:200]!r}")
    return event


def _refusal(body: bytes, status: int) -> str:
    with contextlib.suppress(ValueError, TypeError, KeyError):
        return str(json.loads(body)["error"])
    return f"the code interpreter answered {status or 'nothing'}: {body[:300].decode(errors='replace')}"
