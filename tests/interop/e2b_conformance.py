"""A compact E2B program, run unchanged by every ``e2b`` SDK version of the version matrix
(:mod:`tests.interop.e2b_versions`), each in its own virtualenv: it imports only the SDK and
the standard library.

It points at a server with ``E2B_API_URL``, ``E2B_SANDBOX_URL`` and ``E2B_API_KEY`` and runs,
each step on its own so one failure does not hide the next: ``create`` (the SDK's default
options), ``commands.run``, files ``write``/``read``/``list``, ``watch_dir``, a ``pty``, and
``kill``. When the default create is refused, the rest runs on a sandbox made with
``allow_internet_access=False`` (older SDKs send ``true`` by default). It prints one JSON
object on stdout: the SDK's version and, per step, ``"ok"`` or the first line of what went
wrong (the exception's type and message).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from importlib.metadata import version

from e2b import PtySize, Sandbox

FALLBACK = "create(allow_internet_access=False)"
STEPS = ("create", "commands.run", "files.write", "files.read", "files.list", "watch_dir", "pty", "kill")
EVENT_TIMEOUT_S = 20.0


def main() -> None:
    results: dict[str, str] = {}

    def step(name: str, action: Callable[[], None]) -> None:
        try:
            action()
            results[name] = "ok"
        except Exception as error:  # a refusal of any kind is the result, not a crash
            text = f"{type(error).__name__}: {error}".strip().splitlines()
            results[name] = text[0][:300] if text else type(error).__name__

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
    for name in STEPS:
        results.setdefault(name, "not run")
    print(json.dumps({"version": version("e2b"), "results": results}))


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
    main()
