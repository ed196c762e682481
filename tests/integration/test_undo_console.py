"""Undo in the web console, on one real run: `callbox run` with the scripted model and
``[checkpoints] mode = "changes"`` changes files in a read-write mount (and a scratch place);
the console (the real app over real HTTP) shows each call's changes in the run's page, refuses
a revert with a readable reason (scratch places lost unless "mounts only", a call without a
record, a run without records, a client's token), and in headless Chromium an operator reverts
to before the first call: the page says what was put back and what was not, and the mount is
back byte for byte. One run and one console for the module; then one sandbox of a gRPC door in
the console's server, reverted through its agent (refused while one of its calls runs).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.audit.store import AuditStore
from harness.client import ExecutorClient
from harness.core.policy import parse_policy
from harness.doors.grpc.server import serve_grpc
from harness.doors.grpc.tokens import TokenSet
from harness.doors.http import HttpServer, serve_http
from tests.browser import chromium
from tests.conftest import IMAGE
from tests.support.file_trees import listing, make_project

pytestmark = pytest.mark.docker

OPERATOR_TOKEN = "undo-console-operator-token-012345"
AGENT_TOKEN = "undo-console-agent-token-0123456789"
TOKENS = TokenSet({"operator": OPERATOR_TOKEN, "agent": AGENT_TOKEN}, source="test tokens", operators=["operator"])
WAIT_S = 180.0
PAGE_TIMEOUT_MS = 30_000
MARKUP = "hello <b>bold</b> & <script>alert(1)</script>\n"
"""What the first call writes: it must show as text, never as markup."""


@dataclass
class Undone:
    http: HttpServer
    audit: AuditStore
    run_id: str
    project: Path
    before: dict[str, tuple[str, int, bytes | str | None]]
    unrecorded: str
    """A run with no change records."""


@pytest.fixture(scope="module")
def undone(engine: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Undone]:
    """One ended run whose calls changed a read-write mount and /workspace, and the console on its audit store."""
    tmp = tmp_path_factory.mktemp("undo-console")
    project = tmp / "project"
    make_project(project)
    before = listing(project)
    (tmp / "policy.toml").write_text('[checkpoints]\nmode = "changes"\n')
    edit = ("sed -i 's/two/TWO/' /data/a.txt && rm -r /data/sub && chmod 600 /data/tool.sh"
            " && ln -sfn new.txt /data/link && echo scratch > /workspace/scratch.txt")
    turns = [
        {"tool_calls": [{"call_id": "c1", "name": "write_file", "arguments": {"path": "/data/new.txt",
                                                                              "content": MARKUP}}]},
        {"tool_calls": [{"call_id": "c2", "name": "shell", "arguments": {"command": edit}}]},
        {"tool_calls": [{"call_id": "c3", "name": "read_file", "arguments": {"path": "/data/a.txt"}}]},
        {"text": "done"},
    ]
    (tmp / "transcript.jsonl").write_text("".join(json.dumps(t) + "\n" for t in turns))
    db = tmp / "audit.sqlite3"
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli.main", "run", str(tmp / "transcript.jsonl"), "--json", "--image", IMAGE,
         "--policy", str(tmp / "policy.toml"), "--mount", f"{project}:/data:rw"],
        capture_output=True, env={**os.environ, "CALLBOX_AUDIT_DB": str(db)}, timeout=WAIT_S, check=False)
    assert done.returncode == 0, done.stderr.decode()
    run_id = json.loads(done.stdout.splitlines()[0])["run_id"]
    audit = AuditStore(db)
    try:
        audit.update_run_meta(run_id, {"door": "cli", "client": "agent"})  # the client token's own run
        unrecorded = audit.start_run(meta={"door": "grpc", "client": "agent"})
        audit.end_run(unrecorded, "done")
        http = serve_http("127.0.0.1:0", tokens=TOKENS, executor=None, audit=audit, engine_ping=lambda: None)
        try:
            yield Undone(http, audit, run_id, project, before, unrecorded)
        finally:
            http.stop()
    finally:
        audit.close()


def _get(undone: Undone, path: str, token: str = OPERATOR_TOKEN) -> httpx.Response:
    return httpx.get(f"{undone.http.url}{path}", headers={"authorization": f"Bearer {token}"})


def _revert(undone: Undone, run_id: str, form: dict[str, str], token: str = OPERATOR_TOKEN) -> httpx.Response:
    return httpx.post(f"{undone.http.url}/runs/{run_id}/revert", data=form,
                      headers={"authorization": f"Bearer {token}"})


def test_the_run_page_shows_each_calls_changes(undone: Undone) -> None:
    page = _get(undone, f"/runs/{undone.run_id}")
    assert page.status_code == 200, page.text
    html = page.text
    c1 = html[html.index('id="changes-c1"'):html.index('id="changes-c2"')]
    assert "1 created, 0 changed, 0 removed" in c1 and "+++ b/data/new.txt" in c1
    assert "hello &lt;b&gt;bold&lt;/b&gt; &amp; &lt;script&gt;alert(1)&lt;/script&gt;" in c1  # text, not markup
    assert "<script>" not in html and "<b>bold" not in html
    c2 = html[html.index('id="changes-c2"'):]
    assert "1 created, 3 changed, 2 removed" in c2, c2[:300]  # scratch.txt; a.txt, tool.sh, link; sub, sub/b.txt
    assert '<span class="del">-two</span>' in c2 and '<span class="add">+TWO</span>' in c2
    assert "mode /data/tool.sh: 755 -&gt; 600" in c2 and "symlink /data/link -&gt; new.txt (was a.txt)" in c2
    assert 'id="changes-c3"' not in html  # read_file is read-only: no record
    assert html.count("Revert to before") == 2 and html.count('name="mounts_only"') == 2

    plain = _get(undone, f"/runs/{undone.unrecorded}")
    assert plain.status_code == 200 and "checkpoints were off for it" in plain.text
    assert 'mode = "changes"' in plain.text


def test_a_client_sees_its_runs_changes_but_cannot_revert(undone: Undone) -> None:
    page = _get(undone, f"/runs/{undone.run_id}", AGENT_TOKEN)
    assert page.status_code == 200 and '<span class="add">+TWO</span>' in page.text
    assert "Revert to before" not in page.text and "An operator can revert" in page.text
    refused = _revert(undone, undone.run_id, {"to": "c1", "mounts_only": "yes"}, AGENT_TOKEN)
    assert refused.status_code == 403 and "operator" in refused.text
    assert (undone.project / "new.txt").exists()  # nothing touched


def test_reverts_the_console_refuses_say_why(undone: Undone) -> None:
    lost = _revert(undone, undone.run_id, {"to": "c1"})
    assert lost.status_code == 400, lost.text
    assert "/workspace" in lost.text and 'a tick in "mounts only"' in lost.text
    assert (undone.project / "new.txt").exists()  # refused: nothing touched
    unrecorded_call = _revert(undone, undone.run_id, {"to": "c3", "mounts_only": "yes"})
    assert unrecorded_call.status_code == 400 and "call 'c3' has no change record" in unrecorded_call.text
    no_records = _revert(undone, undone.unrecorded, {"to": "c1", "mounts_only": "yes"})
    assert no_records.status_code == 400 and "has no change records" in no_records.text
    unknown = _revert(undone, "no-such-run", {"to": "c1", "mounts_only": "yes"})
    assert unknown.status_code == 404, unknown.text
    assert listing(undone.project) != undone.before  # still the run's changes


def _colored_pixels(browser: Any, png: bytes) -> dict[str, int]:
    """How many pixels of the screenshot are the diff's added-line green and removed-line red
    (their text and background colors), counted by Chromium on a blank page's canvas."""
    page = browser.new_page()
    try:
        return dict(page.evaluate("""async (src) => {
            const img = new Image(); img.src = src; await img.decode();
            const canvas = document.createElement('canvas');
            canvas.width = img.width; canvas.height = img.height;
            const ctx = canvas.getContext('2d'); ctx.drawImage(img, 0, 0);
            const d = ctx.getImageData(0, 0, img.width, img.height).data;
            const near = (i, r, g, b) => Math.abs(d[i] - r) + Math.abs(d[i + 1] - g) + Math.abs(d[i + 2] - b) < 12;
            let green = 0, red = 0;
            for (let i = 0; i < d.length; i += 4) {
                if (near(i, 0xe6, 0xf4, 0xea) || near(i, 0x1e, 0x6b, 0x34)) green++;
                if (near(i, 0xfc, 0xe8, 0xe6) || near(i, 0xb3, 0x26, 0x1e)) red++;
            }
            return {green, red, width: img.width, height: img.height};
        }""", "data:image/png;base64," + base64.b64encode(png).decode()))
    finally:
        page.close()


