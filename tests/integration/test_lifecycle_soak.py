"""Soak: many sandbox lifecycles with random interruptions leak nothing.

``test_lifecycle_soak`` runs CALLBOX_SOAK_CYCLES (default 1,000) create -> (call) ->
destroy cycles on a small thread pool, each cycle picking one of these at random:

- ``call``: a normal call (a command, or a file written and read back), then destroy;
- ``cancel``: a running ``sleep`` is cancelled by closing its stream (the gRPC call is
  cancelled); the agent must kill it, which the next call checks; then destroy;
- ``close_client``: the client's channel is closed from another thread mid-stream;
- ``docker_kill``: the container is killed (``docker kill``) mid-call; the call must end
  with the "sandbox stopped answering" error, then destroy;
- ``destroy_mid_call``: the sandbox is destroyed while its call runs (the call must fail
  the same way);
- ``no_call``: create and destroy.

One cycle in ten runs its sandbox with ``network = "open"`` or ``"allowlist"`` (nothing is
sent over it), so per-sandbox networks, egress proxies and their logs are checked too.

The choices come from a seeded RNG (the seed is printed; CALLBOX_SOAK_SEED replays one),
one per cycle, so a run is reproducible whatever the thread scheduling. Every failure
inside a cycle must be the structured error its outcome expects; anything else is counted
and fails the test. At the end, with no ``gc`` (the cycles clean up after
themselves; a gc of the whole engine would also take the sandboxes of the tests that
``make test`` runs beside the soak), once the engine's background removals are drained: no
container or network of these sandboxes, no socket directory under the test's own run root,
no host mount naming them, and no threads or file descriptors left in this process beyond a
small tolerance.

``test_sigkilled_harness_mid_call_is_reaped_by_the_next_start_and_by_gc`` covers the
harness itself dying mid-call (SIGKILL, so no cleanup runs).
"""

from __future__ import annotations

import collections
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from harness.core.errors import AgentCallError, CallboxError
from harness.engine.agent_errors import SANDBOX_GONE
from harness.engine.docker import labels
from harness.engine.docker.engine import DockerEngine
from harness.engine.docker.networks import EGRESS_NETWORK
from harness.engine.docker.sandbox import Sandbox
from harness.engine.exec_result import collect
from harness.engine.spec import SandboxSpec
from tests.conftest import IMAGE
from tests.integration.helpers import callbox
from tests.support.run_root import leftovers

pytestmark = pytest.mark.docker

CYCLES = int(os.environ.get("CALLBOX_SOAK_CYCLES", "1000"))
WORKERS = int(os.environ.get("CALLBOX_SOAK_WORKERS", "4"))
OUTCOMES = ("call", "cancel", "close_client", "docker_kill", "destroy_mid_call", "no_call")
FD_TOLERANCE = 6
THREAD_TOLERANCE = 2


class Unexpected(AssertionError):
    """A cycle did something its outcome does not allow."""


@pytest.fixture
def soak_engine(engine) -> Iterator[DockerEngine]:  # type: ignore[no-untyped-def]
    """An engine with its own (short: sun_path is 108 bytes) run root, so leftovers are exact."""
    run_root = Path(tempfile.mkdtemp(prefix="cbx-soak-", dir="/tmp"))
    try:
        yield DockerEngine(engine.client, run_root=run_root, reap_on_start=False)
    finally:
        shutil.rmtree(run_root, ignore_errors=True)


def _started(events: Iterator[object]) -> None:
    """Consume events up to and including the first Output (the command runs by then)."""
    for event in events:
        if event.WhichOneof("event") == "output":  # type: ignore[attr-defined]
            return
    raise Unexpected("the stream ended before the command printed anything")


def _expect_gone(events: Iterator[object]) -> str:
    """The rest of a stream whose sandbox went away must be the structured 'gone' error."""
    try:
        for event in events:
            if event.WhichOneof("event") == "exited":  # type: ignore[attr-defined]
                raise Unexpected(f"the call ended normally although its sandbox went away: {event}")
    except AgentCallError as error:
        gone = SANDBOX_GONE in error.message or "sandbox is stopping" in error.message
        if error.grpc_code != "UNAVAILABLE" or not gone:
            raise Unexpected(f"unclear error after the sandbox went away: {error.grpc_code} {error.message}") from None
        return error.grpc_code
    raise Unexpected("the stream ended without an error although its sandbox went away")


