"""The console's logic without a server: login sessions, the cross-site rules, where a login
goes on to, HTML escaping and cutting, and resolving approvals from the console."""

from __future__ import annotations

from pathlib import Path
from string import Template

import pytest
from starlette.requests import Request

from harness.audit.store import AuditStore
from harness.doors.grpc.tokens import TokenSet
from harness.doors.http.app import _loopback_host, _safe_next
from harness.doors.http.auth import Caller, Sessions, caller_of, cross_site_refusal, csrf_valid
from harness.doors.http.console import Console, ConsoleError
from harness.doors.http.pages import Html, clip, esc, fill, pretty_arguments

TOKEN = "unit-operator-token-0123456789"
TOKENS = TokenSet({"operator": TOKEN}, source="unit tokens")


def _request(headers: dict[str, str], method: str = "POST") -> Request:
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    return Request({"type": "http", "method": method, "path": "/", "headers": raw, "query_string": b""})


# ---- sessions ------------------------------------------------------------------------------------------


def test_a_login_session_names_its_client_and_never_holds_another_token():
    sessions = Sessions(TOKENS)
    assert sessions.login("not-a-token-of-this-server") is None
    session = sessions.login(f"  {TOKEN}\n")
    assert session is not None and session.client == "operator"
    assert session.id != TOKEN and session.csrf != session.id
    assert sessions.get(session.id) is session
    assert sessions.get("made-up") is None and sessions.get(None) is None
    sessions.logout(session.id)
    assert sessions.get(session.id) is None


def test_a_session_ends_when_it_expires_or_its_token_is_no_longer_the_servers():
    expired = Sessions(TOKENS, ttl_s=-1.0)  # already over when it begins
    session = expired.login(TOKEN)
    assert session is not None
    assert expired.get(session.id) is None
    assert len(expired) == 0
    sessions = Sessions(TOKENS)
    session = sessions.login(TOKEN)
    assert session is not None
    sessions.tokens = TokenSet({"operator": "a-rotated-token-0123456789"}, source="rotated")
    assert sessions.get(session.id) is None


def test_the_oldest_sessions_end_beyond_the_limit():
    sessions = Sessions(TOKENS, max_sessions=2)
    first, second, third = (sessions.login(TOKEN) for _ in range(3))
    assert first is not None and second is not None and third is not None
    assert sessions.get(first.id) is None
    assert sessions.get(second.id) is second and sessions.get(third.id) is third


def test_a_bearer_header_wins_over_the_cookie_and_a_bad_one_is_no_one():
    sessions = Sessions(TOKENS)
    session = sessions.login(TOKEN)
    assert session is not None
    cookie = f"callbox_console={session.id}"
    assert caller_of(_request({"cookie": cookie}, "GET"), sessions) == Caller("operator", session)
    assert caller_of(_request({"authorization": f"Bearer {TOKEN}"}, "GET"), sessions) == Caller("operator")
    assert caller_of(_request({"authorization": "Bearer wrong", "cookie": cookie}, "GET"), sessions) is None
    assert caller_of(_request({}, "GET"), sessions) is None


def test_csrf_is_needed_with_the_cookie_only():
    session = Sessions(TOKENS).login(TOKEN)
    assert session is not None
    assert csrf_valid(Caller("operator"), None)
    assert csrf_valid(Caller("operator", session), session.csrf)
    assert not csrf_valid(Caller("operator", session), None)
    assert not csrf_valid(Caller("operator", session), session.csrf + "x")


# ---- cross-site ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("headers", "refused"), [
    ({"host": "127.0.0.1:8080", "origin": "http://127.0.0.1:8080"}, False),
    ({"host": "127.0.0.1:8080", "origin": "HTTP://127.0.0.1:8080", "sec-fetch-site": "same-origin"}, False),
    ({"host": "127.0.0.1:8080"}, False),  # curl: no Origin, no Sec-Fetch-Site
    ({"host": "127.0.0.1:8080", "sec-fetch-site": "none"}, False),  # typed by the user
    ({"host": "127.0.0.1:8080", "origin": "http://127.0.0.1:9090"}, True),  # another port is another origin
    ({"host": "127.0.0.1:8080", "origin": "https://evil.example"}, True),
    ({"host": "127.0.0.1:8080", "origin": "null"}, True),
    ({"host": "127.0.0.1:8080", "sec-fetch-site": "cross-site"}, True),
    ({"host": "127.0.0.1:8080", "sec-fetch-site": "same-site"}, True),
    ({"origin": "http://127.0.0.1:8080"}, True),  # no Host to compare with
])
def test_cross_site_refusal(headers, refused):
    assert (cross_site_refusal(_request(headers)) is not None) is refused


