"""``computer``: look at and drive the desktop of a sandbox (the ``desktop`` image variant).

One plain-schema tool for MCP and the gRPC door: an ``action`` and the fields it needs, checked
here before anything runs. The work is done in the sandbox by the image's one implementation,
``/opt/callbox/desktop/computer.py`` (Xvfb :1 at 1280x800, openbox, xdotool, xwd), started with the
action as one JSON argument; it prints one JSON line, with the screenshot as base64 PNG. Every
action but ``cursor_position`` returns a screenshot (taken after the action) as an image part of
the result, labelled ``screenshot`` (``zoom``: ``zoom x1,y1,x2,y2``).

The display is started on the first action that finds it down: as a sandbox job (a command's
processes end with the command; a job may leave its processes running), waited for, then the
action is run again.

A sandbox whose image has no desktop gets ``not_supported`` naming the image to use, before
anything else happens. The action names and fields are those of Anthropic's computer tool, so the
Anthropic adapter passes its ``tool_use`` input on as it is; :func:`from_openai_action` maps an
OpenAI ``computer_call`` action onto these actions (one or more) for the Responses adapter.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.core.calls import ErrorCode, ToolOutput
from harness.core.context import ToolContext
from harness.core.images import image_part
from harness.core.registry import Tool, ToolAnnotations, ToolDefinition
from harness.engine import desktop
from harness.engine.desktop import DESKTOP_IMAGE, DESKTOP_SCRIPT
from harness.tools.shell import NotRan, Ran, agent_failure, run_in_sandbox

SCREEN_WIDTH, SCREEN_HEIGHT = 1280, 800
MAX_WAIT_S = 60.0

Action = Literal["screenshot", "left_click", "right_click", "middle_click", "double_click", "triple_click",
                 "left_click_drag", "mouse_move", "left_mouse_down", "left_mouse_up", "type", "key", "hold_key",
                 "scroll", "wait", "zoom", "cursor_position"]
ACTION_NEEDS: dict[str, tuple[str, ...]] = {
    "left_click_drag": ("start_coordinate", "coordinate"),
    "mouse_move": ("coordinate",),
    "type": ("text",),
    "key": ("text",),
    "hold_key": ("text",),
    "scroll": ("scroll_direction",),
    "zoom": ("region",),
}
# What each action may take beside what it needs; ``text`` of a click or a scroll: modifier keys held.
_TAKES: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("left_click", "right_click", "middle_click", "double_click", "triple_click"),
                    ("coordinate", "text")),
    "left_mouse_down": ("coordinate",), "left_mouse_up": ("coordinate",), "hold_key": ("duration",),
    "scroll": ("scroll_direction", "scroll_amount", "coordinate", "text"), "wait": ("duration",),
}
Pixel = Annotated[int, Field(ge=0)]
_FIELDS = ("coordinate", "start_coordinate", "text", "scroll_direction", "scroll_amount", "duration", "region")


class ComputerArgs(BaseModel):
    """Take a screenshot of the sandbox's desktop, or click, type, press keys or scroll on it."""

    model_config = ConfigDict(extra="forbid")

    action: Action = Field(description=(
        "What to do. screenshot; left_click, right_click, middle_click, double_click, triple_click "
        "(at coordinate, or where the mouse is; text: modifier keys to hold, such as shift or ctrl+alt); "
        "left_click_drag (start_coordinate to coordinate); mouse_move (coordinate); left_mouse_down, "
        "left_mouse_up; type (text); key (text: xdotool key names such as Return, ctrl+l, several "
        "separated by spaces); hold_key (text, duration); scroll (scroll_direction, scroll_amount, "
        "optional coordinate and modifier text); wait (duration); zoom (region); cursor_position. "
        "Every action but cursor_position returns a screenshot taken after it."))
    coordinate: list[Pixel] | None = Field(
        default=None, min_length=2, max_length=2,
        description=f"[x, y] in screen pixels, 0 <= x < {SCREEN_WIDTH}, 0 <= y < {SCREEN_HEIGHT}.")
    start_coordinate: list[Pixel] | None = Field(
        default=None, min_length=2, max_length=2, description="[x, y] where left_click_drag starts.")
    text: str | None = Field(default=None, min_length=1, max_length=10_000,
                             description="The text to type, the keys to press or hold, or modifier keys.")
    scroll_direction: Literal["up", "down", "left", "right"] | None = Field(default=None)
    scroll_amount: int | None = Field(default=None, ge=1, le=100, description="Wheel clicks (default 3).")
    duration: float | None = Field(default=None, ge=0, le=MAX_WAIT_S,
                                   description="Seconds to wait, or to hold the keys (default 1).")
    region: list[Pixel] | None = Field(
        default=None, min_length=4, max_length=4,
        description="[x1, y1, x2, y2] of the screen part zoom returns at full resolution (x1 < x2, y1 < y2).")

    @model_validator(mode="after")
    def _fields_fit_action(self) -> ComputerArgs:
        needs = ACTION_NEEDS.get(self.action, ())
        missing = [name for name in needs if getattr(self, name) is None]
        if missing:
            raise ValueError(f"action {self.action!r} needs {' and '.join(missing)}")
        for name in ("coordinate", "start_coordinate"):
            point = getattr(self, name)
            if point is not None and not (0 <= point[0] < SCREEN_WIDTH and 0 <= point[1] < SCREEN_HEIGHT):
                raise ValueError(f"{name} {point} is outside the {SCREEN_WIDTH}x{SCREEN_HEIGHT} screen")
        if self.region is not None:
            x1, y1, x2, y2 = self.region
            if not (0 <= x1 < x2 <= SCREEN_WIDTH and 0 <= y1 < y2 <= SCREEN_HEIGHT):
                raise ValueError(f"region {self.region} must lie inside the {SCREEN_WIDTH}x{SCREEN_HEIGHT} "
                                 "screen with x1 < x2 and y1 < y2")
        return self

    def unused(self) -> list[str]:
        """The fields given that the action does not use (named in the result, never sent)."""
        used = set(ACTION_NEEDS.get(self.action, ())) | set(_TAKES.get(self.action, ()))
        return [name for name in _FIELDS if getattr(self, name) is not None and name not in used]


