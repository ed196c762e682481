"""The E2B door's control plane (REST) on the real engine: its handlers called with HttpRequest
objects, over an ExecutorService and E2bSandboxes built as a server builds them.

Create with envVars (the shell tool sees them), metadata and a timeout; refusals of what
the server does not allow or do (a timeout above the limit, an unknown template, internet
access beyond the policy, autoPause, unknown fields); list filters (metadata as the SDK
encodes it, state, template) and paging by x-next-token; get; set_timeout shortening and
extending the end, the session's clock and the engine's record agreeing; pause (409 the
second time) and connect resuming it (201, then 200 for a running one); a denied pause
recorded in the run; metrics; delete (then 404); another client's sandbox 404 on every route;
a short timeout raised to the minimum and reaped. Then the same through the unmodified e2b
SDK against serve_e2b: create, get_info, set_timeout, list, pause, connect, metrics, kill,
the refusals it raises, and another API key.
"""

from __future__ import annotations

import json
import os
import textwrap
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest

from harness.audit.store import AuditStore
from harness.core.calls import ToolCall
from harness.doors.e2b.boxes import MIN_TIMEOUT_S, E2bSandboxes
from harness.doors.e2b.rest import ENVD_VERSION, routes
from harness.doors.e2b.rpc import HttpRequest, HttpResponse
from harness.doors.grpc.service import ExecutorService
from harness.doors.grpc.sessions import Limits
from harness.engine.docker.engine import DockerEngine
from harness.engine.docker.lifetime import read_record
from tests.conftest import IMAGE
from tests.integration.e2b_door import e2b_sandboxes

pytestmark = pytest.mark.docker

LIMIT = 900
POLICY = textwrap.dedent(f"""
    [sandbox]
    image = "{IMAGE}"
    memory = "256m"
    ttl_seconds = {LIMIT}
""")
ALICE_KEY = "a" * 24
BOB_KEY = "b" * 24
LOCKED = POLICY + textwrap.dedent("""
    [actions.pause]
    decision = "deny"
""")


@dataclass
class Api:
    """The REST routes of one E2B door, called like its server calls them."""

    sandboxes: E2bSandboxes
    service: ExecutorService
    audit: AuditStore
    engine: DockerEngine
    table: dict[tuple[str, str], Any]

    def call(self, method: str, path: str, client: str = "alice", body: Any = None,
             query: dict[str, list[str]] | None = None, headers: dict[str, str] | None = None) -> HttpResponse:
        """Route ``method path`` as the app does (literal segments, then ``{sandboxID}``)."""
        for (want_method, template), handler in self.table.items():
            params = match(template, path)
            if want_method == method and params is not None:
                raw = b"" if body is None else json.dumps(body).encode()
                request = HttpRequest(method=method, path=path, query=query or {}, headers=headers or {},
                                      body=iter([raw]), path_params=params)
                response: HttpResponse = handler(request, client)
                return response
        raise AssertionError(f"no route for {method} {path}")

    def ok(self, method: str, path: str, status: int = 200, **kwargs: Any) -> Any:
        response = self.call(method, path, **kwargs)
        assert response.status == status, (response.status, response.body)
        assert isinstance(response.body, bytes)
        return json.loads(response.body) if response.body else None

    def refused(self, method: str, path: str, status: int, words: str, **kwargs: Any) -> dict[str, Any]:
        response = self.call(method, path, **kwargs)
        assert isinstance(response.body, bytes)
        error = json.loads(response.body)
        assert response.status == status, (response.status, error)
        assert error["code"] == status and words in error["message"], error
        return dict(error)

    def create(self, client: str = "alice", **body: Any) -> dict[str, Any]:
        created: dict[str, Any] = self.ok("POST", "/v2/sandboxes", 201, client=client,
                                          body={"templateID": "base", **body})
        return created


