"""``kind = "python"``: call ``module:function`` from a read-only mounted directory, in the
sandbox's own interpreter.

The call runs ``python3 -P -c RUNNER PATH MODULE:FUNCTION`` (argv form, no shell; ``-P``: no
working directory on ``sys.path``, so a file the model wrote there cannot shadow a module),
with the validated arguments as a JSON object on stdin. :data:`RUNNER` is a stdlib-only
script: it puts ``PATH`` first on ``sys.path``, imports the function, calls it with the
arguments as keyword arguments (an optional argument the call left out is not passed, so
the function's own default applies), and writes one JSON envelope to the original stdout.
While the function runs, file descriptor 1 points at stderr, so whatever it prints (or a
child process writes) cannot corrupt the envelope.

Results:

* a ``str`` return value is the result text;
* any other JSON-able value is the result text as JSON and its structured content (a dict
  as it is, anything else as ``{"result": value}``, MCP's convention);
* an exception (``SystemExit`` too) is ``tool_failed`` with the traceback's last lines;
  a value that is not JSON-able likewise;
* a timeout is ``timed_out`` (the whole process group is killed in the sandbox), an OOM
  kill ``oom_killed``; a process that died without an envelope is ``tool_failed`` with its
  exit code and the tail of what it wrote to stderr.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from harness.core.calls import ErrorCode, ToolOutput
from harness.core.context import ToolContext
from harness.core.declared import DeclaredTool
from harness.core.registry import Tool
from harness.engine.exec_result import ExecResult
from harness.tools.declared.running import definition_for, run_argv
from harness.tools.shell import NotRan, agent_failure

__all__ = ["RUNNER", "TRACEBACK_LINES", "python_tool"]

TRACEBACK_LINES = 12
"""Lines of a traceback (its end) an error result shows."""
_STDERR_TAIL = 2000

RUNNER = r"""
import importlib, json, os, sys, traceback
out = os.fdopen(os.dup(1), "w", encoding="utf-8")
os.dup2(2, 1)
path, spec = sys.argv[1], sys.argv[2]
module_name, _, function_name = spec.partition(":")
sys.path.insert(0, path)
def run():
    try:
        args = json.loads(sys.stdin.buffer.read() or b"{}")
        function = getattr(importlib.import_module(module_name), function_name)
        value = function(**args)
    except BaseException as exc:
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        return {"ok": False, "error": "".join(traceback.format_exception_only(type(exc), exc)).strip(),
                "traceback": "".join(traceback.format_exception(type(exc), exc, tb))}
    if isinstance(value, str):
        return {"ok": True, "text": value}
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return {"ok": False, "error": "the function returned a %s, which is not JSON-able (%s); return a str, "
                "a number, a bool, None, or lists and dicts of those" % (type(value).__name__, exc)}
    return {"ok": True, "value": value}
envelope = run()
sys.stdout.flush()
sys.stderr.flush()
out.write(json.dumps(envelope, ensure_ascii=False, allow_nan=False))
out.flush()
"""


def python_tool(declared: DeclaredTool) -> Tool:
    """The registered tool of one ``kind = "python"`` table."""
    function = declared.function or ""
    argv = ("python3", "-P", "-c", RUNNER, declared.path or "/", function)

    def handler(ctx: ToolContext, args: BaseModel) -> ToolOutput:
        given = {k: v for k, v in args.model_dump(mode="json").items() if v is not None}
        ran = run_argv(ctx, argv, env=declared.env, timeout_s=declared.timeout_s,
                       stdin=json.dumps(given).encode(), streamed=("stderr",))
        if isinstance(ran, NotRan):
            return agent_failure(ran.error, started=ran.started)
        return _output(function, ran.result)

    return Tool(definition_for(declared), handler)


def _stderr_tail(result: ExecResult) -> str:
    text = result.stderr.data().decode("utf-8", errors="replace").strip()
    return text[-_STDERR_TAIL:]


def _output(function: str, result: ExecResult) -> ToolOutput:
    raw = result.stdout.total_bytes + result.stderr.total_bytes
    facts: dict[str, Any] = {"exit_code": result.shell_exit_code, "timed_out": result.timed_out,
                             "oom_killed": result.oom_killed, "duration_ms": round(result.duration_ms, 3)}
    if result.timed_out or result.oom_killed:
        what = (f"timed out after {int(result.duration_ms)} milliseconds" if result.timed_out
                else "was killed by the out-of-memory killer (sandbox memory limit)")
        tail = _stderr_tail(result)
        return ToolOutput(text=f"{function} {what}" + (f"\nstderr:\n{tail}" if tail else ""), is_error=True,
                          error=ErrorCode.TIMED_OUT if result.timed_out else ErrorCode.OOM_KILLED,
                          structured=facts, raw_bytes=raw)
    envelope = _envelope(result)
    if envelope is None:
        tail = _stderr_tail(result)
        why = ("its result was larger than the sandbox's output cap" if result.stdout.truncated
               else f"it exited with code {result.shell_exit_code} without a result")
        return ToolOutput(text=f"{function} failed: {why}" + (f"\nstderr:\n{tail}" if tail else ""),
                          is_error=True, error=ErrorCode.TOOL_FAILED, structured=facts, raw_bytes=raw)
    if not envelope.get("ok"):
        lines = str(envelope.get("traceback") or envelope.get("error") or "").rstrip("\n").splitlines()
        shown = "\n".join(lines[-TRACEBACK_LINES:])
        return ToolOutput(text=f"{function} raised an exception:\n{shown}", is_error=True,
                          error=ErrorCode.TOOL_FAILED, structured={**facts, "error": envelope.get("error")},
                          raw_bytes=raw)
    if "text" in envelope:
        return ToolOutput(text=str(envelope["text"]), raw_bytes=raw)
    value = envelope.get("value")
    structured = value if isinstance(value, dict) else {"result": value}
    return ToolOutput(text=json.dumps(value, ensure_ascii=False), structured=structured, raw_bytes=raw)


def _envelope(result: ExecResult) -> dict[str, Any] | None:
    if result.stdout.truncated or result.exit_code != 0:
        return None
    try:
        envelope = json.loads(result.stdout.data())
    except ValueError:
        return None
    return envelope if isinstance(envelope, dict) else None
