"""Timeouts, OOM, pids and output caps are enforced inside a real sandbox."""

from __future__ import annotations

import threading
import time

import psutil
import pytest

from harness.core.errors import AgentCallError
from harness.engine.exec_result import ExecResult
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
