"""``make bench`` section ``living``: living sandboxes against docker-py doing the same, in one run.

Rows (each baseline is measured in the same run, interleaved with callbox's samples):

9. attach with replay: ``JobsClient.attach(pid, from_seq=0, follow=True)`` of a running job that
   has printed 256 KiB (all of it still in the agent's ring buffer), timed to the ``JobLive``
   that follows the last replayed chunk; baseline docker-py ``exec_run(["cat", FILE])`` of the
   same 256 KiB from a file in the same container (``container.logs()`` is not comparable: a
   sandbox's jobs do not write to the container's log);
10. PTY keystroke round trip: one byte sent through ``Terminal.send`` to a PTY job running
    ``stty raw -echo; cat``, timed until ``cat`` has written it back; baseline the same command
    through ``docker exec -it`` as docker-py does it (``exec_create(tty=True, stdin=True)`` +
    ``exec_start(socket=True)``) in the same container;
11. ``cp`` of a 100 MiB tree (64 files of 1 MiB and 1152 of 32 KiB in 17 directories) both
    ways: ``TransferClient.copy_in`` / ``copy_out`` vs docker-py ``put_archive`` (a tar streamed
    from the host tree as it is written) / ``get_archive`` (unpacked on the host with
    ``tarfile``), the API ``docker cp`` uses. Docker's archive API works on the container's root
    filesystem and its mounts; it does not see the sandbox's tmpfs (``/workspace`` shows the
    image's empty directory under it) and refuses to write anywhere else in a read-only root
    filesystem. So both sides copy to and from a read-write bind mount ``/data`` of the same
    sandbox (11a, 11b; its host directory is on disk: the spec refuses mounts from ``/dev``);
    11c is callbox into ``/workspace``, its real place, against the same docker figure. The
    host side (the source tree, the destinations of the copies out) is on ``/dev/shm`` when
    it has room, for both sides, so disk writeback stays out of it;
12. pause and resume: ``Sandbox.pause()`` and ``Sandbox.resume()`` (which waits until the agent
    answers its health check) vs docker-py ``pause`` / ``unpause`` of the same container.
    Docker 20.10 sometimes answers an unpause right after a pause "is not paused" while the
    container stays frozen (a late containerd event flipped its state); such a sample hangs
    the resume, is left out and counted in the row, and the container is thawed again;
13. snapshot and fork of a sandbox with 100 MiB in ``/workspace``: ``Sandbox.snapshot`` and
    ``DockerEngine.fork(snapshot, from_snapshot=True)`` (it returns once the fork's agent
    answers and the files are restored) vs ``docker commit`` and a hardened ``docker run`` of the
    committed image until ``true`` has exited. ``docker commit`` does not capture tmpfs contents
    (checked: a committed sandbox's ``/workspace`` is empty), so the baseline commits a plain
    container of the same image holding the same 100 MiB in its writable layer: the times
    compare, what is captured differs (a snapshot has every writable place of the sandbox and
    its spec, on the host; a commit has the container's writable layer, as an image).

Rows 11 and 13 move 100 MiB per sample, so they take ``heavy_samples`` (a seventh of
``--samples``, at least 3; 4 by default) without a warm-up round (a round costs seconds; the
setup copy and the sandboxes created before warm their paths): the section takes under a
minute. ``--quick`` moves an eighth of the data. Rows 11 and 13 are measured in
:mod:`tests.bench.bench_living_files`.
"""

from __future__ import annotations

import contextlib
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import docker.errors

from harness.core.errors import AgentCallError, SandboxStartError
from harness.engine.docker.engine import DockerEngine, Sandbox
from harness.engine.jobs import JobChunk, JobEnded, JobGap, JobLive
from harness.engine.spec import TOOL_GID, TOOL_UID, SandboxSpec
from sandbox.health import SERVING
from tests.bench.bench_living_files import bench_copy, bench_snapshot, ms_since, run_ok, snapshot_files, tree_bytes

KIB = 1024
MIB = 1 << 20
TIMES = "\N{MULTIPLICATION SIGN}"
REPLAY_BYTES = 256 * KIB
REPLAY_FILE = "/workspace/replay.out"
PTY_COMMAND = ["sh", "-c", "stty raw -echo && printf READY && exec cat"]
PTY_READY = b"READY"
PTY_WATCHDOG_S = 60.0
"""A keystroke that never comes back ends the section instead of hanging it."""
RESUME_BOUND_S = 2.0
TARGET_CP_FACTOR = 0.8


