"""``callbox serve --e2b`` for the E2B SDK's interop tests, started as a user starts it.

:func:`serve_e2b` runs the .venv's ``callbox serve --e2b 127.0.0.1:0`` in a child process
with its own token file (two API keys, ``alice`` and ``bob``, in E2B's key format, mode 0600), its own audit
store and a policy on the test image, waits for the line announcing the server's URL (an
event with a deadline, never a sleep), and on exit stops it with SIGTERM and checks that it
exited cleanly and left no container behind.

The SDK finds the server the way any program written for E2B would: by ``E2B_API_URL``,
``E2B_SANDBOX_URL`` (both the server's URL) and ``E2B_API_KEY``, which it reads each time it
builds a connection (every ``Sandbox.create``/``connect``/``list``...), so setting them
before a call is enough (:func:`sdk_environment`; :meth:`E2bServer.child_env` for a child
process). A test that needs two keys at once passes ``api_key=`` to the call instead.

A test module uses the module-scoped fixture by importing it:
``from tests.interop.e2b_server import e2b_server_fixture  # noqa: F401`` and then asks for
``e2b_server``.
"""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IMAGE
from tests.interop.conftest import Served

URL_LINE = r"E2B API on (https?://[^\s/]+)"
"""The line ``callbox serve --e2b`` prints once it listens: ``callbox: E2B API on http://...``."""
SDK_VARIABLES = ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")
"""Exactly what a user of the SDK sets to point it at callbox."""
KEY_NAMES = ("alice", "bob")
STOP_TIMEOUT_S = 60


def policy_text(extra: str = "") -> str:
    """A policy on the test image, followed by ``extra`` TOML (rules a test needs)."""
    return f'[sandbox]\nimage = "{IMAGE}"\n' + (f"\n{extra.strip()}\n" if extra.strip() else "")


@dataclass
class E2bServer:
    """A running ``callbox serve --e2b``: its URL, its API keys by client name, its process."""

    url: str
    keys: dict[str, str]
    served: Served
    directory: Path
    log_lines: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.served.proc.pid

    @property
    def api_key(self) -> str:
        """The first client's key (``alice``): the one the SDK's environment carries."""
        return self.keys[KEY_NAMES[0]]

    def sdk_env(self, name: str = KEY_NAMES[0]) -> dict[str, str]:
        """The three variables a user sets, with client ``name``'s key."""
        return {"E2B_API_URL": self.url, "E2B_SANDBOX_URL": self.url, "E2B_API_KEY": self.keys[name]}

    def child_env(self, name: str = KEY_NAMES[0]) -> dict[str, str]:
        """An environment for a child process: this one without any other ``E2B_*``
        variable, plus :meth:`sdk_env`."""
        return {**without_e2b(os.environ), **self.sdk_env(name)}

    def log(self) -> str:
        """Everything the server wrote to stderr so far (for failure messages)."""
        self.log_lines.extend(self.served.seen)
        self.served.seen.clear()
        while True:
            try:
                line = self.served.lines.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.log_lines.append(line)
        return "".join(self.log_lines)