@pytest.mark.parametrize(("given", "goes_to"), [
    ("/runs", "/runs"), ("/runs/a?b=c", "/runs/a?b=c"), (None, "/"), ("", "/"), ("https://evil.example", "/"),
    ("//evil.example", "/"), ("/\\evil.example", "/"), ("runs", "/"),
])
def test_a_login_goes_on_only_to_a_path_of_the_console(given, goes_to):
    assert _safe_next(given) == goes_to


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1:8080", True), ("localhost:1", True), ("[::1]:8080", True), ("LOCALHOST", True),
    ("evil.example:8080", False), ("10.0.0.1:80", False), ("", False), ("[::ffff:10.0.0.1]:80", False),
])
def test_loopback_host_names(host, loopback):
    assert _loopback_host(host) is loopback


# ---- pages ---------------------------------------------------------------------------------------------


def test_fill_escapes_every_value_but_markup_made_here():
    shown = fill(Template("<p title=\"$a\">$b $c</p>"), a='"><script>', b="<b>&", c=Html("<i>ok</i>"))
    assert shown == '<p title="&quot;&gt;&lt;script&gt;">&lt;b&gt;&amp; <i>ok</i></p>'
    assert esc(None) == "" and isinstance(esc("x"), Html)


def test_clip_says_how_much_it_left_out():
    assert clip("short", 10) == "short"
    assert clip(None, 10) == ""
    cut = clip("x" * 25, 10)
    assert cut.startswith("x" * 10) and "15 more characters" in cut


def test_arguments_are_indented_when_they_are_json():
    assert pretty_arguments('{"command":"ls"}') == '{\n  "command": "ls"\n}'
    assert pretty_arguments("{not json") == "{not json"


# ---- resolving from the console ------------------------------------------------------------------------


def test_resolving_records_the_console_operator_and_refuses_twice(tmp_path: Path):
    with AuditStore(tmp_path / "audit.sqlite3") as audit:
        run_id = audit.start_run("run-1", meta={"door": "grpc", "client": "agent"})
        audit.claim_call(run_id, "call-0", "read_file", {"path": "a"})
        approval = audit.create_approval(run_id, "call-1", "shell", {"command": "x"}, "rule", "why")
        console = Console(audit, None)
        [pending], total = console.pending()
        assert total == 1
        assert (pending.door, pending.client, pending.earlier_total) == ("grpc", "agent", 1)
        assert pending.earlier[0]["call_id"] == "call-0"
        resolved, said = console.resolve(approval.id, False, client="operator", reason="  no  ")
        assert (resolved.state, resolved.resolved_by, resolved.resolution_reason) == ("denied", "console:operator",
                                                                                      "no")
        assert said == f"approval {approval.id} denied; the model gets the denial: no"
        with pytest.raises(ConsoleError) as twice:
            console.resolve(approval.id, True, client="operator", reason=None)
        assert twice.value.status == 409
        with pytest.raises(ConsoleError) as unknown:
            console.resolve("nosuchid", True, client="operator", reason=None)
        assert unknown.value.status == 404
        assert console.pending() == ([], 0) and console.sandboxes() is None
        with pytest.raises(ConsoleError, match="no live sandboxes to kill"):
            console.kill("anything", client="operator")


def test_the_oldest_pending_approvals_are_shown_first_up_to_the_limit(tmp_path: Path):
    with AuditStore(tmp_path / "audit.sqlite3") as audit:
        ids = [audit.create_approval("run-1", f"call-{i}", "shell", {"command": str(i)}, "rule", "why").id
               for i in range(3)]
        shown, total = Console(audit, None).pending(limit=2)
        assert total == 3
        assert [p.approval.id for p in shown] == ids[:2]