# What bench_exec hands this section (passed in, so this module never imports bench_exec,
# which runs as __main__).
class Resources(Protocol):
    engine: DockerEngine
    sandboxes: dict[str, Sandbox]
    mount_root: Path

    def create_sandbox(self, spec: SandboxSpec) -> Sandbox: ...
    def destroy_sandbox(self, box: Sandbox) -> None: ...
    def new_container_name(self) -> str: ...
    def remove_container(self, name: str) -> None: ...


Case = Callable[[], dict[str, float]]


class Interleave(Protocol):
    def __call__(self, label: str, cases: list[Case], samples: int, warmup: int,
                 every: int = 10) -> dict[str, list[float]]: ...


@dataclass(frozen=True)
class Toolkit:
    progress: Callable[[str], None]
    interleaved: Interleave
    hardened_run_kwargs: Callable[[SandboxSpec, Path], dict[str, Any]]


def heavy_samples(samples: int) -> int:
    return max(3, samples // 7)


def bench_living(res: Resources, spec: SandboxSpec, samples: int, warmup: int, kit: Toolkit, *,
                 quick: bool = False) -> dict[str, list[float]]:
    """Rows 9-13; everything started here is removed before it returns (or by ``res.cleanup``)."""
    data: dict[str, list[float]] = {}
    heavy = heavy_samples(samples)
    scale = 8 if quick else 1  # a smoke run moves an eighth of the data
    kit.progress("living: starting the sandbox for attach, PTY and pause rows")
    box = res.create_sandbox(spec)
    try:
        data.update(bench_attach(box, samples, warmup, kit))
        data.update(bench_pty(box, samples, warmup, kit))
        data.update(bench_pause(box, samples, warmup, kit))
    finally:
        res.destroy_sandbox(box)
    data.update(bench_copy(res, spec, heavy, kit, scale))
    data.update(bench_snapshot(res, spec, heavy, kit, scale))
    data["living_cp_tree_bytes"] = [float(tree_bytes(scale))]
    data["living_snapshot_bytes"] = [float(snapshot_files(scale) * MIB)]
    return data


# ---- 9. attach with replay ------------------------------------------------------------------------


def bench_attach(box: Sandbox, samples: int, warmup: int, kit: Toolkit) -> dict[str, list[float]]:
    jobs = box.jobs
    # The file is complete before the job prints it, so the baseline can cat it at once.
    script = (f"yes 0123456789abcdef | head -c {REPLAY_BYTES} > {REPLAY_FILE} && cat {REPLAY_FILE} "
              "&& exec sleep infinity")
    job = jobs.start(["sh", "-c", script])
    try:
        got = 0
        for event in jobs.attach(job.pid, follow=True, timeout=60):
            if isinstance(event, JobChunk):
                got += len(event.data)
                if got >= REPLAY_BYTES:
                    break
            elif isinstance(event, JobEnded):
                raise RuntimeError(f"replay job ended early: {event.info}")
        if got != REPLAY_BYTES:
            raise RuntimeError(f"replay job printed {got} of {REPLAY_BYTES} bytes")
        container = box.container

        def cb_attach() -> dict[str, float]:
            replayed, elapsed = 0, 0.0
            t0 = time.perf_counter_ns()
            events = jobs.attach(job.pid, from_seq=0, follow=True)
            try:
                for event in events:
                    if isinstance(event, JobChunk):
                        replayed += len(event.data)
                    elif isinstance(event, JobLive):
                        elapsed = ms_since(t0)  # closing the stream (untimed) cancels it
                        break
                    elif isinstance(event, JobGap | JobEnded):
                        raise RuntimeError(f"attach: unexpected {event}")
            finally:
                events.close()
            if replayed != REPLAY_BYTES or not elapsed:
                raise RuntimeError(f"attach replayed {replayed} of {REPLAY_BYTES} bytes")
            return {"living_attach": elapsed}

        def docker_cat() -> dict[str, float]:
            t0 = time.perf_counter_ns()
            result = container.exec_run(["cat", REPLAY_FILE])
            elapsed = ms_since(t0)
            if result.exit_code != 0 or len(result.output) != REPLAY_BYTES:
                raise RuntimeError(f"docker exec_run cat: exit {result.exit_code}, {len(result.output)} bytes")
            return {"living_attach_docker_cat": elapsed}

        return kit.interleaved("living: attach replay", [cb_attach, docker_cat], samples, warmup)
    finally:
        jobs.kill(job.pid)


# ---- 10. PTY keystroke round trip -------------------------------------------------------------------


def bench_pty(box: Sandbox, samples: int, warmup: int, kit: Toolkit) -> dict[str, list[float]]:
    jobs = box.jobs
    job = jobs.start(PTY_COMMAND, pty=True)
    api = box.engine.client.api
    exec_id = api.exec_create(box.container_id, PTY_COMMAND, stdin=True, tty=True,
                              user=f"{TOOL_UID}:{TOOL_GID}")["Id"]
    docker_sock: socket.socket = api.exec_start(exec_id, tty=True, socket=True)._sock
    docker_sock.settimeout(PTY_WATCHDOG_S)
    terminal = jobs.terminal(job.pid)
    # A keystroke that never comes back closes the terminal, which ends its events with an error.
    watchdog = threading.Timer(PTY_WATCHDOG_S + 0.1 * samples, terminal.close)
    watchdog.daemon = True
    watchdog.start()
    try:
        events = terminal.events()
        for read in (lambda: _next_output(events), lambda: docker_sock.recv(4096)):
            seen = b""
            while PTY_READY not in seen:  # `stty` has run: what comes back now is cat's
                seen += read()
        keys = iter(b"abcdefghijklmnopqrstuvwxyz" * (2 * (samples + warmup)))

        def cb_key() -> dict[str, float]:
            key = bytes([next(keys)])
            t0 = time.perf_counter_ns()
            terminal.send(key)
            back = _next_output(events)
            elapsed = ms_since(t0)
            if back != key:
                raise RuntimeError(f"terminal echoed {back!r} for {key!r}")
            return {"living_pty": elapsed}

        def docker_key() -> dict[str, float]:
            key = bytes([next(keys)])
            t0 = time.perf_counter_ns()
            docker_sock.sendall(key)
            back = docker_sock.recv(16)
            elapsed = ms_since(t0)
            if back != key:
                raise RuntimeError(f"docker exec -it echoed {back!r} for {key!r}")
            return {"living_pty_docker": elapsed}

        return kit.interleaved("living: PTY keystroke", [cb_key, docker_key], samples, warmup)
    finally:
        watchdog.cancel()
        terminal.close()
        docker_sock.close()  # its `cat` goes with the sandbox
        jobs.kill(job.pid)


def _next_output(events: Iterator[Any]) -> bytes:
    for event in events:
        if isinstance(event, JobChunk):
            return bytes(event.data)
        if isinstance(event, JobEnded):
            raise RuntimeError(f"PTY job ended: {event.info}")
    raise RuntimeError("the terminal stream ended")


# ---- 12. pause and resume ---------------------------------------------------------------------------


def bench_pause(box: Sandbox, samples: int, warmup: int, kit: Toolkit) -> dict[str, list[float]]:
    api = box.engine.client.api
    # Docker 20.10 can answer a pause-then-unpause "is not paused" (a late containerd event has
    # flipped its state) while the container stays frozen. Such samples are left out and
    # counted, and the container is thawed again, so the run goes on and the row says so.
    hung = {"callbox": 0, "docker": 0}

    def thaw_until_answering() -> None:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(docker.errors.APIError):
                api.unpause(box.container_id)
            with contextlib.suppress(AgentCallError):
                if box.agent.health(timeout=0.5) == SERVING:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"sandbox {box.id} stays frozen after unpause")

    def cb_pause_resume() -> dict[str, float]:
        t0 = time.perf_counter_ns()
        box.pause()
        paused = ms_since(t0)
        t1 = time.perf_counter_ns()
        try:
            # Sandbox.resume() is engine.resume(box); a bound of 2 s (not 10) keeps a hung one short.
            box.engine.resume(box, timeout=RESUME_BOUND_S)
        except SandboxStartError:
            hung["callbox"] += 1
            thaw_until_answering()
            return {"living_pause": paused}
        return {"living_pause": paused, "living_resume": ms_since(t1)}

    def docker_pause_unpause() -> dict[str, float]:
        t0 = time.perf_counter_ns()
        api.pause(box.container_id)
        paused = ms_since(t0)
        t1 = time.perf_counter_ns()
        try:
            api.unpause(box.container_id)
        except docker.errors.APIError as exc:
            if "not paused" not in str(exc):
                raise
            hung["docker"] += 1
            thaw_until_answering()
            return {"living_pause_docker": paused}
        return {"living_pause_docker": paused, "living_resume_docker": ms_since(t1)}

    out = kit.interleaved("living: pause/resume", [cb_pause_resume, docker_pause_unpause], samples, warmup)
    run_ok(box, ["true"], "exec after pause/resume")
    out["living_resume_hung"] = [float(hung["callbox"])]
    out["living_unpause_refused"] = [float(hung["docker"])]
    if hung["callbox"] or hung["docker"]:
        kit.progress(f"living: resume hung {hung['callbox']} times, docker unpause refused {hung['docker']} times "
                     "(Docker's 'is not paused' race)")
    return out


