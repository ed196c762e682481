"""The desktop's browser tools (Playwright MCP's ``browser_*`` names): run as a command, stdlib only.

``python3 /opt/callbox/desktop/browser.py '<json>'`` does one action on the desktop's Chromium over
the DevTools Protocol (``devtools.py``) and prints one JSON line: ``{"ok": true, "text": "...", ...}``
(with ``image_base64`` and ``media_type`` for a screenshot) or ``{"ok": false, "error": "..."}``
(exit 2); ``"browser_down": true`` (exit 3) when Chromium does not answer: the caller runs the
action ``start`` as a job (its processes outlive it) and asks again.

Each call opens its own DevTools connection (Chromium listens on a loopback port it picks and writes
to ``DevToolsActivePort`` in its profile) and closes it: nothing of ours runs between calls. What
lasts between calls lives in Chromium itself (pages, their element ids, their console messages,
which ``Runtime.enable`` replays to a new connection) and in one small state file, the tabs' order
and which one is current.

Element refs (``e1``, ``e2`` ...) number a document's elements in the order its snapshots first
show them, as Playwright's do: the same page gives the same refs, and an element keeps its ref
while the document lives. Each tab's table (ref to ``backendDOMNodeId``, the node's id in Chromium)
is kept in the state file with the document's loader id; a new document starts a new table, so a
ref from a page navigated away from is refused.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import computer  # the display and Chromium's command line
from devtools import ActionError, BrowserDown, CommandError, DevTools

__all__ = ["ActionError", "BrowserDown", "CommandError", "DevTools", "RefTable", "format_snapshot", "key_event",
           "main", "with_scheme"]

TABS_FILE = os.path.join(computer.STATE_DIR, "browser-tabs.json")
START_TIMEOUT_S = 20.0
LOAD_TIMEOUT_S = 30.0
MAX_WAIT_S = 60.0
POLL_S = 0.1
# Roles that only group: shown only when they name something, else their children take their place.
QUIET_ROLES = {"generic", "none", "presentation", "group", "LineBreak", "InlineTextBox", "ignored", "paragraph",
               "form", "LabelText", "Section"}
# Decoration Chromium puts in the tree (a list item's bullet), left out with what is below it.
HIDDEN_ROLES = {"ListMarker"}
STATES = ("checked", "disabled", "expanded", "selected", "pressed", "required", "focused")
MODIFIER_BITS = {"Alt": 1, "Control": 2, "ControlOrMeta": 2, "Meta": 4, "Shift": 8}
# Key names as Playwright's keyboard.press takes them: (code, Windows virtual key code, text typed).
NAMED_KEYS: dict[str, tuple[str, int, str]] = {
    "Enter": ("Enter", 13, "\r"), "Tab": ("Tab", 9, "\t"), "Backspace": ("Backspace", 8, ""),
    "Escape": ("Escape", 27, ""), "Delete": ("Delete", 46, ""), "Insert": ("Insert", 45, ""),
    "ArrowLeft": ("ArrowLeft", 37, ""), "ArrowUp": ("ArrowUp", 38, ""), "ArrowRight": ("ArrowRight", 39, ""),
    "ArrowDown": ("ArrowDown", 40, ""), "Home": ("Home", 36, ""), "End": ("End", 35, ""),
    "PageUp": ("PageUp", 33, ""), "PageDown": ("PageDown", 34, ""), "Space": ("Space", 32, " "),
    "Shift": ("ShiftLeft", 16, ""), "Control": ("ControlLeft", 17, ""), "Alt": ("AltLeft", 18, ""),
    "Meta": ("MetaLeft", 91, ""),
    **{f"F{n}": (f"F{n}", 111 + n, "") for n in range(1, 13)},
}


# ---- tabs -----------------------------------------------------------------------------------------


def _load_tabs() -> dict[str, Any]:
    try:
        with open(TABS_FILE) as f:
            state = json.load(f)
        return state if isinstance(state, dict) else {}
    except (OSError, ValueError):
        return {}


def _save_tabs(state: dict[str, Any]) -> None:
    tmp = TABS_FILE + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, TABS_FILE)


class RefTable:
    """One document's refs: ``e<n>`` for the n-th element its snapshots showed."""

    def __init__(self, nodes: dict[str, int] | None = None) -> None:
        self.by_node = {int(k): v for k, v in (nodes or {}).items()}

    def ref(self, backend: int) -> str:
        if backend not in self.by_node:
            self.by_node[backend] = len(self.by_node) + 1
        return f"e{self.by_node[backend]}"

    def node(self, ref: str) -> int | None:
        number = node_id(ref)
        return next((backend for backend, n in self.by_node.items() if n == number), None)

    def dump(self) -> dict[str, int]:
        return {str(k): v for k, v in self.by_node.items()}


