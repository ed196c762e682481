"""Sandbox ports through ``callbox serve --e2b``: what ``sandbox.get_host(port)`` leads to.

The unmodified e2b SDK starts a server in the sandbox (``tests/interop/port_program.py``, run
with ``commands.run(background=True)``) and the test fetches it the ways a program written
for E2B does: by the host name ``get_host(port)`` returns (connecting to the server's address
as a resolver that maps the name there would, the name in ``Host`` and in the WebSocket URL),
and by the ``E2b-Sandbox-Id``/``E2b-Sandbox-Port`` headers. One server and one sandbox serve
the whole module; the policy allows ``port_forward`` except for port 9000.
"""

from __future__ import annotations

import json
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from e2b import Sandbox, SandboxState
from websockets.sync.client import connect as ws_connect

from tests.interop.e2b_server import E2bServer, policy_text, sdk_environment, serve_e2b

pytestmark = [pytest.mark.interop, pytest.mark.docker]

PORT = 8000
PROGRAM = Path(__file__).with_name("port_program.py")
POLICY = policy_text("""
public_ports = true

[actions.port_forward]
decision = "allow"
[[actions.port_forward.rules]]
action = "deny"
ports = [9000]
reason = "port 9000 stays inside"
""")
TRAFFIC = "e2b-traffic-access-token"


@pytest.fixture(scope="module")
def server(engine: Any) -> Iterator[E2bServer]:
    with serve_e2b(engine, policy=POLICY) as served:
        yield served


@pytest.fixture(scope="module")
def sandbox(server: E2bServer) -> Iterator[Sandbox]:
    with sdk_environment(server):
        # Auto-resuming, as the Agents SDK creates them: the last test pauses it. Its ports stay
        # private although the policy allows public ones.
        sbx = Sandbox.create(lifecycle={"on_timeout": "pause", "auto_resume": True},
                             network={"allow_public_traffic": False})
        try:
            sbx.files.write("/home/user/port_program.py", PROGRAM.read_text())
            for port in (PORT, 9000):
                sbx.commands.run(f"python3 /home/user/port_program.py {port}", background=True)
            sbx.commands.run(f"for i in $(seq 200); do [ -e /tmp/ready-{PORT} ] && [ -e /tmp/ready-9000 ] && exit 0; "
                             "sleep 0.05; done; exit 1")
            yield sbx
        finally:
            sbx.kill()


def _address(server: E2bServer) -> tuple[str, int]:
    parts = urlsplit(server.url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def test_get_host_names_the_port_and_the_sandbox(sandbox: Sandbox) -> None:
    host = sandbox.get_host(PORT)
    assert host.startswith(f"{PORT}-{sandbox.sandbox_id}.")
    assert sandbox.traffic_access_token


def test_get_host_leads_to_the_port(server: E2bServer, sandbox: Sandbox) -> None:
    """The name get_host returns, sent to this server, reaches the program; no credential
    reaches the sandbox."""
    host = sandbox.get_host(PORT)
    r = httpx.get(f"{server.url}/hello?x=1", headers={"Host": host, TRAFFIC: sandbox.traffic_access_token or ""})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["port"] == PORT and body["path"] == "/hello?x=1"
    assert not {TRAFFIC, "x-access-token", "x-api-key", "e2b-sandbox-id"} & set(body["headers"])
    # A client lower-cases the name; the id is found all the same.
    r = httpx.get(f"{server.url}/", headers={"Host": host.lower(), TRAFFIC: sandbox.traffic_access_token or ""})
    assert r.status_code == 200, r.text


def test_headers_lead_to_the_port_and_bodies_go_both_ways(server: E2bServer, sandbox: Sandbox) -> None:
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": str(PORT),
               TRAFFIC: sandbox.traffic_access_token or ""}
    payload = bytes(range(256)) * 4096  # 1 MiB
    r = httpx.post(f"{server.url}/echo", headers=headers, content=payload)
    assert r.status_code == 200 and r.content == payload


