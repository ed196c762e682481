"""The code interpreter of ``e2b_code_interpreter``: port 49999 of a ``code-interpreter-v1`` sandbox.

The template ``code-interpreter-v1`` (the SDK's default) is the ``base`` template on the
code-interpreter image variant (``callbox image build --variant code-interpreter``). Its server
(``images/code-interpreter/server.py``: ``/execute``, ``/contexts``, ``/health``, a Python
kernel per context) runs in the sandbox as the tool user, a job tagged ``code-interpreter``
started the first time a request needs it; starting it is the ``process`` action. The door
reaches it over the agent's tunnel (:mod:`harness.engine.ports`), so no network is needed.

Requests carry ``E2b-Sandbox-Id`` and ``E2b-Sandbox-Port: 49999``. Who may:

* ``POST /execute`` (``run_code``) must carry the sandbox's ``X-Access-Token`` (the SDK sends
  it). Its code is authorized like a command: the ``shell`` tool's rules and decision see the
  code as the command (``default_decision`` and ``allowed_tools`` included) and the
  ``process`` action's rules see it as ``command``; the more restrictive wins, and it is
  recorded once, as the ``process`` action with ``kind = "run_code"``, the language and the
  context, its outcome the execution count and the error's name. A denial is 403 with the
  policy's reason (the SDK raises ``SandboxException`` with it).
* ``/contexts`` (list, create, delete, restart) and ``/health``: the SDK sends no access
  token with them, so, as with E2B's public ports, the sandbox id is enough; a token that is
  sent must be the sandbox's. They run no code of the caller's.

``run_code``'s ``timeout`` is the SDK's: it closes its connection, the door closes the tunnel,
and the server interrupts the cell (the kernel and its state stay).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from harness.core.errors import AgentCallError, CallboxError, ErrorCode
from harness.core.policy import Policy
from harness.core.registry import ToolDefinition
from harness.core.sandbox_settings import SandboxSettings
from harness.doors.e2b.boxes import E2B_WORKDIR, E2bSandbox, E2bSandboxes, e2b_errors, e2b_template
from harness.doors.e2b.errors import E2bError, invalid
from harness.doors.e2b.rpc import EnvdCall, HttpRequest, HttpResponse
from harness.engine.base import LivingSandbox
from harness.engine.cancel import current_scope
from harness.engine.image.variants import VARIANTS
from harness.engine.jobs import JobChunk
from harness.engine.ports import Tunnel
from harness.tools.shell import SHELL

__all__ = ["JUPYTER_PORT", "SERVER_ARGV", "TEMPLATE", "Interpreter", "code_interpreter_template"]

log = logging.getLogger("callbox.e2b")

TEMPLATE = "code-interpreter-v1"
"""The template ``e2b_code_interpreter`` asks for when its caller names none."""
JUPYTER_PORT = "49999"
IMAGE = VARIANTS["code-interpreter"].tag
SERVER_TAG = "code-interpreter"
SERVER_ARGV = ("/usr/bin/python3", "/opt/callbox/code-interpreter/server.py")
SERVER_START_S = 30.0
"""How long the door waits for the server to listen once started."""
MAX_CODE_BYTES = 4 << 20
HEAD_LIMIT = 64 << 10


def code_interpreter_template(policy: Policy) -> Policy:
    """``policy`` as E2B's ``base`` template, on the code-interpreter image variant."""
    base = e2b_template(policy)
    settings = SandboxSettings.model_validate({**base.sandbox.model_dump(), "image": IMAGE})
    return base.model_copy(update={"sandbox": settings})


