"""The E2B SDK (``e2b``, unmodified) and a sandbox's lifecycle on ``callbox serve --e2b``:
pause at the timeout, auto-resume, the paused TTL, shortening a timeout, stable paging.

One server for the module, its policy keeping a paused sandbox :data:`PAUSED_TTL_S` (so the
removal of one is seen within the module). The create options are those the OpenAI Agents
SDK's E2B client passes by default (``lifecycle`` pause on timeout with ``auto_resume``,
``secure``). The sandboxes whose clocks the tests wait on are all made at once, first
(:func:`timed`), so their waits overlap instead of adding up. Every sandbox is killed at the end; waits
poll the sandbox's state with a deadline.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from e2b import Sandbox, SandboxNotRunningException, SandboxQuery, SandboxState
from e2b.exceptions import NotFoundException

from tests.interop.e2b_server import E2bServer, policy_text, sdk_environment, serve_e2b

pytestmark = [pytest.mark.docker, pytest.mark.interop, pytest.mark.clock]  # its tests wait on the reaper

PAUSED_TTL_S = 20
"""The module's policy's ``sandbox.paused_ttl_seconds``."""
TIMEOUT_S = 10
"""The shortest timeout the server keeps a sandbox for."""
WAIT_S = 90.0
"""How long a test waits for the reaper (every 5 s) to pause or remove a sandbox."""
AGENTS_SDK_LIFECYCLE: Any = {"on_timeout": "pause", "auto_resume": True}
"""What the OpenAI Agents SDK's E2B client asks for by default."""
SUITE = f"e2b-lifecycle-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def server(engine: Any) -> Iterator[E2bServer]:
    with serve_e2b(engine, policy=policy_text(f"paused_ttl_seconds = {PAUSED_TTL_S}")) as served:
        yield served


@pytest.fixture
def sdk(server: E2bServer) -> Iterator[E2bServer]:
    with sdk_environment(server):
        yield server


def kill_quietly(*sandbox_ids: str) -> None:
    for sandbox_id in sandbox_ids:
        with contextlib.suppress(Exception):  # cleanup: gone already is fine
            Sandbox.kill(sandbox_id)