def test_a_chunked_response_streams(server: E2bServer, sandbox: Sandbox) -> None:
    headers = {"Host": sandbox.get_host(PORT), TRAFFIC: sandbox.traffic_access_token or ""}
    with httpx.stream("GET", f"{server.url}/stream", headers=headers, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert next(lines) == "first"  # before the program may send the rest
        sandbox.commands.run("touch /tmp/go")
        assert next(lines) == "second"


def test_a_websocket_is_relayed(server: E2bServer, sandbox: Sandbox) -> None:
    host = sandbox.get_host(PORT)
    sock = socket.create_connection(_address(server))
    with ws_connect(f"ws://{host}/chat", sock=sock, subprotocols=["echo.v1"],  # type: ignore[list-item]
                    additional_headers={TRAFFIC: sandbox.traffic_access_token or ""}) as ws:
        assert ws.subprotocol == "echo.v1"
        ws.send("hello")
        assert ws.recv() == "hello"
        blob = bytes(range(256)) * 1024
        ws.send(blob)
        assert ws.recv() == blob


def test_without_the_token_or_with_another_key_the_port_is_refused(server: E2bServer, sandbox: Sandbox) -> None:
    host = sandbox.get_host(PORT)
    for headers in ({}, {"X-API-KEY": server.keys["bob"]}, {TRAFFIC: "not-the-token"}):
        r = httpx.get(f"{server.url}/", headers={"Host": host, **headers})
        assert r.status_code == 403, r.text
        assert TRAFFIC in r.json()["message"]
    # The owner's API key is a credential too.
    r = httpx.get(f"{server.url}/", headers={"Host": host, "X-API-KEY": server.keys["alice"]})
    assert r.status_code == 200, r.text
    # Bob's own sandbox's token opens Bob's sandbox only.
    with sdk_environment(server, "bob"):
        other = Sandbox.create()
    try:
        r = httpx.get(f"{server.url}/", headers={"Host": host, TRAFFIC: other.traffic_access_token or ""})
        assert r.status_code == 403
        sock = socket.create_connection(_address(server))
        with pytest.raises(Exception, match="403"):
            ws_connect(f"ws://{host}/", sock=sock, additional_headers={TRAFFIC: other.traffic_access_token or ""})
    finally:
        other.kill()


def test_public_ports_need_no_credential_where_the_policy_allows_them(server: E2bServer, sandbox: Sandbox) -> None:
    """Under ``sandbox.public_ports = true`` a sandbox created with E2B's defaults serves its
    ports to a client with no credential; the module's sandbox, which asked for private
    ports, still refuses one (the test above)."""
    assert sandbox.get_info().network is not None
    assert sandbox.get_info().network["allow_public_traffic"] is False
    with sdk_environment(server):
        public = Sandbox.create()
    try:
        assert public.get_info().network is not None
        assert public.get_info().network["allow_public_traffic"] is True
        public.files.write("/home/user/port_program.py", PROGRAM.read_text())
        public.commands.run(f"python3 /home/user/port_program.py {PORT}", background=True)
        public.commands.run(f"for i in $(seq 200); do [ -e /tmp/ready-{PORT} ] && exit 0; sleep 0.05; done; exit 1")
        r = httpx.get(f"{server.url}/open", headers={"Host": public.get_host(PORT)})
        assert r.status_code == 200, r.text
        assert r.json()["path"] == "/open"
    finally:
        public.kill()


def test_the_policy_decides_each_port_and_records_it(server: E2bServer, sandbox: Sandbox) -> None:
    token = {TRAFFIC: sandbox.traffic_access_token or ""}
    r = httpx.get(f"{server.url}/", headers={"Host": sandbox.get_host(9000), **token})
    assert r.status_code == 403 and "port 9000 stays inside" in r.json()["message"], r.text
    with sqlite3.connect(server.directory / "audit.sqlite3") as db:
        rows = db.execute("SELECT tool, arguments FROM calls WHERE run_id = ? AND tool = 'sandbox.port_forward'",
                          (sandbox.sandbox_id,)).fetchall()
    ports = {json.loads(arguments)["port"] for _, arguments in rows}
    assert {PORT, 9000} <= ports


def test_a_port_nothing_listens_on_is_502(server: E2bServer, sandbox: Sandbox) -> None:
    r = httpx.get(f"{server.url}/", headers={"Host": sandbox.get_host(8123), TRAFFIC: sandbox.traffic_access_token
                                             or ""})
    assert r.status_code == 502 and "port 8123 is not open" in r.json()["message"], r.text
    r = httpx.get(f"{server.url}/", headers={"Host": "99999-nope.example"})
    assert r.status_code == 400


API_URL_ONLY = """
import sys
from e2b import Sandbox, SandboxState
sbx = Sandbox.create()
try:
    print("HOST", sbx.get_host(8000), flush=True)
    try:
        sbx.commands.run("true")
        print("RAN", flush=True)
    except Exception as error:
        print("FAILED", type(error).__name__, error, flush=True)
finally:
    sbx.kill()
"""


def test_api_url_only_fails_before_sending_anything_elsewhere(server: E2bServer, tmp_path: Path) -> None:
    """A program with E2B_API_URL but no E2B_SANDBOX_URL: the answer's domain never resolves,
    so its envd call fails in the client, naming what to set; the system calls of the whole
    process (strace) show no connection or datagram to anywhere but this server, not even a
    DNS query."""
    import os
    import subprocess
    import sys

    from tests.interop.e2b_server import without_e2b

    trace = tmp_path / "trace"
    env = {**without_e2b(os.environ), "E2B_API_URL": server.url, "E2B_API_KEY": server.api_key}
    done = subprocess.run(["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=connect,sendto,sendmsg,sendmmsg",
                           sys.executable, "-c", API_URL_ONLY], env=env, capture_output=True, text=True, timeout=120)
    out = done.stdout
    assert done.returncode == 0, done.stderr
    assert "HOST 8000-" in out and ".no-sandbox-domain-set-e2b-sandbox-url-to-the-callbox-url" in out, out
    assert "FAILED" in out and "no-sandbox-domain-set-e2b-sandbox-url" in out, out
    _, port = _address(server)
    lines = trace.read_text().splitlines()
    assert any(f"htons({port})" in line for line in lines), "strace saw no connection to the server at all"
    elsewhere = [line for line in lines if ("AF_INET" in line or "AF_INET6" in line) and f"htons({port})" not in line]
    assert not elsewhere, "\n".join(elsewhere)


def test_a_client_that_came_as_api_domain_is_answered_with_that_domain(server: E2bServer) -> None:
    """E2B_DOMAIN alone makes the SDK call https://api.DOMAIN: the answer names DOMAIN, and
    envd answers under 49983-SANDBOXID.DOMAIN (the requests sent here as DNS for the name would)."""
    key = {"X-API-KEY": server.api_key}
    r = httpx.post(f"{server.url}/sandboxes", headers={"Host": "api.callbox.test", **key},
                   json={"templateID": "base", "timeout": 60})
    assert r.status_code == 201, r.text
    created = r.json()
    try:
        assert created["domain"] == "callbox.test"
        # lower-cased, as a client's URL parser writes a host name
        r = httpx.get(f"{server.url}/health", headers={"Host": f"49983-{created['sandboxID'].lower()}.callbox.test"})
        assert r.status_code == 204, r.text
        r = httpx.get(f"{server.url}/sandboxes/{created['sandboxID']}", headers=key)
        assert r.json()["domain"].endswith(".invalid")  # reached by address: no name to give
    finally:
        httpx.delete(f"{server.url}/sandboxes/{created['sandboxID']}", headers=key)


def test_a_port_request_resumes_a_paused_sandbox(server: E2bServer, sandbox: Sandbox) -> None:
    """Last in the module: it pauses the shared sandbox. A WebSocket, then an HTTP request, to its
    port each wake it (it auto-resumes), and the program that listened before the pause answers."""
    host = sandbox.get_host(PORT)
    token = {TRAFFIC: sandbox.traffic_access_token or ""}
    assert sandbox.pause() is True
    assert Sandbox.get_info(sandbox.sandbox_id).state == SandboxState.PAUSED
    sock = socket.create_connection(_address(server))
    with ws_connect(f"ws://{host}/chat", sock=sock, additional_headers=token) as ws:
        ws.send("after the pause")
        assert ws.recv() == "after the pause"
    assert Sandbox.get_info(sandbox.sandbox_id).state == SandboxState.RUNNING
    assert sandbox.pause() is True
    r = httpx.get(f"{server.url}/again", headers={"Host": host, **token}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["path"] == "/again"
    assert Sandbox.get_info(sandbox.sandbox_id).state == SandboxState.RUNNING
