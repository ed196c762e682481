"""A job's output: a ring buffer of numbered chunks, bounded by bytes, that many readers share.

The job's reader (see ``jobloop``) only appends; it never waits for a reader. Readers take
what they want under the buffer's condition and wait on it for more, so a slow reader
only falls behind: when the chunks it has not read yet are evicted it gets a ``Gap``
saying which chunks it missed and how many bytes they held.

Each chunk costs its data plus ``CHUNK_COST`` bytes of the budget (the Python objects that
hold it), so a job writing one byte at a time cannot make the agent hold a million
chunks for a 1 MiB buffer. The sizes of the last ``MAX_SIZES`` evicted chunks are kept
(4 bytes each) to count a gap's bytes exactly; a gap starting before them counts the
bytes from the oldest size still known (a lower bound), or all of them from seq 0.

A log that ``hold``s its job's output does not let a following reader fall behind: each
follower's position is known (``follow``/``advance``/``unfollow``), and the job's reader
asks ``read_allowance`` before it reads a pipe. Once the slowest follower's unread chunks
would no longer fit beside the next read, the allowance is 0: the job's reader stops
reading, the pipe fills and the job waits, until that follower has read half the buffer
and ``on_room`` is called. Until its first follower comes the job is held for it (one
is expected: whoever starts such a job attaches to it at once, and output the job writes in
between must not be lost); once the last follower has left the log keeps only the newest
output, as one that does not hold.
"""

from __future__ import annotations

import array
import itertools
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

CHUNK_COST = 64
"""Bytes of the buffer's budget a chunk costs besides its data."""
MAX_CHUNK = 1 << 16
"""Appended data is split into chunks of at most this much, and at most an eighth of the
buffer (so a burst leaves the buffer mostly full, not holding one piece of it)."""
MIN_CAPACITY = 4096
MAX_SIZES = 1 << 16
"""Sizes of evicted chunks remembered for exact gap counts."""
_SIZES_TRIM = 1 << 12
READ_BATCH = 1 << 20
"""At most this much data is handed to a reader at a time (it holds it until sent)."""
MIN_HELD_READ = 256
"""A holding log never allows a read smaller than this: it waits for room instead."""

_FIRST = object()
"""The follower a holding log waits for until its first real one comes."""

STDOUT = "stdout"
STDERR = "stderr"


@dataclass(frozen=True)
class Chunk:
    seq: int
    stream: str
    data: bytes


@dataclass(frozen=True)
class Gap:
    """Chunks ``first_seq`` up to (not including) ``end_seq`` were evicted before being read."""

    first_seq: int
    end_seq: int
    dropped_bytes: int


