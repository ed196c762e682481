"""The HTTP endpoint (``[http] listen``): /metrics, /healthz and the console's token, cookie and
cross-site rules, over real HTTP against a real Docker engine, a real gRPC door and a real
audit store (the browser side is tests/interop/test_console_chromium.py)."""

from __future__ import annotations

import json
import re
import shutil
import ssl
import tempfile
import textwrap
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import docker.errors
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.audit.store import AuditError, AuditStore
from harness.client import ExecutorClient
from harness.core.policy import parse_policy
from harness.doors.grpc.server import GrpcServer, ServeError, serve_grpc
from harness.doors.grpc.tokens import TokenSet
from harness.doors.http import HttpServer, serve_http
from tests.conftest import IMAGE
from tests.console_data import run as seed_run
from tests.console_data import seed

pytestmark = pytest.mark.docker

TOKEN = "console-operator-token-0123456789"
AGENT_TOKEN = "console-agent-token-0123456789ab"
OTHER_TOKEN = "console-other-client-token-0123456"
TOKENS = TokenSet({"operator": TOKEN, "agent": AGENT_TOKEN, "other": OTHER_TOKEN}, source="test tokens",
                  operators=["operator"])
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@pytest.fixture
def audit(tmp_path: Path) -> Iterator[AuditStore]:
    store = AuditStore(tmp_path / "audit.sqlite3")
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def http(engine, audit: AuditStore) -> Iterator[HttpServer]:  # type: ignore[no-untyped-def]
    """The endpoint alone (no executor): the console reads the audit store only."""
    server = serve_http("127.0.0.1:0", tokens=TOKENS, executor=None, audit=audit)
    try:
        yield server
    finally:
        server.stop()


def _pending(audit: AuditStore, arguments: object = None) -> str:
    """A call waiting for approval, as a door records it; its approval id."""
    run_id = audit.start_run(f"grpc-test-{uuid.uuid4().hex[:8]}", meta={"door": "grpc", "client": "agent"})
    approval = audit.create_approval(run_id, "call-1", "shell", arguments or {"command": "make deploy"},
                                     "tools.shell.rules[0] (command *deploy*)", "deploys ask a person")
    return approval.id


def _logged_in(server: HttpServer, token: str = TOKEN) -> tuple[httpx.Client, str]:
    """A browser-like client logged in through the form, and the CSRF token of its pages."""
    client = httpx.Client(base_url=server.url)
    response = client.post("/login", data={"token": token, "next": "/"}, headers={"origin": server.url})
    assert response.status_code == 303, response.text
    page = client.get("/")
    assert page.status_code == 200
    match = CSRF.search(page.text)
    assert match is not None, page.text
    return client, match[1]


# ---- /metrics and /healthz ------------------------------------------------------------------------------