class Browser:
    """The tabs in the order they were first seen, the current one, and a session on it."""

    def __init__(self, tools: DevTools) -> None:
        self.tools = tools
        targets = [t for t in tools.call("Target.getTargets")["targetInfos"] if t["type"] == "page"]
        self.info = {t["targetId"]: t for t in targets}
        state = _load_tabs()
        self.refs: dict[str, Any] = {t: r for t, r in (state.get("refs") or {}).items() if t in self.info}
        self.order = [t for t in state.get("order", []) if t in self.info]
        self.order += [t for t in self.info if t not in self.order]
        current = state.get("current")
        self.current: str | None = current if current in self.info else (self.order[0] if self.order else None)
        self.session: str | None = None

    def save(self) -> None:
        _save_tabs({"order": self.order, "current": self.current, "refs": self.refs})

    def ref_table(self) -> RefTable:
        """The current document's refs (a new table for a new document)."""
        session = self.page()
        loader = self.tools.call("Page.getFrameTree", {}, session)["frameTree"]["frame"].get("loaderId")
        saved = self.refs.get(self.current or "") or {}
        table = RefTable(saved.get("nodes") if saved.get("loader") == loader else None)
        self.refs[self.current or ""] = {"loader": loader, "nodes": table.by_node}
        return table

    def element(self, ref: str) -> int:
        backend = self.ref_table().node(ref)
        if backend is None:
            raise ActionError(f"ref {ref} is not in this page's snapshots: take a new browser_snapshot")
        return backend

    def page(self) -> str:
        """The current tab's session (a blank tab is opened when there is none)."""
        if self.session is not None:
            return self.session
        if self.current is None:
            self.new_tab()
        assert self.current is not None
        self.session = self.tools.call("Target.attachToTarget", {"targetId": self.current, "flatten": True})[
            "sessionId"]
        self.tools.call("Target.activateTarget", {"targetId": self.current})
        return self.session

    def new_tab(self) -> None:
        target = self.tools.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.order.append(target)
        self.info[target] = {"targetId": target, "title": "", "url": "about:blank"}
        self.select(target)

    def select(self, target: str) -> None:
        self.current, self.session = target, None

    def by_index(self, index: int | None) -> str:
        if index is None:
            if self.current is None:
                raise ActionError("there is no tab")
            return self.current
        if not 0 <= index < len(self.order):
            raise ActionError(f"there is no tab {index}: the tabs are 0 to {len(self.order) - 1}"
                              if self.order else "there is no tab")
        return str(self.order[index])

    def close_tab(self, target: str) -> None:
        if self.order == [target]:  # Chromium would quit with its last window: a blank tab stays
            self.new_tab()
        position = self.order.index(target)
        self.tools.call("Target.closeTarget", {"targetId": target})
        self.order.remove(target)
        self.info.pop(target, None)
        if self.current == target:
            self.select(self.order[max(0, position - 1)] if self.order else None)  # type: ignore[arg-type]

    def listing(self) -> str:
        if not self.order:
            return "No open tabs. Use browser_navigate to open one."
        lines = []
        for index, target in enumerate(self.order):
            info = self.info.get(target, {})
            mark = " (current)" if target == self.current else ""
            lines.append(f"- {index}:{mark} [{info.get('title', '')}] ({info.get('url', '')})")
        return "\n".join(lines)


