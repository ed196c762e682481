"""A compact E2B program, run unchanged by every ``e2b`` SDK version of the version matrix
(:mod:`tests.interop.e2b_versions`), each in its own virtualenv: it imports only the SDK and
the standard library.

It points at a server with ``E2B_API_URL``, ``E2B_SANDBOX_URL`` and ``E2B_API_KEY`` and runs,
each step on its own so one failure does not hide the next: ``create`` (the SDK's default
options), ``commands.run``, files ``write``/``read``/``list``, ``watch_dir``, a ``pty``, and
``kill``, then ``agents_create``: a sandbox made with the create options the OpenAI Agents
SDK's E2B client sends by default (those this version's ``create`` takes, as that client
drops the others), a command in it, and its kill. When the default create is refused, the
rest runs on a sandbox made with ``allow_internet_access=False`` (older SDKs send ``true`` by
default). It prints one JSON object on stdout: the SDK's version and, per step, ``"ok"`` or
the first line of what went wrong (the exception's type and message).

With the argument ``code-interpreter`` it runs ``e2b_code_interpreter``'s steps instead
(:data:`INTERPRETER_STEPS`: its default ``create``, state kept across cells, an exception as
``error``, a matplotlib chart as PNG, a second context kept apart, ``kill``), and the report
names that package's version too.
"""

from __future__ import annotations

import base64
import inspect
import json
import sys
import threading
import time
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

from e2b import PtySize, Sandbox

FALLBACK = "create(allow_internet_access=False)"
STEPS = ("create", "commands.run", "files.write", "files.read", "files.list", "watch_dir", "pty", "kill",
         "agents_create")
AGENTS_OPTIONS: dict[str, Any] = {"secure": True, "allow_internet_access": True,
                                  "lifecycle": {"on_timeout": "pause", "auto_resume": True}}
"""The OpenAI Agents SDK's E2B client's defaults (``E2BSandboxClientOptions``)."""
INTERPRETER = "code-interpreter"
INTERPRETER_STEPS = ("create", "run_code", "error", "png", "context", "kill")
EVENT_TIMEOUT_S = 20.0
CELL_TIMEOUT_S = 120.0
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def stepper(results: dict[str, str]) -> Callable[[str, Callable[[], None]], None]:
    """``step(name, action)``: run ``action`` and record ``"ok"`` or the first line of its error."""

    def step(name: str, action: Callable[[], None]) -> None:
        try:
            action()
            results[name] = "ok"
        except Exception as error:  # a refusal of any kind is the result, not a crash
            text = f"{type(error).__name__}: {error}".strip().splitlines()
            results[name] = text[0][:300] if text else type(error).__name__

    return step


def main() -> None:
    results: dict[str, str] = {}
    step = stepper(results)
    box: list[Sandbox] = []
    step("create", lambda: box.append(Sandbox.create(timeout=120)))
    if not box:  # the rest is still measured, on a sandbox without the defaults that were refused
        step(FALLBACK, lambda: box.append(Sandbox.create(timeout=120, allow_internet_access=False)))
    if box:
        sandbox = box[0]
        try:
            step("commands.run", lambda: check(sandbox.commands.run("echo hi; whoami").stdout.split()[0] == "hi",
                                               "echo's output"))
            step("files.write", lambda: sandbox.files.write("notes/a.txt", "alpha\n") and None)
            step("files.read", lambda: check(sandbox.files.read("notes/a.txt") == "alpha\n", "the file's text"))
            step("files.list", lambda: check([e.name for e in sandbox.files.list("notes")] == ["a.txt"],
                                             "the listing"))
            step("watch_dir", lambda: watch(sandbox))
            step("pty", lambda: pty(sandbox))
        finally:
            step("kill", lambda: check(sandbox.kill() is True, "kill's answer"))
    step("agents_create", agents_create)
    for name in STEPS:
        results.setdefault(name, "not run")
    print(json.dumps({"version": version("e2b"), "results": results}))


