"""Timeouts, OOM, pids and output caps are enforced inside a real sandbox."""

from __future__ import annotations

import threading
import time

import grpc
import psutil
import pytest

from harness.core.errors import AgentCallError
from harness.engine.docker.container import AGENT_PIDS_RESERVE
from harness.engine.exec_result import ExecResult
from sandbox import health
from sandbox.watch import MAX_ACTIVE
from sandbox.workers import AGENT_OTHER_THREADS, CORE_WORKERS
from tests.conftest import RUNTIME
from tests.integration.helpers import run

pytestmark = pytest.mark.docker

SURVIVORS = "ps -e -o user=,comm= | awk '$1 != \"root\"' | grep -v -e '^ *sandbox *ps$' -e awk -e grep || true"


def test_timeout_kills_whole_tree_including_trapping_child_and_double_forked_daemon(sandbox):
    command = (
        "trap '' TERM; "
        "(trap '' TERM; exec sleep 1000) & "                      # child that ignores SIGTERM
        "(setsid sh -c 'trap \"\" TERM; echo $$ > /tmp/daemon.pid; exec sleep 1001' &) ; "  # double fork
        "sleep 1002"
    )
    started = time.monotonic()
    result = run(sandbox, command, timeout_ms=1000)
    elapsed = time.monotonic() - started
    assert result.timed_out
    assert elapsed < 1 + 2, f"took {elapsed:.2f} s"
    daemon = run(sandbox, "cat /tmp/daemon.pid").stdout.data().strip()
    assert daemon.isdigit(), "the daemon never started, so the test proves nothing"
    alive = run(sandbox, f"kill -0 {daemon.decode()} 2>/dev/null && echo alive || echo gone")
    assert alive.stdout.data() == b"gone\n"
    left = run(sandbox, "ps -e -o comm= | grep -c '^sleep$' || true")
    assert left.stdout.data().strip() == b"0"


def test_background_process_does_not_outlive_its_call(sandbox):
    started = time.monotonic()
    result = run(sandbox, "sleep 300 & echo started")
    assert result.stdout.data() == b"started\n"
    assert time.monotonic() - started < 5
    assert run(sandbox, "ps -e -o comm= | grep -c '^sleep$' || true").stdout.data().strip() == b"0"


HOLD_EVERY_PID = """
import os, time
while True:
    try:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
    except BlockingIOError:
        break
print("every pid taken", flush=True)
time.sleep(60)
"""
"""A fork bomb that keeps what it took: unlike a shell bomb, whose failing forks end and free
pids all the time, no pid comes free while it runs."""


def test_with_every_pid_taken_and_every_worker_held_a_call_waits_for_a_free_worker(make_sandbox):
    """The agent keeps only a small core of RPC workers and starts more on demand. A fork bomb
    that takes every pid while long-lived calls hold every worker: a new call cannot get a
    thread, so it waits (it is neither refused nor lost, and the agent keeps serving), and it
    is answered as soon as a worker comes free."""
    pids = 64
    box = make_sandbox(pids=pids)
    assert run(box, "mkdir -p /tmp/held").exit_code == 0
    if RUNTIME == "runc":  # idle: docker-init, the spawner and the agent's threads (gVisor counts its own)
        assert box.stats().pids == 2 + AGENT_OTHER_THREADS + CORE_WORKERS
    assert MAX_ACTIVE >= CORE_WORKERS
    # Watches hold a worker each for as long as they are open, and need no pid.
    watches = [box.agent.transfer.watch("/tmp/held") for _ in range(CORE_WORKERS)]
    outcome: dict[str, object] = {}
    thread = threading.Thread(target=lambda: outcome.setdefault(
        "bomb", run(box, ["python3", "-c", HOLD_EVERY_PID], timeout_ms=7_000)))
    thread.start()  # its Exec takes one more worker, started on demand while pids were free
    try:
        deadline = time.monotonic() + 10
        while box.stats().pids < pids + AGENT_PIDS_RESERVE:
            assert time.monotonic() < deadline, "the bomb never took every pid"
        with pytest.raises(grpc.RpcError) as waited:
            health.check(box.agent.channel, timeout=1.5)
        assert waited.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        watches.pop().close()  # a worker comes free
        assert box.agent.health(timeout=10) == health.SERVING
        # a new command gets a worker too, and is refused as retryable: its process gets no pid
        with pytest.raises(AgentCallError) as refused:
            run(box, ["true"], rpc_timeout=10)
        assert (refused.value.reason, refused.value.retryable) == ("BUSY", True), refused.value
    finally:
        for watch in watches:
            watch.close()
        thread.join(30)
    assert not thread.is_alive()
    bomb = outcome["bomb"]
    assert isinstance(bomb, ExecResult) and bomb.timed_out
    assert bomb.stdout.data() == b"every pid taken\n"
    assert run(box, ["true"]).exit_code == 0