# ---- the accessibility snapshot -------------------------------------------------------------------


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def format_snapshot(nodes: list[dict[str, Any]], refs: RefTable) -> str:
    """Playwright's YAML-ish accessibility snapshot of ``Accessibility.getFullAXTree``'s nodes:
    ``- role "name" [state] [ref=eN]`` per node, children indented below, grouping nodes without a
    name left out (their children in their place) and text that repeats its parent's name dropped."""
    by_id = {node["nodeId"]: node for node in nodes}
    children_of = {node["nodeId"]: node.get("childIds", []) for node in nodes}
    children = {child for ids in children_of.values() for child in ids}
    roots = [node for node in nodes if node["nodeId"] not in children]

    def value(node: dict[str, Any], key: str) -> str:
        field = node.get(key) or {}
        return str(field.get("value", "")) if isinstance(field, dict) else ""

    def render(node: dict[str, Any], depth: int, parent_name: str) -> list[str]:
        role, name = value(node, "role"), value(node, "name").strip()
        kids = [by_id[c] for c in children_of.get(node["nodeId"], []) if c in by_id]
        if node.get("ignored") or role in ("RootWebArea", "WebArea") or (role in QUIET_ROLES and not name):
            return [line for kid in kids for line in render(kid, depth, name or parent_name)]
        if role in HIDDEN_ROLES:
            return []
        if role == "StaticText":
            return [] if not name or name == parent_name else [f"{'  ' * depth}- text: {_quote(name)}"]
        # The ref first, then the children's: refs number the elements in document order.
        ref = refs.ref(node["backendDOMNodeId"]) if node.get("backendDOMNodeId") else None
        below = [line for kid in kids for line in render(kid, depth + 1, name)]
        parts = [f"{'  ' * depth}- {role}"]
        if name:
            parts.append(_quote(name))
        for prop in node.get("properties", []):
            prop_name, prop_value = prop.get("name"), (prop.get("value") or {}).get("value")
            if prop_name in STATES and prop_value not in (None, False, "false"):
                parts.append(f"[{prop_name}]" if prop_value in (True, "true") else f"[{prop_name}={prop_value}]")
            elif prop_name == "level" and role == "heading":
                parts.append(f"[level={prop_value}]")
        if ref:
            parts.append(f"[ref={ref}]")
        line = " ".join(parts)
        return [line + ":", *below] if below else [line]

    return "\n".join(line for root in roots for line in render(root, 0, ""))


def page_state(browser: Browser, *, snapshot: bool = True) -> str:
    tools, session = browser.tools, browser.page()
    title_url = _evaluate(tools, session, "[document.title, location.href]")
    lines = ["### Page state", f"- Page URL: {title_url[1]}", f"- Page Title: {title_url[0]}"]
    if snapshot:
        tree = tools.call("Accessibility.getFullAXTree", {}, session)["nodes"]
        lines += ["- Page Snapshot:", "```yaml", format_snapshot(tree, browser.ref_table()), "```"]
    return "\n".join(lines)


def _evaluate(tools: DevTools, session: str, expression: str) -> Any:
    result = tools.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
    if "exceptionDetails" in result:
        raise ActionError(f"the page's script failed: {result['exceptionDetails'].get('text', '')}")
    return result["result"].get("value")


# ---- elements and input -----------------------------------------------------------------------------


def node_id(ref: str) -> int:
    if not (isinstance(ref, str) and ref[:1] == "e" and ref[1:].isdigit()):
        raise ActionError(f"ref {ref!r} is not an element ref (e12): take them from browser_snapshot")
    return int(ref[1:])


def _stale(ref: str) -> ActionError:
    return ActionError(f"ref {ref} is not on the current page (it changed, or the ref is from another "
                       "page): take a new browser_snapshot")


def center_of(tools: DevTools, session: str, ref: str, backend: int) -> tuple[float, float]:
    try:
        tools.call("DOM.scrollIntoViewIfNeeded", {"backendNodeId": backend}, session)
        quads = tools.call("DOM.getContentQuads", {"backendNodeId": backend}, session)["quads"]
    except CommandError as exc:
        if "node" in exc.reason.lower():
            raise _stale(ref) from None
        raise ActionError(f"ref {ref} cannot be clicked: {exc.reason}") from None
    if not quads:
        raise ActionError(f"ref {ref} is not visible (it has no box on the page)")
    xs, ys = quads[0][0::2], quads[0][1::2]
    return sum(xs) / 4, sum(ys) / 4


