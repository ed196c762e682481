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
    for path in ("/", "/sandboxes", "/runs", "/egress", "/runs/anything"):
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
            own = httpx.get(f"{server.url}/sandboxes", headers={"authorization": f"Bearer {AGENT_TOKEN}"})
            assert sandbox_id in own.text and "/kill" not in own.text  # its own, read-only
            assert sandbox_id not in httpx.get(f"{server.url}/sandboxes",
                                               headers={"authorization": f"Bearer {OTHER_TOKEN}"}).text
            refused = httpx.post(f"{server.url}/sandboxes/{sandbox_id}/kill",
                                 headers={"authorization": f"Bearer {AGENT_TOKEN}"})
            assert refused.status_code == 403 and sandbox_id in grpc_door.service.live_sandboxes()
            killed = httpx.post(f"{server.url}/sandboxes/{sandbox_id}/kill", headers=bearer)
            assert killed.status_code == 200, killed.text
            assert f"sandbox {sandbox_id} of client agent killed" in killed.text
            assert sandbox_id not in grpc_door.service.live_sandboxes()
            assert _container_gone(engine, container), f"container {container} is still there"
            run = audit.get_run(sandbox_id)
            assert run.end_reason == "killed_by_console"
            assert run.meta["killed_by"] == "console:operator"
            again = httpx.post(f"{server.url}/sandboxes/{sandbox_id}/kill", headers=bearer)
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