def wait_for(what: str, check: Callable[[], bool], deadline_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + deadline_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {deadline_s:.0f} s")
        time.sleep(0.5)


def state_of(sandbox_id: str) -> SandboxState | None:
    """The sandbox's state, None once it is gone."""
    try:
        return Sandbox.get_info(sandbox_id).state
    except NotFoundException:
        return None


@pytest.fixture(scope="module")
def timed(server: E2bServer) -> Iterator[dict[str, Any]]:
    """The sandboxes the timer tests watch, made together as the module starts, with what
    each was given before its timeout."""
    made: dict[str, Any] = {}
    with sdk_environment(server):
        try:
            made["resumes"] = Sandbox.create(timeout=TIMEOUT_S, secure=True, lifecycle=AGENTS_SDK_LIFECYCLE,
                                             metadata={"suite": SUITE})
            made["resumes"].files.write("/home/user/kept.txt", "still here\n")
            made["stays_paused"] = Sandbox.create(timeout=TIMEOUT_S, lifecycle={"on_timeout": "pause"},
                                                  metadata={"suite": SUITE})
            made["stays_paused"].files.write("/home/user/kept.txt", "kept\n")
            made["paused_ttl_started"] = time.monotonic()
            made["paused_ttl"] = Sandbox.create(timeout=TIMEOUT_S, lifecycle={"on_timeout": "pause"},
                                                metadata={"suite": SUITE})
            made["shortened"] = Sandbox.create(timeout=600, metadata={"suite": SUITE})
            made["shortened"].set_timeout(TIMEOUT_S)
            made["shortened_left"] = made["shortened"].get_info().end_at.timestamp() - time.time()
            yield made
        finally:
            kill_quietly(*(box.sandbox_id for box in made.values() if isinstance(box, Sandbox)))


def test_agents_sdk_defaults_pause_at_the_timeout_and_the_next_command_resumes(sdk: E2bServer,
                                                                               timed: dict[str, Any]) -> None:
    sandbox = timed["resumes"]
    info = sandbox.get_info()
    assert info.lifecycle == {"on_timeout": "pause", "auto_resume": True}
    wait_for("paused at its timeout", lambda: state_of(sandbox.sandbox_id) == SandboxState.PAUSED)

    result = sandbox.commands.run("cat /home/user/kept.txt")  # resumes it
    assert result.stdout == "still here\n"
    after = sandbox.get_info()
    assert after.state == SandboxState.RUNNING
    # A fresh timeout of at least five minutes (E2B's auto-resume), counted from the resume.
    assert after.end_at.timestamp() - time.time() > 200


def test_without_auto_resume_a_paused_sandbox_is_not_running_until_connect(sdk: E2bServer,
                                                                           timed: dict[str, Any]) -> None:
    sandbox = timed["stays_paused"]
    wait_for("paused at its timeout", lambda: state_of(sandbox.sandbox_id) == SandboxState.PAUSED)
    with pytest.raises(SandboxNotRunningException, match="paused"):
        sandbox.commands.run("true")
    assert state_of(sandbox.sandbox_id) == SandboxState.PAUSED
    resumed = Sandbox.connect(sandbox.sandbox_id, timeout=120)
    assert resumed.files.read("/home/user/kept.txt") == "kept\n"


def test_set_timeout_shortens_the_timeout(sdk: E2bServer, timed: dict[str, Any]) -> None:
    assert 0 < timed["shortened_left"] <= TIMEOUT_S + 1, timed["shortened_left"]
    wait_for("removed at its shortened timeout", lambda: state_of(timed["shortened"].sandbox_id) is None, 40)


def test_a_paused_sandbox_is_removed_after_the_paused_ttl(sdk: E2bServer, timed: dict[str, Any]) -> None:
    """Its sandbox was made with the others and paused meanwhile, well before its removal is due."""
    sandbox_id = timed["paused_ttl"].sandbox_id
    wait_for("paused at its timeout", lambda: state_of(sandbox_id) != SandboxState.RUNNING)
    assert state_of(sandbox_id) == SandboxState.PAUSED, "removed before its paused TTL"
    wait_for("removed after its paused TTL", lambda: state_of(sandbox_id) is None)
    # not before its timeout and then its paused TTL (less the reaper's period, twice)
    assert time.monotonic() - timed["paused_ttl_started"] >= TIMEOUT_S + PAUSED_TTL_S - 10


def test_paging_lists_each_sandbox_once_while_others_start_and_end(sdk: E2bServer) -> None:
    case = uuid.uuid4().hex[:8]
    made: list[str] = []
    try:
        for _ in range(3):
            made.append(Sandbox.create(timeout=120, metadata={"case": case}).sandbox_id)
        paginator = Sandbox.list(query=SandboxQuery(metadata={"case": case}), limit=1)
        seen: list[str] = []
        seen += [s.sandbox_id for s in paginator.next_items()]
        made.append(Sandbox.create(timeout=120, metadata={"case": case}).sandbox_id)  # starts while paging
        seen += [s.sandbox_id for s in paginator.next_items()]
        Sandbox.kill(made[3])  # the one that started ends while paging
        while paginator.has_next:
            seen += [s.sandbox_id for s in paginator.next_items()]
        assert seen[:3] == made[:3], (seen, made)
        assert len(seen) == len(set(seen)), seen
    finally:
        kill_quietly(*made)


def test_create_snapshot_create_from_it_list_delete_and_fork_into_three(sdk: E2bServer) -> None:
    source = Sandbox.create(timeout=300, metadata={"suite": SUITE})
    made = [source.sandbox_id]
    snapshot_id = ""
    try:
        source.files.write("/home/user/state.txt", "from the source\n")
        snapshot = source.create_snapshot()
        snapshot_id = snapshot.snapshot_id
        assert snapshot.names == [snapshot_id]
        source.files.write("/home/user/state.txt", "changed after the snapshot\n")

        restored = Sandbox.create(snapshot_id, timeout=120)
        made.append(restored.sandbox_id)
        assert restored.files.read("/home/user/state.txt") == "from the source\n"

        listed = [s.snapshot_id for s in Sandbox.list_snapshots().next_items()]
        assert snapshot_id in listed
        bob = sdk.keys["bob"]
        assert snapshot_id not in [s.snapshot_id for s in Sandbox.list_snapshots(api_key=bob).next_items()]
        assert Sandbox.delete_snapshot(snapshot_id, api_key=bob) is False  # another key's: not found

        forks = source.fork(count=3)
        assert len(forks) == 3
        for fork in forks:
            assert isinstance(fork, Sandbox), fork
            made.append(fork.sandbox_id)
            assert fork.files.read("/home/user/state.txt") == "changed after the snapshot\n"
        assert len({f.sandbox_id for f in forks} | {source.sandbox_id}) == 4

        assert Sandbox.delete_snapshot(snapshot_id) is True
        assert Sandbox.delete_snapshot(snapshot_id) is False
        assert snapshot_id not in [s.snapshot_id for s in Sandbox.list_snapshots().next_items()]
        snapshot_id = ""
    finally:
        if snapshot_id:
            Sandbox.delete_snapshot(snapshot_id)
        kill_quietly(*made)