# ---- rows -----------------------------------------------------------------------------------------


def add_living_rows(data: dict[str, list[float]], add: Callable[..., None]) -> None:
    """Rows 9-13 of the report (``add`` takes ``Row``'s arguments)."""
    if "living_attach" not in data:
        return
    p50 = statistics.median
    heavy = f"{len(data['living_cp_in'])} samples"
    size = int(data["living_cp_tree_bytes"][0])
    mib = f"{size / MIB:.0f} MiB"
    cp_target = f"≥ {TARGET_CP_FACTOR:g}{TIMES} baseline"

    def cp_ok(row: Any) -> bool:
        return bool(row.cb(p50) >= TARGET_CP_FACTOR * (row.base(p50) or float("inf")))

    add("9. attach with replay: Attach(from_seq=0) of a job's 256 KiB → last chunk + JobLive", "time",
        data["living_attach"], "docker-py `exec_run(['cat', FILE])` of the same 256 KiB, same container",
        data["living_attach_docker_cat"], "— (info)")
    add("10. PTY keystroke round trip: Terminal.send 1 byte → `cat` echoes it (`stty raw -echo`)", "time",
        data["living_pty"], "`docker exec -it` via docker-py (exec_start socket), same command and container",
        data["living_pty_docker"], "— (info)")
    add(f"11a. cp in: copy_in of a {mib} tree to a rw bind mount ({heavy})", "rate", data["living_cp_in"],
        "docker-py `put_archive` (streamed tar) to the same mount", data["living_cp_in_docker"], cp_target,
        cp_ok, rate_bytes=size)
    add(f"11b. cp out: copy_out of the {mib} tree from the rw bind mount ({heavy})", "rate", data["living_cp_out"],
        "docker-py `get_archive` + host `tarfile` extract, same mount", data["living_cp_out_docker"], cp_target,
        cp_ok, rate_bytes=size)
    add(f"11c. cp in: copy_in of the {mib} tree to /workspace (tmpfs) ({heavy})", "rate", data["living_cp_in_ws"],
        "`put_archive` to the bind mount (the archive API cannot write the tmpfs)", data["living_cp_in_docker"],
        "— (info)", rate_bytes=size)
    add("12a. pause: Sandbox.pause()", "time", data["living_pause"], "docker-py `pause`, same container",
        data["living_pause_docker"], "— (info)")
    hung, refused = int(data["living_resume_hung"][0]), int(data["living_unpause_refused"][0])
    race = "Docker's 'is not paused' race, left out"
    add("12b. resume: Sandbox.resume() until the agent answers"
        + (f" ({hung} of {len(data['living_pause'])} hung: {race})" if hung else ""), "time",
        data["living_resume"], "docker-py `unpause`, same container (no readiness wait)"
        + (f" ({refused} refused: {race})" if refused else ""), data["living_resume_docker"], "— (info)")
    snap = f"{len(data['living_snapshot'])} samples"
    snap_mib = f"{data['living_snapshot_bytes'][0] / MIB:.0f} MiB"
    add(f"13a. snapshot of {snap_mib} in /workspace (tmpfs) to the host ({snap})", "time", data["living_snapshot"],
        f"`docker commit` of the same {snap_mib} in a writable layer (commit cannot see tmpfs)",
        data["living_commit"], "— (info)")
    add(f"13b. fork from the snapshot → its agent answers, files restored ({snap})", "time", data["living_fork"],
        "hardened `docker run` of the committed image until `true` exits", data["living_commit_run"], "— (info)")
    add(f"13c. snapshot + fork ({snap})", "time", data["living_snapshot_fork"], "`docker commit` + `docker run`",
        data["living_commit_total"], "— (info)")
