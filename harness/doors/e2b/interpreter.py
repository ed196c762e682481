"""The code interpreter of ``e2b_code_interpreter``: port 49999 of a ``code-interpreter-v1`` sandbox.

The template ``code-interpreter-v1`` (the SDK's default) is the ``base`` template on the
code-interpreter image variant (``callbox image build --variant code-interpreter``). Its server
(``images/code-interpreter/server.py``: ``/execute``, ``/contexts``, ``/health``, a Python
kernel, a bash process or a node process per context) runs in the sandbox as the tool user, a
job tagged ``code-interpreter`` started the first time a request needs it; starting it is the
``process`` action.

Requests reach it as any sandbox port does (:mod:`harness.doors.e2b.ports`: ``E2b-Sandbox-Port:
49999`` or the host name ``49999-ID.``, the owner's credentials, over the agent's tunnel, so no
network is needed), but port 49999 has a filter of its own (:func:`interpreter_filter`)
instead of the ``port_forward`` action:

* a sandbox of another template has no port 49999 (502 "not open");
* ``POST /execute`` (``run_code``) is authorized like a command: the ``shell`` tool's rules and
  decision see the code as the command (``default_decision`` and ``allowed_tools`` included)
  and the ``process`` action's rules see it as ``command``; the more restrictive wins, and it
  is recorded once, as the ``process`` action with ``kind = "run_code"``, the language (none
  when the cell names a context and no language: the context's own) and the context (its
  outcome: the HTTP status and the bytes sent back). A denial is 403 with the policy's reason
  (the SDK raises ``SandboxException`` with it). A cell counts as a tool call of the client's
  ``calls_per_minute``;
* ``/contexts`` (list, create, delete, restart) and ``/health`` run no code of the caller's:
  they are forwarded once the server runs.

**Warm pool.** With ``[pool] code_interpreter = N`` the server keeps N sandboxes of the
template ready (:func:`pool_entry`), each with its server started and its default context's
kernel up, so a claimer's first ``run_code`` runs at once. Such a server is tagged with a
digest of the environment it was started with; a sandbox created with other ``envs`` (or
whose policy's env differs) has it replaced by one with its own at its first request, as a
cold sandbox would have had. Starting a pooled server is not a client's action, so it is not
audited; every cell still is.

The server is started and found with :mod:`harness.engine.code_interpreter` (the ``python`` tool's
way to it too); what is audited of it and its errors' wording are the door's.

``run_code``'s ``timeout`` is the SDK's: it closes its connection, the door closes the tunnel,
and the server interrupts the cell (the kernel and its state stay).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from harness.core.actions import ActionTicket
from harness.core.errors import CallboxError, ErrorCode
from harness.core.policy import Policy
from harness.core.registry import ToolDefinition
from harness.core.sandbox_settings import SandboxSettings
from harness.core.shared_engine import SharedEngine
from harness.doors.e2b.boxes import E2B_WORKDIR, E2bSandbox, E2bSandboxes, e2b_errors, e2b_template
from harness.doors.e2b.errors import E2bError, invalid
from harness.engine import code_interpreter
from harness.engine.base import LivingSandbox, PoolEntry
from harness.engine.image.variants import VARIANTS
from harness.tools.shell import SHELL

if TYPE_CHECKING:
    from harness.doors.e2b.ports import PortRequest

__all__ = ["JUPYTER_PORT", "SERVER_ARGV", "TEMPLATE", "code_interpreter_template", "install", "install_template",
           "interpreter_filter", "pool_entry", "serves"]

log = logging.getLogger("callbox.e2b")

TEMPLATE = "code-interpreter-v1"
"""The template ``e2b_code_interpreter`` asks for when its caller names none."""
JUPYTER_PORT = str(code_interpreter.PORT)
IMAGE = VARIANTS["code-interpreter"].tag
SERVER_TAG = code_interpreter.SERVER_TAG
SERVER_ARGV = code_interpreter.SERVER_ARGV
SERVER_START_S = 30.0
"""How long the door waits for the server to listen once started."""
POOLED_READY_S = 120.0
"""How long preparing a pooled sandbox waits for its server's default kernel."""


