"""The gRPC door's call threads (``harness.doors.grpc.workers``): kept between jobs, one
more only when none is idle, gone after their idle time."""

from __future__ import annotations

import threading

from harness.doors.grpc.workers import Workers

WAIT_S = 10.0


def _wait_idle(workers: Workers, count: int) -> None:
    """Until ``count`` threads wait for a job (the condition is polled on the threads' own events)."""
    done = threading.Event()

    def check() -> None:
        while not done.wait(0.005):
            if workers.idle == count:
                done.set()

    checker = threading.Thread(target=check, daemon=True)
    checker.start()
    checker.join(WAIT_S)
    assert workers.idle == count


def test_a_finished_job_s_thread_runs_the_next_one() -> None:
    workers = Workers("t-reuse")
    names: list[str] = []
    for _ in range(3):
        ran = threading.Event()

        def job(ran: threading.Event = ran) -> None:
            names.append(threading.current_thread().name)
            ran.set()

        workers.submit(job)
        assert ran.wait(WAIT_S)
        _wait_idle(workers, 1)
    assert names == ["t-reuse-1"] * 3


def test_jobs_that_run_together_each_get_a_thread() -> None:
    workers = Workers("t-many")
    release = threading.Event()
    started = threading.Barrier(4)
    names: set[str] = set()
    lock = threading.Lock()

    def job() -> None:
        with lock:
            names.add(threading.current_thread().name)
        started.wait(WAIT_S)
        release.wait(WAIT_S)

    for _ in range(3):
        workers.submit(job)
    started.wait(WAIT_S)  # all three run at once: none waited for another
    release.set()
    _wait_idle(workers, 3)
    assert len(names) == 3


def test_an_idle_thread_ends_and_a_later_job_still_runs() -> None:
    workers = Workers("t-idle", idle_s=0.01)
    first = threading.Event()
    ran_on: list[threading.Thread] = []

    def job() -> None:
        ran_on.append(threading.current_thread())
        first.set()

    workers.submit(job)
    assert first.wait(WAIT_S)
    ran_on[0].join(WAIT_S)  # it waited its idle time for another job, then ended
    assert not ran_on[0].is_alive() and workers.idle == 0
    second = threading.Event()
    workers.submit(second.set)
    assert second.wait(WAIT_S)
