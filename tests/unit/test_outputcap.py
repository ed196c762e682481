"""HeadTailBuffer: the live head, the held tail and the exact count of what lies between."""

from __future__ import annotations

import random

import pytest

from sandbox.outputcap import HeadTailBuffer


def _run(cap: int, chunks: list[bytes]) -> tuple[bytes, bytes, int, HeadTailBuffer]:
    """Feed every chunk; return (everything sent live, the tail, dropped, the buffer)."""
    buf = HeadTailBuffer(cap)
    live = b"".join(buf.feed(c) for c in chunks)
    tail, dropped = buf.finish()
    return live, tail, dropped, buf


def _expected(cap: int, data: bytes) -> tuple[bytes, bytes, int]:
    """What a correct head/tail split of ``data`` under ``cap`` must give."""
    head_limit = cap - cap // 2
    tail_limit = cap // 2
    head = data[:head_limit]
    rest = data[head_limit:]
    tail = rest[len(rest) - min(tail_limit, len(rest)) :]
    return head, tail, len(data) - len(head) - len(tail)


@pytest.mark.parametrize(("cap", "head", "tail"), [(10, 5, 5), (11, 6, 5), (1, 1, 0), (2, 1, 1), (0, 0, 0)])
def test_limits_split_the_cap_with_the_odd_byte_in_the_head(cap: int, head: int, tail: int) -> None:
    buf = HeadTailBuffer(cap)
    assert (buf.head_limit, buf.tail_limit) == (head, tail)
    assert buf.head_limit + buf.tail_limit == cap


def test_negative_cap_is_refused() -> None:
    with pytest.raises(ValueError, match="cap"):
        HeadTailBuffer(-1)


def test_output_within_the_head_streams_entirely_and_nothing_is_held() -> None:
    live, tail, dropped, buf = _run(10, [b"abc", b"de"])
    assert live == b"abcde"
    assert (tail, dropped) == (b"", 0)
    assert buf.total == 5
    assert buf.emitted == 5


def test_even_cap_keeps_first_and_last_halves() -> None:
    data = bytes(range(100))
    live, tail, dropped, _ = _run(10, [data])
    assert live == data[:5]
    assert tail == data[-5:]
    assert dropped == 90


def test_odd_cap_gives_the_extra_byte_to_the_head() -> None:
    data = bytes(range(100))
    live, tail, dropped, _ = _run(11, [data])
    assert live == data[:6]
    assert tail == data[-5:]
    assert dropped == 89


def test_output_between_head_and_cap_is_kept_whole_with_no_gap() -> None:
    data = b"0123456789"  # cap 16: head 8, tail holds the last 2, nothing dropped
    live, tail, dropped, buf = _run(16, [data])
    assert live == b"01234567"
    assert tail == b"89"
    assert dropped == 0
    assert live + tail == data
    assert buf.dropped == 0


def test_exactly_cap_bytes_drop_nothing() -> None:
    data = b"x" * 7 + b"y" * 7
    live, tail, dropped, _ = _run(14, [data])
    assert (live, tail, dropped) == (b"x" * 7, b"y" * 7, 0)


def test_one_byte_over_the_cap_drops_exactly_one() -> None:
    data = bytes(range(15))
    live, tail, dropped, _ = _run(14, [data])
    assert live == data[:7]
    assert tail == data[8:]
    assert dropped == 1


def test_cap_zero_sends_nothing_and_counts_everything() -> None:
    live, tail, dropped, buf = _run(0, [b"abc", b"", b"defg"])
    assert (live, tail, dropped) == (b"", b"", 7)
    assert buf.total == 7
    assert buf.dropped == 7


def test_chunk_straddling_the_head_boundary_is_split_at_the_boundary() -> None:
    buf = HeadTailBuffer(10)  # head 5, tail 5
    assert buf.feed(b"abc") == b"abc"
    assert buf.feed(b"defgh") == b"de"  # 'fgh' goes to the tail
    assert buf.feed(b"ij") == b""
    assert buf.dropped == 0
    assert buf.feed(b"klm") == b""  # tail would be fghijklm: 3 dropped
    assert buf.dropped == 3
    assert buf.finish() == (b"ijklm", 3)


def test_chunk_ending_exactly_at_the_head_boundary() -> None:
    buf = HeadTailBuffer(8)
    assert buf.feed(b"abcd") == b"abcd"
    assert buf.feed(b"e") == b""
    assert buf.finish() == (b"e", 0)


def test_many_single_byte_chunks() -> None:
    data = bytes(i % 251 for i in range(10_000))
    buf = HeadTailBuffer(100)
    live = bytearray()
    for i in range(len(data)):
        live += buf.feed(data[i : i + 1])
    tail, dropped = buf.finish()
    assert bytes(live) == data[:50]
    assert tail == data[-50:]
    assert dropped == 9_900
    assert buf.total == 10_000


def test_dropped_count_is_exact_after_each_chunk() -> None:
    buf = HeadTailBuffer(6)  # head 3, tail 3
    fed = 0
    for size in (1, 2, 4, 8, 16):
        buf.feed(b"z" * size)
        fed += size
        assert buf.dropped == max(0, fed - 6)
        assert buf.total == fed


def test_finish_returns_the_tail_and_the_gap_and_empties_the_tail() -> None:
    buf = HeadTailBuffer(4)
    buf.feed(b"HHmiddleTT")
    assert buf.finish() == (b"TT", 6)
    assert buf.emitted == 4  # head 2 + tail 2: everything that was sent
    # The tail was handed over: a second finish has nothing new to send.
    assert buf.finish() == (b"", 6)


def test_empty_stream_finishes_empty() -> None:
    buf = HeadTailBuffer(10)
    assert buf.feed(b"") == b""
    assert buf.finish() == (b"", 0)
    assert buf.total == 0


@pytest.mark.parametrize("seed", range(40))
def test_random_chunkings_reconstruct_the_right_slices(seed: int) -> None:
    rng = random.Random(seed)
    length = rng.choice([0, 1, 5, 63, 64, 65, 500, 4096, rng.randrange(0, 20_000)])
    data = bytes(rng.randrange(256) for _ in range(length))
    cap = rng.choice([0, 1, 2, 3, 7, 64, 65, 128, 1000, rng.randrange(0, 3 * max(length, 1))])
    chunks = []
    pos = 0
    while pos < len(data):
        size = rng.choice([0, 1, rng.randrange(1, 50), rng.randrange(1, 5000)])
        chunks.append(data[pos : pos + size])
        pos += size

    live, tail, dropped, buf = _run(cap, chunks)

    head, want_tail, want_dropped = _expected(cap, data)
    assert live == head
    assert tail == want_tail
    assert dropped == want_dropped
    assert buf.total == len(data)
    assert len(live) + dropped + len(tail) == len(data)
    # head + gap + tail is the original with exactly the gap cut out
    assert data[: len(live)] + data[len(live) + dropped :] == live + tail
    assert len(live) + len(tail) <= cap
