"""An E2B program for the sandbox domain over TLS (tests/interop/test_e2b_tls_domain.py), run
unchanged by an old SDK in its own virtualenv: it imports only the SDK and the standard library.

The SDKs it runs with reach envd (``e2b`` 2.3.4 to 2.6.4) or the kernel (``e2b_code_interpreter``
before 2.10.4) only at ``https://PORT-SANDBOXID.DOMAIN``, DOMAIN being the create answer's
``domain``. The test runs it in a mount namespace of its own whose ``/etc/hosts`` is the test's
file (``CALLBOX_TEST_HOSTS``), the stand-in for a wildcard DNS record: once the create names
the sandbox, the program maps that sandbox's two names to the server's address in it (after
checking that ``/etc/hosts`` is that file, so it never writes the machine's own).

Newer SDKs (2.63.0) send envd's calls through ``pyqwest`` (Rust's reqwest), whose resolver
reads ``/etc/hosts`` once, when the program starts: for them the test creates the sandbox in
one run (``create``: it prints the sandbox's id, and leaves it running) and, once the names are
in the file, connects to it in another (``connect``: ``Sandbox.connect`` to
``CALLBOX_TEST_SANDBOX``).

``python tls_domain_program.py commands|code-interpreter|create|connect``;
``CALLBOX_TEST_DOMAIN`` is the domain the server is expected to answer. It prints one JSON
object on stdout: the versions and, per step, ``"ok"`` or the first line of what went wrong
(``create``: the sandbox's id).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

HOSTS = "/etc/hosts"
COMMANDS = "commands"
CODE_INTERPRETER = "code-interpreter"
CREATE = "create"
CONNECT = "connect"
STEPS = {COMMANDS: ("create", "domain", "commands.run", "kill"),
         CODE_INTERPRETER: ("create", "domain", "run_code", "kill"),
         CONNECT: ("connect", "domain", "commands.run", "kill")}
SERVER_ADDRESS = "127.0.0.1"
CELL_TIMEOUT_S = 120.0


def main(mode: str) -> None:
    results: dict[str, str] = {}

    def step(name: str, action: Callable[[], None]) -> None:
        try:
            action()
            results[name] = "ok"
        except Exception as error:  # a refusal of any kind is the result, not a crash
            text = f"{type(error).__name__}: {error}".strip().splitlines()
            results[name] = text[0][:400] if text else type(error).__name__

    if mode == CODE_INTERPRETER:
        from e2b_code_interpreter import Sandbox
    else:
        from e2b import Sandbox
    if mode == CREATE:
        print(json.dumps({"sandbox_id": Sandbox.create(timeout=300).sandbox_id}))
        return
    box: list[Any] = []
    if mode == CONNECT:
        step("connect", lambda: box.append(Sandbox.connect(os.environ["CALLBOX_TEST_SANDBOX"])))
    else:
        step("create", lambda: box.append(Sandbox.create(timeout=300)))
    if box:
        sandbox = box[0]
        try:
            step("domain", lambda: answered_domain(sandbox, add_names=mode != CONNECT))
            if mode == CODE_INTERPRETER:
                step("run_code", lambda: cells(sandbox))
            else:
                step("commands.run", lambda: check(sandbox.commands.run("echo hi").stdout == "hi\n", "echo's output"))
        finally:
            step("kill", lambda: check(sandbox.kill() is True, "kill's answer"))
    for name in STEPS[mode]:
        results.setdefault(name, "not run")
    print(json.dumps({"e2b": version("e2b"), "code_interpreter": interpreter_version(), "results": results}))


def answered_domain(sandbox: Any, *, add_names: bool) -> None:
    """The create (or connect) answered the expected domain, ``get_host`` names the server;
    then, with ``add_names``, this sandbox's names lead to the server (the wildcard record's
    stand-in)."""
    domain = os.environ["CALLBOX_TEST_DOMAIN"]
    check(sandbox.sandbox_domain == domain, f"sandbox domain {sandbox.sandbox_domain!r}")
    host = sandbox.get_host(49999)
    check(host == f"49999-{sandbox.sandbox_id}.{domain}", f"get_host(49999) {host!r}")
    if add_names:
        add_host_names(sandbox.sandbox_id, domain)


def add_host_names(sandbox_id: str, domain: str) -> None:
    """Map the sandbox's envd and kernel names to the server in ``/etc/hosts``, once it is
    sure to be the test's file."""
    name = domain.rsplit(":", 1)[0]
    if not os.path.samestat(os.stat(HOSTS), os.stat(os.environ["CALLBOX_TEST_HOSTS"])):
        raise RuntimeError(f"{HOSTS} is not the test's hosts file: not in the test's mount namespace")
    with open(HOSTS, "a", encoding="ascii") as hosts:
        hosts.write(host_line(sandbox_id, name))


def host_line(sandbox_id: str, name: str) -> str:
    """The ``/etc/hosts`` line that maps sandbox ``sandbox_id``'s names under ``name`` to the server."""
    return f"{SERVER_ADDRESS} 49983-{sandbox_id}.{name} 49999-{sandbox_id}.{name}\n"


def cells(sandbox: Any) -> None:
    first = sandbox.run_code("kept = 41\nprint('set')", timeout=CELL_TIMEOUT_S)
    check(first.error is None and first.logs.stdout == ["set\n"], f"first cell {first}")
    check(sandbox.run_code("kept + 1", timeout=CELL_TIMEOUT_S).text == "42", "state across cells")


def interpreter_version() -> str | None:
    try:
        return version("e2b-code-interpreter")
    except PackageNotFoundError:
        return None


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(f"unexpected {what}")


if __name__ == "__main__":
    main(sys.argv[1])
