"""The jobs' output ring buffer: eviction by bytes, exact gap accounting, and readers that
fall behind (a gap mid-stream) without ever holding the writer up."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from sandbox import joblog
from sandbox.joblog import CHUNK_COST, Chunk, Gap, JobLog
from sandbox.jobterm import Detach, follow_log
from sandbox.v1 import jobs_pb2


def filled(capacity: int, sizes: list[int]) -> JobLog:
    log = JobLog(capacity)
    for i, size in enumerate(sizes):
        log.append("stderr" if i % 3 == 2 else "stdout", bytes([65 + i % 26]) * size)
    return log


def test_chunks_are_numbered_and_held_until_the_budget_is_spent() -> None:
    log = filled(4096, [10, 20, 30])
    with log.cond:
        gap, chunks = log.read(0)
    assert gap is None
    assert [(c.seq, c.stream, len(c.data)) for c in chunks] == [(0, "stdout", 10), (1, "stdout", 20), (2, "stderr", 30)]
    assert (log.next_seq, log.output_bytes, log.dropped_bytes, log.held_cost) == (3, 60, 0, 60 + 3 * CHUNK_COST)


def test_eviction_keeps_the_newest_within_the_budget_and_counts_exactly() -> None:
    sizes = [100 + 7 * i for i in range(60)]  # at most 513: not split in an 8 KiB buffer
    log = filled(8192, sizes)
    assert log.held_cost <= 8192
    first = log.first_seq
    assert first > 0 and log.next_seq == 60
    # Nothing newer was evicted: adding back the oldest evicted chunk would overflow.
    assert log.held_cost + sizes[first - 1] + CHUNK_COST > 8192
    assert log.dropped_bytes == sum(sizes[:first])
    assert log.output_bytes == sum(sizes)
    with log.cond:
        for start in (0, 1, first // 2, first - 1):
            gap, chunks = log.read(start)
            assert gap == Gap(start, first, sum(sizes[start:first]))
            assert chunks[0].seq == first and [len(c.data) for c in chunks] == sizes[first:]
        gap, chunks = log.read(first + 2)
        assert gap is None and chunks[0].seq == first + 2
        assert log.read(60) == (None, [])


def test_big_appends_are_split_into_chunks_of_an_eighth_of_the_buffer() -> None:
    log = JobLog(8192)
    log.append("stdout", bytes(range(256)) * 10)  # 2560 bytes: pieces of 1024
    with log.cond:
        _, chunks = log.read(0)
    assert [len(c.data) for c in chunks] == [1024, 1024, 512]
    assert b"".join(c.data for c in chunks) == bytes(range(256)) * 10
    big = JobLog(64 << 20)
    big.append("stdout", b"x" * (200 << 10))
    assert big.next_seq == 4  # 64 KiB at most per chunk


def test_a_read_hands_over_a_bounded_batch() -> None:
    log = filled(1 << 20, [1000] * 50)
    with log.cond:
        _, chunks = log.read(0, max_bytes=4500)
        assert [c.seq for c in chunks] == [0, 1, 2, 3]
        _, chunks = log.read(0, max_bytes=10)  # at least one
        assert [c.seq for c in chunks] == [0]


def test_remembered_sizes_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(joblog, "MAX_SIZES", 64)
    monkeypatch.setattr(joblog, "_SIZES_TRIM", 16)
    log = filled(4096, [10 + i % 50 for i in range(1000)])
    assert len(log._sizes) <= 64
    with log.cond:
        exact_from = log._sizes_seq
        gap, _ = log.read(exact_from)
        assert gap is not None and gap.dropped_bytes == sum(10 + i % 50 for i in range(exact_from, log.first_seq))
        gap, _ = log.read(0)  # from seq 0 it is always exact
        assert gap is not None and gap.dropped_bytes == log.dropped_bytes
        gap, _ = log.read(1)  # older than what is remembered: a lower bound
        assert gap is not None and gap.dropped_bytes == sum(log._sizes) < log.dropped_bytes


def test_too_small_a_buffer_is_refused() -> None:
    with pytest.raises(ValueError, match="at least"):
        JobLog(100)


class FakeJob:
    """What follow_log needs of a job: its log and its info."""

    def __init__(self, log: JobLog) -> None:
        self.log = log
        self.state = jobs_pb2.JOB_STATE_RUNNING

    def info(self) -> jobs_pb2.JobInfo:
        return jobs_pb2.JobInfo(pid=1, state=self.state, next_seq=self.log.next_seq)


def kinds(events: list[jobs_pb2.JobEvent]) -> list[str]:
    return [str(e.WhichOneof("event")) for e in events]


def test_a_reader_that_falls_behind_gets_a_gap_and_never_blocks_the_writer() -> None:
    log = filled(4096, [100] * 5)
    job: Any = FakeJob(log)
    events = follow_log(job, 0, True, lambda _handle: None)
    first = next(events)
    assert first.output.seq == 0
    # The reader stops reading; the writer goes on (appending never waits for it).
    def write() -> None:
        for _ in range(200):
            log.append("stdout", b"y" * 100)

    writer = threading.Thread(target=write)
    writer.start()
    writer.join(5)
    assert not writer.is_alive()
    job.state = jobs_pb2.JOB_STATE_EXITED
    log.close()
    rest = list(events)
    gaps = [e.gap for e in rest if e.WhichOneof("event") == "gap"]
    assert len(gaps) == 1 and gaps[0].first_seq >= 1 and gaps[0].end_seq == log.first_seq
    assert gaps[0].dropped_bytes == 100 * (gaps[0].end_seq - gaps[0].first_seq)
    outputs = [e.output.seq for e in rest if e.WhichOneof("event") == "output"]
    assert outputs[-1] == 204 and outputs == sorted(outputs)
    assert rest[-1].exited.state == jobs_pb2.JOB_STATE_EXITED


def test_follow_sends_live_once_then_waits_and_detach_ends_it() -> None:
    log = filled(4096, [10, 10])
    job: Any = FakeJob(log)
    detach = Detach(log)
    events = follow_log(job, 0, True, lambda _h: None, detach)
    got = [next(events) for _ in range(3)]
    assert kinds(got) == ["output", "output", "live"]
    log.append("stdout", b"live!")
    assert next(events).output.stdout == b"live!"
    threading.Timer(0.05, detach.cancel).start()
    assert list(events) == []  # detached while waiting: the stream just ends

    replay = list(follow_log(job, 0, False, lambda _h: None))  # without follow: held output, no live, no end
    assert kinds(replay) == ["output", "output", "output"]
    assert [Chunk(e.output.seq, "stdout", e.output.stdout) for e in replay][-1] == Chunk(2, "stdout", b"live!")
