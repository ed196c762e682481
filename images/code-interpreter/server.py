"""The E2B code interpreter's HTTP API, inside a sandbox of the code-interpreter image variant.

Runs as the sandbox's tool user, started by the E2B door when a sandbox of the template
``code-interpreter-v1`` first needs it, and listens on 127.0.0.1:49999 (``CALLBOX_CI_PORT``);
the door reaches it over the agent's tunnel, never over a network. Each context, started in its
cwd, is one of four languages: ``python`` (Debian's ipykernel, driven with jupyter_client, with
charts.py as an IPython extension: the ``chart`` of a matplotlib figure), ``bash`` (an
interactive bash process, :mod:`bash_context`), ``javascript`` (``js``; a node process,
:mod:`node_context`) or ``typescript`` (``ts``; a node process that transpiles each cell with
Debian's node-typescript: types are stripped, not checked); any other language is refused,
naming the served ones:

``GET /health``                     ``OK``
``GET /contexts``                   ``[{"id", "language", "cwd"}]``
``POST /contexts``                  ``{"language", "cwd"}`` -> the new context
``DELETE /contexts/ID``             stops its kernel or process
``POST /contexts/ID/restart``       a fresh kernel or process in the same cwd (its state is gone)
``POST /execute``                   ``{"code", "context_id", "language", "env_vars"}`` -> NDJSON lines:
                                    ``stdout``/``stderr`` (``text``, ``timestamp`` in ns), ``result``
                                    (``text``, ``html``, ``png``, ... and ``is_main_result``;
                                    beside a matplotlib figure's ``png``, its ``chart``),
                                    ``error`` (``name``, ``value``, ``traceback``),
                                    ``number_of_executions``, ``end_of_execution``

``/execute`` without a ``context_id`` runs in the default context of its ``language`` (python
when none), made at its first use (the Python one at this server's start). A context runs one
cell at a time (the next waits). ``env_vars`` hold for that cell only. A client that goes away
mid-cell (the SDK's ``timeout``) interrupts it (SIGINT, as Jupyter does; for bash and node, to
the process's group); the kernel or process and what it holds stay. Every response closes its
connection (``Connection: close``): a streamed body ends when the cell has ended.

Debian's archive has no bash, JavaScript or TypeScript Jupyter kernel, hence the processes of our own. Matplotlib's
and IPython's writable directories are under ``$TMPDIR`` (the root filesystem is read-only),
and the user site directory exists before a kernel starts, so ``!pip install`` (a user install
under ``$HOME``) can be imported at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import signal
import site
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bash_context import BashContext
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.connect import write_connection_file
from node_context import NodeContext, TypeScriptContext
from process_context import ContextStartError, ProcessContext

PORT = int(os.environ.get("CALLBOX_CI_PORT", "49999"))
HOME = os.environ.get("HOME") or "/home/user"
DEFAULT_CWD = os.environ.get("CALLBOX_CI_CWD") or HOME
STATE = os.path.join(os.environ.get("TMPDIR") or tempfile.gettempdir(), ".callbox-code-interpreter")
KERNEL_START_S = 60.0
POLL_S = 0.1
LANGUAGES = {"python": "python", "bash": "bash", "javascript": "javascript", "js": "javascript",
             "typescript": "typescript", "ts": "typescript"}
"""The languages a context may be of, by the names a client may give (E2B's ``js`` and ``ts`` included)."""
PROCESS_CONTEXTS: dict[str, type[ProcessContext]] = {"bash": BashContext, "javascript": NodeContext,
                                                     "typescript": TypeScriptContext}
MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/chart": "chart",  # charts.py's formatter: the data of a matplotlib figure
}


CHARTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "charts.py")
# A kernel: ipykernel's, with charts.py (beside this file) loaded as an IPython extension under a
# private name, so that a user's own ``charts`` module neither shadows it nor is shadowed. A chart
# is a bonus: a kernel whose charts.py fails to load starts without it.
KERNEL_MAIN = f"""
import importlib.util, sys
if sys.path and sys.path[0] == "":
    del sys.path[0]  # as ipykernel_launcher does: the cwd's modules must not shadow the kernel's
extensions = []
try:
    spec = importlib.util.spec_from_file_location("_callbox_charts", {CHARTS!r})
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[spec.name] = module
    extensions.append(spec.name)
except Exception as error:
    print("callbox: no charts in this kernel:", repr(error), file=sys.stderr)
from ipykernel.kernelapp import IPKernelApp
IPKernelApp.launch_instance(extensions=extensions)
"""


