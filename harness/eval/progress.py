"""The eval's progress on stderr: a bar with live pass and fail counts on a terminal, one
plain line per finished trial otherwise (a log, a CI job, a pipe)::

    eval: 3/8 · 2 pass · 1 fail · fix-add #1 pass (final:accepted, 3 turns, 2.1 s)
"""

from __future__ import annotations

import sys
import threading
from typing import IO, Any

from harness.eval.scoring import TrialResult

__all__ = ["Progress"]


class Progress:
    """Counts trials as they end and shows them; a context manager (the bar is drawn inside it)."""

    def __init__(self, total: int, *, done: int = 0, passes: int = 0, stream: IO[str] | None = None,
                 live: bool | None = None) -> None:
        """``total`` trials, of which ``done`` (``passes`` of them passing) had already ended
        (a resumed eval); ``live``: draw a bar (default: when ``stream`` is a terminal)."""
        self.stream = stream if stream is not None else sys.stderr
        self.total = total
        self.done = done
        self.passes = passes
        self.live = self.stream.isatty() if live is None else live
        self._lock = threading.Lock()
        self._bar: Any = None
        self._task: Any = None

    @property
    def fails(self) -> int:
        return self.done - self.passes

    def counts(self) -> str:
        return f"{self.done}/{self.total} · {self.passes} pass · {self.fails} fail"

    def __enter__(self) -> Progress:
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            self._bar = Bar(TextColumn("eval"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("[green]{task.fields[passes]} pass[/] [red]{task.fields[fails]} fail[/]"),
                            TimeElapsedColumn(), TextColumn("{task.fields[last]}"),
                            console=Console(file=self.stream), transient=False)
            self._bar.start()
            self._task = self._bar.add_task("eval", total=self.total, completed=self.done, passes=self.passes,
                                            fails=self.fails, last="")
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def started(self, task: str, trial: int) -> None:
        """A trial started (the bar names it; plain output waits for its end)."""
        with self._lock:
            if self._bar is not None:
                self._bar.update(self._task, last=f"running {task} #{trial}")

    def finished(self, result: TrialResult) -> None:
        with self._lock:
            self.done += 1
            self.passes += result.passed
            verdict = "pass" if result.passed else "fail"
            line = (f"{result.task} #{result.trial} {verdict} ({result.reason}, {result.turns} turns, "
                    f"{result.seconds:.1f} s)")
            if self._bar is not None:
                self._bar.update(self._task, completed=self.done, passes=self.passes, fails=self.fails, last=line)
            else:
                print(f"eval: {self.counts()} · {line}", file=self.stream, flush=True)