def _gone_within(box: Sandbox, pid: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        alive = collect(box.agent.exec(f"kill -0 {pid} 2>/dev/null && echo alive || echo gone", timeout_ms=5000))
        if alive.stdout.data() == b"gone\n":
            return
        if time.monotonic() > deadline:
            raise Unexpected(f"the cancelled command (pid {pid}) still runs {seconds} s later")
        time.sleep(0.02)


NETWORKS = {"open": {"network": "open"}, "allowlist": {"network": "allowlist", "allow_hosts": ("example.com",)}}
"""One cycle in ten runs in a networked mode (its bridge, and for allowlist its egress proxy,
must go too); none of them sends a packet anywhere."""


def _cycle(engine: DockerEngine, outcome: str, rng: random.Random) -> Sandbox:
    draw = rng.random()
    network: dict[str, object] = NETWORKS["open"] if draw < 0.05 else NETWORKS["allowlist"] if draw < 0.1 else {}
    box = engine.create(SandboxSpec(image=IMAGE, memory="128m", pids=64, ttl_seconds=600, **network))
    try:
        api = engine.client.api
        if outcome == "call":
            if rng.random() < 0.5:
                n = rng.randrange(1, 1000)
                result = collect(box.agent.exec(["sh", "-c", f"seq 1 {n} | wc -l"], timeout_ms=10_000))
                if (result.exit_code, result.stdout.data()) != (0, f"{n}\n".encode()):
                    raise Unexpected(f"wrong result: {result}")
            else:
                data = rng.randbytes(rng.randrange(1, 4096))
                box.agent.write_file("soak/data.bin", data, make_parents=True)
                if box.agent.read_file("soak/data.bin").data != data:
                    raise Unexpected("the file read back differs")
        elif outcome == "cancel":
            events = box.agent.exec("echo $$; exec sleep 30", timeout_ms=60_000)
            pid = ""
            for event in events:
                if event.WhichOneof("event") == "output":
                    pid = event.output.stdout.decode().strip()
                    break
            events.close()  # cancels the gRPC call: the agent must kill the command
            if not pid.isdigit():
                raise Unexpected(f"no pid printed: {pid!r}")
            _gone_within(box, pid, 5.0)
        elif outcome == "close_client":
            events = box.agent.exec("echo started; exec sleep 30", timeout_ms=60_000)
            _started(events)
            closer = threading.Thread(target=box.agent.close)
            closer.start()
            try:
                for event in events:
                    if event.WhichOneof("event") == "exited":
                        raise Unexpected("the call ended normally although its channel was closed")
                raise Unexpected("the stream ended without an error although its channel was closed")
            except AgentCallError as error:
                if error.grpc_code != "CANCELLED":
                    raise Unexpected(f"closing the channel gave {error.grpc_code}: {error.message}") from None
            finally:
                closer.join()
        elif outcome == "docker_kill":
            events = box.agent.exec("echo started; exec sleep 30", timeout_ms=60_000)
            _started(events)
            api.kill(box.container_id)
            _expect_gone(events)
        elif outcome == "destroy_mid_call":
            events = box.agent.exec("echo started; exec sleep 30", timeout_ms=60_000)
            _started(events)
            engine.destroy(box.id)  # the container goes; the stream is still open
            _expect_gone(events)
        elif outcome != "no_call":
            raise AssertionError(outcome)
    finally:
        box.destroy()
    return box


def _egress_network_gone_or_in_use(api: Any) -> bool:
    """The shared egress network is removed with its last proxy. ``make test`` runs the soak
    beside the other tests, whose proxies may hold it: then it must have containers on it (a
    proxy of the soak's would be a leaked container, checked above). A proxy ending just now
    removes it a moment after it leaves the network, hence the short wait."""
    deadline = time.monotonic() + 10.0
    while True:
        found = api.networks(names=[EGRESS_NETWORK])
        if not found or any(api.inspect_network(n["Id"]).get("Containers") for n in found):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def _mountinfo() -> str:
    return Path("/proc/self/mountinfo").read_text()


GRPC_CORE_THREADS = ("event_engine", "lifeguard", "grpc_global_tim", "default-executo", "resolver-execut")
"""Name prefixes of gRPC core's own threads (its EventEngine pool and the pool's lifeguard, the
timer manager): a pool gRPC grows to the load it sees and shrinks in its own time, so on a busy
machine it is larger after the soak than before; not a leak of ours (a channel left open shows
as its socket in the file descriptor check)."""


def _threads() -> int:
    """This process's threads but gRPC core's own pool."""
    return sum(1 for name in _thread_names() if not name.startswith(GRPC_CORE_THREADS))


def _thread_names() -> list[str]:
    """The names of this process's threads (``comm``: gRPC's and Python's own), for a leak's message."""
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            names.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
        except OSError:
            continue
    return sorted(names)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_lifecycle_soak(soak_engine: DockerEngine, capsys: pytest.CaptureFixture[str]) -> None:
    seed = int(os.environ.get("CALLBOX_SOAK_SEED") or random.SystemRandom().randrange(1 << 32))
    with capsys.disabled():
        print(f"\nlifecycle soak: {CYCLES} cycles, {WORKERS} workers, CALLBOX_SOAK_SEED={seed}", flush=True)
    engine = soak_engine
    ids: list[str] = []
    counts: collections.Counter[str] = collections.Counter()
    unexpected: list[str] = []
    lock = threading.Lock()

    def one(index: int) -> None:
        rng = random.Random(f"{seed}-{index}")
        outcome = rng.choice(OUTCOMES)
        try:
            box = _cycle(engine, outcome, rng)
        except Unexpected as problem:
            with lock:
                counts[f"{outcome}:unexpected"] += 1
                unexpected.append(f"cycle {index} ({outcome}): {problem}")
            return
        except CallboxError as error:  # structured, but this outcome did not expect it
            with lock:
                counts[f"{outcome}:{type(error).__name__}"] += 1
                unexpected.append(f"cycle {index} ({outcome}): {type(error).__name__}: {error.message}")
            return
        except Exception:
            with lock:
                counts[f"{outcome}:exception"] += 1
                unexpected.append(f"cycle {index} ({outcome}): {traceback.format_exc()}")
            return
        with lock:
            counts[outcome] += 1
            ids.append(box.id)

    # Warm up (connection pools, gRPC's own threads) before taking the baseline.
    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(one, range(-2 * WORKERS, 0)))
    fds_before, threads_before, names_before = _fds(), _threads(), _thread_names()

    started = time.monotonic()
    with ThreadPoolExecutor(WORKERS, thread_name_prefix="soak") as pool:
        list(pool.map(one, range(CYCLES)))
    seconds = time.monotonic() - started

    summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    with capsys.disabled():
        print(f"lifecycle soak: {CYCLES} cycles in {seconds:.1f} s ({seconds / CYCLES * 1000:.0f} ms per cycle, "
              f"{WORKERS} workers, seed {seed}): {summary}", flush=True)

    assert not unexpected, f"{len(unexpected)} unexpected results (seed {seed}):\n" + "\n".join(unexpected[:10])
    assert sum(counts.values()) == CYCLES + 2 * WORKERS

    # destroy returns before the removal is done: wait for the background removals (bounded).
    assert engine.drain(300), f"removals still pending: {engine.teardown.pending()}"
    mine = set(ids)
    api = engine.client.api
    containers = [c for c in api.containers(all=True, filters={"label": f"{labels.MANAGED}=1"})
                  if (c.get("Labels") or {}).get(labels.SANDBOX_ID) in mine
                  or str((c.get("Labels") or {}).get(labels.SOCKET_DIR, "")).startswith(f"{engine.run_root}/")]
    assert containers == [], f"leaked containers: {[c['Names'] for c in containers]}"
    networks = [n for n in api.networks(filters={"label": labels.MANAGED})
                if (n.get("Labels") or {}).get(labels.SANDBOX_ID) in mine
                or any(sandbox_id in n.get("Name", "") for sandbox_id in mine)]
    assert networks == [], f"leaked networks: {[n['Name'] for n in networks]}"
    assert _egress_network_gone_or_in_use(api), "the shared egress network outlived its last proxy"
    left = leftovers(engine.run_root)
    assert left == [], f"leaked socket directories (or keep records) under {engine.run_root}: {left[:10]}"
    mounts = [line for line in _mountinfo().splitlines()
              if str(engine.run_root) in line or any(sandbox_id in line for sandbox_id in mine)]
    assert mounts == [], f"leaked host mounts: {mounts[:5]}"

    # The agent channels and docker-py's pooled connections are closed or reused.
    deadline = time.monotonic() + 10
    while (_fds() > fds_before + FD_TOLERANCE or _threads() > threads_before + THREAD_TOLERANCE) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _fds() <= fds_before + FD_TOLERANCE, f"file descriptors: {fds_before} before, {_fds()} after"
    assert _threads() <= threads_before + THREAD_TOLERANCE, \
        f"threads: {threads_before} before ({names_before}), {_threads()} after ({_thread_names()})"