def agents_create() -> None:
    taken = inspect.signature(Sandbox.create).parameters
    sandbox = Sandbox.create(timeout=120, metadata={"by": "agents"},
                             **{k: v for k, v in AGENTS_OPTIONS.items() if k in taken})
    try:
        check(sandbox.commands.run("echo agents").stdout == "agents\n", "echo's output")
    finally:
        check(sandbox.kill() is True, "kill's answer")


def interpreter_main() -> None:
    """``e2b_code_interpreter``'s steps (see the module docstring)."""
    from e2b_code_interpreter import Sandbox as CodeSandbox

    results: dict[str, str] = {}
    step = stepper(results)
    box: list[CodeSandbox] = []
    step("create", lambda: box.append(CodeSandbox.create(timeout=300)))
    if box:
        sandbox = box[0]
        try:
            step("run_code", lambda: cells(sandbox))
            step("error", lambda: error_cell(sandbox))
            step("png", lambda: png_cell(sandbox))
            step("context", lambda: context_cells(sandbox))
        finally:
            step("kill", lambda: check(sandbox.kill() is True, "kill's answer"))
    for name in INTERPRETER_STEPS:
        results.setdefault(name, "not run")
    print(json.dumps({"version": version("e2b"), "code_interpreter": version("e2b-code-interpreter"),
                      "results": results}))


def cells(sandbox: Any) -> None:
    first = sandbox.run_code("kept = 41\nprint('set')", timeout=CELL_TIMEOUT_S)
    check(first.error is None and first.logs.stdout == ["set\n"], f"first cell {first}")
    check(sandbox.run_code("kept + 1", timeout=CELL_TIMEOUT_S).text == "42", "state across cells")


def error_cell(sandbox: Any) -> None:
    failed = sandbox.run_code("1 / 0", timeout=CELL_TIMEOUT_S)
    check(failed.error is not None and failed.error.name == "ZeroDivisionError", f"error {failed.error}")


def png_cell(sandbox: Any) -> None:
    chart = sandbox.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2], [2, 1])\nplt.show()",
                             timeout=CELL_TIMEOUT_S)
    pngs = [base64.b64decode(r.png) for r in chart.results if r.png]
    check(len(pngs) == 1 and pngs[0].startswith(PNG_SIGNATURE), f"chart {chart}")


def context_cells(sandbox: Any) -> None:
    other = sandbox.create_code_context()
    try:
        sandbox.run_code("kept = 'other'", context=other, timeout=CELL_TIMEOUT_S)
        check(sandbox.run_code("kept", timeout=CELL_TIMEOUT_S).text == "41", "the default context's state")
    finally:
        sandbox.remove_code_context(other)


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(f"unexpected {what}")


def watch(sandbox: Sandbox) -> None:
    handle = sandbox.files.watch_dir("notes")
    try:
        sandbox.files.write("notes/b.txt", "beta\n")
        deadline = time.monotonic() + EVENT_TIMEOUT_S
        while time.monotonic() < deadline:
            if any(e.name == "b.txt" for e in handle.get_new_events()):
                return
            time.sleep(0.2)  # the SDK's watch is polled: get_new_events returns what arrived
        raise AssertionError("no event for notes/b.txt")
    finally:
        handle.stop()


def pty(sandbox: Sandbox) -> None:
    seen = bytearray()
    done = threading.Event()

    def on_data(data: bytes) -> None:
        seen.extend(data)
        if b"pty-ok" in seen:
            done.set()

    handle = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=0)
    waiter = threading.Thread(target=lambda: handle.wait(on_pty=on_data), daemon=True)
    waiter.start()
    try:
        sandbox.pty.send_stdin(handle.pid, b"echo pty-$((1+0))k | tr 1 o\n")
        check(done.wait(EVENT_TIMEOUT_S), "pty output")
    finally:
        sandbox.pty.kill(handle.pid)


if __name__ == "__main__":
    if sys.argv[1:] == [INTERPRETER]:
        interpreter_main()
    else:
        main()