def code_interpreter_template(policy: Policy) -> Policy:
    """``policy`` as E2B's ``base`` template, on the code-interpreter image variant."""
    base = e2b_template(policy)
    settings = SandboxSettings.model_validate({**base.sandbox.model_dump(), "image": IMAGE})
    return base.model_copy(update={"sandbox": settings})


def install(sandboxes: E2bSandboxes, filters: dict[int, Any]) -> None:
    """Give ``sandboxes`` the template ``code-interpreter-v1`` (unless they have one) and port
    49999 its filter in ``filters`` (a :class:`~harness.doors.e2b.ports.PortProxy`'s); with
    ``[pool] code_interpreter``, the server's warm pool keeps sandboxes of it ready."""
    install_template(sandboxes)
    filters.setdefault(int(JUPYTER_PORT), interpreter_filter)


def install_template(sandboxes: E2bSandboxes) -> None:
    """Give ``sandboxes`` the template ``code-interpreter-v1`` unless they have one (and, with
    ``[pool] code_interpreter``, pool it). Called before a restarted server adopts its
    sandboxes, so those of this template are adopted too; again by :func:`install`, a no-op then."""
    if TEMPLATE in sandboxes.templates:
        return
    sandboxes.templates[TEMPLATE] = code_interpreter_template(sandboxes.executor.policy)
    executor = sandboxes.executor
    count = executor.policy.pool.code_interpreter
    if count and isinstance(executor.engine_factory, SharedEngine):
        template = sandboxes.templates[TEMPLATE]
        if template.sandbox.image != IMAGE:
            log.warning("[pool] code_interpreter: the template %s is not the code interpreter's; not pooled", TEMPLATE)
            return
        executor.engine_factory.add_pool_entry(pool_entry(template, count))


def pool_entry(template: Policy, count: int) -> PoolEntry:
    """``count`` pooled sandboxes of ``template`` (the code interpreter's), each with its server
    started and its default kernel up (a missing image: one warning, and creates are cold)."""
    spec = template.sandbox_spec()

    def prepare(box: LivingSandbox) -> None:
        pid = _start_job(box, spec.env)
        deadline = time.monotonic() + POOLED_READY_S
        while not _kernel_ready(box):
            if not _alive(box, pid):
                raise CallboxError(f"the code interpreter's server exited at its start: {_output(box, pid)}")
            if time.monotonic() > deadline:
                raise CallboxError(f"the code interpreter's kernel was not ready within {POOLED_READY_S:g} s")
            time.sleep(0.1)  # a kernel starts within seconds; nothing to wait on but the port

    return PoolEntry(spec, count, count, prepare=prepare, label=TEMPLATE)


def _kernel_ready(box: LivingSandbox) -> bool:
    return code_interpreter.kernel_ready(box.agent)


def _start_job(box: LivingSandbox, env: Mapping[str, str]) -> int:
    """Start the server in ``box`` with ``env`` (and its own settings), tagged with the env's digest."""
    return code_interpreter.start_server(box.agent, env, box.spec.workdir or E2B_WORKDIR)


def _stop_foreign(box: LivingSandbox, env: Mapping[str, str]) -> bool:
    return code_interpreter.stop_foreign(box.agent, env)