def _harness_mid_call() -> tuple[subprocess.Popen[str], str]:
    """A child harness with a sandbox in the default run root, in the middle of a call."""
    script = textwrap.dedent(f"""
        from harness.engine.docker.engine import DockerEngine
        from harness.engine.spec import SandboxSpec
        box = DockerEngine.connect(reap_on_start=False).create(SandboxSpec(image={IMAGE!r}))
        print(box.id, flush=True)
        for event in box.agent.exec("echo running; sleep 300", timeout_ms=600_000):
            if event.WhichOneof("event") == "output":
                print("running", flush=True)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    sandbox_id = child.stdout.readline().strip()
    if child.stdout.readline().strip() != "running":
        child.kill()
        child.wait()
        raise AssertionError(f"the child harness did not start its call (sandbox {sandbox_id!r})")
    return child, sandbox_id


def test_sandbox_of_a_harness_sigkilled_mid_call_is_reaped_by_the_next_start_and_by_gc(engine) -> None:  # type: ignore[no-untyped-def]
    """SIGKILL runs no cleanup: the sandbox stays, still running the call, until the next
    harness start (the engine reaps on start) or `callbox gc` removes it and its socket dir.
    (test_cli covers `callbox gc` after an idle owner is killed; this is the mid-call case.)"""
    api = engine.client.api
    children: list[subprocess.Popen[str]] = []
    ids: list[str] = []
    try:
        for _ in range(2):
            child, sandbox_id = _harness_mid_call()
            children.append(child)
            ids.append(sandbox_id)
        (first, by_start), (second, by_gc) = zip(children, ids, strict=True)
        first.send_signal(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL
        assert _container_state(api, by_start) == "running"  # nobody cleaned up

        restarted = DockerEngine(engine.client)  # the next harness start reaps what it can
        assert _container_state(api, by_start) is None
        assert not (restarted.run_root / by_start).exists()
        assert _container_state(api, by_gc) == "running"  # its owner still lives

        second.send_signal(signal.SIGKILL)
        assert second.wait(10) == -signal.SIGKILL
        gc = callbox("gc")
        assert gc.returncode == 0, gc.stderr
        assert f"removed {by_gc}".encode() in gc.stdout
        assert _container_state(api, by_gc) is None
        assert not (restarted.run_root / by_gc).exists()
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        for sandbox_id in ids:
            engine.destroy(sandbox_id)


def _container_state(api, sandbox_id: str) -> str | None:  # type: ignore[no-untyped-def]
    found = api.containers(all=True, filters={"label": f"{labels.SANDBOX_ID}={sandbox_id}"})
    return found[0]["State"] if found else None