def test_metrics_is_prometheus_text_without_a_token(http):
    response = httpx.get(f"{http.url}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    families = list(text_string_to_metric_families(response.text))
    assert families, response.text
    assert all(f.name.startswith("callbox_") for f in families), [f.name for f in families]


def test_healthz_is_200_while_the_engine_answers(http):
    response = httpx.get(f"{http.url}/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "engine": "reachable"}


def test_healthz_is_503_naming_the_engine_when_it_does_not_answer(monkeypatch, audit):
    nowhere = f"unix:///nonexistent/{uuid.uuid4().hex[:8]}.sock"
    monkeypatch.setenv("DOCKER_HOST", nowhere)  # the default ping reads it, as dockerd's clients do
    server = serve_http("127.0.0.1:0", tokens=TOKENS, executor=None, audit=audit)
    try:
        response = httpx.get(f"{server.url}/healthz")
    finally:
        server.stop()
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert nowhere in body["engine"], body


# ---- tokens and the login ---------------------------------------------------------------------------------


def test_a_page_without_a_token_is_401_with_the_login_form(http):
    for path in ("/", "/overview", "/history", "/sandboxes", "/sandboxes/x/kill", "/runs", "/egress", "/runs/anything"):
        response = httpx.get(f"{http.url}{path}")
        assert response.status_code == 401, path
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert '<form method="post" action="/login">' in response.text
        assert f'name="next" value="{path}"' in response.text
    wrong = httpx.get(f"{http.url}/", headers={"authorization": "Bearer not-a-token-of-this-server"})
    assert wrong.status_code == 401


def test_a_post_without_a_token_is_401_and_changes_nothing(http, audit):
    approval = _pending(audit)
    response = httpx.post(f"{http.url}/approvals/{approval}/resolve", data={"decision": "approve"})
    assert response.status_code == 401
    assert "Authorization: Bearer TOKEN" in response.text
    wrong = httpx.post(f"{http.url}/approvals/{approval}/resolve", data={"decision": "approve"},
                       headers={"authorization": f"Bearer {TOKEN}x"})
    assert wrong.status_code == 401
    assert audit.get_approval(approval).state == "pending"


def test_the_login_form_sets_an_httponly_samesite_strict_cookie(http):
    with httpx.Client(base_url=http.url) as client:
        refused = client.post("/login", data={"token": "not-a-token-of-this-server"})
        assert refused.status_code == 401
        assert "not one of this server" in refused.text
        assert "set-cookie" not in refused.headers
        response = client.post("/login", data={"token": TOKEN, "next": "/runs"})
        assert response.status_code == 303
        assert response.headers["location"] == "/runs"
        cookie = response.headers["set-cookie"]
        attributes = [part.strip().lower() for part in cookie.split(";")]
        assert attributes[0].startswith("callbox_console=")
        assert TOKEN not in cookie  # the cookie names a session, never the token
        assert "httponly" in attributes
        assert "samesite=strict" in attributes
        assert "path=/" in attributes
        page = client.get("/runs")
        assert page.status_code == 200
        assert "operator: operator" in page.text


def test_login_goes_on_only_to_a_path_of_the_console(http):
    response = httpx.post(f"{http.url}/login", data={"token": TOKEN, "next": "//evil.example/x"})
    assert response.status_code == 303
    assert response.headers["location"] == "/"


def test_a_cross_site_post_is_403_even_with_a_valid_cookie_and_csrf_token(http, audit):
    approval = _pending(audit)
    client, csrf = _logged_in(http)
    try:
        form = {"decision": "approve", "csrf": csrf}
        other_site = client.post(f"/approvals/{approval}/resolve", data=form,
                                 headers={"origin": "https://evil.example"})
        assert other_site.status_code == 403
        assert "another origin" in other_site.text
        fetch_meta = client.post(f"/approvals/{approval}/resolve", data=form,
                                 headers={"sec-fetch-site": "cross-site"})
        assert fetch_meta.status_code == 403
        null_origin = client.post(f"/approvals/{approval}/resolve", data=form, headers={"origin": "null"})
        assert null_origin.status_code == 403
        assert audit.get_approval(approval).state == "pending"
        no_csrf = client.post(f"/approvals/{approval}/resolve", data={"decision": "approve"},
                              headers={"origin": http.url})
        assert no_csrf.status_code == 403
        assert "CSRF" in no_csrf.text
        wrong_csrf = client.post(f"/approvals/{approval}/resolve", data={**form, "csrf": csrf[:-1] + "x"},
                                 headers={"origin": http.url})
        assert wrong_csrf.status_code == 403
        assert audit.get_approval(approval).state == "pending"
        # the same form from the console's own page goes through
        same_site = client.post(f"/approvals/{approval}/resolve", data=form,
                                headers={"origin": http.url, "sec-fetch-site": "same-origin"})
        assert same_site.status_code == 303
    finally:
        client.close()
    resolved = audit.get_approval(approval)
    assert (resolved.state, resolved.resolved_by) == ("approved", "console:operator")


def test_login_itself_is_refused_cross_site(http):
    response = httpx.post(f"{http.url}/login", data={"token": TOKEN}, headers={"origin": "https://evil.example"})
    assert response.status_code == 403
    assert "set-cookie" not in response.headers


def test_a_client_token_resolves_no_approval_by_any_route_and_sees_only_its_own_work(http, audit):
    approval = _pending(audit)  # a call of client "agent"
    for token in (AGENT_TOKEN, OTHER_TOKEN):  # its own client, and another one
        bearer = httpx.post(f"{http.url}/approvals/{approval}/resolve", data={"decision": "approve"},
                            headers={"authorization": f"Bearer {token}"})
        assert bearer.status_code == 403, bearer.text
        assert "operator" in bearer.text and "client token" in bearer.text
        browser, csrf = _logged_in(http, token)
        try:
            form = browser.post(f"/approvals/{approval}/resolve", data={"decision": "approve", "csrf": csrf},
                                headers={"origin": http.url})
            assert form.status_code == 303  # back to the page, with the refusal as its note
            page = browser.get("/")
            assert "client token" in page.text and "client (read-only)" in page.text
            assert 'action="/approvals/' not in page.text  # no resolve form for a client
            assert (approval in page.text) == (token == AGENT_TOKEN)  # its own approval only
            runs = browser.get("/runs").text
            assert ("grpc-test-" in runs) == (token == AGENT_TOKEN)
        finally:
            browser.close()
    assert audit.get_approval(approval).state == "pending"


def test_an_operator_bearer_token_denies_with_a_reason_without_a_csrf_token(http, audit):
    approval = _pending(audit)
    response = httpx.post(f"{http.url}/approvals/{approval}/resolve", data={"decision": "deny", "reason": "not today"},
                          headers={"authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.text
    assert f"approval {approval} denied" in response.text
    resolved = audit.get_approval(approval)
    assert (resolved.state, resolved.resolved_by, resolved.resolution_reason) == ("denied", "console:operator",
                                                                                  "not today")
    again = httpx.post(f"{http.url}/approvals/{approval}/resolve", data={"decision": "approve"},
                       headers={"authorization": f"Bearer {TOKEN}"})
    assert again.status_code == 409
    assert "already denied" in again.text


def test_held_egress_gets_three_answers_from_an_operator_and_none_from_a_client(http, audit):
    run_id = audit.start_run(f"grpc-test-{uuid.uuid4().hex[:8]}", meta={"door": "grpc", "client": "agent"})
    approval = audit.create_approval(run_id, "egress-h0123456789abcdef", "egress",
                                     {"sandbox_id": "sb1", "destination": "api.example.com:443", "call_id": "call-1"},
                                     "sandbox.allow_hosts: ask", "call call-1 connects to api.example.com:443").id
    page = httpx.get(f"{http.url}/", headers={"authorization": f"Bearer {TOKEN}"})
    assert 'value="approve-sandbox">Allow for this sandbox</button>' in page.text and ">Allow once<" in page.text
    form = {"decision": "approve-sandbox"}
    refused = httpx.post(f"{http.url}/approvals/{approval}/resolve", data=form,
                         headers={"authorization": f"Bearer {AGENT_TOKEN}"})
    assert refused.status_code == 403, refused.text
    allowed = httpx.post(f"{http.url}/approvals/{approval}/resolve", data=form,
                         headers={"authorization": f"Bearer {TOKEN}"})
    assert allowed.status_code == 200, allowed.text
    assert "later ones to the same destination go through" in allowed.text
    resolved = audit.get_approval(approval)
    assert (resolved.state, resolved.scope, resolved.resolved_by) == ("approved", "sandbox", "console:operator")


def test_a_loopback_console_answers_only_to_a_loopback_host_name(http):
    response = httpx.get(f"{http.url}/metrics", headers={"host": "evil.example"})
    assert response.status_code == 421


def test_pages_escape_what_the_audit_store_holds(http, audit):
    _pending(audit, {"command": "echo '<script>alert(1)</script>'"})
    response = httpx.get(f"{http.url}/", headers={"authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200
    assert "<script>" not in response.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in response.text
    assert response.headers["content-security-policy"].startswith("default-src 'none'")
    assert response.headers["x-frame-options"] == "DENY"
    assert "tools.shell.rules[0] (command *deploy*)" in response.text
    css = httpx.get(f"{http.url}/static/console.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")


def test_a_non_loopback_address_needs_tls_or_insecure(audit):
    with pytest.raises(ServeError, match="without TLS"):
        serve_http("0.0.0.0:0", tokens=TOKENS, executor=None, audit=audit)
    server = serve_http("0.0.0.0:0", tokens=TOKENS, executor=None, audit=audit, insecure=True,
                        engine_ping=lambda: None)
    try:
        assert httpx.get(f"{server.url}/healthz").status_code == 200
    finally:
        server.stop()


# ---- overview, history, filters and paging (the audit store only) -------------------------------------

SVG = re.compile(r"<svg xmlns=.*?</svg>", re.S)


def _get(server: HttpServer, path: str, token: str = TOKEN) -> httpx.Response:
    response = httpx.get(f"{server.url}{path}", headers={"authorization": f"Bearer {token}"})
    assert response.status_code == 200, (path, response.status_code, response.text)
    return response


def _charts(page: str) -> dict[str, ET.Element]:
    """The page's charts by their figure's id, each SVG parsed as XML (a malformed one fails here)."""
    found = {}
    for figure in re.finditer(r'<figure class="chart" id="([^"]+)">(.*?)</figure>', page, re.S):
        svg = SVG.search(figure[2])
        assert svg is not None, figure[0]
        found[figure[1]] = ET.fromstring(svg[0])
    return found


def test_the_overview_draws_well_formed_charts_of_the_callers_own_work_and_reloads(http, audit):
    seed(audit)
    operator = _get(http, "/overview").text
    assert '<meta http-equiv="refresh" content="15">' in operator
    charts = _charts(operator)
    assert set(charts) == {"chart-calls", "chart-latency", "chart-sandboxes", "chart-egress"}
    svg = "{http://www.w3.org/2000/svg}"
    for chart in charts.values():
        assert chart.get("role") == "img" and chart.get("aria-label")
    bars = charts["chart-calls"].findall(f"{svg}rect")
    assert {bar.get("class") for bar in bars} >= {"series-ok", "series-bad", "series-warn"}  # ran, refused, failed
    assert charts["chart-latency"].findall(f"{svg}circle"), "the latency chart has no point"
    assert "9 calls in the last hour, 1 refused" in operator  # 3 runs x 2 calls + refused + failed, and other's one
    assert "3 connections through the egress proxies in the last hour, 1 refused" in operator
    assert re.search(r"<b>1</b> approvals waiting", operator)
    client = _get(http, "/overview", AGENT_TOKEN).text
    assert len(_charts(client)) == 4
    assert "8 calls in the last hour, 1 refused" in client  # not other's call
    assert "2 connections through the egress proxies" in client
    assert "your live sandboxes" in client and "pooled (warm)" not in client
    other = _get(http, "/overview", OTHER_TOKEN).text
    assert "1 call in the last hour, 0 refused" in other and re.search(r"<b>0</b> approvals waiting", other)
    # the navigation counts the approvals waiting on every page; only the overview reloads itself
    for path in ("/", "/history", "/runs", "/egress", "/sandboxes"):
        page = _get(http, path).text
        assert re.search(r'Approvals <span class="badge"[^>]*>1<', page), path
        assert 'http-equiv="refresh"' not in page, path
    assert 'class="badge"' not in _get(http, "/runs", OTHER_TOKEN).text  # another client's approval is not its


def test_history_says_who_resolved_what_when_and_why_filtered_and_only_the_clients_own(http, audit):
    seeded = seed(audit)
    page = _get(http, "/history").text
    assert "resolved approvals 1 to 3 of 3" in page
    denied = re.search(rf'<tr id="history-{seeded.denied}">(.*?)</tr>', page, re.S)
    assert denied is not None
    for shown in ("cli:ops", "denied", "make wipe", "not on a Friday", "tools.shell.rules[0]", "agent", " UTC"):
        assert shown in denied[1], shown
    assert seeded.pending not in page  # pending is not history
    only_denied = _get(http, "/history?state=denied").text
    assert seeded.denied in only_denied and seeded.approved not in only_denied
    by_console = _get(http, "/history?by=console%3Aoperator").text
    assert "1 to 2 of 2" in by_console and seeded.denied not in by_console
    assert "fine for other" in _get(http, "/history?client=other").text
    assert "fine for other" not in _get(http, "/history?client=agent").text
    own = _get(http, "/history?client=other", AGENT_TOKEN).text  # a client's filter cannot reach another's
    assert "fine for other" not in own and seeded.denied in own and "1 to 2 of 2" in own
    assert 'name="client"' not in own  # no client filter for a client


def test_runs_are_filtered_by_client_tool_and_state_and_paged_past_100(http, audit):
    seeded = seed(audit)
    for _ in range(100):
        seed_run(audit, "bulk")
    first = _get(http, "/runs").text
    assert "runs 1 to 100 of 104" in first
    assert first.count('<a href="/runs/') == 100
    older = re.search(r'<a rel="next" href="([^"]+)">', first)
    assert older is not None and older[1] == "/runs?page=2"
    second = _get(http, older[1]).text
    assert "runs 101 to 104 of 104" in second and 'rel="prev"' in second and 'rel="next"' not in second
    assert seeded.runs["agent"][0] in second  # the oldest runs come last
    by_tool = _get(http, "/runs?tool=read_file").text
    assert "of 3" in by_tool and "bulk" not in by_tool and seeded.runs["other"][0] not in by_tool
    waiting = _get(http, "/runs?state=waiting").text
    assert "of 1," in waiting and seeded.runs["agent"][-1] in waiting
    assert "of 100," in _get(http, "/runs?client=bulk&state=open").text
    assert "No run matches" in _get(http, "/runs?state=ended").text
    assert 'rel="next"' not in _get(http, "/runs?client=bulk&page=1").text  # 100 fit on one page
    assert '<a rel="next" href="/runs?state=open&amp;page=2">' in _get(http, "/runs?state=open").text  # kept
    own = _get(http, "/runs?client=bulk", OTHER_TOKEN).text
    assert "of 1," in own and seeded.runs["other"][0] in own and "bulk" not in own
    for wrong in ("/runs?state=finished", "/runs?page=two", "/history?state=consumed"):  # said, not ignored
        refused = httpx.get(f"{http.url}{wrong}", headers={"authorization": f"Bearer {TOKEN}"})
        assert refused.status_code == 400 and ("use one of" in refused.text or "a number" in refused.text), wrong


def test_egress_is_filtered_by_host_decision_and_client(http, audit):
    seed(audit)
    assert "1 to 3 of 3" in _get(http, "/egress").text
    evil = _get(http, "/egress?host=EVIL").text
    assert "evil.example" in evil and "pypi.org" not in evil
    allowed = _get(http, "/egress?state=allow").text
    assert "pypi.org" in allowed and "other-only.example" in allowed and "evil.example" not in allowed
    own = _get(http, "/egress?client=agent", OTHER_TOKEN).text
    assert "other-only.example" in own and "pypi.org" not in own


def test_a_kill_needs_an_operator_and_a_confirmation(http):
    for token in (AGENT_TOKEN, OTHER_TOKEN):
        page = httpx.get(f"{http.url}/sandboxes/some-box/kill", headers={"authorization": f"Bearer {token}"})
        assert page.status_code == 403 and "operator" in page.text
    missing = httpx.get(f"{http.url}/sandboxes/some-box/kill", headers={"authorization": f"Bearer {TOKEN}"})
    assert missing.status_code == 404
    unconfirmed = httpx.post(f"{http.url}/sandboxes/some-box/kill", headers={"authorization": f"Bearer {TOKEN}"})
    assert unconfirmed.status_code == 400 and "confirm=some-box" in unconfirmed.text


def test_a_run_page_is_a_table_of_calls_each_opening_to_the_whole_call(http, audit):
    seeded = seed(audit)
    page = _get(http, f"/runs/{seeded.runs['agent'][0]}").text
    assert page.count('<details class="call"') == 4
    denied = re.search(r'<details class="call" id="call-c3">(.*?)</details>', page, re.S)
    assert denied is not None
    summary = denied[1].split("</summary>")[0]
    for shown in ("c3", "shell", "deny", "done", "0 ms", "rm -rf /"):
        assert shown in summary, shown
    assert "<h3>Result</h3>" in denied[1] and "tools.shell" in denied[1]
    assert "Sandbox</dt><dd>not live" in page


# ---- live sandboxes, with a gRPC door -------------------------------------------------------------------


@pytest.fixture
def grpc_door(engine, audit: AuditStore) -> Iterator[GrpcServer]:  # type: ignore[no-untyped-def]
    short = Path(tempfile.mkdtemp(prefix="cbx-http-", dir="/tmp"))  # sun_path is 108 bytes
    policy = parse_policy(textwrap.dedent(f"""
        [sandbox]
        image = "{IMAGE}"
        memory = "256m"
    """))
    server = serve_grpc(str(short / "x.sock"), policy=policy, audit=audit, tokens=TOKENS, announce=None)
    try:
        yield server
    finally:
        server.stop(grace=1)
        shutil.rmtree(short, ignore_errors=True)


def _container_gone(engine, container: str, within: float = 30.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            engine.client.api.inspect_container(container)
        except docker.errors.NotFound:
            return True
        time.sleep(0.1)
    return False


def test_sandboxes_page_shows_owner_and_resources_and_kill_destroys_the_container(engine, grpc_door, audit):
    server = serve_http("127.0.0.1:0", tokens=TOKENS, executor=grpc_door.service, audit=audit)
    try:
        with ExecutorClient(grpc_door.target, AGENT_TOKEN) as agent:
            sandbox_id = agent.create_sandbox()
            assert agent.call(sandbox_id, "shell", {"command": "echo hi"}).text.count("hi") >= 1
            container = audit.get_run(sandbox_id).meta["container"]
            bearer = {"authorization": f"Bearer {TOKEN}"}
            page = httpx.get(f"{server.url}/sandboxes", headers=bearer)
            assert page.status_code == 200
            row = re.search(rf'<tr id="sandbox-{re.escape(sandbox_id)}">(.*?)</tr>', page.text, re.S)
            assert row is not None, page.text
            cells = row[1]
            assert "<td>agent</td>" in cells and "<td>running</td>" in cells
            assert re.search(r"\d+\.\d MiB of 256\.0 MiB", cells), cells
            assert re.search(r"\d+\.\d% of 1, \d+\.\d\d s in all", cells), cells
            assert re.search(r"<td>\d+ of 256</td>", cells), cells  # processes, of the pids limit
            own = httpx.get(f"{server.url}/sandboxes", headers={"authorization": f"Bearer {AGENT_TOKEN}"})
            assert sandbox_id in own.text and "/kill" not in own.text  # its own, read-only
            assert "Warm pool" not in own.text and "Quota use per client" in own.text  # the server's pool: not its
            assert sandbox_id not in httpx.get(f"{server.url}/sandboxes",
                                               headers={"authorization": f"Bearer {OTHER_TOKEN}"}).text
            assert "Quota use per client" in page.text and "Warm pool: none" in page.text
            refused = httpx.post(f"{server.url}/sandboxes/{sandbox_id}/kill", data={"confirm": sandbox_id},
                                 headers={"authorization": f"Bearer {AGENT_TOKEN}"})
            assert refused.status_code == 403 and sandbox_id in grpc_door.service.live_sandboxes()
            assert httpx.get(f"{server.url}/sandboxes/{sandbox_id}/kill",
                             headers={"authorization": f"Bearer {AGENT_TOKEN}"}).status_code == 403
            confirm = httpx.get(f"{server.url}/sandboxes/{sandbox_id}/kill", headers=bearer)
            assert confirm.status_code == 200 and "cannot be undone" in confirm.text
            assert f'name="confirm" value="{sandbox_id}"' in confirm.text
            unconfirmed = httpx.post(f"{server.url}/sandboxes/{sandbox_id}/kill", headers=bearer)
            assert unconfirmed.status_code == 400 and "confirm=" in unconfirmed.text
            assert sandbox_id in grpc_door.service.live_sandboxes()
            killed = httpx.post(f"{server.url}/sandboxes/{sandbox_id}/kill", data={"confirm": sandbox_id},
                                headers=bearer)
            assert killed.status_code == 200, killed.text
            assert f"sandbox {sandbox_id} of client agent killed" in killed.text
            assert sandbox_id not in grpc_door.service.live_sandboxes()
            assert _container_gone(engine, container), f"container {container} is still there"
            run = audit.get_run(sandbox_id)
            assert run.end_reason == "killed_by_console"
            assert run.meta["killed_by"] == "console:operator"
            again = httpx.post(f"{server.url}/sandboxes/{sandbox_id}/kill", data={"confirm": sandbox_id},
                               headers=bearer)
            assert again.status_code == 404
            runs = httpx.get(f"{server.url}/runs/{sandbox_id}", headers=bearer)
            assert runs.status_code == 200
            assert "killed_by_console" in runs.text and "echo hi" in runs.text
    finally:
        server.stop()


def test_a_run_page_that_does_not_exist_is_404(http):
    response = httpx.get(f"{http.url}/runs/no-such-run", headers={"authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 404
    assert "no run with id no-such-run" in response.text


def test_json_health_body_is_one_line(http):
    assert json.loads(httpx.get(f"{http.url}/healthz").text.strip())["status"] == "ok"


def test_tls_serves_https_and_the_cookie_is_secure(audit, tmp_path):
    from tests.integration.test_grpc_executor import _self_signed

    cert, key = _self_signed(tmp_path)
    with pytest.raises(ServeError, match="both"):
        serve_http("127.0.0.1:0", tokens=TOKENS, executor=None, audit=audit, tls_cert=cert)
    # TLS is what a non-loopback address needs (no --insecure)
    server = serve_http("0.0.0.0:0", tokens=TOKENS, executor=None, audit=audit, tls_cert=cert, tls_key=key,
                        engine_ping=lambda: None)
    try:
        assert server.url.startswith("https://127.0.0.1:")
        with httpx.Client(base_url=server.url, verify=ssl.create_default_context(cafile=str(cert))) as client:
            assert client.get("/healthz").status_code == 200
            login = client.post("/login", data={"token": TOKEN})
            assert login.status_code == 303
            attributes = [part.strip().lower() for part in login.headers["set-cookie"].split(";")]
            assert {"secure", "httponly", "samesite=strict"} <= set(attributes)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{server.url}/healthz")  # an unverified certificate is refused, so it really is TLS
    finally:
        server.stop()


def test_a_port_in_use_is_a_serve_error_and_an_owned_audit_store_is_closed(http, tmp_path):
    owned = AuditStore(tmp_path / "owned.sqlite3")
    with pytest.raises(ServeError, match="cannot listen"):
        serve_http(f"127.0.0.1:{http.port}", tokens=TOKENS, executor=None, audit=owned, close_audit=True)
    with pytest.raises(AuditError, match="closed"):
        owned.list_runs()
