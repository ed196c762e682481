"""The harness process being stopped in the middle of a call.

Ctrl-C raises ``KeyboardInterrupt``; the CLI turns SIGTERM into ``SystemExit(128 + 15)``
(``harness.cli.main``). Either unwinds through the call path, which records the call as
interrupted before the process exits (:mod:`harness.audit.interruptions`). :func:`stop_signal`
names the signal behind such an exception; :func:`signals_held` keeps a second Ctrl-C (or a
SIGTERM) from breaking off that last write: a signal that arrives meanwhile is delivered as
soon as the write is done.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["STOPS", "signals_held", "stop_signal"]

STOPS: tuple[type[BaseException], ...] = (KeyboardInterrupt, SystemExit)
"""What a stopping process raises through a call in progress."""

_HELD = (signal.SIGINT, signal.SIGTERM)


def stop_signal(stop: BaseException) -> str | None:
    """``SIGINT`` for Ctrl-C, the signal's name for a ``SystemExit(128 + N)``; else None."""
    if isinstance(stop, KeyboardInterrupt):
        return "SIGINT"
    code = stop.code if isinstance(stop, SystemExit) else None
    if isinstance(code, int) and code > 128:
        with contextlib.suppress(ValueError):
            return signal.Signals(code - 128).name
    return None


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM for the ``with`` block, then deliver the first that came (in the
    main thread, where Python runs signal handlers; elsewhere there is nothing to hold)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in _HELD}
    if any(handler is None for handler in previous.values()):  # set outside Python: cannot be restored
        yield
        return
    caught: list[int] = []

    def hold(signum: int, _frame: FrameType | None) -> None:
        caught.append(signum)

    for signum in _HELD:
        signal.signal(signum, hold)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if caught:
            signal.raise_signal(caught[0])