class JobLog:
    """A ring buffer of output chunks numbered from 0, holding at most ``capacity`` bytes of budget.

    ``cond`` guards every field; readers wait on it and ``append``/``close`` notify it.
    """

    def __init__(self, capacity: int, *, hold: bool = False) -> None:
        if capacity < MIN_CAPACITY:
            raise ValueError(f"a job's buffer holds at least {MIN_CAPACITY} bytes")
        self.capacity = capacity
        self.hold = hold
        self._followers: dict[object, int] = {_FIRST: 0} if hold else {}
        self._appended_cost = 0
        """Cost of every chunk appended so far."""
        self._cost_through: deque[int] = deque()
        """For each held chunk, in step with ``_held``: ``_appended_cost`` once it was appended
        (so what a follower has not read is ``_appended_cost`` less the entry before its seq)."""
        self.waiting = False
        """The job's reader stopped reading for a follower (``on_room`` will be called)."""
        self.on_room: Callable[[], None] | None = None
        self.max_chunk = min(MAX_CHUNK, capacity // 8)
        self.cond = threading.Condition()
        self._held: deque[tuple[str, bytes]] = deque()
        self.first_seq = 0
        """The seq of the oldest chunk held (= next_seq when nothing is held)."""
        self.next_seq = 0
        self.output_bytes = 0
        self.dropped_bytes = 0
        self.held_cost = 0
        # Sizes of evicted chunks _sizes_seq .. first_seq - 1.
        self._sizes = array.array("I")
        self._sizes_seq = 0
        self.closed = False
        """No more output will come (the job ended and its output was drained)."""

    def append(self, stream: str, data: bytes) -> None:
        """Add ``data`` as one chunk or more, evicting the oldest ones over the budget."""
        if not data:
            return
        with self.cond:
            step = self.max_chunk
            pieces = [data] if len(data) <= step else [data[i:i + step] for i in range(0, len(data), step)]
            for piece in pieces:
                self._held.append((stream, piece))
                self.next_seq += 1
                self.output_bytes += len(piece)
                self.held_cost += len(piece) + CHUNK_COST
                self._appended_cost += len(piece) + CHUNK_COST
                self._cost_through.append(self._appended_cost)
            while self.held_cost > self.capacity:
                self._evict()
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    # ---- holding the job for its followers -----------------------------------------------

    def follow(self, token: object, seq: int) -> None:
        """A reader following from ``seq`` (it holds the job back where the log holds)."""
        with self.cond:
            self._followers.pop(_FIRST, None)
            self._followers[token] = max(seq, self.first_seq)

    def advance(self, token: object, seq: int) -> None:
        """Follower ``token`` has sent everything before ``seq``."""
        with self.cond:
            if token in self._followers:
                self._followers[token] = max(self._followers[token], seq)
            room = self._room_made()
        if room is not None:
            room()

    def unfollow(self, token: object) -> None:
        with self.cond:
            self._followers.pop(token, None)
            room = self._room_made()
        if room is not None:
            room()

    def _unread_cost(self) -> int:
        """Cost of the chunks the slowest follower has not read (caller holds ``cond``)."""
        slowest = min(self._followers.values())
        if slowest <= self.first_seq:
            return self.held_cost
        if slowest >= self.next_seq:
            return 0
        return self._appended_cost - self._cost_through[slowest - self.first_seq - 1]

    def read_allowance(self, wanted: int) -> int:
        """How many bytes the job's reader may read now (``wanted`` at most); 0: stop reading
        until ``on_room`` is called."""
        with self.cond:
            if not self.hold or not self._followers:
                return wanted
            room = self.capacity - self._unread_cost() - CHUNK_COST
            # the chunks a read becomes cost CHUNK_COST each besides their data
            allowed = min(wanted, room * self.max_chunk // (self.max_chunk + CHUNK_COST))
            if allowed >= min(wanted, MIN_HELD_READ):
                return allowed
            self.waiting = True
            return 0

    def _room_made(self) -> Callable[[], None] | None:
        """``on_room`` if the job's reader waits and the followers have made room (caller holds ``cond``)."""
        if not self.waiting:
            return None
        if self._followers and self._unread_cost() > self.capacity // 2:
            return None
        self.waiting = False
        return self.on_room

    def _evict(self) -> None:
        _stream, data = self._held.popleft()
        self._cost_through.popleft()
        self.held_cost -= len(data) + CHUNK_COST
        self.first_seq += 1
        self.dropped_bytes += len(data)
        if len(self._sizes) >= MAX_SIZES:
            del self._sizes[:_SIZES_TRIM]
            self._sizes_seq += _SIZES_TRIM
        self._sizes.append(len(data))

    def dropped_since(self, seq: int) -> int:
        """Bytes of the evicted chunks from ``seq`` on (caller holds ``cond``); see the module doc."""
        if seq <= 0:
            return self.dropped_bytes
        return sum(self._sizes[max(0, seq - self._sizes_seq):])

    def read(self, seq: int, max_bytes: int = READ_BATCH) -> tuple[Gap | None, list[Chunk]]:
        """From ``seq``: a Gap if chunks from there were evicted, then the held chunks from there
        on (at least one if any, about ``max_bytes`` of data at most). Caller holds ``cond``."""
        gap = None
        if seq < self.first_seq:
            gap = Gap(seq, self.first_seq, self.dropped_since(seq))
            seq = self.first_seq
        chunks: list[Chunk] = []
        size = 0
        for stream, data in itertools.islice(self._held, seq - self.first_seq, None):
            if chunks and size + len(data) > max_bytes:
                break
            chunks.append(Chunk(seq, stream, data))
            size += len(data)
            seq += 1
        return gap, chunks