def without_e2b(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without ``E2B_*`` variables (``E2B_DEBUG``, ``E2B_DOMAIN``... would redirect the SDK)."""
    return {k: v for k, v in env.items() if not k.startswith("E2B_")}


@contextlib.contextmanager
def sdk_environment(server: E2bServer, name: str = KEY_NAMES[0]) -> Iterator[None]:
    """Within the block, this process's environment points the SDK at ``server`` with client
    ``name``'s key and has no other ``E2B_*`` variable; restored afterwards."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("E2B_")}
    for k in saved:
        del os.environ[k]
    os.environ.update(server.sdk_env(name))
    try:
        yield
    finally:
        for k in [k for k in os.environ if k.startswith("E2B_")]:
            del os.environ[k]
        os.environ.update(saved)


def owned_containers(engine: Any, pid: int) -> list[str]:
    """Ids of the callbox containers (running or not) whose owner label is process ``pid``."""
    containers = engine.client.api.containers(all=True, filters={"label": "callbox.managed=1"})
    return [str(c["Id"]) for c in containers if f"/{pid}/" in c["Labels"].get("callbox.owner", "")]


@contextlib.contextmanager
def serve_e2b(engine: Any, *, policy: str | None = None, args: tuple[str, ...] = (),
              after: E2bServer | None = None, port: int = 0) -> Iterator[E2bServer]:
    """``callbox serve --e2b 127.0.0.1:PORT`` (``port``, 0: a free one) with two API keys, its
    own audit store and ``policy`` (TOML; default :func:`policy_text`); ``args`` are added to
    the command line. ``engine`` (the tests' engine fixture) is what checks no container
    outlives the server.

    With ``after`` (a stopped server of :func:`keeping`), the server restarts it: the same
    address, keys, policy and audit store, so it adopts the sandboxes that one left."""
    if after is not None:
        directory, keys, listen = after.directory, after.keys, after.url.rsplit(":", 1)[1]
    else:
        directory = Path(tempfile.mkdtemp(prefix="cbx-e2b-", dir="/tmp"))
        # E2B's own key format (``e2b_`` and 40 hex digits): some SDK versions refuse any other.
        keys = {name: "e2b_" + secrets.token_hex(20) for name in KEY_NAMES}
        listen = str(port)
    tokens = directory / "tokens"
    tokens.write_text("".join(f"{name}:{key}\n" for name, key in keys.items()))
    tokens.chmod(0o600)
    policy_file = directory / "policy.toml"
    if after is None or policy is not None:
        policy_file.write_text(policy if policy is not None else policy_text())
    command = ["serve", "--e2b", f"127.0.0.1:{listen}", "--token-file", str(tokens), "--policy", str(policy_file),
               "--audit-db", str(directory / "audit.sqlite3"), *args]
    served = Served(command, without_e2b(os.environ))
    try:
        url = served.wait_for(URL_LINE)[1]
    except BaseException:  # it never started: the failure says why (its stderr), nothing to check
        served.stop()
        if after is None:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    server = E2bServer(url=url, keys=keys, served=served, directory=directory)
    try:
        yield server
    finally:
        served.stop()
        code = served.proc.returncode
        left = owned_containers(engine, served.proc.pid)
        log = server.log()
        if after is None:
            shutil.rmtree(directory, ignore_errors=True)
        assert not left, f"callbox serve --e2b left containers behind: {left}\n{log}"
        assert code == 0, f"callbox serve --e2b exited with {code} on SIGTERM:\n{log}"


@contextlib.contextmanager
def keeping(policy: str | None = None) -> Iterator[E2bServer]:
    """``callbox serve --e2b --config FILE`` whose ``[service] keep_sandboxes`` is on, as a
    service runs it: its sandboxes stay running at its stop for the next server on the same
    audit store (:func:`serve_e2b` ``after=`` it). The directory (tokens, policy, audit store)
    outlives it, removed when the block ends; the sandboxes are the test's to remove."""
    directory = Path(tempfile.mkdtemp(prefix="cbx-e2b-", dir="/tmp"))
    keys = {name: "e2b_" + secrets.token_hex(20) for name in KEY_NAMES}
    tokens = directory / "tokens"
    tokens.write_text("".join(f"{name}:{key}\n" for name, key in keys.items()))
    tokens.chmod(0o600)
    (directory / "policy.toml").write_text(policy if policy is not None else policy_text())
    config = directory / "callbox.toml"
    config.write_text("[service]\nkeep_sandboxes = true\n")
    command = ["serve", "--config", str(config), "--e2b", "127.0.0.1:0", "--token-file", str(tokens),
               "--policy", str(directory / "policy.toml"), "--audit-db", str(directory / "audit.sqlite3")]
    served = Served(command, without_e2b(os.environ))
    try:
        try:
            url = served.wait_for(URL_LINE)[1]
        except BaseException:
            served.stop()
            raise
        yield E2bServer(url=url, keys=keys, served=served, directory=directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


DENIED_COMMAND_REASON = "pushing changes leaves the sandbox"
"""The reason of the policy rule :data:`INTEROP_POLICY` denies ``git push`` commands with."""
INTEROP_POLICY = policy_text(f"""
[tools.shell]
[[tools.shell.rules]]
action = "deny"
command = "*git push*"
reason = "{DENIED_COMMAND_REASON}"
""")
"""The policy of the module-scoped server: the test image, ``git push`` denied."""


@pytest.fixture(scope="module", name="e2b_server")
def e2b_server_fixture(engine: Any) -> Iterator[E2bServer]:
    """One ``callbox serve --e2b`` per test module, with :data:`INTEROP_POLICY`."""
    with serve_e2b(engine, policy=INTEROP_POLICY) as server:
        yield server
