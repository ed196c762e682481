"""The E2B SDK's async API (``e2b.AsyncSandbox``, unmodified, from PyPI) against
``callbox serve --e2b``, as a program written for E2B uses it: it only has
``E2B_API_URL``, ``E2B_SANDBOX_URL`` and ``E2B_API_KEY`` set.

The core scenario, written from the SDK's documentation: create a sandbox with
environment variables and metadata; run a command in the foreground (its exit code, its
output through the callbacks and on the result, a non-zero exit raising
``CommandExitException``); start a command in the background, connect to it and kill it;
write, read and list files; kill the sandbox (``is_running`` then says False, a second kill
finds nothing). It runs once on its own, with the background command reached from a second
client (``AsyncSandbox.connect``), then for 20 sandboxes at once with ``asyncio.gather``:
each checks its own output and files, all are killed in ``finally``, and the server lists
none of them afterwards.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from e2b import AsyncSandbox, CommandExitException, SandboxQuery

from tests.interop.e2b_server import E2bServer, serve_e2b

pytestmark = [pytest.mark.docker, pytest.mark.interop]

CONCURRENT = 20
EVENT_TIMEOUT_S = 30.0
"""How long a test waits for something the server must send (output, an end event)."""
SCENARIO_TIMEOUT_S = 120.0
CROWD_TIMEOUT_S = 240.0
SANDBOX_TIMEOUT_S = 300
"""The sandboxes' own lifetime (``timeout=`` at create): longer than any test here."""

T = TypeVar("T")


async def within(seconds: float, awaitable: Awaitable[T], what: str) -> T:
    """``awaitable``'s result, or a failure naming what never came."""
    try:
        return await asyncio.wait_for(awaitable, seconds)
    except TimeoutError:
        raise AssertionError(f"{what}: nothing within {seconds:g} s") from None


def collector(into: list[str], seen: asyncio.Event, needle: str) -> Callable[[str], None]:
    """An ``on_stdout``/``on_stderr`` callback keeping every chunk; ``seen`` is set once the
    text so far contains ``needle``."""
    def on_output(chunk: str) -> None:
        into.append(chunk)
        if needle in "".join(into):
            seen.set()
    return on_output


async def core_scenario(n: int, run: str, created: list[AsyncSandbox], *, second_client: bool) -> str:
    """The scenario in sandbox number ``n`` of test run ``run``; returns the sandbox's id.
    The sandbox is appended to ``created`` as soon as it exists (the caller kills it)."""
    greeting = f"hello-{n}-{run}"
    sandbox = await AsyncSandbox.create(envs={"GREETING": greeting}, metadata={"run": run, "n": str(n)},
                                        timeout=SANDBOX_TIMEOUT_S)
    created.append(sandbox)
    info = await sandbox.get_info()
    assert info.sandbox_id == sandbox.sandbox_id
    assert info.metadata.get("run") == run and info.metadata.get("n") == str(n), info.metadata

    # Foreground: the sandbox's envs and the command's own, output by callback and on the result.
    out: list[str] = []
    err: list[str] = []
    result = await sandbox.commands.run(f'echo "$GREETING $EXTRA"; echo "to-stderr-{n}" >&2',
                                        envs={"EXTRA": f"extra-{n}"},
                                        on_stdout=out.append, on_stderr=err.append)
    assert result.exit_code == 0
    assert result.stdout == f"{greeting} extra-{n}\n"
    assert result.stderr == f"to-stderr-{n}\n"
    assert "".join(out) == result.stdout and "".join(err) == result.stderr

    with pytest.raises(CommandExitException) as failed:
        await sandbox.commands.run(f'echo "partial-{n}"; echo "failing-{n}" >&2; exit 3')
    assert failed.value.exit_code == 3
    assert failed.value.stdout == f"partial-{n}\n"
    assert failed.value.stderr == f"failing-{n}\n"

    # Background: a command that keeps printing; connect to it (from a second client when
    # asked), see its new output arrive, kill it, and both handles see it end.
    started = await sandbox.commands.run(f'while true; do echo "tick-{n}"; sleep 0.1; done', background=True)
    listed = await sandbox.commands.list()
    assert started.pid in [p.pid for p in listed], listed
    viewer = await AsyncSandbox.connect(sandbox.sandbox_id) if second_client else sandbox
    ticks: list[str] = []
    ticking = asyncio.Event()
    connected = await viewer.commands.connect(started.pid, on_stdout=collector(ticks, ticking, f"tick-{n}\n"))
    await within(EVENT_TIMEOUT_S, ticking.wait(), f"output of background command {started.pid} after connect")
    assert await viewer.commands.kill(started.pid) is True
    for handle in (connected, started):
        with pytest.raises(CommandExitException) as ended:
            await within(EVENT_TIMEOUT_S, handle.wait(), f"end of killed command {started.pid}")
        assert ended.value.exit_code != 0
    assert started.pid not in [p.pid for p in await sandbox.commands.list()]
    assert await sandbox.commands.kill(started.pid) is False  # gone: the SDK's "not found"

    # Files: write (creating the directory), read back as text and as bytes, list.
    folder = f"/workspace/async-{n}"
    text = f"notes of sandbox {n}\n{greeting}\n"
    blob = os.urandom(256 * 1024)
    written = await sandbox.files.write(f"{folder}/notes.txt", text)
    assert written.path == f"{folder}/notes.txt" and written.name == "notes.txt"
    await sandbox.files.write(f"{folder}/blob.bin", blob)
    assert await sandbox.files.read(f"{folder}/notes.txt") == text
    assert bytes(await sandbox.files.read(f"{folder}/blob.bin", format="bytes")) == blob
    entries = {entry.name: entry for entry in await sandbox.files.list(folder)}
    assert set(entries) == {"notes.txt", "blob.bin"}, entries
    assert entries["blob.bin"].size == len(blob)
    assert entries["notes.txt"].path == f"{folder}/notes.txt"
    # A command sees the file the SDK wrote, and this sandbox holds no other sandbox's folder.
    assert (await sandbox.commands.run(f"cat {folder}/notes.txt")).stdout == text
    ours = [entry.name for entry in await sandbox.files.list("/workspace") if entry.name.startswith("async-")]
    assert ours == [f"async-{n}"], ours

    assert await sandbox.is_running() is True
    assert await sandbox.kill() is True
    assert await sandbox.is_running() is False  # as the SDK's docstring shows
    assert await AsyncSandbox.kill(sandbox.sandbox_id) is False  # already gone
    return sandbox.sandbox_id


