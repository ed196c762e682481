"""What a tool handler may use while it runs: the run's sandbox runtime, limits, and a stream.

Handlers never create containers themselves, nor see the engine: they ask
``ToolContext.runtime()``, which starts the run's sandbox on first use (so a call that is
rejected or denied before its handler runs never starts one) and reuses it for later calls
of the same run, and get its agent client, environment, id and working directory.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from harness.core.budgets import Budgets, CallTimeout, clamp_timeout
from harness.core.images import ImageBounds
from harness.engine.base import Sandbox, SandboxRuntime

if TYPE_CHECKING:
    from harness.core.memory import MemoryScope
    from harness.core.run_revert import LiveUndo

OutputSink = Callable[[str, bytes], None]
"""Receives ``(stream, chunk)`` while a tool runs (stream is "stdout" or "stderr")."""


class SandboxProvider(Protocol):
    def sandbox(self) -> Sandbox:
        """The run's sandbox, started on first use."""
        ...


@dataclass(frozen=True)
class ToolContext:
    run_id: str
    call_id: str
    provider: SandboxProvider
    default_timeout_s: float
    """Timeout for a call that names none."""
    timeout_ceiling_s: float
    """No call may run longer, whatever it asks for (policy budgets.call_timeout_ceiling_s)."""
    output_budget: int
    """Bytes of output the model gets back (policy budgets.max_output_bytes)."""
    on_output: OutputSink | None = None
    image_bounds: ImageBounds = field(default_factory=lambda: Budgets().image_bounds())
    """What one picture of the result may be (policy budgets.max_image_bytes, ...): a tool
    that reads one can refuse it before reading it all."""
    undo: LiveUndo | None = None
    """The run's change records and the revert of its sandbox (the ``undo`` tool); None when
    its policy records no changes (``[checkpoints] mode = "off"``)."""
    memory: MemoryScope | None = None
    """The run's memory scope on this host (the ``memory`` tool): its directory and caps (None:
    a context made outside a session, which has no memory)."""
    started_at: float = field(default_factory=time.monotonic)
    """``time.monotonic()`` when the context was made: the harness makes it just before the
    call's handler runs, after validation, policy and approval."""
    lowered: list[CallTimeout] = field(default_factory=list)
    """The timeouts the call asked for that :meth:`call_timeout` lowered to the ceiling: the
    harness tells the model (a line of the result text, ``timeout_clamped`` in its
    structured content and meta)."""

    @property
    def deadline(self) -> float:
        """``time.monotonic()`` by which a call that names no timeout of its own should be
        done: ``started_at + timeout_for(None)`` (the policy's default call timeout, never
        above its ceiling). Advisory: the harness does not interrupt a handler at it; pass
        :meth:`remaining_s` on to what the handler starts (an ``agent.exec`` ``timeout_ms``)."""
        return self.started_at + self.timeout_for(None)

    def remaining_s(self) -> float:
        """Seconds left until :attr:`deadline` (0 once it has passed)."""
        return max(0.0, self.deadline - time.monotonic())

    def runtime(self) -> SandboxRuntime:
        """The run's sandbox as a tool sees it (started on first use)."""
        return self.provider.sandbox().runtime()

    def timeout_for(self, requested_s: float | None) -> float:
        """The requested timeout, or the default, never above the ceiling (silently: for a
        timeout the policy or the tool chose; one the model asked for is :meth:`call_timeout`'s)."""
        wanted = self.default_timeout_s if requested_s is None else requested_s
        return min(wanted, self.timeout_ceiling_s)

    def call_timeout(self, requested_s: float | None, *, argument: str, unit_s: float = 1.0) -> CallTimeout:
        """The timeout for one the model asked for in its ``argument`` (in units of ``unit_s``
        seconds; None: the default), never above the ceiling. A lowered one is kept in
        :attr:`lowered`, so the model is told; :meth:`CallTimeout.note` words it."""
        timeout = clamp_timeout(requested_s, self.default_timeout_s, self.timeout_ceiling_s, argument=argument,
                                unit_s=unit_s)
        if timeout.clamped:
            self.lowered.append(timeout)
        return timeout
