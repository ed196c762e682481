"""The exec loop's gathering of small pipe reads into one Output message."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from sandbox.execloop import GATHER_BYTES, gather, read_available


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        yield read_end, write_end
    finally:
        for fd in (read_end, write_end):
            with contextlib.suppress(OSError):
                os.close(fd)


def test_what_is_already_in_the_pipe_joins_the_first_read(pipe: tuple[int, int]) -> None:
    read_end, write_end = pipe
    os.write(write_end, b"a" * 4096)
    first = read_available(read_end)
    assert first == b"a" * 4096
    for piece in (b"b" * 4096, b"c" * 100):
        os.write(write_end, piece)
    assert gather(read_end, first) == b"a" * 4096 + b"b" * 4096 + b"c" * 100
    assert read_available(read_end) is None  # everything was taken; the pipe is still open


def test_the_end_of_the_pipe_stops_the_wait_and_stays_for_the_caller(pipe: tuple[int, int]) -> None:
    read_end, write_end = pipe
    os.write(write_end, b"last words")
    os.close(write_end)
    first = read_available(read_end, 4)
    assert first == b"last"
    assert gather(read_end, first) == b"last words"
    assert read_available(read_end) == b""  # the end, seen by the caller's next read


def test_a_large_read_is_sent_as_it_is(pipe: tuple[int, int]) -> None:
    read_end, write_end = pipe
    os.write(write_end, b"more")
    big = b"x" * GATHER_BYTES
    assert gather(read_end, big) is big
    assert read_available(read_end) == b"more"


def test_gathering_stops_at_the_limit(pipe: tuple[int, int]) -> None:
    read_end, write_end = pipe
    os.write(write_end, b"y" * 10_000)
    assert gather(read_end, b"x", limit=100) == b"x" + b"y" * 99
    assert read_available(read_end) == b"y" * 9_901