async def kill_all(sandboxes: list[AsyncSandbox]) -> None:
    """Kill every sandbox (a scenario that finished has killed its own: False then)."""
    outcomes = await asyncio.gather(*(s.kill() for s in sandboxes), return_exceptions=True)
    failures = [(s.sandbox_id, o) for s, o in zip(sandboxes, outcomes, strict=True) if isinstance(o, BaseException)]
    assert not failures, f"could not kill: {failures}"


async def live_of_run(run: str) -> list[str]:
    """Ids of the sandboxes this API key still has with ``run`` in their metadata."""
    paginator = AsyncSandbox.list(query=SandboxQuery(metadata={"run": run}))
    found: list[str] = []
    while paginator.has_next:
        found.extend(info.sandbox_id for info in await paginator.next_items())
    return found


async def crowd(run: str, count: int) -> list[str]:
    created: list[AsyncSandbox] = []
    try:
        outcomes = await within(CROWD_TIMEOUT_S, asyncio.gather(
            *(core_scenario(n, run, created, second_client=False) for n in range(count)),
            return_exceptions=True), f"{count} concurrent scenarios")
    finally:
        await kill_all(created)
    failures = [(n, repr(o)) for n, o in enumerate(outcomes) if isinstance(o, BaseException)]
    assert not failures, f"{len(failures)} of {count} scenarios failed: {failures}"
    return [o for o in outcomes if isinstance(o, str)]


async def single(run: str) -> str:
    created: list[AsyncSandbox] = []
    try:
        return await within(SCENARIO_TIMEOUT_S, core_scenario(0, run, created, second_client=True), "the scenario")
    finally:
        await kill_all(created)


@pytest.fixture(scope="module")
def e2b_server(engine: Any) -> Iterator[E2bServer]:
    """One ``callbox serve --e2b`` for this module, allowing one client the 20 sandboxes at once
    (the server's default is 16 per client)."""
    with serve_e2b(engine, args=("--max-per-client", str(CONCURRENT + 4))) as server:
        yield server


@pytest.fixture
def e2b_sdk(e2b_server: E2bServer, monkeypatch: pytest.MonkeyPatch) -> E2bServer:
    """The SDK pointed at the server by its three environment variables (the first API key),
    and by nothing else: no other ``E2B_*`` variable of the test's environment."""
    for name in [name for name in os.environ if name.startswith("E2B_")]:
        monkeypatch.delenv(name)
    for name, value in e2b_server.sdk_env().items():
        monkeypatch.setenv(name, value)
    return e2b_server


def test_async_core_scenario(e2b_sdk: E2bServer) -> None:
    run = uuid.uuid4().hex[:12]
    sandbox_id = asyncio.run(single(run))
    assert sandbox_id
    assert asyncio.run(live_of_run(run)) == []


def test_async_twenty_sandboxes_at_once(e2b_sdk: E2bServer) -> None:
    run = uuid.uuid4().hex[:12]
    ids = asyncio.run(crowd(run, CONCURRENT))
    assert len(set(ids)) == CONCURRENT, ids
    assert asyncio.run(live_of_run(run)) == [], "sandboxes still live after every scenario killed its own"