# OpenAI's key names (upper or lower case) as xdotool names them; any other key is passed as it is.
_OPENAI_KEYS = {"enter": "Return", "return": "Return", "ctrl": "ctrl", "control": "ctrl", "shift": "shift",
                "alt": "alt", "option": "alt", "cmd": "super", "meta": "super", "super": "super", "win": "super",
                "space": "space", "backspace": "BackSpace", "tab": "Tab", "esc": "Escape", "escape": "Escape",
                "delete": "Delete", "del": "Delete", "insert": "Insert", "home": "Home", "end": "End",
                "pageup": "Page_Up", "pagedown": "Page_Down", "capslock": "Caps_Lock",
                "arrowup": "Up", "arrowdown": "Down", "arrowleft": "Left", "arrowright": "Right",
                "up": "Up", "down": "Down", "left": "Left", "right": "Right", "/": "slash", "\\": "backslash"}
_OPENAI_BUTTONS = {"left": "left_click", "right": "right_click", "wheel": "middle_click"}
SCROLL_PIXELS_PER_CLICK = 100
"""OpenAI scrolls by pixels, the desktop by wheel clicks: this many pixels make one click."""
OPENAI_WAIT_S = 2.0


def _openai_key(name: object) -> str:
    """A key as xdotool names it: a letter is the key, not the character (``L`` is ``l``, as a
    shifted ``L`` would add shift), function keys are ``F1``..., the rest from the table."""
    text = str(name)
    if len(text) == 1:
        return _OPENAI_KEYS.get(text, text.lower())
    if text.lower().startswith("f") and text[1:].isdigit():
        return text.upper()
    return _OPENAI_KEYS.get(text.lower(), text)


