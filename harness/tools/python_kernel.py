"""``python``: run a cell in the sandbox's Python kernel, whose state lasts for the run.

The kernel is the code interpreter's (:mod:`harness.engine.code_interpreter`: the server of the
code-interpreter image variant, a Jupyter kernel with matplotlib, pandas and numpy). The first
call of a run starts the server in the run's sandbox and waits for its default kernel; every
call runs in that kernel, so a variable, an import or a loaded DataFrame of one call is there in
the next. A sandbox whose image has no kernel (the default ``callbox-sandbox`` image) gets a
``not_supported`` result naming the fix (the policy's ``[sandbox] image``).

The result text is what a notebook shows, in order: the cell's stdout and stderr as they
came, then each displayed value's text (``Out[N]:`` before the cell's own value), then, for a
cell that raised, its traceback (``is_error``, ``tool_failed``; ``structured["error"]`` has the
exception's name and value). A value's text is its ``text/plain`` (pandas' text table for a
DataFrame), else its markdown, else its HTML. A PNG or JPEG a cell displays (a matplotlib
figure: shown inline by the kernel, or by ``plt.show()``) is an image part of the result,
with its size read from its header.

A cell that runs past its timeout (``timeout_ms``, capped by the policy's ceiling) is
interrupted, as Jupyter's stop button does: the kernel and its state stay, the result is
``timed_out`` with what the cell printed before. The cell's stdout and stderr reach
``ToolContext.on_output`` as they come. A kernel that exits during a cell (out of
memory, ``os._exit``) is restarted at once, and the result says its state is gone.

The policy sees the code as the tool's command (``command_field``): ``[tools.python]`` rules
match the code text, with the decisions ``allow``, ``ask`` and ``deny`` as for ``shell``.
"""

from __future__ import annotations

import base64
import binascii
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from harness.core import images
from harness.core.calls import ErrorCode, ImagePart, ToolOutput
from harness.core.context import ToolContext
from harness.core.errors import AgentCallError, CallboxError
from harness.core.registry import Tool, ToolAnnotations, ToolDefinition
from harness.core.shaping import strip_terminal_codes
from harness.engine import code_interpreter
from harness.engine.agent_client import AgentClient
from harness.engine.image.variants import VARIANTS
from harness.tools.shell import agent_failure

KERNEL_IMAGE = VARIANTS["code-interpreter"].tag
SERVER_START_S = 30.0
"""How long the first call waits for the server to listen once started."""
KERNEL_START_S = 90.0
"""How long the first call waits for the default kernel to answer (a cold kernel imports a lot)."""
KEEP_CHARS = 2 << 20
"""Characters of a cell's text the tool holds (head and tail) before the harness bounds it to
the output budget; beyond, the middle is dropped and counted."""
KEEP_IMAGE_BYTES = 32 << 20
"""Bytes of images one cell's result holds; further images are counted, not kept."""
KERNEL_DIED = "KernelDied"
"""The error the server reports for a cell whose kernel exited (then the tool restarts it)."""
IMAGE_FIELDS = (("png", "image/png"), ("jpeg", "image/jpeg"))
"""The result fields that become image parts (what every model dialect can see)."""


class PythonArgs(BaseModel):
    """Run Python code in a stateful Jupyter kernel in the sandbox."""

    model_config = ConfigDict(extra="forbid")

    code: str = Field(min_length=1, description=(
        "The cell: Python code (IPython syntax: `!cmd`, `%magic`). Variables, imports and definitions "
        "stay for later calls. The value of the last line is shown; matplotlib figures come back as images."))
    timeout_ms: int | None = Field(
        default=None, ge=1, description="Interrupt the cell after this many milliseconds (capped by policy); "
        "the kernel and its state stay.")


# ---- the result (pure; tests/unit/test_python_kernel.py) ------------------------------------------


def image_part(field_name: str, encoded: Any, label: str) -> ImagePart | None:
    """The image part of a result's ``png`` or ``jpeg`` (base64), or None when it does not
    decode to an image of that kind."""
    media_type = dict(IMAGE_FIELDS)[field_name]
    if not isinstance(encoded, str):
        return None
    try:
        part = images.image_part(base64.b64decode(encoded, validate=False), label)
    except (binascii.Error, ValueError):  # NotAnImage is a ValueError
        return None
    return part if part.media_type == media_type else None


def value_text(result: dict[str, Any]) -> str:
    """What the model reads of one displayed value: its plain text, else markdown, else HTML,
    else a note of the formats it came in."""
    for name in ("text", "markdown", "html", "latex"):
        value = result.get(name)
        if isinstance(value, str) and value:
            return value
    kinds = [name for name in ("svg", "pdf", "json", "javascript") if result.get(name)]
    return f"[a value shown as {', '.join(kinds)}]" if kinds else ""