def click(tools: DevTools, session: str, args: dict[str, Any], backend: int) -> None:
    x, y = center_of(tools, session, args["ref"], backend)
    button = args.get("button") or "left"
    modifiers = sum(MODIFIER_BITS[m] for m in args.get("modifiers") or ())
    base = {"x": x, "y": y, "modifiers": modifiers}
    tools.call("Input.dispatchMouseEvent", {"type": "mouseMoved", **base}, session)
    for count in ((1, 2) if args.get("doubleClick") else (1,)):
        for kind in ("mousePressed", "mouseReleased"):
            tools.call("Input.dispatchMouseEvent", {"type": kind, "button": button, "clickCount": count, **base},
                       session)


def key_event(name: str) -> tuple[int, dict[str, Any]]:
    """The modifier bits and the key of a Playwright key name (``Enter``, ``a``, ``Control+a``)."""
    *mods, key = name.split("+") if name != "+" else ["+"]
    if not key:
        key, mods = "+", mods[:-1]
    unknown = [m for m in mods if m not in MODIFIER_BITS]
    if unknown:
        raise ActionError(f"{'+'.join(unknown)} is not a modifier (Shift, Control, Alt, Meta)")
    bits = sum(MODIFIER_BITS[m] for m in mods)
    if key in NAMED_KEYS:
        code, keycode, text = NAMED_KEYS[key]
        return bits, {"key": " " if key == "Space" else key, "code": code, "windowsVirtualKeyCode": keycode,
                      "text": text}
    if len(key) == 1:
        upper = key.upper()
        code = f"Key{upper}" if upper.isalpha() and upper.isascii() else (f"Digit{key}" if key.isdigit() else "")
        keycode = ord(upper) if upper.isascii() and upper.isalnum() else 0
        return bits, {"key": key, "code": code, "windowsVirtualKeyCode": keycode, "text": key}
    raise ActionError(f"{key!r} is not a key name: use one character or one of {', '.join(NAMED_KEYS)}")


def press(tools: DevTools, session: str, name: str) -> None:
    bits, key = key_event(name)
    down = {"type": "keyDown" if key["text"] and not bits & 7 else "rawKeyDown", "modifiers": bits, **key}
    if down["type"] == "rawKeyDown":
        down.pop("text")
    tools.call("Input.dispatchKeyEvent", down, session)
    tools.call("Input.dispatchKeyEvent", {"type": "keyUp", "modifiers": bits,
                                          **{k: v for k, v in key.items() if k != "text"}}, session)


FOCUS_AND_SELECT = """function () {
  this.focus();
  if (typeof this.select === 'function') { this.select(); return; }
  const range = document.createRange(); range.selectNodeContents(this);
  const selection = getSelection(); selection.removeAllRanges(); selection.addRange(range);
}"""


def type_text(tools: DevTools, session: str, args: dict[str, Any], backend: int) -> None:
    ref = args["ref"]
    try:
        obj = tools.call("DOM.resolveNode", {"backendNodeId": backend}, session)["object"]["objectId"]
    except CommandError:
        raise _stale(ref) from None
    tools.call("Runtime.callFunctionOn", {"objectId": obj, "functionDeclaration": FOCUS_AND_SELECT}, session)
    text = args["text"]
    if args.get("slowly"):
        press(tools, session, "Delete")
        for char in text:
            press(tools, session, "Enter" if char == "\n" else char)
    elif text:
        tools.call("Input.insertText", {"text": text}, session)
    else:
        press(tools, session, "Delete")
    if args.get("submit"):
        press(tools, session, "Enter")


# ---- actions ----------------------------------------------------------------------------------------