def _point(action: dict[str, Any]) -> list[Any]:
    return [action.get("x"), action.get("y")]


def from_openai_action(action: dict[str, Any]) -> list[dict[str, Any]]:
    """One OpenAI computer-use action (``click``, ``double_click``, ``drag``, ``keypress``, ``move``,
    ``screenshot``, ``scroll``, ``type``, ``wait``) as this tool's arguments, in order: usually one,
    several for a drag along a path of more than two points (mouse down, moves, up) or a scroll on
    both axes. Nothing is checked here: the call path validates each result like any other call, so
    an action this tool cannot do (a misspelt type, a missing field) is an ``invalid_arguments``
    result naming it. Held ``keys`` become the modifier ``text`` (ignored, and said so in the result,
    by the actions that take none)."""
    kind = action.get("type")
    keys = action.get("keys")
    held = {"text": "+".join(_openai_key(k) for k in keys)} if isinstance(keys, list) and keys else {}
    if kind == "click":
        button = str(action.get("button") or "left")
        if button in ("back", "forward"):  # the mouse's history buttons, as Chromium takes them
            return [{"action": "key", "text": "alt+Left" if button == "back" else "alt+Right"}]
        return [{"action": _OPENAI_BUTTONS.get(button, f"{button}_click"), "coordinate": _point(action), **held}]
    if kind == "double_click":
        return [{"action": "double_click", "coordinate": _point(action), **held}]
    if kind == "drag":
        path = [_point(p) if isinstance(p, dict) else p for p in action.get("path") or []]
        if len(path) <= 2:
            return [{"action": "left_click_drag", "start_coordinate": path[0] if path else None,
                     "coordinate": path[-1] if path else None, **held}]
        return [{"action": "left_mouse_down", "coordinate": path[0]},
                *({"action": "mouse_move", "coordinate": p} for p in path[1:-1]),
                {"action": "left_mouse_up", "coordinate": path[-1]}]
    if kind == "keypress":
        names = action.get("keys")
        return [{"action": "key", "text": "+".join(_openai_key(k) for k in names) if isinstance(names, list)
                 else names}]
    if kind == "move":
        return [{"action": "mouse_move", "coordinate": _point(action)}]
    if kind == "type":
        return [{"action": "type", "text": action.get("text")}]
    if kind == "wait":
        return [{"action": "wait", "duration": OPENAI_WAIT_S}]
    if kind == "scroll":
        scrolls = []
        for axis, negative, positive in (("scroll_y", "up", "down"), ("scroll_x", "left", "right")):
            amount = action.get(axis) or 0
            if isinstance(amount, (int, float)) and amount:
                clicks = min(100, max(1, round(abs(amount) / SCROLL_PIXELS_PER_CLICK)))
                scrolls.append({"action": "scroll", "coordinate": _point(action), **held,
                                "scroll_direction": positive if amount > 0 else negative, "scroll_amount": clicks})
        return scrolls or [{"action": "mouse_move", "coordinate": _point(action)}]
    if kind == "screenshot":
        return [{"action": "screenshot"}]
    return [{"action": str(kind)}]


def _failed(text: str, **structured: Any) -> ToolOutput:
    return ToolOutput(text=text, is_error=True, error=ErrorCode.TOOL_FAILED, structured=structured or None)


def _reply(ran: Ran) -> dict[str, Any] | None:
    stdout = ran.result.stdout.data().decode("utf-8", errors="replace").strip()
    try:
        reply = json.loads(stdout.splitlines()[-1]) if stdout else None
    except ValueError:
        return None
    return reply if isinstance(reply, dict) else None


def start_display(ctx: ToolContext) -> str | None:
    """Start the desktop's display in the call's sandbox; None once it is up, else why not."""
    runtime = ctx.runtime()
    return desktop.start_display(runtime.agent, runtime.env)


