"""The E2B SDK (``e2b``, unmodified) running commands as ``user="root"``, as Harbor does.

Root commands run only where the policy sets ``[sandbox] root_commands = true``: on such a
server ``id -u`` as root prints 0 (and without a user 1000), a terminal as root is root too,
the server announced the loosening at start, and the audit record says the user. Under the
default policy the same call is refused naming the key and the fix. File operations as root
are refused either way, saying they act as the sandbox's user. One sandbox per server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from e2b import CommandExitException, PtySize, Sandbox, SandboxException

from harness.audit.store import AuditStore
from tests.interop.e2b_server import E2bServer, policy_text, sdk_environment, serve_e2b

pytestmark = [pytest.mark.docker, pytest.mark.interop]

KEY = "sandbox.root_commands"


@pytest.fixture(scope="module")
def root_server(engine: Any) -> Iterator[E2bServer]:
    with serve_e2b(engine, policy=policy_text("root_commands = true")) as served:
        yield served


@pytest.fixture(scope="module")
def root_sandbox(root_server: E2bServer) -> Iterator[Sandbox]:
    with sdk_environment(root_server):
        sandbox = Sandbox.create(timeout=120)
        try:
            yield sandbox
        finally:
            sandbox.kill()


def test_a_command_as_root_runs_as_uid_0_where_the_policy_allows_it(root_server: E2bServer,
                                                                      root_sandbox: Sandbox) -> None:
    with sdk_environment(root_server):
        assert root_sandbox.commands.run("id -u", user="root").stdout == "0\n"
        assert root_sandbox.commands.run("echo $HOME $USER", user="root").stdout == "/root root\n"
        assert root_sandbox.commands.run("id -u").stdout == "1000\n"
        assert root_sandbox.commands.run("id -u", user="user").stdout == "1000\n"
        with pytest.raises(CommandExitException) as caught:  # root, but the root filesystem is read-only
            root_sandbox.commands.run("touch /usr/bin/from-root", user="root")
        assert "Read-only file system" in caught.value.stderr
    assert f"loosens a hardened default: {KEY} = true" in root_server.log()
    with AuditStore(root_server.directory / "audit.sqlite3") as audit:
        calls = audit.calls_for_run(root_sandbox.sandbox_id)
    started = [json.loads(c["arguments"]) if isinstance(c["arguments"], str) else c["arguments"]
               for c in calls if c["tool"] == "sandbox.process"]
    users = [(a["command"], a.get("user")) for a in started]
    assert ("id -u", "root") in users and ("id -u", None) in users, users  # the record says who ran it


def test_a_terminal_as_root_is_root(root_server: E2bServer, root_sandbox: Sandbox) -> None:
    seen = bytearray()
    with sdk_environment(root_server):
        terminal = root_sandbox.pty.create(PtySize(rows=24, cols=80), user="root", timeout=60)
        try:
            root_sandbox.pty.send_stdin(terminal.pid, b"id -u; exit\n")
            terminal.wait(on_pty=seen.extend)
        except CommandExitException:
            pass  # bash's exit status after the terminal closes does not matter here
    screen = bytes(seen)
    assert b"root@" in screen and b"\r0\r\nlogout" in screen, screen


def test_files_as_root_are_refused_saying_they_act_as_the_sandbox_user(root_server: E2bServer,
                                                                         root_sandbox: Sandbox) -> None:
    with sdk_environment(root_server), pytest.raises(SandboxException) as caught:
        root_sandbox.files.write("/tmp/as-root.txt", "x", user="root")
    assert "never as root" in str(caught.value) and KEY in str(caught.value)


def test_a_command_as_root_is_refused_by_default_naming_the_key(engine: Any) -> None:
    with serve_e2b(engine, policy=policy_text()) as server, sdk_environment(server):
        sandbox = Sandbox.create(timeout=60)
        try:
            with pytest.raises(SandboxException) as caught:
                sandbox.commands.run("id -u", user="root")
            assert f"{KEY} = false" in str(caught.value) and "root_commands = true" in str(caught.value)
            assert sandbox.commands.run("id -u").stdout == "1000\n"
        finally:
            sandbox.kill()