@dataclass
class Cell:
    """What one cell produced, as the server's events arrive. Of its text, at most ``keep``
    characters are held (a head and a tail, the middle counted in ``dropped``: a cell that
    prints without end costs bounded memory); of its images, at most ``keep_image_bytes``."""

    keep: int = KEEP_CHARS
    keep_image_bytes: int = KEEP_IMAGE_BYTES
    head: list[str] = field(default_factory=list)
    tail: deque[str] = field(default_factory=deque)
    head_chars: int = 0
    tail_chars: int = 0
    dropped: int = 0
    images: list[ImagePart] = field(default_factory=list)
    images_dropped: int = 0
    execution_count: int | None = None
    error: dict[str, str] | None = None
    finished: bool = False
    raw_bytes: int = 0
    _ends_line: bool = True

    def add(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind in ("stdout", "stderr"):
            text = str(event.get("text", ""))
            self.raw_bytes += len(text.encode())
            self._keep(text)
        elif kind == "number_of_executions":
            count = event.get("execution_count")
            self.execution_count = count if isinstance(count, int) else None
        elif kind == "result":
            self._result(event)
        elif kind == "error":
            self.error = {"name": str(event.get("name", "")), "value": str(event.get("value", ""))}
            traceback = str(event.get("traceback") or "")
            self.raw_bytes += len(traceback.encode())
            if self.error["name"] == KERNEL_DIED:  # the server's words name its own API's remedy
                self.say("The kernel exited during the cell.")
            else:
                self.say(traceback or f"{self.error['name']}: {self.error['value']}")
        elif kind == "end_of_execution":
            self.finished = True

    def _result(self, event: dict[str, Any]) -> None:
        label = f"Out[{self.execution_count}]" if self.execution_count is not None else "Out"
        shown = False
        for name, _ in IMAGE_FIELDS:
            if name in event:
                part = image_part(name, event[name], f"{label} ({len(self.images) + 1})")
                if part is None:
                    continue
                self.raw_bytes += len(part.data)
                if sum(len(kept.data) for kept in self.images) + len(part.data) > self.keep_image_bytes:
                    self.images_dropped += 1
                    continue
                self.images.append(part)
                shown = True
        text = value_text(event)
        if shown and text.startswith("<Figure"):
            text = f"{text} (image {len(self.images)})"
        if not text:
            return
        self.raw_bytes += len(text.encode())
        if event.get("is_main_result"):  # a table or other lines of their own keep their columns
            text = f"{label}:\n{text}" if "\n" in text else f"{label}: {text}"
        self.say(text)

    def say(self, text: str) -> None:
        """``text`` on lines of its own after what came before."""
        if not self._ends_line:
            self._keep("\n")
        self._keep(text if text.endswith("\n") else f"{text}\n")

    def _keep(self, text: str) -> None:
        if not text:
            return
        self._ends_line = text.endswith("\n")
        half = self.keep // 2
        if self.head_chars < half:
            taken = text[:half - self.head_chars]
            self.head.append(taken)
            self.head_chars += len(taken)
            text = text[len(taken):]
            if not text:
                return
        self.tail.append(text)
        self.tail_chars += len(text)
        while self.tail_chars > self.keep - half:
            excess = self.tail_chars - (self.keep - half)
            first = self.tail[0]
            if len(first) <= excess:
                self.tail.popleft()
                cut = len(first)
            else:
                self.tail[0] = first[excess:]
                cut = excess
            self.tail_chars -= cut
            self.dropped += cut

    def text(self) -> str:
        middle = f"\n[... {self.dropped} characters of output dropped ...]\n" if self.dropped else ""
        text = strip_terminal_codes("".join(self.head) + middle + "".join(self.tail)).rstrip("\n")
        if self.images_dropped:
            size = (f"{self.keep_image_bytes >> 20} MiB" if self.keep_image_bytes >= 1 << 20
                    else f"{self.keep_image_bytes} bytes")
            text += f"\n[{self.images_dropped} more image(s) not kept: a cell's images may hold {size}]"
        return text


def cell_output(cell: Cell, *, duration_ms: float, timed_out_after_ms: int | None = None,
                notes: tuple[str, ...] = ()) -> ToolOutput:
    """The result of a cell: its text (or ``(no output)``), its images, and the facts."""
    text = cell.text()
    error_code = None
    if timed_out_after_ms is not None:
        error_code = ErrorCode.TIMED_OUT
        interrupted = (f"The cell was interrupted after {timed_out_after_ms} milliseconds (its timeout); "
                       "the kernel and its variables stay.")
        text = f"{text}\n{interrupted}" if text else interrupted
    elif cell.error is not None:
        error_code = ErrorCode.TOOL_FAILED
    lines = [note for note in notes if note]
    body = text or "(no output)"
    return ToolOutput(
        text="\n".join([*lines, body]), is_error=error_code is not None, error=error_code,
        structured={"execution_count": cell.execution_count, "error": cell.error,
                    "timed_out": timed_out_after_ms is not None, "images": len(cell.images),
                    "images_dropped": cell.images_dropped, "dropped_chars": cell.dropped,
                    "duration_ms": round(duration_ms, 3)},
        raw_bytes=cell.raw_bytes, images=tuple(cell.images),
    )


def no_kernel(image: str) -> ToolOutput:
    """The result for a sandbox whose image has no kernel: what to change."""
    return ToolOutput(
        text=(f"The sandbox's image ({image or 'unknown'}) has no Python kernel: the python tool needs the "
              f"code-interpreter image. Set image = \"{KERNEL_IMAGE}\" in the policy's [sandbox] table "
              "(or pass --image to callbox call/run; build it with `callbox image build --variant "
              "code-interpreter`), or use the shell tool."),
        is_error=True, error=ErrorCode.NOT_SUPPORTED,
        structured={"image": image, "needs_image": KERNEL_IMAGE, "policy_key": "sandbox.image"})


# ---- the handler ------------------------------------------------------------------------------

_STARTING = tuple(threading.Lock() for _ in range(32))
"""Held while a sandbox's server starts (one of them per sandbox id: two calls of one run never
start two servers, and a process serving many runs keeps no lock per run)."""


def _start_lock(sandbox_id: str) -> threading.Lock:
    return _STARTING[zlib.crc32(sandbox_id.encode()) % len(_STARTING)]


def ensure_kernel(agent: AgentClient, sandbox_id: str, env: dict[str, str], workdir: str) -> bool:
    """Make sure the sandbox's server listens and its default kernel answers (starting the
    server on the run's first call); False when the image has no server. CallboxError when it
    does not come up."""
    if code_interpreter.listening(agent):
        return True
    with _start_lock(sandbox_id):
        if code_interpreter.listening(agent):
            return True
        if not code_interpreter.has_server(agent):
            return False
        pid = code_interpreter.start_server(agent, env, workdir)
        code_interpreter.wait_listening(agent, pid, SERVER_START_S)
        deadline = time.monotonic() + KERNEL_START_S
        while not code_interpreter.kernel_ready(agent):
            if not code_interpreter.server_alive(agent, pid):
                raise CallboxError("the code interpreter's server exited while its kernel started: "
                                   f"{code_interpreter.server_output(agent, pid)}")
            if time.monotonic() > deadline:
                raise CallboxError(f"the Python kernel did not start within {KERNEL_START_S:g} s")
            time.sleep(0.1)  # the server lists its default context once the kernel answers; nothing else to wait on
    return True


def run_python(ctx: ToolContext, args: PythonArgs) -> ToolOutput:
    timeout = ctx.call_timeout(args.timeout_ms / 1000 if args.timeout_ms else None, argument="timeout_ms",
                               unit_s=0.001)
    sandbox = ctx.provider.sandbox()
    runtime = sandbox.runtime()
    try:
        if not ensure_kernel(runtime.agent, runtime.sandbox_id, dict(runtime.env), runtime.workdir):
            return no_kernel(sandbox.spec.image)
    except AgentCallError as error:
        return agent_failure(error, started=False)
    except CallboxError as error:
        return ToolOutput(text=f"The Python kernel could not be started: {error}", is_error=True,
                          error=ErrorCode.SANDBOX_UNAVAILABLE, structured={"kernel_started": False})
    cell = Cell(keep=max(KEEP_CHARS, 2 * ctx.output_budget))
    started = time.monotonic()
    timed_out_after: int | None = None
    try:
        for event in code_interpreter.execute(runtime.agent, args.code, timeout_s=timeout.seconds):
            cell.add(event)
            if ctx.on_output is not None and event.get("type") in ("stdout", "stderr"):
                ctx.on_output(str(event["type"]), str(event.get("text", "")).encode())
    except code_interpreter.CellEnded as ended:
        if not ended.timed_out:
            return ToolOutput(text=f"The kernel refused the cell: {ended}", is_error=True,
                              error=ErrorCode.TOOL_FAILED, structured={"status": ended.status})
        timed_out_after = int((time.monotonic() - started) * 1000)
    except AgentCallError as error:
        return agent_failure(error, started=None)
    if cell.error is not None and cell.error["name"] == KERNEL_DIED:
        cell.say(_restarted(runtime.agent))
    return cell_output(cell, duration_ms=(time.monotonic() - started) * 1000, timed_out_after_ms=timed_out_after,
                       notes=(timeout.note(),))


def _restarted(agent: AgentClient) -> str:
    """Restart the default kernel after it died; the line that tells the model."""
    try:
        code_interpreter.restart_default_kernel(agent)
    except (CallboxError, AgentCallError) as error:
        return f"The kernel exited and could not be restarted ({error}); the next call may fail the same way."
    return ("The kernel exited (out of memory, or the cell ended its process) and has been restarted: "
            "the variables and imports of earlier calls are gone.")


PYTHON = Tool(
    ToolDefinition(
        name="python",
        description=(
            "Run Python code in a stateful Jupyter kernel in the sandbox (variables and imports persist "
            "between calls; numpy, pandas and matplotlib are installed). Returns stdout, stderr, the last "
            "expression's value, DataFrames as text tables, and matplotlib charts as PNG images."
        ),
        input_model=PythonArgs,
        annotations=ToolAnnotations(read_only=False, destructive=True, idempotent=False, open_world=False,
                                    title="Python (stateful kernel)"),
        command_field="code",
    ),
    run_python,
)
