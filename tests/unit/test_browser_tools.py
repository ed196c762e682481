"""The ``browser_*`` tools without a sandbox: their arguments checked before anything runs, the
policy switch that serves them, and the desktop image's snapshot formatting, refs and key names
(images/desktop/browser.py) on this host."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from harness.core.calls import ErrorCode
from harness.core.policy import parse_policy
from harness.core.validation import CallRejected, validate_call
from harness.engine.spec import HostLimits
from harness.tools import registry_for
from harness.tools.browser import BROWSER_TOOL_NAMES, BROWSER_TOOLS


def _desktop_module(name: str) -> ModuleType:
    folder = Path(__file__).resolve().parents[2] / "images" / "desktop"
    spec = importlib.util.spec_from_file_location(f"desktop_{name}", folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"desktop_{name}"] = module
    spec.loader.exec_module(module)
    return module


browser = _desktop_module("browser")
TOOLS = {tool.name: tool for tool in BROWSER_TOOLS}


def rejected(name: str, args: dict[str, Any]) -> str:
    with pytest.raises(CallRejected) as info:
        validate_call(TOOLS[name].definition, args)
    assert info.value.code is ErrorCode.INVALID_ARGUMENTS
    return info.value.message


def test_the_tools_have_playwrights_names_and_both_schema_forms() -> None:
    playwright = {"browser_navigate", "browser_snapshot", "browser_click", "browser_type", "browser_press_key",
                  "browser_take_screenshot", "browser_tabs", "browser_console_messages", "browser_wait_for"}
    assert playwright == BROWSER_TOOL_NAMES
    click = TOOLS["browser_click"].definition
    assert set(click.input_schema("plain")["required"]) == {"element", "ref"}
    assert set(click.input_schema("strict")["properties"]) == {"element", "ref", "doubleClick", "button",
                                                               "modifiers"}
    assert TOOLS["browser_snapshot"].definition.annotations.read_only


@pytest.mark.parametrize(("name", "args", "message"), [
    ("browser_click", {"element": "b", "ref": "button"}, "ref"),
    ("browser_click", {"element": "b", "ref": "e1", "button": "back"}, "button"),
    ("browser_type", {"element": "b", "ref": "e1"}, "text"),
    ("browser_take_screenshot", {"ref": "e1"}, "element and ref go together"),
    ("browser_take_screenshot", {"element": "b", "ref": "e1", "fullPage": True}, "fullPage cannot be used"),
    ("browser_take_screenshot", {"filename": "page.png"}, "filename"),
    ("browser_tabs", {"action": "select"}, "action 'select' needs index"),
    ("browser_tabs", {"action": "list", "index": 0}, "action 'list' takes no index"),
    ("browser_wait_for", {}, "give time, text or textGone"),
    ("browser_wait_for", {"time": 61}, "time"),
    ("browser_navigate", {}, "url"),
])
def test_wrong_arguments_are_refused_before_anything_runs(name: str, args: dict[str, Any], message: str) -> None:
    assert message in rejected(name, args)


@pytest.mark.parametrize(("policy", "served"), [
    ("", False),
    ('[tools."browser_*"]\n', True),
    ('allowed_tools = ["browser_snapshot", "shell"]\n', True),
    ('[tools.browser_click]\ndecision = "ask"\n', True),
    ("[tools.computer]\n", False),
])
def test_the_family_is_served_to_a_policy_that_names_it(policy: str, served: bool) -> None:
    names = set(registry_for(parse_policy(policy, host=HostLimits(cpus=None, memory=None))).names())
    assert names & BROWSER_TOOL_NAMES == (BROWSER_TOOL_NAMES if served else set())


def _node(node_id: str, role: str, name: str = "", children: tuple[str, ...] = (), backend: int | None = None,
          **extra: Any) -> dict[str, Any]:
    node: dict[str, Any] = {"nodeId": node_id, "role": {"type": "role", "value": role},
                            "name": {"type": "computedString", "value": name}, "childIds": list(children), **extra}
    if backend is not None:
        node["backendDOMNodeId"] = backend
    return node


TREE = [
    _node("1", "RootWebArea", "Page", ("2",), 1),
    _node("2", "generic", "", ("3", "4", "7", "9"), 10),
    _node("3", "heading", "Title", ("31",), 20, properties=[{"name": "level", "value": {"value": 1}}]),
    _node("31", "StaticText", "Title", (), 21),
    _node("4", "button", "Go", ("41",), 30, properties=[{"name": "disabled", "value": {"value": True}},
                                                        {"name": "focusable", "value": {"value": True}}]),
    _node("41", "StaticText", "Go", (), 31),
    _node("7", "none", "", ("8",), 40, ignored=True),
    _node("8", "checkbox", 'Say "yes"', (), 50, properties=[{"name": "checked", "value": {"value": "true"}}]),
    _node("9", "paragraph", "", ("91",), 60),
    _node("91", "StaticText", "Some words", (), 61),
]


def test_a_snapshot_is_playwrights_yaml_with_refs_in_first_seen_order() -> None:
    refs = browser.RefTable()
    assert browser.format_snapshot(TREE, refs) == "\n".join([
        '- heading "Title" [level=1] [ref=e1]',
        '- button "Go" [disabled] [ref=e2]',
        '- checkbox "Say \\"yes\\"" [checked] [ref=e3]',
        '- text: "Some words"',
    ])
    # the same document's next snapshot keeps the refs; a new element gets the next number
    again = [*TREE[:-2], _node("9", "link", "More", (), 70)]
    assert browser.format_snapshot(again, refs).splitlines()[-1] == '- link "More" [ref=e4]'
    assert refs.node("e2") == 30 and refs.node("e9") is None
    assert browser.RefTable(refs.dump()).node("e4") == 70  # what the state file keeps between calls
    with pytest.raises(browser.ActionError, match="not an element ref"):
        refs.node("button")


def test_refs_follow_document_order_and_decoration_is_left_out() -> None:
    tree = [
        _node("1", "RootWebArea", "Tasks", ("2",), 1),
        _node("2", "list", "Tasks", ("3",), 10),
        _node("3", "listitem", "", ("4", "5"), 20, properties=[{"name": "level", "value": {"value": 1}}]),
        _node("4", "ListMarker", "•", (), 21),
        _node("5", "link", "Buy milk", (), 30),
    ]
    assert browser.format_snapshot(tree, browser.RefTable()).splitlines() == [
        '- list "Tasks" [ref=e1]:', "  - listitem [ref=e2]:", '    - link "Buy milk" [ref=e3]']


def test_key_names_are_playwrights() -> None:
    assert browser.key_event("Enter") == (0, {"key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13,
                                              "text": "\r"})
    assert browser.key_event("Control+a") == (2, {"key": "a", "code": "KeyA", "windowsVirtualKeyCode": 65,
                                                  "text": "a"})
    assert browser.key_event("Shift++")[1]["key"] == "+" and browser.key_event("+")[0] == 0
    with pytest.raises(browser.ActionError, match="'Hyper' is not a key name"):
        browser.key_event("Hyper")
    with pytest.raises(browser.ActionError, match="Super is not a modifier"):
        browser.key_event("Super+a")


def test_a_url_without_a_scheme_gets_one() -> None:
    assert browser.with_scheme("127.0.0.1:8000/app") == "http://127.0.0.1:8000/app"
    assert browser.with_scheme("localhost") == "http://localhost"
    assert browser.with_scheme("example.com/x") == "https://example.com/x"
    assert browser.with_scheme("file:///workspace/a.html") == "file:///workspace/a.html"
    assert browser.with_scheme("about:blank") == "about:blank"
