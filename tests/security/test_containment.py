"""Resource attacks stay inside their sandbox (part of the attack suite).

Each attack runs in sandbox A while the test measures the round trip of a command in
another sandbox B on the same machine (it must answer within 1 s; on the Ray engine A is
placed on B's node), and afterwards A is still usable or cleanly limited: the memory bomb
is OOM-killed and the agent answers; a disk-filling loop stops at its tmpfs size (no byte
reaches the host's disk) and the agent answers; the ``fsize`` ulimit stops a large file
with SIGXFSZ/EFBIG; an output flood is cut to the cap with the harness's memory bounded; a
SIGTERM-ignoring, detached daemon dies with its call. The fork bomb is in
``tests/integration/test_process_limits.py``.

Attacks that last are started in a thread; the test waits for the attack's own
"started" marker on its output (an event, not a sleep) and then samples B until the
attack's call returns (a bounded number of samples).

Two cases found real gaps, now fixed: the OOM killer could choose the agent rather than a
tool process (tool processes now start with oom_score_adj 1000), and full tmpfs mounts
could add up to more than the memory limit (they now stay under half of it).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from harness.core.errors import AgentCallError
from harness.engine.exec_result import ExecResult, collect
from harness.engine.spec import SandboxSpec
from tests.conftest import IMAGE, RUNTIME
from tests.integration.helpers import run
from tests.security.engines import beside, docker_client, machine

pytestmark = pytest.mark.docker

ROUND_TRIP_LIMIT_S = 1.0
MAX_SAMPLES = 60
SAMPLE_PACE_S = 0.05
"""Between two samples wait this long for the attack's end (an event), so the samples
spread over the attack instead of crowding its first moments."""
SIGXFSZ = 25
EFBIG = 27
GVISOR = RUNTIME == "runsc"
WHOLE_SANDBOX_OOM = "running out of memory .*under runsc a tool over the limit stops the whole sandbox"
"""Under gVisor every tool's memory is the memory of one host process, gVisor's kernel, and
its own cgroups enforce no limit: a tool over the limit makes the host's OOM killer stop
the whole sandbox, agent included. The call then fails with this reason (from the
container's OOMKilled state) instead of an ``oom_killed`` result in a sandbox that lives on."""


@pytest.fixture(scope="module")
def other(engine) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    """Sandbox B: it only answers ``echo``, so one serves the whole module."""
    sandbox = engine.create(SandboxSpec(image=IMAGE, runtime=RUNTIME))
    try:
        yield sandbox
    finally:
        sandbox.destroy()


def attacker(make_sandbox: Any, other: Any, **fields: Any) -> Any:
    """Sandbox A, made with ``fields`` on the machine that runs B (``other``)."""
    box = make_sandbox(**fields, **beside(other))
    assert machine(box) == machine(other), "the attack would not share B's machine, so B's answers prove less"
    return box


def round_trip(box: Any) -> float:
    started = time.monotonic()
    result = run(box, ["echo", "ok"], rpc_timeout=10)
    elapsed = time.monotonic() - started
    assert result.stdout.data() == b"ok\n"
    return elapsed


class Attack:
    """An attack command running in a thread; ``started`` is set when its output shows ``marker``."""

    def __init__(self, box: Any, command: Any, *, marker: bytes = b"ATTACK-STARTED", **options: Any) -> None:
        self.started = threading.Event()
        self.done = threading.Event()
        self.result: ExecResult | None = None
        self.error: BaseException | None = None
        self._seen = b""
        self._marker = marker

        def on_output(_stream: str, data: bytes, _dropped: int) -> None:
            if not self.started.is_set():
                self._seen = (self._seen + data)[-4096:]
                if self._marker in self._seen:
                    self.started.set()

        def body() -> None:
            try:
                self.result = collect(box.agent.exec(command, **options), on_output=on_output)
            except BaseException as exc:  # reported by finish()
                self.error = exc
            finally:
                self.started.set()
                self.done.set()

        self.thread = threading.Thread(target=body, daemon=True)
        self.thread.start()

    def sample(self, other: Any) -> list[float]:
        """Round trips of ``other`` from the attack's start until its call returns (at least one)."""
        assert self.started.wait(30), "the attack never started"
        latencies = [round_trip(other)]
        while len(latencies) < MAX_SAMPLES and not self.done.wait(SAMPLE_PACE_S):
            latencies.append(round_trip(other))
        return latencies

    def finish(self, timeout: float = 60) -> ExecResult:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the attack's call did not return"
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def agent_pid(box: Any) -> str:
    pid = run(box, "pgrep -o -u root -f '^/usr/bin/python3 -I -S /opt/callbox/agent.py' || true")
    return pid.stdout.data().decode().strip()


def started_agent_pid(box: Any) -> str:
    """``agent_pid`` before an attack: there must be one to compare with afterwards."""
    pid = agent_pid(box)
    assert pid.isdigit(), pid
    return pid


def assert_agent_intact(box: Any, agent_before: str) -> None:
    """After an attack the sandbox's agent is the same process, and it answers."""
    assert run(box, ["echo", "alive"]).stdout.data() == b"alive\n"
    assert agent_pid(box) == agent_before


def memory_usage(box: Any) -> int:
    text = run(box, "cat /sys/fs/cgroup/memory/memory.usage_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.current")
    return int(text.stdout.data())


def oom_kills(box: Any) -> int:
    """The OOM kills counted in the sandbox's memory cgroup (v1 ``memory.oom_control``, v2 ``memory.events``)."""
    text = run(box, "cat /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null || cat /sys/fs/cgroup/memory.events")
    counts = dict(line.split() for line in text.stdout.data().decode().splitlines())
    return int(counts["oom_kill"])


def size_rw(box: Any) -> int:
    """Bytes in the container's writable layer on the disk of the machine that runs it (Docker's SizeRw)."""
    # docker-py's inspect_container takes no ``size``; the listing computes the same SizeRw
    # and leaves it out when it is 0 (SizeRootFs shows the sizes were computed).
    listed = docker_client(box).api.containers(all=True, size=True, filters={"id": box.container_id})
    assert len(listed) == 1 and "SizeRootFs" in listed[0], listed
    return int(listed[0].get("SizeRw") or 0)


# ---- memory -------------------------------------------------------------------------------------

ALLOCATE = (
    "chunks = []\n"
    "while True:\n"
    "    chunks.append(bytearray(16 << 20))  # zero-filled: every page is touched\n"
)


def assert_whole_sandbox_oom(box: Any, command: str, other: Any) -> None:
    """Under gVisor: ``command`` takes ``box`` down, the call says why, ``other`` answers."""
    with pytest.raises(AgentCallError, match=WHOLE_SANDBOX_OOM):
        run(box, command, timeout_ms=30_000)
    assert round_trip(other) < ROUND_TRIP_LIMIT_S
    with pytest.raises(AgentCallError, match="stopped answering"):
        run(box, ["true"], rpc_timeout=5)


def test_memory_bomb_is_oom_killed_and_the_agent_survives(make_sandbox, other):
    box = attacker(make_sandbox, other, memory="256m")
    if GVISOR:
        # gVisor refuses some allocations near the limit itself (the allocator exits 1 with a
        # MemoryError it has no memory left to print) and the sandbox lives on; when one gets
        # past that, the whole sandbox is stopped and the call says so. Never a sandbox over
        # its limit, never a silent loss.
        agent_before = agent_pid(box)
        try:
            result = run(box, f"python3 -c '{ALLOCATE}'", timeout_ms=30_000)
        except AgentCallError as exc:
            assert re.search(WHOLE_SANDBOX_OOM, str(exc)), exc
        else:
            assert result.exit_code == 1 and not result.timed_out, result.to_json()
            assert_agent_intact(box, agent_before)
        assert round_trip(other) < ROUND_TRIP_LIMIT_S
        return
    agent_before = agent_pid(box)
    assert agent_before.isdigit()
    kills_before = oom_kills(box)
    # three seconds of sustained pressure: one allocator after another, each far above the limit
    command = (
        "echo ATTACK-STARTED; end=$((SECONDS + 3)); "
        f"while [ $SECONDS -lt $end ]; do python3 -c '{ALLOCATE}'; echo rc=$?; done"
    )
    attack = Attack(box, command, timeout_ms=30_000)
    latencies = attack.sample(other)
    result = attack.finish()
    codes = [line for line in result.stdout.data().decode().split() if line.startswith("rc=")]
    assert codes and set(codes) == {"rc=137"}, result.stdout.data()  # every allocator was SIGKILLed ...
    assert oom_kills(box) - kills_before >= len(codes)  # ... by the OOM killer
    assert max(latencies) < ROUND_TRIP_LIMIT_S, latencies
    # the agent is the same process and answers
    assert run(box, ["echo", "alive"]).stdout.data() == b"alive\n"
    assert agent_pid(box) == agent_before


def test_memory_bomb_of_small_processes_does_not_kill_the_agent(make_sandbox, other):
    # Each process is smaller than the agent (~40 MB RSS), so without the tool processes'
    # oom_score_adj the OOM killer would pick the agent first.
    box = attacker(make_sandbox, other, memory="256m")
    hog = "import time; b = bytearray(25 << 20); time.sleep(30)"
    if GVISOR:
        assert_whole_sandbox_oom(box, f"for i in $(seq 16); do python3 -c '{hog}' & done; wait", other)
        return
    agent_before = started_agent_pid(box)
    kills_before = oom_kills(box)
    # 16 x 25 MB is far above 256 MB: the OOM killer must free memory, and the hogs wait
    # (the survivors until the call times out); each subshell reports its hog's end
    command = f"for i in $(seq 16); do (python3 -c '{hog}'; echo rc=$?) & done; echo ATTACK-STARTED; wait"
    attack = Attack(box, command, timeout_ms=10_000)
    latencies = attack.sample(other)
    result = attack.finish()
    killed = result.stdout.data().decode().split().count("rc=137")
    assert killed >= 1, result.to_json()  # hogs were SIGKILLed ...
    assert oom_kills(box) - kills_before >= killed  # ... by the OOM killer
    assert max(latencies) < ROUND_TRIP_LIMIT_S, latencies
    assert_agent_intact(box, agent_before)  # ... never the agent


# ---- disk ---------------------------------------------------------------------------------------

TMPFS_MOUNTS = ("/tmp", "/workspace", "/home/sandbox", "/dev/shm")


def tmpfs_usage(box: Any, mount: str) -> tuple[int, int]:
    """Size and used bytes of a mount as ``df -B1`` reports them."""
    text = run(box, ["df", "-B1", "--output=size,used", mount]).stdout.data().decode()
    size, used = text.splitlines()[-1].split()
    return int(size), int(used)


def test_filling_every_tmpfs_leaves_the_agent_alive(make_sandbox, other):
    # tmpfs pages count against the memory limit and cannot be reclaimed (no swap); full
    # mounts must leave room for the agent and a modest command.
    box = attacker(make_sandbox, other, memory="256m")
    agent_before = started_agent_pid(box)
    sizes = [tmpfs_usage(box, mount)[0] for mount in TMPFS_MOUNTS]
    assert sum(sizes) == box.spec.tmpfs_total <= box.spec.memory // 2, sizes
    fills = "; ".join(f"dd if=/dev/zero of={mount}/fill bs=1M status=none; echo rc=$?" for mount in TMPFS_MOUNTS)
    allocate = "b = bytearray(30 << 20); print('allocated')"
    command = f"echo ATTACK-STARTED; {fills}; python3 -c \"{allocate}\"; echo alloc=$?"
    attack = Attack(box, command, timeout_ms=30_000)
    latencies = attack.sample(other)
    result = attack.finish()
    lines = result.stdout.data().decode().split()
    # every mount filled up to ENOSPC ...
    assert [line for line in lines if line.startswith("rc=")] == ["rc=1"] * len(TMPFS_MOUNTS), result.to_json()
    assert result.stderr.data().count(b"No space left on device") == len(TMPFS_MOUNTS), result.to_json()
    for mount in TMPFS_MOUNTS:
        size, used = tmpfs_usage(box, mount)
        assert used == size, (mount, size, used)
    # ... and a modest allocation either fits or only it is OOM-killed
    assert "alloc=0" in lines or "alloc=137" in lines, result.to_json()
    assert max(latencies) < ROUND_TRIP_LIMIT_S, latencies
    assert_agent_intact(box, agent_before)


FILL_ROUNDS = 10


@pytest.mark.parametrize("mount", ["/tmp", "/workspace", "/home/sandbox"])
def test_disk_fill_stops_at_the_tmpfs_size(make_sandbox, other, mount):
    box = attacker(make_sandbox, other, memory="256m")
    agent_before = started_agent_pid(box)
    size, used = tmpfs_usage(box, mount)
    expected = {"/tmp": box.spec.effective_tmp_size, "/workspace": box.spec.effective_workspace_size,
                "/home/sandbox": box.spec.small_tmpfs_size}
    assert (size, used) == (expected[mount], 0)
    host_before = size_rw(box)
    # sustained pressure: fill the mount, empty it, fill it again (the last fill stays)
    command = (
        f"echo ATTACK-STARTED; for round in $(seq {FILL_ROUNDS}); do "
        f"rm -f {mount}/fill; dd if=/dev/zero of={mount}/fill bs=1M status=none; echo rc=$?; done; "
        f"stat -c size=%s {mount}/fill"
    )
    attack = Attack(box, command, timeout_ms=30_000)
    latencies = attack.sample(other)
    result = attack.finish()
    lines = result.stdout.data().decode().split()
    assert [line for line in lines if line.startswith("rc=")] == ["rc=1"] * FILL_ROUNDS, result.to_json()
    assert result.stderr.data().count(b"No space left on device") == FILL_ROUNDS, result.to_json()
    assert f"size={size}" in lines, result.to_json()  # the file stopped at the tmpfs size
    assert tmpfs_usage(box, mount) == (size, size)
    # none of it reached the host's disk: the container's writable layer did not grow
    host_growth = size_rw(box) - host_before
    assert host_growth < 1 << 20, f"the writable layer grew by {host_growth} bytes after writing {size}"
    assert max(latencies) < ROUND_TRIP_LIMIT_S, latencies
    assert_agent_intact(box, agent_before)


def test_fsize_limit_cannot_be_raised_and_stops_large_writes(make_sandbox, other):
    box = attacker(make_sandbox, other)
    agent_before = started_agent_pid(box)
    shown = run(box, "ulimit -f; ulimit -f unlimited; echo rc=$?; ulimit -f")
    assert shown.stdout.data().split() == [b"1048576", b"rc=1", b"1048576"], shown.to_json()  # 1 GiB in KiB
    assert b"cannot modify limit" in shown.stderr.data(), shown.to_json()

    small = attacker(make_sandbox, other, fsize="2m")
    small_agent_before = started_agent_pid(small)
    command = (
        "ulimit -f; echo ATTACK-STARTED; dd if=/dev/zero of=/workspace/big bs=1M count=10; echo rc=$?; "
        "stat -c size=%s /workspace/big"
    )
    attack = Attack(small, command, timeout_ms=30_000)
    latencies = attack.sample(other)
    result = attack.finish()
    lines = result.stdout.data().decode().split()
    assert lines[0] == "2048", result.to_json()
    assert f"size={2 << 20}" in lines, result.to_json()  # exactly 2 MiB, not a byte more
    # dd is killed by SIGXFSZ, or (if it ignored the signal) its write fails with EFBIG
    efbig = os.strerror(EFBIG).encode()
    assert f"rc={128 + SIGXFSZ}" in lines or ("rc=1" in lines and efbig in result.stderr.data()), result.to_json()
    assert max(latencies) < ROUND_TRIP_LIMIT_S, latencies
    assert_agent_intact(box, agent_before)
    assert_agent_intact(small, small_agent_before)


# ---- output and processes -----------------------------------------------------------------------

OUTPUT_CAP = 1 << 20
"""The agent's default ``output_cap_bytes``."""


def test_output_flood_is_capped_and_the_harness_stays_small(make_sandbox, other):
    sandbox = attacker(make_sandbox, other)
    agent_before = started_agent_pid(sandbox)
    harness = psutil.Process()
    rss_before = harness.memory_info().rss
    attack = Attack(sandbox, "echo ATTACK-STARTED; exec yes", timeout_ms=1000)
    latencies = attack.sample(other)
    result = attack.finish()
    rss_growth = harness.memory_info().rss - rss_before
    assert result.timed_out, result.to_json()
    kept = len(result.stdout.data())
    assert 0 < kept <= OUTPUT_CAP, kept
    assert result.stdout.dropped_bytes > 0 and result.stdout.truncated
    assert result.stdout.total_bytes == kept + result.stdout.dropped_bytes
    assert rss_growth < 50 << 20, f"the harness grew by {rss_growth >> 20} MiB"
    assert max(latencies) < ROUND_TRIP_LIMIT_S, latencies
    assert_agent_intact(sandbox, agent_before)


DAEMON_PID_FILE = "/tmp/daemon.pid"
DAEMON = (
    f"setsid nohup sh -c 'trap \"\" TERM; echo $$ > {DAEMON_PID_FILE}; while :; do sleep 1; done' "
    ">/dev/null 2>&1 & "
    # wait (bounded) for the daemon's pid, then show that it ignores SIGTERM
    f"for i in $(seq 500); do [ -s {DAEMON_PID_FILE} ] && break; sleep 0.01; done; "
    f"daemon=$(cat {DAEMON_PID_FILE}); echo daemon=$daemon; grep '^SigIgn:' /proc/$daemon/status || "
    # gVisor's /proc/PID/status has no signal masks: send SIGTERM and see it still there a
    # moment later (showing that something does not happen needs a bounded wait)
    "{ kill -TERM $daemon; sleep 0.3; kill -0 $daemon && echo SURVIVED-SIGTERM; }; "
    "echo ATTACK-STARTED"
)
SIGTERM_BIT = 1 << (15 - 1)
GONE_PROBES = 20


def daemon_state(box: Any, pid: str) -> str:
    """``alive``, ``zombie`` (killed, not yet reaped by init) or ``gone``."""
    probe = (
        f"if kill -0 {pid} 2>/dev/null; then "
        f"[ \"$(awk '/^State:/ {{print $2}}' /proc/{pid}/status 2>/dev/null)\" = Z ] && echo zombie || echo alive; "
        "else echo gone; fi"
    )
    return run(box, probe).stdout.data().decode().strip()


def assert_daemon_died(box: Any, result: ExecResult) -> None:
    """The daemon the call reported (``daemon=PID``, and ``SigIgn: MASK`` or ``SURVIVED-SIGTERM``)
    is gone after the call."""
    pid, ignored = "", 0
    for line in result.stdout.data().decode().splitlines():
        if line.startswith("daemon="):
            pid = line.removeprefix("daemon=")
        elif line.startswith("SigIgn:"):
            ignored = int(line.split()[1], 16)
        elif line == "SURVIVED-SIGTERM":
            ignored = SIGTERM_BIT
    assert pid.isdigit(), f"the daemon never started, so the test proves nothing: {result.to_json()}"
    assert ignored & SIGTERM_BIT, "the daemon does not ignore SIGTERM, so the test proves less"
    state = daemon_state(box, pid)
    assert state != "alive", "the daemon outlived its call"
    for _ in range(GONE_PROBES):  # a killed daemon may wait a moment for init to reap it
        if state == "gone":
            break
        state = daemon_state(box, pid)
    assert state == "gone", state


def test_sigterm_ignoring_daemon_dies_when_its_call_ends(make_sandbox, other):
    sandbox = attacker(make_sandbox, other)
    agent_before = started_agent_pid(sandbox)
    attack = Attack(sandbox, DAEMON, timeout_ms=30_000)
    latencies = attack.sample(other)
    result = attack.finish()
    assert result.exit_code == 0 and not result.timed_out, result.to_json()
    assert_daemon_died(sandbox, result)
    assert max(latencies) < ROUND_TRIP_LIMIT_S, latencies
    assert_agent_intact(sandbox, agent_before)


def test_sigterm_ignoring_daemon_dies_when_its_call_times_out(make_sandbox, other):
    sandbox = attacker(make_sandbox, other)
    agent_before = started_agent_pid(sandbox)
    # 3 s: under gVisor starting the daemon and showing it ignores SIGTERM takes about 1 s
    attack = Attack(sandbox, f"{DAEMON}; sleep 30", timeout_ms=3000)
    latencies = attack.sample(other)
    result = attack.finish()
    assert result.timed_out, result.to_json()
    assert_daemon_died(sandbox, result)
    assert max(latencies) < ROUND_TRIP_LIMIT_S, latencies
    assert_agent_intact(sandbox, agent_before)
