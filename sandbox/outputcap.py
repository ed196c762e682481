"""Output bounded at the source: keep a head and a tail of each stream, count the rest.

The first half of the cap streams to the caller as it arrives; after that the most
recent bytes are held in a tail buffer of the other half, and everything pushed out
of the tail is counted as dropped. At exit the tail is sent, preceded by the number
of bytes dropped between head and tail, so the caller can place a marker exactly.
"""

from __future__ import annotations


class HeadTailBuffer:
    """Splits one output stream into a live head, a held tail and a dropped count."""

    def __init__(self, cap: int) -> None:
        if cap < 0:
            raise ValueError("cap must be >= 0")
        self.head_limit = cap - cap // 2
        self.tail_limit = cap // 2
        self.total = 0
        self.emitted = 0
        self._tail = bytearray()
        self._dropped = 0

    def feed(self, data: bytes) -> bytes:
        """Take a chunk; return the part to send now (may be empty)."""
        self.total += len(data)
        room = self.head_limit - self.emitted
        now = data[:room] if room > 0 else b""
        self.emitted += len(now)
        rest = data[len(now) :]
        if rest:
            self._tail += rest
            excess = len(self._tail) - self.tail_limit
            if excess > 0:
                del self._tail[:excess]
                self._dropped += excess
        return now

    def finish(self) -> tuple[bytes, int]:
        """Return the held tail and how many bytes were dropped just before it."""
        tail = bytes(self._tail)
        self._tail.clear()
        self.emitted += len(tail)
        return tail, self._dropped

    @property
    def dropped(self) -> int:
        return self._dropped