def wait_loaded(tools: DevTools, session: str, timeout_s: float = LOAD_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while _evaluate(tools, session, "document.readyState") != "complete":
        if time.monotonic() > deadline:
            return  # a page still loading is read as it is
        time.sleep(POLL_S)


def with_scheme(url: str) -> str:
    """``url`` with a scheme: as given, else http:// for the sandbox's own host, https:// for others."""
    if "://" in url or url.startswith(("about:", "data:")):
        return url
    host = url.split("/", 1)[0].rsplit(":", 1)[0]
    return ("http://" if host in ("localhost", "127.0.0.1", "[::1]") else "https://") + url


def navigate(tools: DevTools, session: str, url: str) -> None:
    url = with_scheme(url)
    result = tools.call("Page.navigate", {"url": url}, session)
    error = result.get("errorText")
    if error:
        if error in ("net::ERR_TUNNEL_CONNECTION_FAILED", "net::ERR_PROXY_CONNECTION_FAILED"):
            error += (" (the sandbox's network is an allowlist: its egress proxy refused this host, or could "
                      "not reach it; the hosts it allows are the policy's sandbox.allow_hosts)")
        raise ActionError(f"navigating to {url} failed: {error}")
    wait_loaded(tools, session)


def screenshot(tools: DevTools, session: str, args: dict[str, Any], backend: int | None) -> dict[str, Any]:
    kind = args.get("type") or "png"
    params: dict[str, Any] = {"format": kind}
    if kind == "jpeg":
        params["quality"] = 80
    if backend is not None:
        center_of(tools, session, args["ref"], backend)  # scrolls it into view; the box below is exact
        model = tools.call("DOM.getBoxModel", {"backendNodeId": backend}, session)["model"]
        xs, ys = model["border"][0::2], model["border"][1::2]
        scroll = _evaluate(tools, session, "[scrollX, scrollY]")
        params["clip"] = {"x": min(xs) + scroll[0], "y": min(ys) + scroll[1], "width": max(xs) - min(xs),
                          "height": max(ys) - min(ys), "scale": 1}
    elif args.get("fullPage"):
        size = tools.call("Page.getLayoutMetrics", {}, session)["cssContentSize"]
        params["clip"] = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        params["captureBeyondViewport"] = True
    data = tools.call("Page.captureScreenshot", params, session)["data"]
    return {"image_base64": data, "media_type": f"image/{kind}"}


def console_messages(tools: DevTools, session: str, only_errors: bool) -> str:
    # A new connection's Runtime.enable replays the messages Chromium kept for the page.
    tools.call("Runtime.enable", {}, session)
    tools.call("Runtime.disable", {}, session)
    lines = []
    for event in tools.events:
        params = event.get("params", {})
        if event.get("method") == "Runtime.consoleAPICalled":
            kind = params.get("type", "log")
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            frame = (params.get("stackTrace") or {}).get("callFrames") or [{}]
            where = f" @ {frame[0].get('url', '')}:{frame[0].get('lineNumber', 0) + 1}" if frame[0] else ""
        elif event.get("method") == "Runtime.exceptionThrown":
            kind = "error"
            details = params.get("exceptionDetails", {})
            text = (details.get("exception") or {}).get("description") or details.get("text", "")
            where = ""
        else:
            continue
        if only_errors and kind not in ("error", "assert"):
            continue
        lines.append(f"[{kind.upper()}] {text}{where}")
    return "\n".join(lines) if lines else "No console messages."


def wait_for(tools: DevTools, session: str, args: dict[str, Any]) -> str:
    if args.get("time") is not None:
        time.sleep(min(float(args["time"]), MAX_WAIT_S))
    for key, present in (("text", True), ("textGone", False)):
        text = args.get(key)
        if text is None:
            continue
        limit_s = float(args.get("timeout") or LOAD_TIMEOUT_S)
        deadline = time.monotonic() + limit_s
        check = f"(document.body ? document.body.innerText : '').includes({json.dumps(text)})"
        while bool(_evaluate(tools, session, check)) != present:
            if time.monotonic() > deadline:
                raise ActionError(f"{_quote(text)} did not {'appear' if present else 'disappear'} "
                                  f"within {limit_s:.0f} s")
            time.sleep(POLL_S)
    waited = [f"{args['time']} s" if args.get("time") is not None else "",
              f"text {_quote(args['text'])} to appear" if args.get("text") else "",
              f"text {_quote(args['textGone'])} to disappear" if args.get("textGone") else ""]
    return "Waited for " + ", ".join(w for w in waited if w)


def start() -> dict[str, Any]:
    """The display (with Chromium), or Chromium alone when the display is up without it; then its
    DevTools port answering."""
    display_was_up = computer._display_up()
    computer.ensure_display()  # starts Chromium with the display
    if display_was_up and not _devtools_up() and not _chromium_running():
        chromium = shutil.which("chromium")
        if chromium is None:
            raise ActionError("chromium is not installed in this image")
        computer._spawn(computer.chromium_argv(chromium, "--start-maximized", "about:blank"), "chromium.log")
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _devtools_up():
        if time.monotonic() > deadline:
            raise ActionError(f"Chromium's DevTools did not answer in {START_TIMEOUT_S:.0f} s: "
                              f"{computer._log_tail('chromium.log')}")
        time.sleep(0.05)
    return {"ok": True}


def _devtools_up() -> bool:
    """Whether Chromium answers on its DevTools port and has opened its first window's tab (the
    port answers before it does, and a call meanwhile would open a second tab)."""
    try:
        tools = DevTools(timeout_s=2)
    except ActionError:
        return False
    try:
        return any(t["type"] == "page" for t in tools.call("Target.getTargets")["targetInfos"])
    except ActionError:
        return False
    finally:
        tools.close()


def _chromium_running() -> bool:
    """Whether a Chromium browser process runs (it may not answer yet: it is starting)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        # /usr/bin/chromium is a shell script that execs the browser: either may be seen.
        if any(a.endswith(b"chromium") for a in argv[:2]) and not any(a.startswith(b"--type=") for a in argv):
            return True
    return False


def perform(args: dict[str, Any]) -> dict[str, Any]:
    action = args.get("action")
    if action == "start":
        return start()
    tools = DevTools()
    try:
        browser = Browser(tools)
        result = _act(tools, browser, str(action), args)
        browser.save()
        return {"ok": True, **result}
    finally:
        tools.close()


def _act(tools: DevTools, browser: Browser, action: str, args: dict[str, Any]) -> dict[str, Any]:
    if action == "tabs":
        what = args.get("tab_action")
        if what == "new":
            browser.new_tab()
        elif what == "close":
            browser.close_tab(browser.by_index(args.get("index")))
        elif what == "select":
            browser.select(browser.by_index(args.get("index")))
        elif what != "list":
            raise ActionError(f"tabs action {what!r}: use list, new, close or select")
        text = "### Open tabs\n" + browser.listing()
        if what in ("new", "select") or (what == "close" and browser.current):
            text += "\n\n" + page_state(browser)
        return {"text": text}
    session = browser.page()
    if action == "navigate":
        navigate(tools, session, args["url"])
    elif action == "click":
        click(tools, session, args, browser.element(args["ref"]))
    elif action == "type":
        type_text(tools, session, args, browser.element(args["ref"]))
    elif action == "press_key":
        press(tools, session, args["key"])
    elif action == "wait_for":
        return {"text": wait_for(tools, session, args) + "\n\n" + page_state(browser)}
    elif action == "snapshot":
        return {"text": page_state(browser)}
    elif action == "screenshot":
        backend = browser.element(args["ref"]) if args.get("ref") else None
        return {"text": page_state(browser, snapshot=False), **screenshot(tools, session, args, backend)}
    elif action == "console_messages":
        return {"text": console_messages(tools, session, bool(args.get("onlyErrors")))}
    else:
        raise ActionError(f"unknown action {action!r}")
    # After an action the page may be loading or repainting: its snapshot is read once it settled.
    time.sleep(computer.SETTLE_S)
    wait_loaded(tools, session, 5.0)
    return {"text": page_state(browser)}


def main(argv: list[str]) -> int:
    try:
        if len(argv) != 2:
            raise ActionError("usage: browser.py '<json object with an action>'")
        try:
            args = json.loads(argv[1])
        except ValueError as exc:
            raise ActionError(f"the argument is not JSON: {exc}") from None
        if not isinstance(args, dict):
            raise ActionError("the argument must be a JSON object")
        result = perform(args)
    except BrowserDown as exc:
        print(json.dumps({"ok": False, "error": str(exc), "browser_down": True}))
        return 3
    except ActionError as exc:
        print(json.dumps({"ok": False, "error": str(exc)}))
        return 2
    except (OSError, KeyError, IndexError, ValueError) as exc:
        print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