def run_computer(ctx: ToolContext, args: ComputerArgs) -> ToolOutput:
    unused = args.unused()
    request = args.model_dump(exclude_none=True, exclude=set(unused))
    note = f" ({', '.join(unused)} not used by {args.action}: ignored)" if unused else ""
    extra_s = args.duration or 0.0
    argv = ["python3", "-I", DESKTOP_SCRIPT, json.dumps(request)]
    timeout_s = min(ctx.timeout_ceiling_s, ctx.timeout_for(None) + extra_s)
    ran = run_in_sandbox(ctx, argv, timeout_s=timeout_s, cwd="", streamed=())
    if isinstance(ran, NotRan):
        return agent_failure(ran.error, started=ran.started)
    first = ran.result
    if first.shell_exit_code == 2 and not first.stdout.data() and b"can't open file" in first.stderr.data():
        return ToolOutput(
            text=(f"The sandbox's image has no desktop: the computer tool needs the desktop image. Set "
                  f"image = \"{DESKTOP_IMAGE}\" in the policy's [sandbox] table (or pass --image to callbox "
                  "call/run; build it with `callbox image build --variant desktop`)."),
            is_error=True, error=ErrorCode.NOT_SUPPORTED,
            structured={"action": args.action, "needs_image": DESKTOP_IMAGE, "policy_key": "sandbox.image"})
    reply = _reply(ran)
    if reply is not None and reply.get("display_down"):
        problem = start_display(ctx)
        if problem is not None:
            return _failed(f"computer {args.action}: the desktop's display did not start: {problem}",
                           action=args.action)
        ran = run_in_sandbox(ctx, argv, timeout_s=timeout_s, cwd="", streamed=())
        if isinstance(ran, NotRan):
            return agent_failure(ran.error, started=ran.started)
        reply = _reply(ran)
    result = ran.result
    if result.timed_out:
        return ToolOutput(text=f"computer {args.action} timed out", is_error=True, error=ErrorCode.TIMED_OUT,
                          structured={"action": args.action})
    if reply is None:
        stderr = result.stderr.data().decode("utf-8", errors="replace").strip()[-500:]
        return _failed(f"computer {args.action} failed (exit {result.shell_exit_code}): {stderr or 'no output'}",
                       action=args.action, exit_code=result.shell_exit_code)
    if not reply.get("ok"):
        return _failed(f"computer {args.action}: {reply.get('error', 'failed')}", action=args.action)
    if args.action == "cursor_position":
        x, y = reply["x"], reply["y"]
        return ToolOutput(text=f"X={x},Y={y}{note}", structured={"action": args.action, "x": x, "y": y})
    label = "zoom " + ",".join(map(str, args.region)) if args.action == "zoom" and args.region else "screenshot"
    try:
        png = base64.b64decode(reply["png_base64"], validate=True)
        image = image_part(png, label)
    except (KeyError, TypeError, ValueError, binascii.Error):  # NotAnImage is a ValueError
        return _failed(f"computer {args.action}: the desktop returned no readable screenshot", action=args.action)
    done = "screenshot" if args.action == "screenshot" else f"{args.action} done; screenshot"
    return ToolOutput(
        text=f"{done} ({image.width}x{image.height} PNG){note}",
        structured={"action": args.action, "width": image.width, "height": image.height,
                    "capture_ms": reply.get("capture_ms")},
        raw_bytes=len(png),
        images=(image,),
    )


COMPUTER = Tool(
    ToolDefinition(
        name="computer",
        description=(
            f"Use the sandbox's desktop ({SCREEN_WIDTH}x{SCREEN_HEIGHT}, Chromium available): take a screenshot, "
            "click, drag, type, press keys, scroll, wait or zoom. Actions return a screenshot. Needs a sandbox "
            "made from the desktop image."
        ),
        input_model=ComputerArgs,
        annotations=ToolAnnotations(read_only=False, destructive=True, idempotent=False, open_world=False,
                                    title="Computer (desktop)"),
    ),
    run_computer,
)
