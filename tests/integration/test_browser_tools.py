"""The ``browser_*`` tools on a real desktop sandbox (network ``none``): a page served inside the
sandbox, a scripted model navigating, finding the button's ref in the snapshot, clicking it and
seeing its new text, through ``callbox run``; and the MCP door giving the official MCP client the
screenshot as ``ImageContent``. Every hardening default and limit unchanged.

``CALLBOX_TEST_DESKTOP_IMAGE`` names the desktop image (default callbox-sandbox-desktop:latest).
"""

from __future__ import annotations

import base64
import json
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.types import ImageContent, TextContent

from harness.audit.store import AuditStore
from harness.core.calls import ErrorCode, ToolCall
from harness.core.context import ToolContext
from harness.core.images import read_header
from harness.core.policy import parse_policy
from harness.core.session import Session
from harness.doors.mcp.http import serve_mcp_http
from harness.engine.docker.engine import DockerEngine
from harness.engine.spec import HostLimits
from harness.tools import registry_for
from harness.tools.browser import BROWSER_TOOLS, NavigateArgs
from tests.conftest import DESKTOP_TEST_IMAGE, IMAGE, unavailable
from tests.integration.helpers import callbox
from tests.netdest import BANNER, HTTP_PORT

pytestmark = pytest.mark.docker

FLOW_TIMEOUT_S = 120
PAGE = ("<!doctype html><title>Button page</title><h1>A page</h1>"
        "<button onclick=\"this.textContent='Clicked'; console.log('clicked it')\">Click me</button>")
SERVE = ("mkdir -p /workspace/site && printf '%s' \"$PAGE\" > /workspace/site/index.html && "
         "exec python3 -m http.server 8765 --bind 127.0.0.1 --directory /workspace/site")


@pytest.fixture(scope="module")
def desktop_image(engine: Any) -> str:
    try:
        engine.client.images.get(DESKTOP_TEST_IMAGE)
    except Exception:
        unavailable(f"image {DESKTOP_TEST_IMAGE} is missing (run `make image-desktop`)", module=True)
    return DESKTOP_TEST_IMAGE


def _policy(tmp_path: Path, image: str) -> Path:
    policy = tmp_path / "policy.toml"
    policy.write_text(textwrap.dedent(f"""
        [sandbox]
        image = "{image}"
        [tools."browser_*"]
    """))
    return policy


