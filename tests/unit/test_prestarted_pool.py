"""The agent's RPC thread pool: every worker exists before the first call, calls run and report."""

from __future__ import annotations

import os
import threading

import pytest

from sandbox.server import PrestartedPool


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_all_workers_exist_before_the_first_call() -> None:
    before = _threads()
    pool = PrestartedPool(16)
    try:
        assert _threads() == before + 16
        # Sixteen calls that can only finish together run on sixteen threads, none new.
        barrier = threading.Barrier(16)
        calls = [pool.submit(barrier.wait, 10) for _ in range(16)]
        assert sorted(f.result(timeout=30) for f in calls) == list(range(16))
        assert _threads() == before + 16
    finally:
        pool.shutdown()


def test_results_exceptions_and_callbacks() -> None:
    pool = PrestartedPool(2)
    try:
        assert pool.submit(lambda a, b=0: a + b, 1, b=2).result(timeout=30) == 3

        def boom() -> None:
            raise ValueError("no")

        failed = pool.submit(boom)
        with pytest.raises(ValueError, match="no"):
            failed.result(timeout=30)
        done = threading.Event()
        pool.submit(lambda: None).add_done_callback(lambda _f: done.set())
        assert done.wait(30)
    finally:
        pool.shutdown()


def test_no_calls_after_shutdown() -> None:
    pool = PrestartedPool(2)
    pool.shutdown()
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)
