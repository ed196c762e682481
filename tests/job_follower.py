"""A job's events gathered in a thread, for tests that wait on its output (in-process agent
and real sandbox alike)."""

from __future__ import annotations

import queue
import re
import threading
from collections.abc import Iterator

from harness.engine.jobs import JobChunk, JobEvent


class Follower:
    """Gather a job's events in a thread; wait for output by pattern or for the end (each
    wait for the next event at most ``wait_s``)."""

    def __init__(self, events: Iterator[JobEvent], *, wait_s: float = 30.0) -> None:
        self.items: queue.Queue[JobEvent | BaseException | None] = queue.Queue()
        self.events: list[JobEvent] = []
        self.text = b""
        self.done = False
        self.wait_s = wait_s
        threading.Thread(target=self._consume, args=(events,), daemon=True).start()

    def _consume(self, events: Iterator[JobEvent]) -> None:
        try:
            for event in events:
                self.items.put(event)
        except BaseException as exc:  # handed to the test thread
            self.items.put(exc)
        finally:
            self.items.put(None)

    def _next(self) -> None:
        item = self.items.get(timeout=self.wait_s)
        if isinstance(item, BaseException):
            raise item
        if item is None:
            self.done = True
            return
        self.events.append(item)
        if isinstance(item, JobChunk):
            self.text += item.data

    def wait_for(self, pattern: bytes) -> re.Match[bytes]:
        while (match := re.search(pattern, self.text)) is None:
            assert not self.done, f"the stream ended before {pattern!r}; got {self.text[-2000:]!r}"
            self._next()
        return match

    def finish(self) -> list[JobEvent]:
        while not self.done:
            self._next()
        return self.events
