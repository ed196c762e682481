"""The console in a real browser: Debian's headless Chromium driven by Playwright (the
``playwright`` package from PyPI, pointed at /usr/bin/chromium; no browser download).

A gRPC door runs with a policy where every ``shell`` call asks a person; an agent's calls come
back pending. An operator logs in through the form, approves one call in the page while the
agent's client waits for it (the client then sends the call again, and it runs exactly once),
denies another with a reason (the model's result item carries it), and kills the live
sandbox (its container is gone). A form another site serves cannot act on the console.

Chromium comes from ``scripts/setup-browser.sh`` (``apt-get install chromium``); when it is
missing the test skips saying so, except under CI=true, where it fails.
"""

from __future__ import annotations

import shutil
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.errors
import grpc
import pytest

from harness.audit.store import AuditStore
from harness.client import CallResult, ExecutorClient, ExecutorError
from harness.core.policy import parse_policy
from harness.doors.grpc.server import GrpcServer, serve_grpc
from harness.doors.grpc.tokens import TokenSet
from harness.doors.http import HttpServer, serve_http
from tests.browser import chromium
from tests.conftest import IMAGE
from tests.console_data import seed

pytestmark = [pytest.mark.interop, pytest.mark.docker]

OPERATOR_TOKEN = "console-operator-token-0123456789"
AGENT_TOKEN = "console-agent-token-0123456789ab"
TOKENS = TokenSet({"operator": OPERATOR_TOKEN, "agent": AGENT_TOKEN}, source="test tokens", operators=["operator"])
WAIT_S = 60.0
PAGE_TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium from Debian, or a skip (a failure under CI=true) saying how to get it."""
    with chromium() as launched:
        yield launched


@dataclass
class Stack:
    grpc: GrpcServer
    http: HttpServer
    audit: AuditStore


@pytest.fixture
def stack(engine, tmp_path: Path) -> Iterator[Stack]:  # type: ignore[no-untyped-def]
    """A gRPC door whose policy asks a person about every shell call, and the console on its executor."""
    short = Path(tempfile.mkdtemp(prefix="cbx-console-", dir="/tmp"))  # sun_path is 108 bytes
    audit = AuditStore(tmp_path / "audit.sqlite3")
    policy = parse_policy(textwrap.dedent(f"""
        [sandbox]
        image = "{IMAGE}"
        memory = "256m"

        [tools.shell]
        decision = "ask"
    """))
    door = serve_grpc(str(short / "executor.sock"), policy=policy, audit=audit, tokens=TOKENS, announce=None)
    try:
        http = serve_http("127.0.0.1:0", tokens=TOKENS, executor=door.service, audit=audit)
        try:
            yield Stack(door, http, audit)
        finally:
            http.stop()
    finally:
        door.stop(grace=1)
        audit.close()
        shutil.rmtree(short, ignore_errors=True)


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context()
    context.set_default_timeout(PAGE_TIMEOUT_MS)
    try:
        yield context.new_page()
    finally:
        context.close()


class WaitingClient(threading.Thread):
    """An agent's client that got ``approval_pending`` and waits for a person: it watches its
    run's approval (GetRun) and, once resolved, sends the same call again."""

    def __init__(self, agent: ExecutorClient, sandbox_id: str, call_id: str, arguments: dict[str, Any],
                 approval_id: str) -> None:
        super().__init__(daemon=True)
        self.agent, self.sandbox_id, self.call_id = agent, sandbox_id, call_id
        self.arguments, self.approval_id = arguments, approval_id
        self.result: CallResult | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()

    def run(self) -> None:
        try:
            deadline = time.monotonic() + WAIT_S
            while self._state() == "pending":
                if time.monotonic() > deadline:
                    raise TimeoutError(f"approval {self.approval_id} was not resolved in {WAIT_S} s")
                time.sleep(0.05)
            self.result = self.agent.call(self.sandbox_id, "shell", self.arguments, call_id=self.call_id)
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()

    def _state(self) -> str:
        run = self.agent.get_run(self.sandbox_id)
        return next(a.state for a in run.approvals if a.approval_id == self.approval_id)

    def outcome(self) -> CallResult:
        assert self.done.wait(WAIT_S), "the waiting client never got its result"
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def _log_in(page: Any, url: str, token: str = OPERATOR_TOKEN) -> None:
    response = page.goto(f"{url}/")
    assert response is not None and response.status == 401  # the login form, as a 401
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Log in").click()
    page.get_by_role("heading", name="Pending approvals").wait_for()


def _container_gone(engine: Any, container: str) -> bool:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            engine.client.api.inspect_container(container)
        except docker.errors.NotFound:
            return True
        time.sleep(0.1)
    return False