def test_memory_hog_is_reported_oom_killed(make_sandbox):
    box = make_sandbox(memory="128m")
    result = run(box, ["python3", "-c", "b = bytearray(b'x') * (256 << 20)"], timeout_ms=30_000)
    assert result.oom_killed, result.to_json()
    assert result.signal == 9
    assert result.shell_exit_code == 137
    # the agent survived and still answers
    assert run(box, ["true"]).exit_code == 0


def test_plain_sigkill_is_not_reported_as_oom(sandbox):
    result = run(sandbox, "kill -9 $$")
    assert result.signal == 9
    assert not result.oom_killed


def test_fork_bomb_hits_pids_limit_while_other_sandbox_answers(make_sandbox):
    bomb_box = make_sandbox(pids=64)
    other = make_sandbox()
    bomb_started = threading.Event()
    outcome: dict[str, object] = {}

    def bomb() -> None:
        bomb_started.set()
        outcome["bomb"] = run(bomb_box, "f(){ f | f & }; f; sleep 3", timeout_ms=4000)

    thread = threading.Thread(target=bomb)
    thread.start()
    try:
        assert bomb_started.wait(5)
        # while the bomb runs, another sandbox answers promptly
        latencies = []
        for _ in range(5):
            t0 = time.monotonic()
            assert run(other, ["echo", "ok"]).stdout.data() == b"ok\n"
            latencies.append(time.monotonic() - t0)
        assert max(latencies) < 1.0, latencies
        # inside the bombed sandbox a new command either runs or is refused as retryable
        try:
            assert run(bomb_box, ["true"], rpc_timeout=20).exit_code in (0, 126)
        except AgentCallError as error:
            assert (error.reason, error.retryable) == ("BUSY", True), error
    finally:
        thread.join(30)
    assert not thread.is_alive()
    bomb_result = outcome["bomb"]
    assert isinstance(bomb_result, ExecResult)
    assert b"Resource temporarily unavailable" in bomb_result.stderr.data(), "the bomb never hit the pids limit"
    # the bomb is gone afterwards and the sandbox still works
    after = run(bomb_box, "ps -e -o comm= | wc -l")
    assert int(after.stdout.data()) < 10
    assert run(bomb_box, ["true"]).exit_code == 0


def test_100mb_output_truncated_to_cap_with_exact_head_tail_and_bounded_harness_memory(sandbox):
    lines = 10_000_000  # 10 bytes each: 100 MB
    cap = 1 << 20
    script = (
        "import sys\n"
        "w = sys.stdout.buffer.write\n"
        f"for start in range(0, {lines}, 10000):\n"
        "    w(b''.join(b'%09d\\n' % i for i in range(start, start + 10000)))\n"
    )
    rss_before = psutil.Process().memory_info().rss
    result = run(sandbox, ["python3", "-c", script], output_cap_bytes=cap, timeout_ms=120_000)
    rss_growth = psutil.Process().memory_info().rss - rss_before
    total = lines * 10
    expected = b"".join(b"%09d\n" % i for i in range(0, 60_000))
    expected_tail = b"".join(b"%09d\n" % i for i in range(lines - 60_000, lines))
    assert result.exit_code == 0
    assert result.stdout.total_bytes == total
    assert result.stdout.dropped_bytes == total - cap
    assert bytes(result.stdout.head) == expected[: cap - cap // 2]
    assert bytes(result.stdout.tail) == expected_tail[-(cap // 2):]
    assert b"bytes dropped" in result.stdout.rendered()
    assert rss_growth < 50 << 20, f"harness grew by {rss_growth >> 20} MiB"


def test_binary_and_non_utf8_output_survive(sandbox):
    payload = bytes(range(256)) * 4
    result = run(sandbox, ["cat"], stdin=payload)
    assert result.stdout.data() == payload
    err = run(sandbox, "printf '\\377\\376 \\000x' >&2")
    assert err.stderr.data() == b"\xff\xfe \x00x"
