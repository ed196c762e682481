"""The editor tool's ``undo_edit`` history: per sandbox (keyed by its id) and per path, a
stack of the contents before each edit, held in this harness process and bounded in bytes and
in the number of sandboxes (least recently used go first)."""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass

HISTORY_MAX_BYTES = 64 << 20
HISTORY_MAX_SANDBOXES = 64


@dataclass
class _Entry:
    sandbox: str
    path: str
    previous: bytes | None
    """The file's bytes before the edit; None if the edit created it."""
    live: bool = True

    @property
    def size(self) -> int:
        return len(self.previous or b"") + len(self.path) + 64


class EditHistory:
    """Per sandbox and path, a stack of the contents before each edit; bounded in memory.

    At most ``max_bytes`` in all (the oldest entries are dropped first) and ``max_sandboxes``
    sandboxes (the least recently used one is dropped whole). Thread-safe.
    """

    def __init__(self, max_bytes: int = HISTORY_MAX_BYTES, max_sandboxes: int = HISTORY_MAX_SANDBOXES) -> None:
        self.max_bytes = max_bytes
        self.max_sandboxes = max_sandboxes
        self._lock = threading.Lock()
        self._stacks: OrderedDict[str, dict[str, list[_Entry]]] = OrderedDict()
        self._order: deque[_Entry] = deque()  # every pushed entry, oldest first (dead ones skipped)
        self._bytes = 0
        self._live = 0

    @property
    def bytes_held(self) -> int:
        return self._bytes

    def push(self, sandbox: str, path: str, previous: bytes | None) -> None:
        entry = _Entry(sandbox, path, previous)
        if entry.size > self.max_bytes:
            return  # larger than the whole budget: this edit cannot be undone
        with self._lock:
            stacks = self._stacks.get(sandbox)
            if stacks is None:
                stacks = self._stacks[sandbox] = {}
                while len(self._stacks) > self.max_sandboxes:
                    self._drop_sandbox(next(iter(self._stacks)))
            self._stacks.move_to_end(sandbox)
            stacks.setdefault(path, []).append(entry)
            self._order.append(entry)
            self._bytes += entry.size
            self._live += 1
            while self._bytes > self.max_bytes:
                self._evict_oldest()
            if len(self._order) > 2 * self._live + 64:
                self._order = deque(e for e in self._order if e.live)

    def pop(self, sandbox: str, path: str) -> _Entry | None:
        """The most recent entry for ``path`` (removed), or None."""
        with self._lock:
            stacks = self._stacks.get(sandbox)
            stack = stacks.get(path) if stacks is not None else None
            if not stack:
                return None
            assert stacks is not None
            self._stacks.move_to_end(sandbox)
            entry = stack.pop()
            if not stack:
                del stacks[path]
            self._kill(entry)
            return entry

    def depth(self, sandbox: str, path: str) -> int:
        with self._lock:
            return len(self._stacks.get(sandbox, {}).get(path, ()))

    def forget(self, sandbox: str) -> None:
        """Drop a sandbox's history (e.g. when it is destroyed)."""
        with self._lock:
            if sandbox in self._stacks:
                self._drop_sandbox(sandbox)

    def _kill(self, entry: _Entry) -> None:
        entry.live = False
        self._bytes -= entry.size
        self._live -= 1

    def _drop_sandbox(self, sandbox: str) -> None:
        for stack in self._stacks.pop(sandbox).values():
            for entry in stack:
                self._kill(entry)

    def _evict_oldest(self) -> None:
        while self._order:
            entry = self._order.popleft()
            if not entry.live:
                continue
            stacks = self._stacks[entry.sandbox]
            stack = stacks[entry.path]
            stack.remove(entry)  # it is the oldest, so at the bottom of its stack
            if not stack:
                del stacks[entry.path]
            self._kill(entry)
            return


HISTORY = EditHistory()
"""The harness process's undo history (``undo_edit`` works within one harness process)."""