def test_approve_deny_and_kill_in_chromium(engine, stack: Stack, page: Any) -> None:  # type: ignore[no-untyped-def]
    from playwright.sync_api import expect

    _log_in(page, stack.http.url)
    cookie = next(c for c in page.context.cookies() if c["name"] == "callbox_console")
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"

    with ExecutorClient(stack.grpc.target, AGENT_TOKEN) as agent:
        box = agent.create_sandbox()
        container = stack.audit.get_run(box).meta["container"]

        # 1. approve: the agent's call is pending; its client waits; the page lets it run, once
        command = {"command": "echo ran >> /workspace/count; echo approved-output-$((6*7))"}
        first = agent.call(box, "shell", command, call_id="call-approve")
        assert first.error_code == "approval_pending" and first.approval_id, first
        waiting = WaitingClient(agent, box, "call-approve", command, first.approval_id)
        waiting.start()
        page.reload()
        card = page.locator(f'[id="approval-{first.approval_id}"]')
        expect(card).to_contain_text("shell")
        expect(card).to_contain_text("approved-output-$((6*7))")  # the arguments
        expect(card).to_contain_text("tools.shell")  # the rule that asked
        expect(card).to_contain_text(box)  # the run, its door and client
        expect(card).to_contain_text("client agent")
        assert not waiting.done.is_set(), waiting.error  # the client is really waiting
        card.get_by_role("button", name="Approve").click()
        expect(page.get_by_role("status")).to_contain_text(f"approval {first.approval_id} approved")
        approved = waiting.outcome()
        assert not approved.is_error, approved.text
        assert "approved-output-42" in approved.text
        again = agent.call(box, "shell", command, call_id="call-approve")  # a retry returns the record
        assert again.text == approved.text
        counted = agent.call(box, "read_file", {"path": "/workspace/count"})
        assert counted.text.count("ran") == 1, counted.text  # the command ran exactly once
        assert stack.audit.get_approval(first.approval_id).resolved_by == "console:operator"

        # 2. deny with a reason: the model's result item carries it
        wipe = {"command": "rm -rf /workspace/count"}
        second = agent.call(box, "shell", wipe, call_id="call-deny")
        assert second.error_code == "approval_pending" and second.approval_id
        page.reload()
        card = page.locator(f'[id="approval-{second.approval_id}"]')
        expect(card).to_contain_text("rm -rf /workspace/count")
        expect(card).to_contain_text("call-approve")  # the run's earlier calls
        card.get_by_label("Reason").fill("the count file is evidence; keep it")
        card.get_by_role("button", name="Deny").click()
        expect(page.get_by_role("status")).to_contain_text(f"approval {second.approval_id} denied")
        denied = agent.call(box, "shell", wipe, call_id="call-deny")
        assert denied.is_error and denied.error_code == "approval_denied", denied
        assert "the count file is evidence; keep it" in str(denied.item), denied.item
        assert agent.call(box, "read_file", {"path": "/workspace/count"}).text.count("ran") == 1

        # 3. the run's calls in order, one row each, opening to its whole call; a link to its sandbox
        page.goto(f"{stack.http.url}/runs/{box}")
        rows = page.locator("details.call")
        expect(rows).to_have_count(4)
        expect(rows.nth(0).locator("summary")).to_contain_text("call-approve")
        result = rows.nth(0).locator("pre.result")
        expect(result).to_be_hidden()  # closed: one row
        rows.nth(0).locator("summary").click()
        expect(result).to_be_visible()
        expect(result).to_contain_text("approved-output-42")
        expect(rows.nth(2).locator("summary")).to_contain_text("call-deny")
        expect(rows.nth(2)).to_contain_text("the count file is evidence; keep it")
        page.get_by_role("link", name="live on the Sandboxes page").click()
        expect(page.locator(f'[id="sandbox-{box}"]')).to_be_visible()

        # 4. a form served by another site cannot act on the console
        third = agent.call(box, "shell", {"command": "true"}, call_id="call-cross-site")
        assert third.approval_id
        attacker = page.context.new_page()
        attacker.route("http://attacker.test/", lambda route: route.fulfill(content_type="text/html", body=(
            f'<form method="post" action="{stack.http.url}/approvals/{third.approval_id}/resolve">'
            '<input name="decision" value="approve"><button>win a prize</button></form>')))
        attacker.goto("http://attacker.test/")
        with attacker.expect_response(lambda r: "/resolve" in r.url) as posted:
            attacker.get_by_role("button", name="win a prize").click()
        assert posted.value.status == 403
        attacker.close()
        assert stack.audit.get_approval(third.approval_id).state == "pending"

        # 5. kill the live sandbox from the page: the executor deletes it, the container goes
        page.goto(f"{stack.http.url}/sandboxes")
        row = page.locator(f'[id="sandbox-{box}"]')
        expect(row).to_contain_text("agent")
        expect(row).to_contain_text("MiB of 256.0 MiB")
        row.get_by_role("link", name=f"Kill {box}").click()  # first a page that says what a kill does
        expect(page.get_by_role("heading", name="Kill a sandbox?")).to_be_visible()
        expect(page.locator("section.confirm")).to_contain_text("cannot be undone")
        assert box in stack.grpc.service.live_sandboxes()  # nothing killed yet
        page.get_by_role("button", name=f"Kill {box}").click()
        expect(page.get_by_role("status")).to_contain_text(f"sandbox {box} of client agent killed")
        expect(page.locator(f'[id="sandbox-{box}"]')).to_have_count(0)
        assert _container_gone(engine, container), f"container {container} is still there"
        with pytest.raises(ExecutorError) as gone:
            agent.call(box, "read_file", {"path": "/workspace/count"})
        assert gone.value.code == grpc.StatusCode.NOT_FOUND