def kernel_env() -> dict[str, str]:
    """The environment of a kernel: this server's, with the writable places the kernel needs."""
    env = dict(os.environ)
    for name, sub in (("MPLCONFIGDIR", "matplotlib"), ("IPYTHONDIR", "ipython"),
                      ("JUPYTER_RUNTIME_DIR", "runtime"), ("JUPYTER_DATA_DIR", "data"),
                      ("JUPYTER_CONFIG_DIR", "config")):
        path = env.setdefault(name, os.path.join(STATE, sub))
        os.makedirs(path, mode=0o700, exist_ok=True)
    env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    env.pop("CALLBOX_CI_PORT", None)
    return env


class ContextError(Exception):
    """A request this server refuses: ``status`` and a message for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def served_language(name: Any) -> str:
    """The language of a context asked for as ``name`` (None: python), or a refusal naming the served ones."""
    if name is None or name == "":
        return "python"
    language = LANGUAGES.get(str(name).strip().lower())
    if language is None:
        raise ContextError(400, f"language {name!r} is not available: this code interpreter runs python, bash, "
                           "javascript (js) and typescript (ts) only")
    return language


class Context:
    """One kernel and its client; ``lock`` is held while a cell runs."""

    def __init__(self, language: str, cwd: str) -> None:
        self.id = uuid.uuid4().hex
        self.language = language
        self.cwd = cwd
        self.lock = threading.Lock()
        self.process: subprocess.Popen[bytes] | None = None
        self.client: BlockingKernelClient | None = None

    def describe(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def start(self) -> None:
        if not os.path.isdir(self.cwd):
            raise ContextError(400, f"cwd {self.cwd!r} is not a directory in the sandbox")
        connection = os.path.join(kernel_env()["JUPYTER_RUNTIME_DIR"], f"kernel-{self.id}.json")
        write_connection_file(connection, ip="127.0.0.1")
        log_path = os.path.join(STATE, f"kernel-{self.id}.log")
        with open(log_path, "wb") as log_file:  # what a kernel that dies at its start said
            self.process = subprocess.Popen(
                [sys.executable, "-c", KERNEL_MAIN, "-f", connection],
                cwd=self.cwd, env=kernel_env(), stdin=subprocess.DEVNULL,
                stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
            )
        client = BlockingKernelClient(connection_file=connection)
        client.load_connection_file()
        client.start_channels()
        try:
            self._wait_ready(client)
        except RuntimeError as error:
            client.stop_channels()
            self.stop()
            with contextlib.suppress(OSError), open(log_path, errors="replace") as said:
                error = RuntimeError(f"{error}: {said.read()[-800:].strip()}")
            raise ContextError(500, f"the Python kernel did not start: {error}") from None
        self.client = client

    def _wait_ready(self, client: BlockingKernelClient) -> None:
        """Until the kernel answers kernel_info (jupyter_client's own wait takes a kernel whose
        first heartbeat is late, as on a busy machine, for a dead one)."""
        deadline = time.monotonic() + KERNEL_START_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"the kernel exited with {self.process.returncode}")
            msg_id = client.kernel_info()
            try:
                while True:
                    reply = client.get_shell_msg(timeout=1.0)
                    if reply["parent_header"].get("msg_id") == msg_id:
                        break
            except queue.Empty:
                continue
            while True:  # what the kernel said at its start is not a cell's
                try:
                    client.get_iopub_msg(timeout=0.2)
                except queue.Empty:
                    return
        raise RuntimeError(f"the kernel did not answer within {KERNEL_START_S:g} s")

    def stop(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.stop_channels()
            self.client = None
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def interrupt(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGINT)

    def quiet(self, code: str) -> None:
        """Run ``code`` with no output and no history (the env_vars of a cell)."""
        assert self.client is not None
        msg_id = self.client.execute(code, silent=True, store_history=False, allow_stdin=False)
        while True:
            reply = self.client.get_shell_msg(timeout=KERNEL_START_S)
            if reply["parent_header"].get("msg_id") == msg_id:
                return


AnyContext = Context | ProcessContext


def start_process(context: ProcessContext) -> None:
    try:
        context.start()
    except ContextStartError as error:
        raise ContextError(500, f"the {context.language} context did not start: {error}") from None


class Contexts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.all: dict[str, AnyContext] = {}
        self.defaults: dict[str, AnyContext] = {}

    def create(self, language: str | None, cwd: str | None) -> AnyContext:
        language = served_language(language)
        context: AnyContext
        if language == "python":
            context = Context(language, cwd or DEFAULT_CWD)
            context.start()
        else:
            context = PROCESS_CONTEXTS[language](cwd or DEFAULT_CWD, kernel_env(), STATE)
            if not os.path.isdir(context.cwd):
                raise ContextError(400, f"cwd {context.cwd!r} is not a directory in the sandbox")
            start_process(context)
        with self.lock:
            self.all[context.id] = context
        return context

    def find(self, context_id: str | None, language: str | None) -> AnyContext:
        if context_id:
            with self.lock:
                found = self.all.get(context_id)
            if found is None:
                raise ContextError(404, f"context {context_id!r} not found")
            return found
        language = served_language(language)
        with self.lock:
            if language in self.defaults:
                return self.defaults[language]
        default = self.create(language, None)
        with self.lock:
            if language not in self.defaults:
                self.defaults[language] = default
                return default
            keep = self.defaults[language]
        self.remove(default.id)
        return keep

    def remove(self, context_id: str) -> None:
        with self.lock:
            context = self.all.pop(context_id, None)
            for language, default in list(self.defaults.items()):
                if default is context:
                    del self.defaults[language]
        if context is None:
            raise ContextError(404, f"context {context_id!r} not found")
        with context.lock:
            context.stop()

    def restart(self, context_id: str) -> None:
        context = self.find(context_id, None)
        with context.lock:
            context.stop()
            if isinstance(context, ProcessContext):
                start_process(context)
            else:
                context.start()


CONTEXTS = Contexts()


def _now_ns() -> int:
    return time.time_ns()


def _result(data: dict[str, Any], main: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "result", "is_main_result": main}
    extra: dict[str, Any] = {}
    for mime, value in data.items():
        field = MIME_FIELDS.get(mime)
        if field is not None:
            out[field] = value
        else:
            extra[mime] = value
    if extra:
        out["extra"] = extra
    return out


def _env_code(env_vars: dict[str, str]) -> tuple[str, str]:
    """Code that sets ``env_vars`` in the kernel, and code that puts back what was there."""
    names = json.dumps(env_vars)
    setup = (f"import os as _cb_os\n_cb_saved = {{k: _cb_os.environ.get(k) for k in {names}}}\n"
             f"_cb_os.environ.update({names})\n")
    restore = ("for _cb_k, _cb_v in _cb_saved.items():\n"
               "    (_cb_os.environ.pop(_cb_k, None) if _cb_v is None else _cb_os.environ.__setitem__(_cb_k, _cb_v))\n"
               "del _cb_saved, _cb_os\n")
    return setup, restore


class Gone(Exception):
    """The client closed its connection."""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "callbox-code-interpreter"

    def log_message(self, format: str, *args: Any) -> None:
        return

    # ---- plumbing --------------------------------------------------------------------------

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return {}
        try:
            doc = json.loads(raw)
        except ValueError:
            raise ContextError(400, "the request body is not JSON") from None
        if not isinstance(doc, dict):
            raise ContextError(400, "the request body is not a JSON object")
        return doc

    def _send(self, status: int, body: Any, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    def _fail(self, error: ContextError) -> None:
        self._send(error.status, {"error": str(error)})

    def _gone(self) -> bool:
        """Whether the client has closed its side (no body is expected after the request)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _stream_head(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def _emit(self, doc: dict[str, Any]) -> bool:
        """One line to the client; False when it has gone."""
        try:
            self._line(doc)
        except Gone:
            return False
        return True

    def _line(self, doc: dict[str, Any]) -> None:
        try:
            self.wfile.write(json.dumps(doc).encode() + b"\n")
            self.wfile.flush()
        except OSError:
            raise Gone from None

    # ---- routes ----------------------------------------------------------------------------

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, b"OK", "text/plain")
        elif self.path == "/contexts":
            with CONTEXTS.lock:
                self._send(200, [c.describe() for c in CONTEXTS.all.values()])
        else:
            self._fail(ContextError(404, f"no route GET {self.path}"))

    def do_DELETE(self) -> None:
        parts = self.path.strip("/").split("/")
        try:
            if len(parts) == 2 and parts[0] == "contexts":
                CONTEXTS.remove(parts[1])
                self._send(200, {})
            else:
                raise ContextError(404, f"no route DELETE {self.path}")
        except ContextError as error:
            self._fail(error)

    def do_POST(self) -> None:
        parts = self.path.strip("/").split("/")
        try:
            body = self._body()
            if parts == ["contexts"]:
                context = CONTEXTS.create(body.get("language"), body.get("cwd"))
                self._send(200, context.describe())
            elif len(parts) == 3 and parts[0] == "contexts" and parts[2] == "restart":
                CONTEXTS.restart(parts[1])
                self._send(200, {})
            elif parts == ["execute"]:
                self._execute(body)
            else:
                raise ContextError(404, f"no route POST {self.path}")
        except ContextError as error:
            self._fail(error)

    def _execute(self, body: dict[str, Any]) -> None:
        code = body.get("code")
        if not isinstance(code, str):
            raise ContextError(400, "execute needs code, a string")
        env_vars = body.get("env_vars") or {}
        if not isinstance(env_vars, dict) or not all(isinstance(v, str) for v in env_vars.values()):
            raise ContextError(400, "env_vars must map names to strings")
        context = CONTEXTS.find(body.get("context_id"), body.get("language"))
        if isinstance(context, ProcessContext):
            try:
                context.check(env_vars)
            except ValueError as error:
                raise ContextError(400, str(error)) from None
            with context.lock:
                self._stream_head()
                context.run(code, env_vars, self._emit, self._gone)
            return
        with context.lock:
            if context.client is None:
                raise ContextError(500, f"context {context.id} has no kernel; restart it")
            self._stream_head()
            restore = None
            if env_vars:
                setup, restore = _env_code(env_vars)
                context.quiet(setup)
            try:
                self._run_cell(context, code)
            finally:
                if restore is not None:
                    with contextlib.suppress(Exception):
                        context.quiet(restore)

    def _run_cell(self, context: Context, code: str) -> None:
        client = context.client
        assert client is not None
        msg_id = client.execute(code, store_history=True, allow_stdin=False, stop_on_error=True)
        interrupted = False
        while True:
            if not interrupted and self._gone():
                context.interrupt()
                interrupted = True
            try:
                message = client.get_iopub_msg(timeout=POLL_S)
            except queue.Empty:
                if context.process is not None and context.process.poll() is not None:
                    if not interrupted:
                        with contextlib.suppress(Gone):
                            self._line({"type": "error", "name": "KernelDied",
                                        "value": "the kernel exited during the cell; restart the context",
                                        "traceback": ""})
                            self._line({"type": "end_of_execution"})
                    return
                continue
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            kind = message["msg_type"]
            content = message["content"]
            try:
                if interrupted:
                    pass
                elif kind == "stream":
                    self._line({"type": "stdout" if content.get("name") == "stdout" else "stderr",
                                "text": content.get("text", ""), "timestamp": _now_ns()})
                elif kind == "execute_input":
                    self._line({"type": "number_of_executions", "execution_count": content.get("execution_count")})
                elif kind == "execute_result":
                    self._line(_result(content.get("data", {}), True))
                elif kind == "display_data":
                    self._line(_result(content.get("data", {}), False))
                elif kind == "error":
                    self._line({"type": "error", "name": content.get("ename", ""),
                                "value": content.get("evalue", ""),
                                "traceback": "\n".join(content.get("traceback", []))})
            except Gone:
                context.interrupt()
                interrupted = True
            if kind == "status" and content.get("execution_state") == "idle":
                if not interrupted:
                    with contextlib.suppress(Gone):
                        self._line({"type": "end_of_execution"})
                return


def main() -> int:
    site_dir = site.getusersitepackages()
    with contextlib.suppress(OSError):
        os.makedirs(site_dir, exist_ok=True)  # so a kernel started now has it on sys.path for `!pip install`
    os.makedirs(STATE, mode=0o700, exist_ok=True)
    server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
    server.daemon_threads = True
    threading.Thread(target=lambda: CONTEXTS.find(None, "python"), daemon=True).start()  # the default context
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(0)))
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        for context_id in list(CONTEXTS.all):
            with contextlib.suppress(ContextError):
                CONTEXTS.remove(context_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
