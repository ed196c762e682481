"""The ``browser_*`` tools: Playwright MCP's names, arguments and answers, on the desktop's Chromium.

Each call runs ``python3 -I /opt/callbox/desktop/browser.py '<json>'`` in the sandbox (the desktop
image's stdlib-only DevTools client, one connection per call): it prints one JSON line with the
answer's text (the page's URL, title and accessibility snapshot after an action, as Playwright MCP
answers) and, for ``browser_take_screenshot``, the picture, returned as an image part.

Chromium is the one the desktop's display runs (the ``computer`` tool sees the same windows). When it
does not answer (the display is not up yet, or the model closed its window) the script's ``start``
action is run as a sandbox job, whose processes outlive it, and the call is made again.

Elements are named by the refs of the last snapshot (``e42``); ``element``, the human-readable
description Playwright asks for beside a ref, is kept in the call's audit record and not otherwise
used. Not served: Playwright's other tools (``browser_evaluate``, ``browser_drag`` ...) and
``browser_take_screenshot``'s ``filename`` (the picture is in the result; a file would be written
where no path rule looks).

A sandbox whose image has no desktop gets ``not_supported`` naming the image to use.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.core.calls import ErrorCode, ToolOutput
from harness.core.context import ToolContext
from harness.core.images import image_part
from harness.core.registry import Tool, ToolAnnotations, ToolDefinition
from harness.engine import desktop
from harness.engine.desktop import DESKTOP_IMAGE
from harness.tools.shell import NotRan, Ran, agent_failure, run_in_sandbox

BROWSER_SCRIPT = "/opt/callbox/desktop/browser.py"
MAX_WAIT_S = 60.0
LOAD_WAIT_S = 30.0  # what the script waits for a page to load, beyond the call's own timeout
ELEMENT = "Human-readable element description used to obtain permission to interact with the element"
REF = "Exact target element reference from the page snapshot"


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NavigateArgs(_Args):
    """Navigate to a URL."""

    url: str = Field(min_length=1, max_length=8192, description="The URL to navigate to")


class SnapshotArgs(_Args):
    """Capture accessibility snapshot of the current page, this is better than screenshot."""


class ClickArgs(_Args):
    """Perform click on a web page."""

    element: str = Field(max_length=1000, description=ELEMENT)
    ref: str = Field(pattern=r"^e[0-9]+$", description=REF)
    doubleClick: bool | None = Field(default=None, description="Whether to perform a double click instead of a "
                                                               "single click")
    button: Literal["left", "right", "middle"] | None = Field(default=None,
                                                              description="Button to click, defaults to left")
    modifiers: list[Literal["Alt", "Control", "ControlOrMeta", "Meta", "Shift"]] | None = Field(
        default=None, max_length=5, description="Modifier keys to press")


class TypeArgs(_Args):
    """Type text into editable element."""

    element: str = Field(max_length=1000, description=ELEMENT)
    ref: str = Field(pattern=r"^e[0-9]+$", description=REF)
    text: str = Field(max_length=100_000, description="Text to type into the element")
    submit: bool | None = Field(default=None, description="Whether to submit entered text (press Enter after)")
    slowly: bool | None = Field(default=None, description=(
        "Whether to type one character at a time. Useful for triggering key handlers in the page. By default "
        "entire text is filled in at once."))


class PressKeyArgs(_Args):
    """Press a key on the keyboard."""

    key: str = Field(min_length=1, max_length=100, description=(
        "Name of the key to press or a character to generate, such as `ArrowLeft` or `a` (modifiers with +: "
        "`Control+a`)"))


class ScreenshotArgs(_Args):
    """Take a screenshot of the current page. You can't perform actions based on the screenshot, use
    browser_snapshot for actions."""

    type: Literal["png", "jpeg"] | None = Field(default=None, description="Image format for the screenshot. "
                                                                          "Default is png.")
    element: str | None = Field(default=None, max_length=1000, description=(
        "Human-readable element description used to obtain permission to screenshot the element. If not "
        "provided, the screenshot will be taken of viewport. If element is provided, ref must be provided too."))
    ref: str | None = Field(default=None, pattern=r"^e[0-9]+$", description=(
        "Exact target element reference from the page snapshot. If not provided, the screenshot will be taken "
        "of viewport. If ref is provided, element must be provided too."))
    fullPage: bool | None = Field(default=None, description=(
        "When true, takes a screenshot of the full scrollable page, instead of the currently visible viewport. "
        "Cannot be used with element screenshots."))

    @model_validator(mode="after")
    def _element_with_ref(self) -> ScreenshotArgs:
        if (self.element is None) != (self.ref is None):
            raise ValueError("element and ref go together: give both for an element's screenshot, or neither")
        if self.ref is not None and self.fullPage:
            raise ValueError("fullPage cannot be used with an element's screenshot (ref)")
        return self


class TabsArgs(_Args):
    """List, create, close, or select a browser tab."""

    action: Literal["list", "new", "close", "select"] = Field(description="Operation to perform")
    index: int | None = Field(default=None, ge=0, le=1000, description=(
        "Tab index, used for close/select. If omitted for close, current tab is closed."))

    @model_validator(mode="after")
    def _select_needs_index(self) -> TabsArgs:
        if self.action == "select" and self.index is None:
            raise ValueError("action 'select' needs index")
        if self.action in ("list", "new") and self.index is not None:
            raise ValueError(f"action {self.action!r} takes no index")
        return self


class ConsoleMessagesArgs(_Args):
    """Returns all console messages."""

    onlyErrors: bool | None = Field(default=None, description="Only return error messages")


class WaitForArgs(_Args):
    """Wait for text to appear or disappear or a specified time to pass."""

    time: float | None = Field(default=None, ge=0, le=MAX_WAIT_S, description="The time to wait in seconds")
    text: str | None = Field(default=None, min_length=1, max_length=1000, description="The text to wait for")
    textGone: str | None = Field(default=None, min_length=1, max_length=1000,
                                 description="The text to wait for to disappear")

    @model_validator(mode="after")
    def _something_to_wait_for(self) -> WaitForArgs:
        if self.time is None and self.text is None and self.textGone is None:
            raise ValueError("give time, text or textGone")
        return self


def _not_supported(name: str) -> ToolOutput:
    return ToolOutput(
        text=(f"The sandbox's image has no desktop: {name} needs the desktop image's Chromium. Set "
              f"image = \"{DESKTOP_IMAGE}\" in the policy's [sandbox] table (or pass --image to callbox "
              "call/run; build it with `callbox image build --variant desktop`)."),
        is_error=True, error=ErrorCode.NOT_SUPPORTED,
        structured={"tool": name, "needs_image": DESKTOP_IMAGE, "policy_key": "sandbox.image"})


def _reply(ran: Ran) -> dict[str, Any] | None:
    stdout = ran.result.stdout.data().decode("utf-8", errors="replace").strip()
    try:
        reply = json.loads(stdout.splitlines()[-1]) if stdout else None
    except ValueError:
        return None
    return reply if isinstance(reply, dict) else None


def _failed(name: str, text: str) -> ToolOutput:
    return ToolOutput(text=f"{name}: {text}", is_error=True, error=ErrorCode.TOOL_FAILED,
                      structured={"tool": name})


def run_browser(ctx: ToolContext, name: str, request: dict[str, Any], extra_s: float = 0.0) -> ToolOutput:
    """One action of the sandbox's browser script; Chromium started first when it does not answer."""
    argv = ["python3", "-I", BROWSER_SCRIPT, json.dumps(request)]
    timeout_s = min(ctx.timeout_ceiling_s, ctx.timeout_for(None) + extra_s)
    ran = run_in_sandbox(ctx, argv, timeout_s=timeout_s, cwd="", streamed=())
    if isinstance(ran, NotRan):
        return agent_failure(ran.error, started=ran.started)
    first = ran.result
    if first.shell_exit_code == 2 and not first.stdout.data() and b"can't open file" in first.stderr.data():
        return _not_supported(name)
    reply = _reply(ran)
    if reply is not None and reply.get("browser_down"):
        runtime = ctx.runtime()
        problem = desktop.start_display(runtime.agent, runtime.env,
                                        ["python3", "-I", BROWSER_SCRIPT, json.dumps({"action": "start"})])
        if problem is not None:
            return _failed(name, f"the desktop's browser did not start: {problem}")
        ran = run_in_sandbox(ctx, argv, timeout_s=timeout_s, cwd="", streamed=())
        if isinstance(ran, NotRan):
            return agent_failure(ran.error, started=ran.started)
        reply = _reply(ran)
    if ran.result.timed_out:
        return ToolOutput(text=f"{name} timed out", is_error=True, error=ErrorCode.TIMED_OUT,
                          structured={"tool": name})
    if reply is None:
        stderr = ran.result.stderr.data().decode("utf-8", errors="replace").strip()[-500:]
        return _failed(name, f"failed (exit {ran.result.shell_exit_code}): {stderr or 'no output'}")
    if not reply.get("ok"):
        return _failed(name, str(reply.get("error", "failed")))
    text = str(reply.get("text", ""))
    if "image_base64" not in reply:
        return ToolOutput(text=text)
    try:
        data = base64.b64decode(reply["image_base64"], validate=True)
        image = image_part(data, "browser screenshot")
    except (TypeError, ValueError, binascii.Error):  # NotAnImage is a ValueError
        return _failed(name, "the browser returned no readable screenshot")
    return ToolOutput(text=f"Took a screenshot of the current page ({image.width}x{image.height} "
                           f"{image.media_type.split('/')[1].upper()}).\n\n{text}",
                      structured={"width": image.width, "height": image.height}, raw_bytes=len(data),
                      images=(image,))


