"""The E2B SDK (``e2b``, unmodified) running commands as ``user="root"``, as Harbor does.

Root commands run only where the policy sets ``[sandbox] root_commands = true``: on such a
server ``id -u`` as root prints 0 (and without a user 1000), a terminal as root is root too,
the server announced the loosening at start, and the audit record says the user. Under the
default policy the same call is refused naming the key and the fix. File operations as root
(what Inspect's ``inspect-sandboxes`` sends for every one) are served there as the sandbox's
user's, in its places and with its permissions, their audit records saying root; where that
user may not write the refusal says whose rights they had, and what only root may read is read
with root's rights (a root command's, no more). Under the default policy they are
refused naming the key. One sandbox per server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from e2b import CommandExitException, FileNotFoundException, FileType, PtySize, Sandbox, SandboxException

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


def test_files_as_root_are_served_as_the_sandbox_user_where_root_commands_are_allowed(
        root_server: E2bServer, root_sandbox: Sandbox) -> None:
    with sdk_environment(root_server):  # Inspect's read_file/write_file and its stdin file, as root
        root_sandbox.files.write("/tmp/inspect-stdin", "from inspect\n", user="root")
        root_sandbox.files.write("notes/as-root.txt", b"bytes\n", user="root")  # relative: the home directory
        info = root_sandbox.files.get_info("/tmp/inspect-stdin", user="root")
        assert (info.type, info.owner) == (FileType.FILE, "user"), info  # written with the sandbox user's rights
        assert root_sandbox.files.read("/tmp/inspect-stdin", user="root") == "from inspect\n"
        assert root_sandbox.files.read("/home/user/notes/as-root.txt", format="bytes", user="root") == b"bytes\n"
        assert root_sandbox.commands.run("cat /tmp/inspect-stdin", user="root").stdout == "from inspect\n"
        # What only root may read (Harbor's build-time record of a template's environment,
        # root's and 0600) is read with root's rights, as a root command could; outside the
        # sandbox user's places too.
        root_sandbox.commands.run("umask 077; echo secret > /tmp/root-only", user="root")
        assert root_sandbox.files.read("/tmp/root-only", user="root") == "secret\n"
        assert root_sandbox.files.read("/etc/hostname", user="root").strip()
        with pytest.raises(FileNotFoundException):
            root_sandbox.files.read("/var/lib/no-such-file", user="root")
        # Root has no CAP_DAC_OVERRIDE: another uid's private file stays unreadable, saying so.
        root_sandbox.commands.run("python3 -c \"import os; os.setgid(4321); os.setuid(4321); os.umask(0o77); "
                                  "open('/tmp/theirs', 'w').write('x')\"", user="root")
        with pytest.raises(SandboxException, match=r"read as root: cat: /tmp/theirs: Permission denied"):
            root_sandbox.files.read("/tmp/theirs", user="root")
        with pytest.raises(SandboxException) as outside:  # writes stay the sandbox user's: not in its places
            root_sandbox.files.write("/etc/planted", "x", user="root")
        with pytest.raises(SandboxException) as private:  # nor with its rights
            root_sandbox.files.write("/tmp/root-only", "x", user="root")
    for refusal in (private.value, outside.value):
        assert "served as the sandbox's user 'user'" in str(refusal), refusal
    with AuditStore(root_server.directory / "audit.sqlite3") as audit:
        calls = audit.calls_for_run(root_sandbox.sandbox_id)
    copies = [(c["tool"], args.get("path"), args.get("user")) for c in calls if c["tool"].startswith("sandbox.copy")
              for args in [json.loads(c["arguments"]) if isinstance(c["arguments"], str) else c["arguments"]]]
    assert ("sandbox.copy_in", "/tmp/inspect-stdin", "root") in copies, copies  # the record says who asked
    assert ("sandbox.copy_out", "/tmp/inspect-stdin", "root") in copies, copies
    assert ("sandbox.copy_out", "/tmp/root-only", "root") in copies, copies


def test_a_command_as_root_is_refused_by_default_naming_the_key(engine: Any) -> None:
    with serve_e2b(engine, policy=policy_text()) as server, sdk_environment(server):
        sandbox = Sandbox.create(timeout=60)
        try:
            with pytest.raises(SandboxException) as caught:
                sandbox.commands.run("id -u", user="root")
            assert f"{KEY} = false" in str(caught.value) and "root_commands = true" in str(caught.value)
            assert sandbox.commands.run("id -u").stdout == "1000\n"
            with pytest.raises(SandboxException) as files:
                sandbox.files.write("/tmp/as-root.txt", "x", user="root")
            assert f"{KEY} = false" in str(files.value) and not sandbox.files.exists("/tmp/as-root.txt")
        finally:
            sandbox.kill()