class _Server:
    """The server of one sandbox: started once (under ``lock``), its job's pid, and whether a
    pooled server's env was checked."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid: int | None = None
        self.checked = False


_SERVERS: dict[str, _Server] = {}
_SERVERS_LOCK = threading.Lock()


def serves(sandboxes: E2bSandboxes, sandbox: E2bSandbox) -> bool:
    """Whether ``sandbox`` has the code interpreter (its template's image is the variant)."""
    template = sandboxes.templates.get(sandbox.template_id)
    return template is not None and template.sandbox.image == IMAGE


@contextlib.contextmanager
def interpreter_filter(request: PortRequest) -> Iterator[ActionTicket | None]:
    """The port filter of port 49999 (:func:`~harness.doors.e2b.ports.register_port_filter`):
    a sandbox without the code interpreter has no such port; ``POST /execute`` is a command
    to the policy (see the module docstring); the server is started when it is not running."""
    sandbox, sandboxes = request.sandbox, request.sandboxes
    if not serves(sandboxes, sandbox):
        raise E2bError(ErrorCode.SANDBOX_UNAVAILABLE, f"sandbox {sandbox.sandbox_id!r} is running but port "
                       f"{JUPYTER_PORT} is not open: only sandboxes of the template {TEMPLATE} have the code "
                       "interpreter", status=502)
    if request.method != "POST" or request.target.split("?", 1)[0].rstrip("/") != "/execute":
        with e2b_errors(sandbox):
            _ensure_server(sandboxes, sandbox)
        yield None
        return
    try:
        doc = json.loads(request.body or b"{}")
    except ValueError as error:
        raise invalid(f"the /execute body is not JSON: {error}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("code"), str):
        raise invalid('/execute takes {"code": STRING, "context_id", "language", "env_vars"}')
    code: str = doc["code"]
    # A cell that names a context runs in that context's language, which only the server knows.
    language = doc.get("language") or (None if doc.get("context_id") else "python")
    details = {"command": code, "kind": "run_code", "language": language, "context_id": doc.get("context_id")}
    with e2b_errors(sandbox):
        sandboxes.executor.quotas.start_call(sandbox.client, door="e2b")  # a cell is a tool call
        box = sandbox.running()
        floor = sandbox.session.policy.decide(_shell(sandboxes), {"command": code, "workdir": box.spec.workdir})
        with sandboxes.acting(sandbox, "process", details, floor=floor) as ticket:
            _ensure_server(sandboxes, sandbox)
            yield ticket


def _shell(sandboxes: E2bSandboxes) -> ToolDefinition:
    """The ``shell`` tool whose rules a cell's code meets (the registry's, if it has one)."""
    registered = sandboxes.executor.registry.get(SHELL.name)
    return (registered or SHELL).definition


def _ensure_server(sandboxes: E2bSandboxes, sandbox: E2bSandbox) -> None:
    """Start the sandbox's server unless one listens (also one an earlier server process of the
    door started: a kept sandbox adopted after a restart), and wait until it does."""
    box = sandbox.running()
    with _SERVERS_LOCK:
        for gone in [sid for sid in _SERVERS if sandboxes.find(sid) is None]:
            del _SERVERS[gone]
        server = _SERVERS.setdefault(sandbox.sandbox_id, _Server())
    with server.lock:
        if not server.checked:
            server.checked = True
            if _stop_foreign(box, {**box.spec.env, **sandbox.env_vars}):
                log.info("sandbox %s: the pooled code interpreter's server had another env; restarting it",
                         sandbox.sandbox_id)
                deadline = time.monotonic() + SERVER_START_S
                while _listening(box) and time.monotonic() < deadline:
                    time.sleep(0.05)  # the killed server's port closes with it
        if _listening(box):
            return
        server.pid = pid = _start(sandboxes, sandbox, box)
        try:
            code_interpreter.wait_listening(box.agent, pid, SERVER_START_S)
        except CallboxError as error:
            if not _alive(box, pid):
                server.pid = None
            raise E2bError(ErrorCode.SANDBOX_UNAVAILABLE, str(error), status=502) from None


def _listening(box: LivingSandbox) -> bool:
    return code_interpreter.listening(box.agent)


def _start(sandboxes: E2bSandboxes, sandbox: E2bSandbox, box: LivingSandbox) -> int:
    with sandboxes.acting(sandbox, "process", {"command": list(SERVER_ARGV), "tag": SERVER_TAG,
                                               "pty": False}) as ticket:
        pid = _start_job(box, {**box.spec.env, **sandbox.env_vars})
        ticket.outcome["pid"] = pid
    log.info("sandbox %s: the code interpreter's server started (pid %d)", sandbox.sandbox_id, pid)
    return pid


def _alive(box: LivingSandbox, pid: int) -> bool:
    return code_interpreter.server_alive(box.agent, pid)


def _output(box: LivingSandbox, pid: int) -> str:
    return code_interpreter.server_output(box.agent, pid)