@pytest.fixture
def seeded_console(tmp_path: Path) -> Iterator[tuple[HttpServer, AuditStore]]:
    """The console on an audit store holding two clients' runs, approvals and egress (no sandbox)."""
    audit = AuditStore(tmp_path / "audit.sqlite3")
    seed(audit)
    try:
        http = serve_http("127.0.0.1:0", tokens=TOKENS, executor=None, audit=audit, engine_ping=lambda: None)
        try:
            yield http, audit
        finally:
            http.stop()
    finally:
        audit.close()


@pytest.mark.parametrize("token", [OPERATOR_TOKEN, AGENT_TOKEN], ids=["operator", "client"])
def test_overview_history_and_filters_in_chromium(seeded_console: tuple[HttpServer, AuditStore], page: Any,
                                                  token: str) -> None:
    from playwright.sync_api import expect

    http, _audit = seeded_console
    operator = token == OPERATOR_TOKEN
    _log_in(page, http.url, token)
    nav = page.get_by_role("navigation").first
    expect(nav.locator(".badge")).to_have_text("1 waiting")  # the agent's approval waits, on every page

    # the overview: four charts drawn as SVG in the page (no script, no image request), reloading itself
    nav.get_by_role("link", name="Overview").click()
    expect(page.locator('meta[http-equiv="refresh"]')).to_have_attribute("content", "15")
    charts = page.locator("figure.chart svg[role=img]")
    expect(charts).to_have_count(4)
    for i in range(4):
        box = charts.nth(i).bounding_box()
        assert box is not None and box["width"] > 200 and box["height"] > 50, box  # laid out, not collapsed
    calls = page.locator("#chart-calls")
    expect(calls).to_contain_text("9 calls in the last hour" if operator else "8 calls in the last hour")
    assert calls.locator("svg[role=img] rect.series-bad").count() == 1  # the refused call's bar

    # the history: who, what, when, why; filtered by decision
    nav.get_by_role("link", name="History").click()
    table = page.locator("table")
    expect(table).to_contain_text("not on a Friday")
    expect(table).to_contain_text("cli:ops")
    expect(page.locator("tbody tr")).to_have_count(3 if operator else 2)  # other's approval only for an operator
    page.get_by_label("Decision").select_option("denied")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("tbody tr")).to_have_count(1)
    assert "state=denied" in page.url

    # runs filtered by tool; a client sees no client filter and only its own runs
    nav.get_by_role("link", name="Runs").click()
    expect(page.get_by_label("Client")).to_have_count(1 if operator else 0)
    expect(page.locator("tbody tr")).to_have_count(4 if operator else 3)
    page.get_by_label("Tool").fill("write_file")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("tbody tr")).to_have_count(1 if operator else 0)
    if not operator:
        expect(page.get_by_text("No run matches these filters.")).to_be_visible()


def test_held_egress_is_answered_in_chromium_by_an_operator_only(seeded_console: tuple[HttpServer, AuditStore],
                                                                 page: Any) -> None:
    from playwright.sync_api import expect

    from harness.audit.records import EGRESS_CALL_PREFIX, EGRESS_TOOL

    http, audit = seeded_console
    run_id = audit.list_runs(client="agent")[0].id
    held = audit.create_approval(run_id, f"{EGRESS_CALL_PREFIX}h1", EGRESS_TOOL,
                                 {"sandbox_id": run_id, "destination": "pypi.org:443", "method": "CONNECT",
                                  "call_id": "c9", "tool": "shell"},
                                 "sandbox.allow_hosts: ask", "an ask entry of allow_hosts names it")
    section = page.locator(f"#approval-{held.id}")
    _log_in(page, http.url, AGENT_TOKEN)  # the sandbox's own client sees it waiting, and no answer
    expect(section).to_contain_text("pypi.org:443")
    expect(section.get_by_role("button")).to_have_count(0)
    page.get_by_role("button", name="Log out").click()
    _log_in(page, http.url)
    expect(section.get_by_role("button", name="Allow once")).to_be_visible()
    expect(section.get_by_role("button", name="Deny")).to_be_visible()
    section.get_by_role("button", name="Allow for this sandbox").click()
    expect(page.locator(".note.ok")).to_contain_text(held.id)
    answered = audit.get_approval(held.id)
    assert (answered.state, answered.scope, answered.resolved_by) == ("approved", "sandbox", "console:operator")
