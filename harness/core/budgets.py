"""``[budgets]``: what one run may spend (tool calls, wall time) and the limits of each call
(its timeout, the output returned to the model, the pictures it may carry).

:meth:`Budgets.check` is the budget half of authorizing a call (the session asks it before
the policy's :meth:`~harness.core.policy.Policy.decide`): a spent budget denies any call,
naming the key. A call asking for a longer timeout than the ceiling is not refused: it
runs with the ceiling, and the model is told: :meth:`CallTimeout.note` is a line of the
result text, :meth:`CallTimeout.meta` the field of its structured content and meta.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.core.calls import Action, Decision
from harness.core.images import ImageBounds
from harness.core.units import ByteSize

__all__ = ["MAX_RESULT_IMAGE_BYTES", "Budgets", "CallTimeout", "clamp_timeout"]

MAX_RESULT_IMAGE_BYTES = 24 << 20
"""Bytes of pictures one result may carry in all (``max_image_bytes`` times ``max_images_per_result``)."""


class CallTimeout(NamedTuple):
    """The timeout a call runs with, and whether the ceiling cut the one it asked for;
    ``argument`` and ``unit_s`` say how the call asked (``timeout_ms``: 0.001 s)."""

    seconds: float
    requested: float | None
    clamped: bool
    argument: str = "timeout"
    unit_s: float = 1.0

    def meta(self) -> dict[str, Any]:
        """For ``ToolResult.meta`` and its structured content: empty unless the request was clamped."""
        if not self.clamped:
            return {}
        return {"timeout_clamped": {"requested_s": self.requested, "ceiling_s": self.seconds}}

    def note(self) -> str:
        """The line the model reads when its timeout was lowered ("" when it was not), in
        the unit it asked in: ``Timeout lowered: timeout_ms 99999999 is above this sandbox's
        ceiling; the command got timeout_ms 600000 (600 s).``"""
        if not self.clamped or self.requested is None:
            return ""
        asked, got = _in_unit(self.requested, self.unit_s), _in_unit(self.seconds, self.unit_s)
        return (f"Timeout lowered: {self.argument} {asked} is above this sandbox's ceiling; the command got "
                f"{self.argument} {got} ({self.seconds:g} s).")


def _in_unit(seconds: float, unit_s: float) -> str:
    value = seconds / unit_s
    return str(round(value)) if abs(value - round(value)) < 1e-6 else f"{value:g}"


class Budgets(BaseModel):
    """``[budgets]``: limits per run and per call."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tool_calls: int = Field(default=200, ge=1)
    """Tool calls per run; call number max_tool_calls + 1 is denied (``budgets.max_tool_calls``)."""
    max_wall_time_s: float = Field(default=3600, gt=0)
    """Seconds per run; once they have passed every further call is denied."""
    call_timeout_ceiling_s: float = Field(default=600, gt=0)
    """Longest timeout a call may have; a call asking more runs with this (clamped, noted in meta)."""
    default_call_timeout_s: float = Field(default=30, gt=0)
    """Timeout of a call that does not ask for one."""
    max_output_bytes: int = Field(default=30000, ge=256)
    """Bytes of result text returned to the model per call (head and tail kept)."""
    max_image_bytes: ByteSize = Field(default=5 << 20, ge=1024, le=20 << 20)
    """Bytes of one picture in a result (``5m``); a larger one is left out, and the text says so."""
    max_image_pixels: int = Field(default=4 << 20, ge=1, le=64_000_000)
    """Pixels (width times height) of one picture in a result; a larger one is left out, and the text says so."""
    max_images_per_result: int = Field(default=4, ge=0, le=100)
    """Pictures one result may carry; those after are left out, and the text says so (0: none)."""

    @model_validator(mode="after")
    def _default_under_ceiling(self) -> Budgets:
        if self.default_call_timeout_s > self.call_timeout_ceiling_s:
            raise ValueError(
                f"default_call_timeout_s ({self.default_call_timeout_s:g}) is above call_timeout_ceiling_s "
                f"({self.call_timeout_ceiling_s:g}); lower the default or raise the ceiling"
            )
        return self

    @model_validator(mode="after")
    def _pictures_fit_a_message(self) -> Budgets:
        # A result travels as one gRPC message holding each picture twice (its bytes, and
        # base64 in the format's item), and a message is at most 64 MiB.
        total = self.max_image_bytes * self.max_images_per_result
        if total > MAX_RESULT_IMAGE_BYTES:
            raise ValueError(
                f"max_image_bytes ({self.max_image_bytes}) times max_images_per_result "
                f"({self.max_images_per_result}) is {total} bytes, above the {MAX_RESULT_IMAGE_BYTES >> 20} MiB "
                "of pictures one result can carry; lower one of them"
            )
        return self

    def image_bounds(self) -> ImageBounds:
        """The bounds each picture of a result is checked against (:func:`harness.core.images.bound_images`)."""
        return ImageBounds(self.max_image_bytes, self.max_image_pixels, self.max_images_per_result)

    def check(self, calls_so_far: int, elapsed_s: float) -> Decision | None:
        """A DENY naming the budget when a run with ``calls_so_far`` calls made and
        ``elapsed_s`` seconds spent may not make another call; else None."""
        if calls_so_far >= self.max_tool_calls:
            return Decision(
                Action.DENY,
                "budgets.max_tool_calls",
                f"denied: this run has used its budget of {self.max_tool_calls} tool calls "
                "(budgets.max_tool_calls); finish with what you have",
            )
        if elapsed_s >= self.max_wall_time_s:
            return Decision(
                Action.DENY,
                "budgets.max_wall_time_s",
                f"denied: this run has used its wall-time budget of {self.max_wall_time_s:g} s "
                "(budgets.max_wall_time_s); finish with what you have",
            )
        return None

    def call_timeout(self, requested_s: float | None, *, argument: str = "timeout",
                     unit_s: float = 1.0) -> CallTimeout:
        """The timeout to run a call with: the default when none is asked, else at most the
        ceiling (``argument`` and ``unit_s``: how the call asked, for :meth:`CallTimeout.note`)."""
        return clamp_timeout(requested_s, self.default_call_timeout_s, self.call_timeout_ceiling_s,
                             argument=argument, unit_s=unit_s)


def clamp_timeout(requested_s: float | None, default_s: float, ceiling_s: float, *, argument: str = "timeout",
                  unit_s: float = 1.0) -> CallTimeout:
    """``requested_s`` (None: ``default_s``) at most ``ceiling_s``, saying whether it was cut."""
    if requested_s is None:
        return CallTimeout(min(default_s, ceiling_s), None, False, argument, unit_s)
    if requested_s <= 0:
        raise ValueError(f"a call timeout must be positive, got {requested_s}")
    if requested_s > ceiling_s:
        return CallTimeout(ceiling_s, requested_s, True, argument, unit_s)
    return CallTimeout(requested_s, requested_s, False, argument, unit_s)
