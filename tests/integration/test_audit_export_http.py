"""``GET /audit/export`` over real HTTP against a real audit store: an operator exports any
client's records or all of them, a client only its own, whatever it asks (no engine needed:
the endpoint's engine ping is given)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.audit.store import AuditStore
from harness.core.calls import Action, Decision, ToolResult
from harness.doors.grpc.tokens import TokenSet
from harness.doors.http import HttpServer, serve_http

OPERATOR = "export-operator-token-0123456789ab"
CI = "export-ci-client-token-0123456789ab"
OPS = "export-ops-client-token-0123456789a"
TOKENS = TokenSet({"operator": OPERATOR, "ci": CI, "ops": OPS}, source="test tokens", operators=["operator"])
ALLOW = Decision(Action.ALLOW, "tools.shell allow", "")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    """One endpoint over a store with a run and a call of each client."""
    audit = AuditStore(Path(tmp_path_factory.mktemp("export")) / "audit.sqlite3")
    for client in ("ci", "ops"):
        run = audit.start_run(f"run-{client}", {"client": client})
        audit.claim_and_start(run, "c1", "shell", {"command": f"echo {client}-only"}, lambda _n: ALLOW)
        audit.finish_call(run, "c1", ToolResult("c1", f"{client}-only"), decision=None, exit_code=0,
                          duration_ms=1.0, bytes_out=8, truncated=False)
    server = serve_http("127.0.0.1:0", tokens=TOKENS, executor=None, audit=audit, engine_ping=lambda: None,
                        close_audit=True)
    try:
        yield server
    finally:
        server.stop()


def _export(server: HttpServer, token: str | None, **params: str) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.get(f"{server.url}/audit/export", params=params, headers=headers)


def _runs(response: httpx.Response) -> set[str | None]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-ndjson")
    return {json.loads(line)["run_id"] for line in response.text.splitlines()}


def test_export_roles_over_http(served: HttpServer) -> None:
    # an operator: everything (the chain's notes too), or one client's
    assert _runs(_export(served, OPERATOR)) == {None, "run-ci", "run-ops"}
    assert _runs(_export(served, OPERATOR, client="ops")) == {"run-ops"}
    # a client: its own, asked for or not; never another's
    mine = _export(served, CI)
    assert _runs(mine) == {"run-ci"} and "ops-only" not in mine.text and "ci-only" in mine.text
    assert _runs(_export(served, CI, client="ci")) == {"run-ci"}
    refused = _export(served, CI, client="ops")
    assert refused.status_code == 403 and "exports its own records only" in refused.text
    assert "ops-only" not in refused.text
    # no token, a bad time
    assert _export(served, None).status_code == 401
    bad = _export(served, OPERATOR, since="last tuesday")
    assert bad.status_code == 400 and "ISO 8601" in bad.text
    assert _runs(_export(served, OPERATOR, since="2999-01-01")) == set()


def test_the_chain_head_is_in_metrics(served: HttpServer) -> None:
    text = httpx.get(f"{served.url}/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    heads = [s.labels for s in families["callbox_audit_chain_head_info"].samples]  # an info: a gauge in 0.0.4
    assert heads and all(len(h["hash"]) == 64 and int(h["seq"]) > 0 for h in heads), heads
    assert families["callbox_audit_chain_seq"].samples