def test_a_scripted_model_clicks_a_button_by_its_snapshot_ref(desktop_image: str, tmp_path: Path) -> None:
    call = {"name": "exec_command", "arguments": {"cmd": f"PAGE={json.dumps(PAGE)!s} && {SERVE}",
                                                  "yield_time_ms": 1000}}
    turns = [
        {"text": "serving the page", "tool_calls": [{"call_id": "serve", **call}]},
        {"tool_calls": [{"call_id": "nav", "name": "browser_navigate",
                         "arguments": {"url": "http://127.0.0.1:8765/"}}]},
        {"tool_calls": [{"call_id": "snap", "name": "browser_snapshot", "arguments": {}}]},
        {"tool_calls": [{"call_id": "click", "name": "browser_click",
                         "arguments": {"element": "Click me button", "ref": "e2"}}]},
        {"tool_calls": [{"call_id": "console", "name": "browser_console_messages", "arguments": {}}]},
        {"tool_calls": [{"call_id": "shot", "name": "browser_take_screenshot", "arguments": {}}]},
        {"tool_calls": [{"call_id": "stale", "name": "browser_click",
                         "arguments": {"element": "nothing", "ref": "e99"}}]},
        {"text": "the button says Clicked"},
    ]
    transcript = tmp_path / "transcript.jsonl"
    transcript.write_text("".join(json.dumps(t) + "\n" for t in turns))
    env = {"CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}
    proc = callbox("run", str(transcript), "--json", "--policy", str(_policy(tmp_path, desktop_image)), env=env,
                   timeout=FLOW_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    results = {e["call_id"]: e for e in events if e["event"] == "tool_result"}
    texts = {call_id: json.dumps(e) for call_id, e in results.items()}
    assert "Button page" in texts["nav"], texts["nav"]
    assert '- button \\"Click me\\" [ref=e2]' in texts["snap"], texts["snap"]
    assert '- heading \\"A page\\" [level=1] [ref=e1]' in texts["snap"]
    assert '- button \\"Clicked\\" [focused] [ref=e2]' in texts["click"], texts["click"]
    assert "[LOG] clicked it @ http://127.0.0.1:8765/" in texts["console"], texts["console"]
    assert "ref e99 is not in this page's snapshots" in texts["stale"], texts["stale"]
    (picture,) = results["shot"]["result"]["meta"]["images"]
    assert picture["media_type"] == "image/png" and picture["width"] > 1000 and picture["bytes"] > 1000
    assert events[-1]["reason"] == "final"


def _text(result: Any) -> str:
    return "".join(block.text for block in result.content if isinstance(block, TextContent))


def test_the_mcp_door_gives_the_screenshot_as_image_content(desktop_image: str, tmp_path: Path) -> None:
    server = serve_mcp_http("127.0.0.1:0", policy_path=_policy(tmp_path, desktop_image),
                            audit_path=tmp_path / "audit.sqlite3")

    async def flow() -> None:
        async with Client(server.url) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert {tool.name for tool in BROWSER_TOOLS} <= names and "computer" not in names
            page = "data:text/html," + PAGE.replace("#", "%23")
            opened = await client.call_tool("browser_navigate", {"url": page})
            assert opened.is_error is False, _text(opened)
            shot = await client.call_tool("browser_take_screenshot", {})
            assert shot.is_error is False, _text(shot)
            (image,) = [block for block in shot.content if isinstance(block, ImageContent)]
            media_type, width, height = read_header(base64.b64decode(image.data))
            assert (image.mime_type, media_type) == ("image/png", "image/png")
            assert 1000 <= width <= 1280 and 400 <= height <= 800
            assert _text(shot).startswith(f"Took a screenshot of the current page ({width}x{height} PNG).")
            button = await client.call_tool("browser_take_screenshot",
                                            {"element": "the button", "ref": "e2", "type": "jpeg"})
            (part,) = [block for block in button.content if isinstance(block, ImageContent)]
            assert part.mime_type == "image/jpeg" and read_header(base64.b64decode(part.data))[1] < 200
            tabs = await client.call_tool("browser_tabs", {"action": "new"})
            assert "- 1: (current) [] (about:blank)" in _text(tabs), _text(tabs)
            closed = await client.call_tool("browser_tabs", {"action": "close"})
            assert "- 0: (current) [Button page]" in _text(closed), _text(closed)
            missing = await client.call_tool("browser_tabs", {"action": "select", "index": 5})
            assert missing.is_error is True and "there is no tab 5: the tabs are 0 to 0" in _text(missing)
            waited = await client.call_tool("browser_wait_for", {"text": "Click me"})
            assert waited.is_error is False and 'Waited for text "Click me" to appear' in _text(waited)
            # closing the last tab leaves a blank one (Chromium would quit with its window)
            last = await client.call_tool("browser_tabs", {"action": "close", "index": 0})
            assert _text(last).startswith("### Open tabs\n- 0: (current) [] (about:blank)\n"), _text(last)
            again = await client.call_tool("browser_navigate", {"url": page})
            assert '- button "Click me" [ref=e2]' in _text(again), _text(again)

    try:
        async def bounded() -> None:
            with anyio.fail_after(FLOW_TIMEOUT_S):
                await flow()
        anyio.run(bounded)
    finally:
        server.stop()


class _Provider:
    def __init__(self, box: Any) -> None:
        self.box = box

    def sandbox(self) -> Any:
        return self.box


def test_a_sandbox_without_a_desktop_is_told_which_image_to_use(make_sandbox: Any) -> None:
    ctx = ToolContext(run_id="browser", call_id="c1", provider=_Provider(make_sandbox(image=IMAGE)),
                      default_timeout_s=30.0, timeout_ceiling_s=60.0, output_budget=30_000)
    out = BROWSER_TOOLS[0].handler(ctx, NavigateArgs(url="http://127.0.0.1:8765/"))
    assert out.is_error and out.error is ErrorCode.NOT_SUPPORTED and "callbox-sandbox-desktop:latest" in out.text
    assert out.structured == {"tool": "browser_navigate", "needs_image": "callbox-sandbox-desktop:latest",
                              "policy_key": "sandbox.image"}


def test_under_allowlist_the_browser_goes_through_the_egress_proxy(
    desktop_image: str, net_engine: DockerEngine, tmp_path: Path,
) -> None:
    """An allowed host loads; a denied one gets the proxy's refusal; both are in the egress audit."""
    policy = parse_policy(textwrap.dedent(f"""
        [sandbox]
        image = "{desktop_image}"
        network = "allowlist"
        allow_hosts = ["dest.callbox.test:{HTTP_PORT}"]
        [tools."browser_*"]
    """), source="test.toml", base_dir=tmp_path, host=HostLimits(cpus=None, memory=None))
    with AuditStore(tmp_path / "audit.sqlite3") as audit:
        with Session(registry_for(policy), policy, audit, spec=policy.sandbox_spec(),
                     engine_factory=lambda: net_engine) as harness:
            allowed = harness.call(ToolCall("browser_navigate", {"url": f"http://dest.callbox.test:{HTTP_PORT}/hi"},
                                            "nav-allowed"))
            denied = harness.call(ToolCall("browser_navigate", {"url": f"http://api.callbox.test:{HTTP_PORT}/x"},
                                           "nav-denied"))
            tunnel = harness.call(ToolCall("browser_navigate", {"url": "https://api.callbox.test/"}, "nav-tls"))
            run_id = harness.run_id
        rows = audit.egress(run_id)
    assert not allowed.is_error, allowed.text
    assert f'- text: "{BANNER} /hi' in allowed.text, allowed.text
    assert f"callbox egress proxy refused api.callbox.test:{HTTP_PORT}" in denied.text, denied.text
    assert tunnel.is_error and "net::ERR_TUNNEL_CONNECTION_FAILED (the sandbox's network is an allowlist" in tunnel.text
    decisions = {(r["call_id"], r["decision"], r["host"], r["port"]) for r in rows
                 if r["host"].endswith(".callbox.test")}
    assert decisions == {("nav-allowed", "allow", "dest.callbox.test", HTTP_PORT),
                         ("nav-denied", "deny", "api.callbox.test", HTTP_PORT),
                         ("nav-tls", "deny", "api.callbox.test", 443)}