def _tool(name: str, title: str, model: type[_Args], action: str, *, read_only: bool = False,
          request: Callable[[Any], dict[str, Any]] | None = None,
          extra_s: Callable[[Any], float] | None = None) -> Tool:
    def handler(ctx: ToolContext, args: Any) -> ToolOutput:
        fields = request(args) if request else args.model_dump(exclude_none=True, exclude={"element"})
        return run_browser(ctx, name, {"action": action, **fields}, extra_s(args) if extra_s else 0.0)

    description = " ".join((model.__doc__ or "").split())
    return Tool(ToolDefinition(
        name=name, description=f"{description} (The sandbox's Chromium; needs the desktop image.)",
        input_model=model,
        annotations=ToolAnnotations(read_only=read_only, destructive=not read_only, idempotent=read_only,
                                    open_world=action == "navigate", title=title)),
        handler)


BROWSER_TOOLS: tuple[Tool, ...] = (
    _tool("browser_navigate", "Navigate to a URL", NavigateArgs, "navigate", extra_s=lambda a: LOAD_WAIT_S),
    _tool("browser_snapshot", "Page snapshot", SnapshotArgs, "snapshot", read_only=True),
    _tool("browser_click", "Click", ClickArgs, "click"),
    _tool("browser_type", "Type text", TypeArgs, "type"),
    _tool("browser_press_key", "Press a key", PressKeyArgs, "press_key"),
    _tool("browser_take_screenshot", "Take a screenshot", ScreenshotArgs, "screenshot", read_only=True,
          request=lambda a: a.model_dump(exclude_none=True, exclude={"element"})),
    _tool("browser_tabs", "Manage tabs", TabsArgs, "tabs",
          request=lambda a: {"tab_action": a.action, **({"index": a.index} if a.index is not None else {})}),
    _tool("browser_console_messages", "Get console messages", ConsoleMessagesArgs, "console_messages",
          read_only=True),
    _tool("browser_wait_for", "Wait for", WaitForArgs, "wait_for",
          extra_s=lambda a: (a.time or 0.0) + (30.0 if a.text or a.textGone else 0.0)),
)
BROWSER_TOOL_NAMES = frozenset(tool.name for tool in BROWSER_TOOLS)
