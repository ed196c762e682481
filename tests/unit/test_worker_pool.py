"""The agent's RPC worker pool: a pre-started core, more workers on demand, the extras retired
when idle, and calls that wait (never an error from ``submit``) when no thread can start."""

from __future__ import annotations

import _thread
import os
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from sandbox.workers import WorkerPool

WAIT_S = 30


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


class _Pids:
    """A thread starter that fails like the kernel at the pids limit while ``full`` is set."""

    def __init__(self) -> None:
        self.full = False
        self.started = 0

    def __call__(self, target: Callable[[], None]) -> None:
        if self.full:
            raise RuntimeError("can't start new thread")
        self.started += 1
        _thread.start_new_thread(target, ())


@pytest.fixture
def pids() -> _Pids:
    return _Pids()


@pytest.fixture
def pool(pids: _Pids) -> Iterator[WorkerPool]:
    pool = WorkerPool(2, 6, idle_s=0.2, start=pids)
    try:
        yield pool
    finally:
        pool.shutdown()


def test_only_the_core_exists_before_the_first_call() -> None:
    before = _threads()
    pool = WorkerPool(4, 72)
    try:
        assert _threads() == before + 4 and pool.threads == 4
    finally:
        pool.shutdown()
        _until(lambda: _threads() == before)


def test_busy_workers_start_more_up_to_the_maximum_and_the_extras_retire(pool: WorkerPool, pids: _Pids) -> None:
    release = threading.Event()
    calls = [pool.submit(release.wait, WAIT_S) for _ in range(6)]
    assert pool.threads == 6 and pids.started == 6 and pool.waiting == 0
    release.set()
    assert all(call.result(timeout=WAIT_S) for call in calls)
    _until(lambda: pool.threads == 2)  # idle for idle_s: back to the core, never below it
    time.sleep(0.5)
    assert pool.threads == 2
    assert pool.submit(lambda: 7).result(timeout=WAIT_S) == 7
    assert pids.started == 6, "an idle core worker took the call"


def test_with_no_pid_left_a_call_waits_for_a_busy_worker(pool: WorkerPool, pids: _Pids) -> None:
    release = [threading.Event() for _ in range(2)]
    held = [pool.submit(event.wait, WAIT_S) for event in release]
    pids.full = True
    waiting = pool.submit(lambda: "served")  # never raises: gRPC's loop calls submit
    assert pool.waiting == 1 and pool.threads == 2
    assert not waiting.done()
    release[0].set()
    assert waiting.result(timeout=WAIT_S) == "served"
    assert held[0].result(timeout=WAIT_S) and pool.waiting == 0
    # the accounting is whole again: one worker busy, one idle, nothing owed
    assert pool.submit(lambda: 1).result(timeout=WAIT_S) == 1
    release[1].set()


def test_a_waiting_call_gets_a_new_worker_once_a_pid_is_free(pool: WorkerPool, pids: _Pids) -> None:
    release = threading.Event()
    held = [pool.submit(release.wait, WAIT_S) for _ in range(2)]
    pids.full = True
    waiting = pool.submit(lambda: "served")
    pool.top_up()
    assert not waiting.done() and pool.waiting == 1
    pids.full = False
    pool.top_up()
    assert waiting.result(timeout=WAIT_S) == "served"
    assert pool.waiting == 0 and pool.threads == 3
    release.set()
    assert all(call.result(timeout=WAIT_S) for call in held)


def test_results_exceptions_and_callbacks(pool: WorkerPool) -> None:
    assert pool.submit(lambda a, b=0: a + b, 1, b=2).result(timeout=WAIT_S) == 3

    def boom() -> None:
        raise ValueError("no")

    failed = pool.submit(boom)
    with pytest.raises(ValueError, match="no"):
        failed.result(timeout=WAIT_S)
    done = threading.Event()
    pool.submit(lambda: None).add_done_callback(lambda _f: done.set())
    assert done.wait(WAIT_S)


def test_no_calls_after_shutdown(pool: WorkerPool) -> None:
    pool.shutdown()
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)


def test_core_must_fit_in_the_maximum() -> None:
    with pytest.raises(ValueError, match="core"):
        WorkerPool(0, 4)
    with pytest.raises(ValueError, match="core"):
        WorkerPool(5, 4)
