"""The E2B SDK (``e2b`` from PyPI, unmodified, its sync API) against ``callbox serve --e2b``.

Written from the SDK's documentation (its docstrings, README and e2b.dev's Python docs), as a
program written for E2B uses it: the SDK only has ``E2B_API_URL``, ``E2B_SANDBOX_URL`` and
``E2B_API_KEY`` set. One server per module (see ``tests/interop/e2b_server.py``); read-only
checks of commands and files share one sandbox, and what changes a sandbox's life (kill,
pause, timeouts, another API key, expiry) gets a sandbox of its own. Every sandbox a test
creates is killed in ``finally``.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, TypeVar

import pytest
from e2b import (
    AuthenticationException,
    CommandExitException,
    FileNotFoundException,
    FilesystemEventType,
    FileType,
    NotFoundException,
    PtySize,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
)

from tests.interop.e2b_server import (
    DENIED_COMMAND_REASON,
    E2bServer,
    e2b_server_fixture,  # noqa: F401 - the module-scoped ``e2b_server`` fixture
    owned_containers,
    sdk_environment,
)

pytestmark = [pytest.mark.docker, pytest.mark.interop]

EVENT_TIMEOUT_S = 30.0
"""How long a test waits for something the server must send (output, an end, an event)."""
SANDBOX_TIMEOUT_S = 600
"""The lifetime (``timeout=``) of sandboxes that must outlive the module."""
SUITE = f"e2b-sdk-{uuid.uuid4().hex[:8]}"
"""Metadata every sandbox of this module carries, so listings can be told apart from others'."""
ENVS = {"GREETING": "hello from envs", "SECOND": "two words"}
EXPIRY_TIMEOUT_S = 10
"""The shortest sandbox timeout the server keeps (seconds): the engine's minimum."""
EXPIRY_SLACK_S = 20.0
"""How long after its timeout an abandoned sandbox may still be listed (the reaper's period)."""
EXAMPLE = Path(__file__).with_name("e2b_example.py")

T = TypeVar("T")


# ---- helpers -------------------------------------------------------------------------------------