def match(template: str, path: str) -> dict[str, str] | None:
    want, got = template.strip("/").split("/"), path.strip("/").split("/")
    if len(want) != len(got):
        return None
    params = {}
    for part, value in zip(want, got, strict=True):
        if part.startswith("{"):
            params[part[1:-1]] = value
        elif part != value:
            return None
    return params


@pytest.fixture(scope="module")
def api(engine: Any) -> Iterator[Api]:
    with e2b_sandboxes(engine, POLICY, prefix="cbx-e2b-rest-", keys={"alice": ALICE_KEY, "bob": BOB_KEY},
                       templates={"locked": LOCKED}, limits=Limits(max_sandboxes_per_client=6)) as door:
        table: dict[tuple[str, str], Any] = {}
        for method, path, handler in routes(door.sandboxes):
            table.setdefault((method, path), handler)
        yield Api(door.sandboxes, door.executor, door.audit, door.engine, table)


@pytest.fixture(scope="module")
def box(api: Api) -> dict[str, Any]:
    """Alice's sandbox, made with envVars, metadata and a timeout."""
    return api.create(timeout=600, envVars={"E2B_REST_MARK": "mark-1"}, metadata={"team": "red", "k y": "v&1"})


def when(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_create_answers_what_the_sdk_reads_and_applies_env_metadata_timeout(api: Api, box: dict[str, Any]) -> None:
    assert set(box) >= {"templateID", "sandboxID", "clientID", "envdVersion", "envdAccessToken"}
    assert box["templateID"] == "base" and box["envdVersion"] == ENVD_VERSION == "0.6.4"
    assert box["sandboxID"].startswith("e2b-") and len(box["envdAccessToken"]) >= 24
    sandbox = api.sandboxes.get("alice", box["sandboxID"])
    assert sandbox.box.spec.env["E2B_REST_MARK"] == "mark-1"
    assert sandbox.session.ttl_seconds == 600
    # The shell tool's commands get the sandbox's environment.
    result = sandbox.session.harness.call(ToolCall("shell", json.dumps({"command": "echo $E2B_REST_MARK"}), "c1"))
    assert not result.is_error and "mark-1" in result.text, result
    detail = api.ok("GET", f"/sandboxes/{box['sandboxID']}")
    assert detail["metadata"] == {"team": "red", "k y": "v&1"} and detail["state"] == "running"
    assert detail["envdAccessToken"] == box["envdAccessToken"] and detail["envdVersion"] == ENVD_VERSION
    assert detail["memoryMB"] == 256 and detail["cpuCount"] == 1 and detail["diskSizeMB"] > 0
    assert detail["allowInternetAccess"] is False and detail["lifecycle"] == {"autoResume": False, "onTimeout": "kill"}
    assert 590 <= when(detail["endAt"]) - time.time() <= 600
    assert when(detail["startedAt"]) <= time.time()
    run = api.audit.get_run(box["sandboxID"])
    assert run.meta["door"] == "e2b" and run.meta["client"] == "alice" and run.meta["metadata"]["team"] == "red"


def test_refusals_of_create_name_the_fix(api: Api) -> None:
    before = [s.sandbox_id for s in api.sandboxes.list("alice")]
    api.refused("POST", "/v2/sandboxes", 403, "above this server's limit of 900 s (sandbox.ttl_seconds",
                body={"templateID": "base", "timeout": LIMIT + 1})
    api.refused("POST", "/v2/sandboxes", 400, "not a whole number", body={"templateID": "base", "timeout": 1.5})
    error = api.refused("POST", "/v2/sandboxes", 404, "template 'nope' not found", body={"templateID": "nope"})
    assert "base, locked" in error["message"]
    api.refused("POST", "/v2/sandboxes", 400, "network.allowOut[0]",
                body={"templateID": "base", "network": {"allowOut": ["*bad*"]}})
    api.refused("POST", "/v2/sandboxes", 501, "autoPauseMemory false",
                body={"templateID": "base", "autoPause": True, "autoPauseMemory": False})
    api.refused("POST", "/v2/sandboxes", 501, "network.egressProxy",
                body={"templateID": "base", "network": {"egressProxy": {"address": "proxy.example.com:1080"}}})
    api.refused("POST", "/v2/sandboxes", 501, "mcp", body={"templateID": "base", "mcp": {"x": {}}})
    api.refused("POST", "/v2/sandboxes", 400, "futureOption", body={"templateID": "base", "futureOption": 1})
    api.refused("POST", "/v2/sandboxes", 400, "envVars['A']", body={"templateID": "base", "envVars": {"A": 1}})
    assert [s.sandbox_id for s in api.sandboxes.list("alice")] == before  # none was made


def test_list_filters_and_pages(api: Api, box: dict[str, Any]) -> None:
    other = api.create(metadata={"team": "blue"}, allow_internet_access=False, secure=True)
    third = api.create(metadata={"team": "blue"}, autoPause=False, network={"allowPublicTraffic": True})
    try:
        # The SDK's metadata query: urlencode of quote()d keys and values.
        sdk_query = urllib.parse.urlencode({urllib.parse.quote("k y"): urllib.parse.quote("v&1")})
        found = api.ok("GET", "/v2/sandboxes", query={"metadata": [sdk_query]})
        assert [s["sandboxID"] for s in found] == [box["sandboxID"]]
        blue = api.ok("GET", "/v2/sandboxes", query={"metadata": ["team=blue"]})
        assert [s["sandboxID"] for s in blue] == [other["sandboxID"], third["sandboxID"]]
        assert {"startedAt", "endAt", "cpuCount", "memoryMB", "diskSizeMB", "state", "envdVersion"} <= set(blue[0])
        assert api.ok("GET", "/v2/sandboxes", query={"state": ["paused"]}) == []
        assert len(api.ok("GET", "/v2/sandboxes", query={"state": ["running,paused"], "template": ["base"]})) == 3
        api.refused("GET", "/v2/sandboxes", 400, "not a sandbox state", query={"state": ["sleeping"]})
        api.refused("GET", "/v2/sandboxes", 400, "1 to 100", query={"limit": ["101"]})
        # Pages of one, as the SDK's paginator follows x-next-token.
        seen: list[str] = []
        token: str | None = None
        for _ in range(5):
            query = {"limit": ["1"], "order": ["desc"], **({"nextToken": [token]} if token else {})}
            response = api.call("GET", "/v2/sandboxes", query=query)
            assert response.status == 200 and isinstance(response.body, bytes)
            seen += [s["sandboxID"] for s in json.loads(response.body)]
            token = dict(response.headers).get("x-next-token")
            if not token:
                break
        assert seen == [third["sandboxID"], other["sandboxID"], box["sandboxID"]]
        api.refused("GET", "/v2/sandboxes", 400, "nextToken", query={"nextToken": ["garbage!"]})
        assert api.sandboxes.get("alice", other["sandboxID"]).box.spec.network == "none"
        assert api.ok("GET", "/v2/sandboxes", client="bob") == []
    finally:
        for made in (other, third):
            api.ok("DELETE", f"/sandboxes/{made['sandboxID']}", 204)


def test_timeout_moves_the_end_both_ways_within_the_limit(api: Api, box: dict[str, Any]) -> None:
    path = f"/sandboxes/{box['sandboxID']}/timeout"
    sandbox = api.sandboxes.get("alice", box["sandboxID"])
    for seconds in (60, LIMIT):
        api.ok("POST", path, 204, body={"timeout": seconds})
        end = when(api.ok("GET", f"/sandboxes/{box['sandboxID']}")["endAt"])
        assert seconds - 5 <= end - time.time() <= seconds
        record = read_record(api.engine.run_root, sandbox.box.id)
        assert record is not None and abs(record.expires - sandbox.session.expires) < 1
    api.refused("POST", path, 403, "sandbox.ttl_seconds", body={"timeout": LIMIT + 1})
    api.refused("POST", path, 400, "needs \"timeout\"", body={})
    assert api.audit.get_run(box["sandboxID"]).meta["timeout_s"] == LIMIT


def test_pause_then_connect_resumes(api: Api, box: dict[str, Any]) -> None:
    sid = box["sandboxID"]
    api.ok("POST", f"/sandboxes/{sid}/timeout", 204, body={"timeout": 120})
    api.ok("POST", f"/sandboxes/{sid}/pause", 204, body={})
    sandbox = api.sandboxes.get("alice", sid)
    assert sandbox.box.paused and sandbox.state == "paused"
    api.refused("POST", f"/sandboxes/{sid}/pause", 409, "already paused", body={})
    assert [s["sandboxID"] for s in api.ok("GET", "/v2/sandboxes", query={"state": ["paused"]})] == [sid]
    # Metrics work while paused (the freezer keeps the counters).
    assert api.ok("GET", f"/sandboxes/{sid}/metrics")[0]["memUsed"] > 0
    resumed = api.ok("POST", f"/v2/sandboxes/{sid}/connect", 201, body={"timeout": 300})
    assert resumed["sandboxID"] == sid and resumed["envdAccessToken"] == box["envdAccessToken"]
    assert not sandbox.box.paused and sandbox.state == "running"
    assert 295 <= sandbox.end_at() - time.time() <= 300
    # A running sandbox: 200, and a shorter timeout leaves the longer end it has.
    assert api.ok("POST", f"/v2/sandboxes/{sid}/connect", 200, body={"timeout": 30})["sandboxID"] == sid
    assert sandbox.end_at() - time.time() > 280
    api.refused("POST", f"/sandboxes/{sid}/resume", 409, "already running", body={})
    ops = [json.loads(c["arguments"]).get("op") for c in api.audit.calls_for_run(sid)
           if c["tool"] == "sandbox.pause" and c["state"] == "done"]
    assert ops == ["pause", "resume"]
    result = sandbox.session.harness.call(ToolCall("shell", json.dumps({"command": "echo back"}), "c2"))
    assert not result.is_error, result


def test_a_denied_pause_is_refused_and_recorded(api: Api) -> None:
    made = api.create(templateID="locked")
    sid = made["sandboxID"]
    try:
        api.refused("POST", f"/sandboxes/{sid}/pause", 403, "pause", body={})
        assert api.sandboxes.get("alice", sid).state == "running"
        calls = [c for c in api.audit.calls_for_run(sid) if c["tool"] == "sandbox.pause"]
        assert [c["decision"] for c in calls] == ["deny"], calls
    finally:
        api.ok("DELETE", f"/sandboxes/{sid}", 204)


def test_metrics(api: Api, box: dict[str, Any]) -> None:
    sid = box["sandboxID"]
    sandbox = api.sandboxes.get("alice", sid)
    job = sandbox.running().jobs.start(["python3", "-c", "import time\nt=time.time()\nwhile time.time()-t<1.5: pass"])
    first = api.ok("GET", f"/sandboxes/{sid}/metrics")
    assert len(first) == 1
    metric = first[0]
    assert metric["cpuCount"] == 1 and metric["memTotal"] == 256 << 20 and 0 < metric["memUsed"] < 256 << 20
    assert abs(metric["timestampUnix"] - time.time()) < 5 and metric["diskTotal"] > 0
    assert 0 <= metric["cpuUsedPct"] <= 100
    # The busy loop shows between two readings (following its output ends when it does).
    list(sandbox.box.jobs.attach(job.pid, follow=True, timeout=20))
    assert sandbox.box.jobs.get(job.pid).state == "exited"
    busy = api.ok("GET", f"/sandboxes/{sid}/metrics")[0]["cpuUsedPct"]
    assert busy > 20, busy
    assert api.ok("GET", f"/sandboxes/{sid}/metrics", query={"end": ["1000"]}) == []


def test_another_clients_sandbox_is_not_found_everywhere(api: Api, box: dict[str, Any]) -> None:
    sid = box["sandboxID"]
    for method, path, body in (("GET", f"/sandboxes/{sid}", None), ("DELETE", f"/sandboxes/{sid}", None),
                               ("POST", f"/sandboxes/{sid}/timeout", {"timeout": 60}),
                               ("POST", f"/sandboxes/{sid}/pause", {}),
                               ("POST", f"/v2/sandboxes/{sid}/connect", {"timeout": 60}),
                               ("POST", f"/sandboxes/{sid}/resume", {}),
                               ("GET", f"/sandboxes/{sid}/metrics", None)):
        bobs = api.refused(method, path, 404, f"sandbox {sid!r} not found", client="bob", body=body)
        never = api.refused(method, path.replace(sid, "e2b-never"), 404, "not found", client="bob", body=body)
        assert bobs["message"].replace(sid, "X") == never["message"].replace("e2b-never", "X")
    assert api.sandboxes.get("alice", sid).state == "running"


def test_unsupported_paths_say_so(api: Api, box: dict[str, Any]) -> None:
    sid = box["sandboxID"]
    api.refused("POST", f"/sandboxes/{sid}/fork", 400, "count must be a whole number from 1 to", body={"count": 0})
    api.refused("PUT", f"/sandboxes/{sid}/network", 403, "no network", body={"allowOut": ["example.com"]})
    api.refused("GET", "/sandboxes/metrics", 501, "many sandboxes")
    api.refused("POST", f"/sandboxes/{sid}/pause", 501, "filesystem-only", body={"memory": False})


def test_idempotency_key_returns_the_same_sandbox(api: Api) -> None:
    key = {"idempotency-key": "key-1"}
    first = api.ok("POST", "/v2/sandboxes", 201, body={"templateID": "base"}, headers=key)
    try:
        again = api.ok("POST", "/v2/sandboxes", 201, body={"templateID": "base"}, headers=key)
        assert again["sandboxID"] == first["sandboxID"]
        api.refused("POST", "/v2/sandboxes", 409, "different create request",
                    body={"templateID": "base", "timeout": 60}, headers=key)
    finally:
        api.ok("DELETE", f"/sandboxes/{first['sandboxID']}", 204)


def test_delete_then_not_found(api: Api) -> None:
    made = api.create()
    sid = made["sandboxID"]
    container = api.sandboxes.get("alice", sid).box.container_id
    api.refused("DELETE", f"/sandboxes/{sid}", 404, "not found", client="bob")
    api.ok("DELETE", f"/sandboxes/{sid}", 204)
    api.refused("DELETE", f"/sandboxes/{sid}", 404, "not found")
    api.refused("GET", f"/sandboxes/{sid}", 404, "not found")
    assert api.engine.drain(60)  # the container's removal runs in the background; wait for it
    assert not api.engine.client.containers.list(all=True, filters={"id": container}, ignore_removed=True)
    assert api.audit.get_run(sid).end_reason == "deleted"


def test_a_short_timeout_is_the_minimum_and_the_reaper_removes_it(api: Api) -> None:
    made = api.create(timeout=1)
    sid = made["sandboxID"]
    try:
        end = when(api.ok("GET", f"/sandboxes/{sid}")["endAt"])
        assert 5 <= end - time.time() <= MIN_TIMEOUT_S
        assert api.service.reap_expired(now=end - 1) == []
        assert api.service.reap_expired(now=end + 1) == [sid]
        api.refused("GET", f"/sandboxes/{sid}", 404, "not found")
        assert sid not in [s["sandboxID"] for s in api.ok("GET", "/v2/sandboxes")]
        assert api.audit.get_run(sid).end_reason == "expired"
    finally:
        api.call("DELETE", f"/sandboxes/{sid}")


# ---- through the SDK --------------------------------------------------------------------------------


@pytest.fixture
def sdk(api: Api, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """serve_e2b over the module's sandboxes, the SDK's environment pointed at it as alice."""
    from harness.doors.e2b.server import serve_e2b

    server = serve_e2b("127.0.0.1:0", sandboxes=api.sandboxes, announce=None)
    try:
        for name in [n for n in os.environ if n.startswith("E2B_")]:
            monkeypatch.delenv(name)
        monkeypatch.setenv("E2B_API_URL", server.url)
        monkeypatch.setenv("E2B_SANDBOX_URL", server.url)
        monkeypatch.setenv("E2B_API_KEY", ALICE_KEY)
        yield server.url
    finally:
        server.stop()


def test_sdk_create_info_timeout_list_pause_connect_kill(api: Api, sdk: str) -> None:
    from e2b import Sandbox, SandboxQuery, SandboxState
    from e2b.exceptions import SandboxException

    sandbox = Sandbox.create(timeout=120, envs={"SDK_MARK": "s1"}, metadata={"case": "sdk-rest"})
    try:
        info = sandbox.get_info()
        assert info.sandbox_id == sandbox.sandbox_id and info.template_id == "base" and info.name == "base"
        assert info.metadata == {"case": "sdk-rest"} and info.state == SandboxState.RUNNING
        assert info.envd_version == ENVD_VERSION and info.memory_mb == 256 and info.cpu_count == 1
        assert abs((info.end_at - info.started_at).total_seconds() - 120) < 5
        assert api.sandboxes.get("alice", sandbox.sandbox_id).box.spec.env["SDK_MARK"] == "s1"

        sandbox.set_timeout(LIMIT)
        assert abs(Sandbox.get_info(sandbox.sandbox_id).end_at.timestamp() - time.time() - LIMIT) < 5
        with pytest.raises(SandboxException, match=r"sandbox\.ttl_seconds"):
            sandbox.set_timeout(LIMIT + 1)

        paginator = Sandbox.list(query=SandboxQuery(metadata={"case": "sdk-rest"}))
        assert [s.sandbox_id for s in paginator.next_items()] == [sandbox.sandbox_id] and not paginator.has_next

        assert sandbox.pause() is True
        assert sandbox.pause() is False
        paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
        assert [s.sandbox_id for s in paused] == [sandbox.sandbox_id]
        again = Sandbox.connect(sandbox.sandbox_id)
        assert again.sandbox_id == sandbox.sandbox_id and again.get_info().state == SandboxState.RUNNING
        metrics = again.get_metrics()
        assert len(metrics) == 1 and metrics[0].mem_total == 256 << 20 and metrics[0].mem_used > 0

        assert sandbox.kill() is True
        assert Sandbox.kill(sandbox.sandbox_id) is False
    finally:
        api.call("DELETE", f"/sandboxes/{sandbox.sandbox_id}")


def test_sdk_refusals_and_another_key(api: Api, sdk: str) -> None:
    from e2b import Sandbox
    from e2b.exceptions import NotFoundException, SandboxException, SandboxNotFoundException

    with pytest.raises(SandboxException, match=r"sandbox\.ttl_seconds"):
        Sandbox.create(timeout=LIMIT + 1)
    with pytest.raises(SandboxException, match="template 'nope' not found"):
        Sandbox.create(template="nope")
    mine = Sandbox.create(timeout=60)
    try:
        bob = {"api_key": BOB_KEY}
        with pytest.raises(SandboxNotFoundException):
            Sandbox.get_info(mine.sandbox_id, **bob)
        with pytest.raises(NotFoundException):
            Sandbox.set_timeout(mine.sandbox_id, 60, **bob)
        assert Sandbox.kill(mine.sandbox_id, **bob) is False
        assert Sandbox.list(**bob).next_items() == []
        assert mine.get_info().state.value == "running"
    finally:
        mine.kill()