def test_an_operator_reverts_in_chromium(undone: Undone, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    with chromium() as browser:
        context = browser.new_context()
        context.set_default_timeout(PAGE_TIMEOUT_MS)
        try:
            page = context.new_page()
            page.goto(f"{undone.http.url}/runs/{undone.run_id}")
            page.get_by_label("Token").fill(OPERATOR_TOKEN)
            page.get_by_role("button", name="Log in").click()
            changes = page.get_by_role("region", name="changes of call c2")
            diff = changes.locator("pre.diff")
            expect(diff).to_be_visible()
            expect(diff).to_contain_text("+TWO")
            expect(diff).to_contain_text("removed /data/sub/b.txt")
            expect(page.get_by_role("region", name="changes of call c1")).to_contain_text(MARKUP.strip())

            shot = tmp_path / "undo-console-diff.png"
            png = diff.screenshot(path=str(shot))
            assert shot.read_bytes() == png
            seen = _colored_pixels(browser, png)
            assert seen["width"] > 300 and seen["height"] > 60, seen  # the diff laid out, not collapsed
            assert seen["green"] > 200 and seen["red"] > 200, seen  # its added and removed lines, colored

            first = page.get_by_role("region", name="changes of call c1")
            first.get_by_label(re.compile("mounts only")).check()
            first.get_by_role("button", name="Revert to before c1").click()
            expect(page.get_by_role("status")).to_contain_text(f"run {undone.run_id} reverted to just before call c1")
            report = page.locator("ul.reverts li").first
            expect(report).to_contain_text("console:operator")
            expect(report).to_contain_text("removed /data/new.txt")
            expect(report).to_contain_text("recreated /data/sub/b.txt")
            expect(report).to_contain_text("not restored: /workspace: only the run's sandbox holds it")
            page.screenshot(path=str(tmp_path / "undo-console-reverted.png"), full_page=True)
        finally:
            context.close()
    assert listing(undone.project) == undone.before  # byte for byte, modes and symlinks included
    reverts = undone.audit.get_run(undone.run_id).meta["console_reverts"]
    assert [(r["by"], r["to_call"], r["where"]) for r in reverts] == [("console:operator", "c1", "mounts")]


def test_an_operator_reverts_a_live_sandbox_through_its_agent(engine: object, tmp_path: Path) -> None:
    """A run whose session lives in the console's server: refused while a call of it runs, then
    every writable place put back (a scratch place's file too)."""
    short = Path(tempfile.mkdtemp(prefix="cbx-undo-", dir="/tmp"))  # sun_path is 108 bytes
    audit = AuditStore(tmp_path / "audit.sqlite3")
    policy = parse_policy(f'[sandbox]\nimage = "{IMAGE}"\nmemory = "256m"\n\n[checkpoints]\nmode = "changes"\n')
    door = serve_grpc(str(short / "executor.sock"), policy=policy, audit=audit, tokens=TOKENS, announce=None)
    try:
        http = serve_http("127.0.0.1:0", tokens=TOKENS, executor=door.service, audit=audit, engine_ping=lambda: None)
        try:
            with ExecutorClient(door.target, AGENT_TOKEN) as agent:
                box = agent.create_sandbox()
                try:
                    for call_id, tool, arguments in (
                            ("w1", "write_file", {"path": "/workspace/notes.txt", "content": "first\n"}),
                            ("w2", "shell", {"command": "echo second >> /workspace/notes.txt && echo x > /tmp/new"})):
                        assert not agent.call(box, tool, arguments, call_id=call_id).is_error
                    live = Undone(http, audit, box, tmp_path, {}, "")
                    waiting = threading.Thread(target=agent.call, args=(box, "shell", {
                        "command": "while [ ! -e /tmp/go ]; do sleep 0.05; done"}), kwargs={"call_id": "w3"})
                    waiting.start()
                    try:
                        deadline = time.monotonic() + WAIT_S
                        while not any(c["call_id"] == "w3" and c.get("state") == "running"
                                      for c in audit.calls_for_run(box)):
                            assert time.monotonic() < deadline, "call w3 never started"
                            time.sleep(0.05)
                        busy = _revert(live, box, {"to": "w2"})
                        assert busy.status_code == 409 and "call w3 of run" in busy.text and "is running" in busy.text
                    finally:
                        agent.call(box, "write_file", {"path": "/tmp/go", "content": ""})
                        waiting.join(WAIT_S)
                    page = _get(live, f"/runs/{box}")
                    assert "every writable place of the run&#x27;s live sandbox" in page.text
                    assert '<span class="add">+second</span>' in page.text and 'name="mounts_only"' not in page.text
                    done = _revert(live, box, {"to": "w2"})
                    assert done.status_code == 200, done.text
                    assert f"run {box} reverted to just before call w2 (its sandbox's writable places)" in done.text
                    assert agent.call(box, "read_file", {"path": "/workspace/notes.txt"}).text.endswith("first\n")
                    gone = agent.call(box, "shell", {"command": "test -e /tmp/new || test -e /tmp/go || echo gone"})
                    assert gone.text.strip().endswith("gone"), gone.text
                    assert audit.get_run(box).meta["console_reverts"][0]["where"] == "sandbox"
                finally:
                    agent.delete_sandbox(box)
        finally:
            http.stop()
    finally:
        door.stop(grace=1)
        audit.close()
        shutil.rmtree(short, ignore_errors=True)