class Outcome(Generic[T]):
    """``target()`` run in a daemon thread: its result or its exception, waited for with a deadline."""

    def __init__(self, target: Callable[[], T]) -> None:
        self._target = target
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._target()
        except BaseException as exc:  # handed to the test
            self._error = exc

    def join(self, what: str, timeout: float = EVENT_TIMEOUT_S) -> tuple[T | None, BaseException | None]:
        """(result, None) or (None, exception); fails the test naming ``what`` when it does not end."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"{what}: still running after {timeout:g} s"
        return self._value, self._error


class Collector:
    """Output chunks (str, or a PTY's bytes) as callbacks deliver them; a test waits until
    the text so far contains what it expects."""

    def __init__(self) -> None:
        self._chunks: list[str] = []
        self._changed = threading.Condition()

    def __call__(self, chunk: str | bytes) -> None:
        with self._changed:
            self._chunks.append(chunk.decode(errors="replace") if isinstance(chunk, bytes) else chunk)
            self._changed.notify_all()

    @property
    def text(self) -> str:
        with self._changed:
            return "".join(self._chunks)

    def wait_for(self, needle: str, timeout: float = EVENT_TIMEOUT_S) -> None:
        with self._changed:
            ok = self._changed.wait_for(lambda: needle in "".join(self._chunks), timeout)
            assert ok, f"no {needle!r} in the output within {timeout:g} s: {''.join(self._chunks)!r}"


def kill_quietly(sandbox_id: str, api_key: str | None = None) -> None:
    """Cleanup: kill a sandbox a test created, whatever state the test left it in."""
    try:
        Sandbox.kill(sandbox_id, api_key=api_key)
    except Exception as exc:  # cleanup never hides the test's own failure
        print(f"cleanup: killing {sandbox_id} failed: {exc!r}", file=sys.stderr)


def listed_ids(query: SandboxQuery | None = None, api_key: str | None = None, limit: int | None = None,
               pages: list[int] | None = None) -> list[str]:
    """The ids of every sandbox ``Sandbox.list`` returns for ``query`` (with ``api_key``, or the
    environment's; ``limit`` per page), over all its pages; ``pages`` gets each page's size."""
    paginator = Sandbox.list(query=query, limit=limit, api_key=api_key)
    ids: list[str] = []
    while paginator.has_next:
        page = [info.sandbox_id for info in paginator.next_items()]
        ids.extend(page)
        if pages is not None:
            pages.append(len(page))
    return ids


def pids(sandbox: Sandbox) -> list[int]:
    return [p.pid for p in sandbox.commands.list()]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# ---- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sdk(e2b_server: E2bServer) -> Iterator[E2bServer]:
    """The SDK pointed at the module's server by the three environment variables (alice's key)."""
    with sdk_environment(e2b_server):
        yield e2b_server


@pytest.fixture(scope="module")
def shared(sdk: E2bServer) -> Iterator[Sandbox]:
    """One sandbox for the checks of commands and files, created as the docs show."""
    sandbox = Sandbox.create(envs=ENVS, metadata={"suite": SUITE, "role": "shared"}, timeout=SANDBOX_TIMEOUT_S)
    try:
        yield sandbox
    finally:
        kill_quietly(sandbox.sandbox_id)


@pytest.fixture
def scratch(shared: Sandbox) -> str:
    """A fresh directory of the shared sandbox (under /tmp, which every E2B sandbox has)."""
    path = f"/tmp/{unique('e2b-sdk')}"
    assert shared.files.make_dir(path) is True
    return path


# ---- create, envs, info --------------------------------------------------------------------------


def test_create_envs_reach_commands(shared: Sandbox) -> None:
    assert shared.commands.run("echo $GREETING").stdout == "hello from envs\n"
    assert shared.commands.run('echo "$SECOND"').stdout == "two words\n"
    # The command's own envs beside the sandbox's, and its cwd.
    result = shared.commands.run('echo "$GREETING/$OWN"; pwd', envs={"OWN": "mine"}, cwd="/tmp")
    assert result.stdout == "hello from envs/mine\n/tmp\n"


def test_get_info_and_metrics(shared: Sandbox) -> None:
    info = shared.get_info()
    assert info.sandbox_id == shared.sandbox_id
    assert info.metadata == {"suite": SUITE, "role": "shared"}
    assert info.template_id == "base" or info.name == "base", (info.template_id, info.name)
    assert info.state == SandboxState.RUNNING
    assert info.started_at <= datetime.now(UTC) < info.end_at
    assert shared.is_running() is True
    assert Sandbox.get_info(shared.sandbox_id).metadata == info.metadata
    metrics = shared.get_metrics()
    assert metrics, "get_metrics returned no sample"
    assert metrics[-1].cpu_count >= 1 and 0 < metrics[-1].mem_used <= metrics[-1].mem_total, metrics[-1]


# ---- commands ------------------------------------------------------------------------------------


def test_foreground_output_by_callbacks_and_on_the_result(shared: Sandbox) -> None:
    out, err = Collector(), Collector()
    result = shared.commands.run("echo out-1; echo err-1 >&2; echo out-2; printf 'no newline'",
                                 on_stdout=out, on_stderr=err)
    assert result.exit_code == 0 and result.error is None
    assert result.stdout == "out-1\nout-2\nno newline"
    assert result.stderr == "err-1\n"
    assert out.text == result.stdout and err.text == result.stderr


def test_output_larger_than_the_buffer_arrives_whole_and_in_order(shared: Sandbox) -> None:
    # 14.9 MB, far past the agent's 1 MiB buffer: the command waits for the stream, as under
    # envd, instead of its oldest output being dropped; a slow callback holds it back too.
    seen: list[str] = []

    def slow(chunk: str) -> None:
        seen.append(chunk)
        if len(seen) < 200:
            time.sleep(0.005)  # a callback slower than seq at first: the command must wait for it

    result = shared.commands.run("seq 1 2000000; echo end >&2", on_stdout=slow, timeout=120)
    expected = "".join(f"{i}\n" for i in range(1, 2_000_001))
    assert "dropped" not in result.stderr, result.stderr[:200]
    assert result.stderr == "end\n"
    assert len(result.stdout) == len(expected) and result.stdout == expected
    assert "".join(seen) == expected


def test_nonzero_exit_raises_command_exit_exception(shared: Sandbox) -> None:
    with pytest.raises(CommandExitException) as caught:
        shared.commands.run("echo partial; echo broken >&2; exit 3")
    assert caught.value.exit_code == 3
    assert caught.value.stdout == "partial\n"
    assert caught.value.stderr == "broken\n"
    assert "broken" in str(caught.value)
    # A background command's exit code comes from its handle.
    handle = shared.commands.run("exit 7", background=True)
    with pytest.raises(CommandExitException) as waited:
        handle.wait()
    assert waited.value.exit_code == 7


def test_background_command_connect_from_second_client_then_kill(sdk: E2bServer, shared: Sandbox,
                                                                scratch: str) -> None:
    go = f"{scratch}/go"
    handle = shared.commands.run(f"while [ ! -e {go} ]; do sleep 0.05; done; echo go-seen; sleep 600",
                                 background=True)
    first_out = Collector()
    first = Outcome(lambda: handle.wait(on_stdout=first_out))
    second_client = Sandbox.connect(shared.sandbox_id)
    assert second_client.sandbox_id == shared.sandbox_id
    assert handle.pid in pids(second_client)
    joined = second_client.commands.connect(handle.pid)
    assert joined.pid == handle.pid
    joined_out = Collector()
    second = Outcome(lambda: joined.wait(on_stdout=joined_out))

    second_client.files.write(go, "")
    first_out.wait_for("go-seen")
    joined_out.wait_for("go-seen")

    assert second_client.commands.kill(handle.pid) is True
    for name, outcome in (("the starting client's wait", first), ("the connected client's wait", second)):
        _, error = outcome.join(name)
        assert isinstance(error, CommandExitException), f"{name} ended with {error!r}, not a non-zero exit"
        assert error.exit_code != 0
    assert handle.pid not in pids(shared)
    assert shared.commands.kill(handle.pid) is False  # documented: False when not found


def test_send_stdin_and_close_stdin(shared: Sandbox) -> None:
    reader = shared.commands.run("read line; echo got:$line", background=True, stdin=True)
    shared.commands.send_stdin(reader.pid, "hello stdin\n")
    assert reader.wait().stdout == "got:hello stdin\n"

    cat = shared.commands.run("cat", background=True, stdin=True)
    cat.send_stdin("first ")
    shared.commands.send_stdin(cat.pid, b"second\n")
    shared.commands.close_stdin(cat.pid)
    result = cat.wait()
    assert result.exit_code == 0 and result.stdout == "first second\n"


def test_pty_create_send_stdin_resize_kill(shared: Sandbox) -> None:
    terminal = shared.pty.create(PtySize(rows=24, cols=80))
    screen = Collector()
    ended = Outcome(lambda: terminal.wait(on_pty=screen))
    try:
        assert terminal.pid in pids(shared)
        shared.pty.send_stdin(terminal.pid, b"echo size=$(stty size) term=$TERM\n")
        screen.wait_for("size=24 80 term=xterm-256color")
        shared.pty.resize(terminal.pid, PtySize(rows=30, cols=100))
        shared.pty.send_stdin(terminal.pid, b"echo size=$(stty size)\n")
        screen.wait_for("size=30 100")
        assert shared.pty.kill(terminal.pid) is True
        ended.join("the terminal's stream after pty.kill")
        assert terminal.pid not in pids(shared)
    finally:
        if terminal.pid in pids(shared):
            shared.pty.kill(terminal.pid)


def test_policy_denied_command_raises_with_the_reason(shared: Sandbox, scratch: str) -> None:
    witness = f"{scratch}/ran"
    with pytest.raises(SandboxException) as caught:
        shared.commands.run(f"touch {witness}; git push origin main")
    assert not isinstance(caught.value, CommandExitException), "a denied command must not start at all"
    assert DENIED_COMMAND_REASON in str(caught.value), str(caught.value)
    assert shared.files.exists(witness) is False, "the denied command ran"
    assert shared.commands.run("echo still allowed").stdout == "still allowed\n"


# ---- files ---------------------------------------------------------------------------------------


def test_files_write_read_list_exists_rename_remove_make_dir(shared: Sandbox, scratch: str) -> None:
    text_path, bin_path = f"{scratch}/a.txt", f"{scratch}/b.bin"
    payload = bytes(range(256))

    written = shared.files.write(text_path, "alpha\nbeta\n")
    assert (written.name, written.path, written.type) == ("a.txt", text_path, FileType.FILE)
    shared.files.write(bin_path, payload)
    assert shared.files.read(text_path) == "alpha\nbeta\n"
    assert shared.files.read(bin_path, format="bytes") == bytearray(payload)
    # What the filesystem API wrote is what commands see.
    assert shared.commands.run(f"sha256sum < {bin_path}").stdout.split()[0] == hashlib.sha256(payload).hexdigest()

    # Writing creates the missing parent directories; make_dir too, and says if one existed.
    shared.files.write(f"{scratch}/deep/er/c.txt", "gamma")
    assert shared.files.make_dir(f"{scratch}/x/y") is True
    assert shared.files.make_dir(f"{scratch}/x/y") is False

    entries = {e.name: e for e in shared.files.list(scratch)}
    assert set(entries) == {"a.txt", "b.bin", "deep", "x"}, sorted(entries)
    assert entries["b.bin"].type == FileType.FILE and entries["b.bin"].size == 256
    assert entries["b.bin"].path == bin_path
    assert entries["deep"].type == FileType.DIR
    deeper = {e.path for e in shared.files.list(scratch, depth=3)}
    assert f"{scratch}/deep/er/c.txt" in deeper and f"{scratch}/x/y" in deeper, sorted(deeper)

    assert shared.files.exists(text_path) is True
    assert shared.files.exists(f"{scratch}/nothing-here") is False
    info = shared.files.get_info(text_path)
    assert (info.name, info.type, info.size) == ("a.txt", FileType.FILE, len("alpha\nbeta\n"))

    renamed = shared.files.rename(text_path, f"{scratch}/renamed.txt")
    assert renamed.path == f"{scratch}/renamed.txt" and renamed.name == "renamed.txt"
    assert shared.files.exists(text_path) is False
    assert shared.files.read(f"{scratch}/renamed.txt") == "alpha\nbeta\n"

    shared.files.remove(f"{scratch}/renamed.txt")
    shared.files.remove(f"{scratch}/deep")
    assert shared.files.exists(f"{scratch}/renamed.txt") is False
    assert shared.files.exists(f"{scratch}/deep") is False
    with pytest.raises(FileNotFoundException):
        shared.files.read(f"{scratch}/renamed.txt")
    with pytest.raises(NotFoundException):
        shared.files.list(f"{scratch}/deep")


def test_watch_dir_reports_a_file_a_command_writes(shared: Sandbox, scratch: str) -> None:
    watcher = shared.files.watch_dir(scratch)
    try:
        shared.commands.run(f"echo hi > {scratch}/by-command.txt")
        shared.commands.run(f"rm {scratch}/by-command.txt")
        seen: set[FilesystemEventType] = set()
        deadline = time.monotonic() + EVENT_TIMEOUT_S
        # The sync SDK's watcher is pulled (get_new_events): poll it until both events came.
        while not {FilesystemEventType.CREATE, FilesystemEventType.REMOVE} <= seen:
            assert time.monotonic() < deadline, f"events of by-command.txt within {EVENT_TIMEOUT_S:g} s: {seen}"
            seen |= {e.type for e in watcher.get_new_events() if e.name == "by-command.txt"}
            time.sleep(0.05)
    finally:
        watcher.stop()
    with pytest.raises(SandboxException):
        watcher.get_new_events()  # documented: the watcher is stopped


def test_50_mb_upload_and_download_keep_every_byte(shared: Sandbox) -> None:
    data = os.urandom(50 * 1024 * 1024)
    digest = hashlib.sha256(data).hexdigest()
    # /workspace: callbox's working directory, a larger scratch space than /tmp.
    as_bytes, as_stream = "/workspace/big-bytes.bin", "/workspace/big-stream.bin"
    try:
        shared.files.write(as_bytes, data)  # multipart/form-data
        shared.files.write(as_stream, io.BytesIO(data))  # a file object: application/octet-stream
        sums = shared.commands.run(f"sha256sum {as_bytes} {as_stream}").stdout.split()
        assert sums == [digest, as_bytes, digest, as_stream]
        back = shared.files.read(as_stream, format="bytes")
        assert len(back) == len(data) and hashlib.sha256(back).hexdigest() == digest
    finally:
        shared.commands.run(f"rm -f {as_bytes} {as_stream}")


# ---- the sandbox's life --------------------------------------------------------------------------


def test_timeout_list_connect_kill(sdk: E2bServer, shared: Sandbox) -> None:
    case = unique("lifecycle")
    metadata = {"suite": SUITE, "case": case}
    sandbox = Sandbox.create(metadata=metadata, timeout=120)
    try:
        info = sandbox.get_info()
        assert abs((info.end_at - info.started_at).total_seconds() - 120) < 10, (info.started_at, info.end_at)

        sandbox.set_timeout(900)
        extended = Sandbox.get_info(sandbox.sandbox_id)
        assert abs((extended.end_at - datetime.now(UTC)).total_seconds() - 900) < 10, extended.end_at

        assert listed_ids(SandboxQuery(metadata={"case": case})) == [sandbox.sandbox_id]
        assert listed_ids(SandboxQuery(metadata={"case": case, "suite": SUITE})) == [sandbox.sandbox_id]
        assert listed_ids(SandboxQuery(metadata={"case": case + "-other"})) == []
        assert listed_ids(SandboxQuery(metadata={"case": case}, state=[SandboxState.PAUSED])) == []
        page = Sandbox.list(query=SandboxQuery(metadata={"case": case})).next_items()
        assert page[0].metadata == metadata and page[0].state == SandboxState.RUNNING
        # Paging (x-next-token): one sandbox a page still lists them all, each once.
        sizes: list[int] = []
        paged = listed_ids(SandboxQuery(metadata={"suite": SUITE}), limit=1, pages=sizes)
        assert {sandbox.sandbox_id, shared.sandbox_id} <= set(paged), paged
        assert sorted(paged) == sorted(listed_ids(SandboxQuery(metadata={"suite": SUITE})))
        assert len(sizes) >= 2 and max(sizes) == 1, sizes

        again = Sandbox.connect(sandbox.sandbox_id)
        assert again.commands.run("echo through connect").stdout == "through connect\n"

        assert sandbox.kill() is True
        assert Sandbox.kill(sandbox.sandbox_id) is False
        with pytest.raises(SandboxNotFoundException):
            Sandbox.connect(sandbox.sandbox_id)
        with pytest.raises(SandboxNotFoundException):
            Sandbox.get_info(sandbox.sandbox_id)
        assert sandbox.sandbox_id not in listed_ids(SandboxQuery(metadata={"suite": SUITE}))
        assert sandbox.is_running() is False  # documented: after kill, is_running() is False
    finally:
        kill_quietly(sandbox.sandbox_id)


def test_pause_and_resume_keep_files_and_processes(sdk: E2bServer) -> None:
    case = unique("pause")
    sandbox = Sandbox.create(metadata={"suite": SUITE, "case": case}, timeout=SANDBOX_TIMEOUT_S)
    try:
        sandbox.files.write("/tmp/kept.txt", "survives the pause\n")
        sleeper = sandbox.commands.run("sleep 600", background=True)

        assert sandbox.pause() is True
        assert sandbox.pause() is False  # documented: False when already paused
        assert Sandbox.get_info(sandbox.sandbox_id).state == SandboxState.PAUSED
        assert listed_ids(SandboxQuery(metadata={"case": case}, state=[SandboxState.PAUSED])) == [sandbox.sandbox_id]
        assert listed_ids(SandboxQuery(metadata={"case": case}, state=[SandboxState.RUNNING])) == []
        with pytest.raises(SandboxException):
            sandbox.commands.run("echo while paused", timeout=20)

        resumed = Sandbox.connect(sandbox.sandbox_id)  # resumes it
        assert resumed.get_info().state == SandboxState.RUNNING
        assert resumed.files.read("/tmp/kept.txt") == "survives the pause\n"
        assert sleeper.pid in pids(resumed)
        # The first object keeps working too (same sandbox, same access).
        assert sandbox.commands.run("cat /tmp/kept.txt").stdout == "survives the pause\n"

        # Pause again and resume through the instance method the docs show.
        assert sandbox.pause() is True
        assert sandbox.connect() is sandbox
        assert sandbox.commands.run("echo back").stdout == "back\n"
    finally:
        kill_quietly(sandbox.sandbox_id)


def test_another_key_cannot_see_connect_or_kill(sdk: E2bServer) -> None:
    case = unique("keys")
    bob = sdk.keys["bob"]
    mine = Sandbox.create(metadata={"suite": SUITE, "case": case}, timeout=SANDBOX_TIMEOUT_S)
    theirs: Sandbox | None = None
    try:
        assert mine.sandbox_id not in listed_ids(api_key=bob)
        assert listed_ids(SandboxQuery(metadata={"case": case}), api_key=bob) == []
        with pytest.raises(SandboxNotFoundException):
            Sandbox.connect(mine.sandbox_id, api_key=bob)
        with pytest.raises(SandboxNotFoundException):
            Sandbox.get_info(mine.sandbox_id, api_key=bob)
        with pytest.raises(NotFoundException):
            Sandbox.set_timeout(mine.sandbox_id, 5, api_key=bob)
        with pytest.raises(NotFoundException):
            Sandbox.pause(mine.sandbox_id, api_key=bob)
        assert Sandbox.kill(mine.sandbox_id, api_key=bob) is False

        theirs = Sandbox.create(metadata={"suite": SUITE, "case": case}, timeout=SANDBOX_TIMEOUT_S, api_key=bob)
        assert listed_ids(SandboxQuery(metadata={"case": case}), api_key=bob) == [theirs.sandbox_id]
        assert listed_ids(SandboxQuery(metadata={"case": case})) == [mine.sandbox_id]
        assert Sandbox.kill(theirs.sandbox_id) is False  # alice's key

        # Nothing bob tried touched alice's sandbox.
        assert mine.get_info().state == SandboxState.RUNNING
        assert mine.commands.run("echo still mine").stdout == "still mine\n"
        with pytest.raises(AuthenticationException):
            listed_ids(api_key="not-a-key-of-this-server-0123456789")
    finally:
        kill_quietly(mine.sandbox_id)
        if theirs is not None:
            kill_quietly(theirs.sandbox_id, api_key=bob)


@pytest.fixture(scope="module", autouse=True)
def abandoned(sdk: E2bServer, engine: object) -> Iterator[dict[str, Any]]:
    """A sandbox made as the module starts by a client process that then exits: its timeout
    runs out while the other tests run, so its test only checks the reaper's work (its own
    ``suite`` label, so the listings other tests compare never see it come and go)."""
    case = unique("expiry")
    client = ("import sys\nfrom e2b import Sandbox\n"
              f"s = Sandbox.create(timeout={EXPIRY_TIMEOUT_S}, "
              f"metadata={{'suite': {SUITE + '-abandoned'!r}, 'case': {case!r}}})\n"
              "print(s.sandbox_id)\n")
    before = set(owned_containers(engine, sdk.pid))
    gone = subprocess.run([sys.executable, "-c", client], env=sdk.child_env(), capture_output=True, text=True,
                          timeout=120, check=False)
    made = {"case": case, "error": gone.stderr, "sandbox_id": gone.stdout.strip() if gone.returncode == 0 else "",
            "containers": set(owned_containers(engine, sdk.pid)) - before,
            "deadline": time.monotonic() + EXPIRY_TIMEOUT_S + EXPIRY_SLACK_S}
    try:
        yield made
    finally:
        if made["sandbox_id"]:
            kill_quietly(made["sandbox_id"])


def test_expiry_removes_a_sandbox_whose_client_vanished(sdk: E2bServer, engine: object,
                                                        abandoned: dict[str, Any]) -> None:
    sandbox_id, its_containers, deadline = abandoned["sandbox_id"], abandoned["containers"], abandoned["deadline"]
    assert sandbox_id, abandoned["error"]
    assert len(its_containers) == 1, f"containers the create started: {its_containers}"
    # The server's reaper runs on its own clock: poll what the SDK can see, with a deadline.
    while sandbox_id in listed_ids(SandboxQuery(metadata={"case": abandoned["case"]})):
        assert time.monotonic() < deadline, f"{sandbox_id} still listed {EXPIRY_SLACK_S:g} s after its timeout"
        time.sleep(0.25)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sandbox_id)
    assert Sandbox.kill(sandbox_id) is False
    # Its container goes too (removed just after the sandbox leaves the server's view).
    while left := its_containers & set(owned_containers(engine, sdk.pid)):
        assert time.monotonic() < deadline, f"the expired sandbox's container is still there: {left}"
        time.sleep(0.25)


# ---- a script written for E2B --------------------------------------------------------------------


def test_the_e2b_example_script_runs_unchanged(sdk: E2bServer) -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE)], env=sdk.child_env(), capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\nserver:\n{sdk.log()}"
    assert done.stdout.splitlines() == [
        "Hello from Linux",
        "Hello, file!",
        "/home/user",
        "13 bytes",
        "listed: True",
        "killed: True",
    ], done.stdout
    assert listed_ids(SandboxQuery(metadata={"purpose": "example"})) == []