class _Server:
    """The server of one sandbox: started once (under ``lock``), its job's pid."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid: int | None = None


class Interpreter:
    """Port 49999 of code-interpreter sandboxes; see the module docstring."""

    def __init__(self, sandboxes: E2bSandboxes) -> None:
        self.sandboxes = sandboxes
        self._lock = threading.Lock()
        self._servers: dict[str, _Server] = {}

    @functools.cached_property
    def shell(self) -> ToolDefinition:
        """The ``shell`` tool whose rules a cell's code meets (the registry's, if it has one)."""
        registered = self.sandboxes.executor.registry.get(SHELL.name)
        return (registered or SHELL).definition

    def serves(self, sandbox: E2bSandbox) -> bool:
        """Whether ``sandbox`` has the code interpreter (its template's image is the variant)."""
        template = self.sandboxes.templates.get(sandbox.template_id)
        return template is not None and template.sandbox.image == IMAGE

    # ---- one request -------------------------------------------------------------------------

    def handle(self, request: HttpRequest, call: EnvdCall) -> HttpResponse:
        sandbox = call.sandbox
        token = request.headers.get("x-access-token")
        if token is not None and not sandbox.accepts(token):
            raise E2bError(ErrorCode.UNAUTHENTICATED, f"the X-Access-Token is not the access token of sandbox "
                                                      f"{sandbox.sandbox_id}")
        body = request.read(MAX_CODE_BYTES) if request.method in {"POST", "PUT", "DELETE"} else b""
        if request.method == "POST" and request.path.rstrip("/") == "/execute":
            if token is None:
                raise E2bError(ErrorCode.UNAUTHENTICATED, "run_code needs the sandbox's X-Access-Token header "
                                                          "(the SDK sends it)")
            return self._execute(sandbox, body, call)
        with e2b_errors(sandbox), current_scope(call.scope):
            tunnel = self._tunnel(sandbox)
            call.scope.track(_Closing(tunnel))
            return self._forward(tunnel, request.method, request.path, body, outcome=None, stack=None)

    def _execute(self, sandbox: E2bSandbox, body: bytes, call: EnvdCall) -> HttpResponse:
        try:
            doc = json.loads(body or b"{}")
        except ValueError as error:
            raise invalid(f"the /execute body is not JSON: {error}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("code"), str):
            raise invalid("/execute takes {\"code\": STRING, \"context_id\", \"language\", \"env_vars\"}")
        code: str = doc["code"]
        language = doc.get("language") or "python"
        context_id = doc.get("context_id")
        with e2b_errors(sandbox):
            self.sandboxes.executor.quotas.start_call(sandbox.client, door="e2b")  # a cell is a tool call
            box = sandbox.running()
            floor = sandbox.session.policy.decide(self.shell, {"command": code, "workdir": box.spec.workdir})
            details = {"command": code, "kind": "run_code", "language": language, "context_id": context_id}
            stack = contextlib.ExitStack()
            ticket = stack.enter_context(self.sandboxes.acting(sandbox, "process", details, floor=floor))
            try:
                with current_scope(call.scope):
                    tunnel = self._tunnel(sandbox)
                # The client going away (its timeout) closes the tunnel at once, even while the
                # cell prints nothing: the server reads that as the end and interrupts the cell.
                call.scope.track(_Closing(tunnel))
                return self._forward(tunnel, "POST", "/execute", body, outcome=ticket.outcome, stack=stack)
            except BaseException:
                stack.close()
                raise

    # ---- the server and the tunnel -----------------------------------------------------------

    def _server(self, sandbox_id: str) -> _Server:
        with self._lock:
            for gone in [sid for sid in self._servers if self.sandboxes.find(sid) is None]:
                del self._servers[gone]
            return self._servers.setdefault(sandbox_id, _Server())

    def _tunnel(self, sandbox: E2bSandbox) -> Tunnel:
        """A connection to the server, started first when it is not running."""
        box = sandbox.running()
        server = self._server(sandbox.sandbox_id)
        with server.lock:
            if server.pid is None or not self._alive(box, server.pid):
                server.pid = self._start(sandbox, box)
            pid = server.pid
            deadline = time.monotonic() + SERVER_START_S
            while True:
                try:
                    return box.agent.ports.connect(int(JUPYTER_PORT))
                except AgentCallError as error:
                    if error.reason != "CONNECTION_REFUSED" or time.monotonic() > deadline:
                        raise
                if not self._alive(box, pid):
                    server.pid = None
                    raise E2bError(ErrorCode.SANDBOX_UNAVAILABLE, "the code interpreter's server exited at its "
                                   f"start: {self._output(box, pid)}", status=502)
                time.sleep(0.05)  # the server binds its port within a second of its start

    def _start(self, sandbox: E2bSandbox, box: LivingSandbox) -> int:
        argv = list(SERVER_ARGV)
        with self.sandboxes.acting(sandbox, "process", {"command": argv, "tag": SERVER_TAG, "pty": False}) as ticket:
            env = {**box.spec.env, **sandbox.env_vars, "CALLBOX_CI_PORT": JUPYTER_PORT,
                   "CALLBOX_CI_CWD": box.spec.workdir or E2B_WORKDIR}
            info = box.jobs.start(argv, tag=SERVER_TAG, cwd=box.spec.workdir or E2B_WORKDIR, env=env)
            ticket.outcome["pid"] = info.pid
        log.info("sandbox %s: the code interpreter's server started (pid %d)", sandbox.sandbox_id, info.pid)
        return info.pid

    @staticmethod
    def _alive(box: LivingSandbox, pid: int) -> bool:
        try:
            return box.jobs.get(pid).state == "running"
        except CallboxError:
            return False

    @staticmethod
    def _output(box: LivingSandbox, pid: int) -> str:
        with contextlib.suppress(CallboxError):
            text = "".join(event.data.decode(errors="replace") for event in box.jobs.attach(pid, follow=False)
                           if isinstance(event, JobChunk))
            return text.strip()[-500:] or "no output"
        return "its output could not be read"

    def _forward(self, tunnel: Tunnel, method: str, path: str, body: bytes, *,
                 outcome: dict[str, Any] | None, stack: contextlib.ExitStack | None) -> HttpResponse:
        """Send one request through ``tunnel``; the response with its body streamed as it comes.
        The tunnel is never half-closed: the server reads its end as the client going away."""
        try:
            head = (f"{method} {path} HTTP/1.1\r\nHost: localhost:{JUPYTER_PORT}\r\nConnection: close\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
            tunnel.send(head + body)
            chunks = tunnel.recv()
            buffered = b""
            while b"\r\n\r\n" not in buffered:
                chunk = next(chunks, None)
                if chunk is None or len(buffered) > HEAD_LIMIT:
                    raise E2bError(ErrorCode.SANDBOX_UNAVAILABLE, "the code interpreter's server closed the "
                                   "connection without an answer", status=502)
                buffered += chunk
            raw_head, _, rest = buffered.partition(b"\r\n\r\n")
            lines = raw_head.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            headers = [(k.strip().lower(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:])]
            kept = [(k, v) for k, v in headers if k == "content-type"]
        except BaseException:
            tunnel.close()
            if stack is not None:
                stack.close()
            raise
        return HttpResponse(status, kept, _relay(tunnel, rest, chunks, outcome, stack))


class _Closing:
    """What a call's scope cancels: the tunnel, closed."""

    def __init__(self, tunnel: Tunnel) -> None:
        self.tunnel = tunnel

    def cancel(self) -> None:
        self.tunnel.close()


def _relay(tunnel: Tunnel, first: bytes, chunks: Iterator[bytes], outcome: dict[str, Any] | None,
           stack: contextlib.ExitStack | None) -> Iterator[bytes]:
    """The rest of the body; closing it (the client went away) closes the tunnel. With ``outcome``,
    the NDJSON lines of an execution are read on the way for the audit record."""
    pending = b""
    ended = False
    try:
        for chunk in _chain(first, chunks):
            if outcome is not None:
                pending += chunk
                *complete, pending = pending.split(b"\n")
                for line in complete:
                    ended = _note(line, outcome) or ended
            yield chunk
        if outcome is not None and not ended:
            outcome["ended"] = "the server ended the cell without end_of_execution"
    except GeneratorExit:
        if outcome is not None:
            outcome["ended"] = "the client went away (its timeout?): the cell was interrupted, the kernel kept"
        raise
    finally:
        tunnel.close()
        if stack is not None:
            stack.close()


def _chain(first: bytes, chunks: Iterator[bytes]) -> Iterator[bytes]:
    if first:
        yield first
    yield from chunks


def _note(line: bytes, outcome: dict[str, Any]) -> bool:
    """Record what the audit keeps of one NDJSON line (never the output); True at its end."""
    try:
        doc = json.loads(line)
    except ValueError:
        return False
    if not isinstance(doc, dict):
        return False
    kind = doc.get("type")
    if kind == "number_of_executions":
        outcome["execution_count"] = doc.get("execution_count")
    elif kind == "error":
        outcome["error"] = str(doc.get("name", ""))[:200]
    elif kind == "result":
        outcome["results"] = int(outcome.get("results", 0)) + 1
    return kind == "end_of_execution"
