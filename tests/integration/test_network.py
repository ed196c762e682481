"""Network modes ``allowlist`` and ``open`` against servers this test session owns.

Every destination is the network namespace of ``tests/netdest.py`` (198.18.77.0/24 and
a link-local stand-in); nothing here sends traffic anywhere else. The egress proxy may
reach that private network only through the documented test-only override
(``net_engine``); ``test_private_destinations_are_refused_without_the_override`` shows
the default refusing it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from harness.engine.docker import labels
from harness.engine.docker.engine import DockerEngine
from harness.engine.docker.networks import EGRESS_NETWORK, ROLE, network_name, proxy_name
from harness.engine.spec import SandboxSpec
from tests.conftest import IMAGE
from tests.integration.helpers import callbox, run
from tests.netdest import BANNER, ECHO_PORT, HTTP_PORT, connect_from

pytestmark = pytest.mark.docker

CURL = ["curl", "-sS", "-m", "10", "-w", "\n%{http_code}"]


def curl(box: Any, url: str, *extra: str) -> tuple[str, str]:
    """``curl`` inside the sandbox with its proxy environment: (status code, body)."""
    result = run(box, [*CURL, *extra, url], env=box.spec.env, timeout_ms=30_000)
    body, _, code = result.stdout.data().decode(errors="replace").rpartition("\n")
    return code, body


@pytest.fixture
def make_box(net_engine: DockerEngine) -> Iterator[Any]:
    made: list[Any] = []

    def make(**fields: Any) -> Any:
        box = net_engine.create(SandboxSpec(image=IMAGE, **fields))
        made.append(box)
        return box

    try:
        yield make
    finally:
        for box in made:
            box.destroy()


def test_allowlisted_host_is_reached_through_the_proxy(make_box, destination):
    box = make_box(network="allowlist", allow_hosts=("dest.callbox.test:8080",))
    assert box.spec.env["HTTP_PROXY"] == box.proxy_url and box.spec.env["https_proxy"] == box.proxy_url
    code, body = curl(box, f"http://dest.callbox.test:{HTTP_PORT}/hello?x=1")
    # the proxy sent origin-form and closed the connection after the response
    assert (code, body) == ("200", f"{BANNER} /hello?x=1 connection=close")
    events = box.new_egress_events()
    assert [(e.decision, e.method, e.host, e.port, e.address) for e in events] == [
        ("allow", "GET", "dest.callbox.test", HTTP_PORT, destination.address)
    ]
    assert events[0].sandbox_id == box.id
    assert box.new_egress_events() == []  # each decision is handed out once


def test_wildcard_entry_and_connect_tunnel(make_box, destination):
    box = make_box(network="allowlist", allow_hosts=(f"*.callbox.test:{ECHO_PORT}",))
    script = r"""
import os, socket, sys
proxy = os.environ["HTTPS_PROXY"].removeprefix("http://")
host, port = proxy.rsplit(":", 1)
s = socket.create_connection((host, int(port)), timeout=10)
s.sendall(f"CONNECT API.Callbox.Test.:{sys.argv[1]} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
head = b""
while b"\r\n\r\n" not in head:
    head += s.recv(1)
s.sendall(b"ping through the tunnel")
print(head.split(b"\r\n")[0].decode(), s.recv(100).decode(), sep="|")
"""
    result = run(box, ["python3", "-c", script, str(ECHO_PORT)], env=box.spec.env, timeout_ms=30_000)
    assert result.exit_code == 0, result.stderr.data()
    status, echoed = result.stdout.data().decode().strip().split("|")
    assert status.startswith("HTTP/1.1 200") and echoed == "ping through the tunnel"
    # the apex is not covered by *.callbox.test, nor another port of a covered name
    assert curl(box, "http://callbox.test:7007/")[0] == "403"
    assert curl(box, f"http://api.callbox.test:{HTTP_PORT}/")[0] == "403"
    decisions = [(e.decision, e.host, e.port) for e in box.new_egress_events()]
    assert decisions == [("allow", "api.callbox.test", ECHO_PORT), ("deny", "callbox.test", 7007),
                         ("deny", "api.callbox.test", HTTP_PORT)]


def test_unlisted_host_is_refused_with_a_reason_the_model_can_read(make_box):
    box = make_box(network="allowlist", allow_hosts=("dest.callbox.test:8080",))
    code, body = curl(box, "http://api.callbox.test:8080/")
    assert code == "403"
    assert "api.callbox.test:8080" in body and "allowlist" in body, body
    [event] = box.new_egress_events()
    assert (event.decision, event.host, event.address) == ("deny", "api.callbox.test", None)
    assert event.reason and "allowlist" in event.reason


def test_a_client_that_ignores_the_proxy_reaches_nothing(make_box, destination):
    box = make_box(network="allowlist", allow_hosts=("dest.callbox.test:8080",))
    assert connect_from(box, destination.address, HTTP_PORT) != "connected"
    code, _ = curl(box, f"http://{destination.address}:{HTTP_PORT}/", "--noproxy", "*", "-m", "3")  # dropped: no wait
    assert code == "000"
    # the sandbox resolves no name itself: only the proxy knows dest.callbox.test (one short try of the
    # resolver: an unanswered query fails as surely as a refused one)
    result = run(box, ["python3", "-c", "import socket; socket.getaddrinfo('dest.callbox.test', 80)"],
                 env={"RES_OPTIONS": "timeout:1 attempts:1"}, timeout_ms=30_000)
    assert result.exit_code != 0 and b"gaierror" in result.stderr.data()
    assert box.new_egress_events() == []  # none of this went through the proxy


def test_private_destinations_are_refused_without_the_override(engine, destination):
    plain = DockerEngine(engine.client, run_root=engine.run_root, reap_on_start=False,
                         egress_test_network=None, egress_test_hosts={})
    box = plain.create(SandboxSpec(image=IMAGE, network="allowlist", allow_hosts=(
        f"{destination.address}:{HTTP_PORT}", "169.254.169.254:80", f"{destination.metadata_standin}:{HTTP_PORT}",
    )))
    try:
        for target in (f"{destination.address}:{HTTP_PORT}", "169.254.169.254:80",
                       f"{destination.metadata_standin}:{HTTP_PORT}"):
            code, body = curl(box, f"http://{target}/")
            assert code == "403", (target, body)
        events = box.new_egress_events()
        assert [e.decision for e in events] == ["deny"] * 3
        assert all(e.reason for e in events)
    finally:
        box.destroy()


def test_open_mode_reaches_the_outside_directly(make_box, destination):
    box = make_box(network="open")
    assert "HTTP_PROXY" not in box.spec.env and box.proxy_url is None
    code, body = curl(box, f"http://{destination.address}:{HTTP_PORT}/open")
    assert (code, body) == ("200", f"{BANNER} /open connection=None")


def test_destroy_leaves_no_network_or_proxy_and_gc_removes_the_filter(net_engine):
    api = net_engine.client.api
    box = net_engine.create(SandboxSpec(image=IMAGE, network="allowlist", allow_hosts=("dest.callbox.test",)))
    sandbox_id = box.id
    assert api.networks(names=[network_name(sandbox_id)])
    assert api.inspect_network(network_name(sandbox_id))["Internal"] is True
    proxy = api.inspect_container(proxy_name(sandbox_id))
    assert proxy["Config"]["User"] == "65534:65534" and proxy["HostConfig"]["ReadonlyRootfs"] is True
    assert proxy["HostConfig"]["CapDrop"] == ["ALL"] and not proxy["HostConfig"]["CapAdd"]
    assert api.inspect_network(EGRESS_NETWORK)["Options"]["com.docker.network.bridge.enable_icc"] == "false"
    assert net_engine.networks.packet_filter.installed()
    box.destroy()
    assert net_engine.drain(60)  # the removal runs in the background; wait for it
    assert not api.networks(names=[network_name(sandbox_id)])
    assert not api.containers(all=True, filters={"name": proxy_name(sandbox_id)})
    # (only this sandbox's: make test runs the lifecycle soak, with proxies of its own, beside)
    mine = [f"{ROLE}=egress-proxy", f"{labels.SANDBOX_ID}={sandbox_id}"]
    assert not api.containers(all=True, filters={"label": mine})
    net_engine.gc()
    if not api.networks(filters={"label": "callbox.managed"}):
        assert not net_engine.networks.packet_filter.installed()


def test_cli_exec_with_an_allowlist(destination):
    env = {"CALLBOX_EGRESS_TEST_NETWORK": destination.network,
           "CALLBOX_EGRESS_TEST_HOSTS": f"dest.callbox.test={destination.address}"}
    done = callbox("exec", "--image", IMAGE, "--network", "allowlist", "--allow-host", "DEST.callbox.test.:8080",
                   "--", "curl", "-sS", "-m", "10", f"http://dest.callbox.test:{HTTP_PORT}/cli", env=env)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode() == f"{BANNER} /cli connection=close"
    refused = callbox("exec", "--image", IMAGE, "--network", "allowlist", "--allow-host", "dest.callbox.test:8080",
                      "--", "curl", "-sS", "-m", "10", "-f", f"http://api.callbox.test:{HTTP_PORT}/", env=env)
    assert refused.returncode == 22  # curl -f: HTTP error (403)


def test_cli_rejects_bad_allowlists_before_any_engine_is_contacted():
    env = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    for args, needle in (
        (["--allow-host", "dest.callbox.test"], "allowlist"),
        (["--network", "allowlist"], "at least one allowed host"),
        (["--network", "allowlist", "--allow-host", "*bad*.example.com"], "--allow-host: invalid allowlist entry"),
    ):
        done = callbox("exec", *args, "--", "true", env=env)
        assert done.returncode == 2, (args, done.stderr)
        assert needle in done.stderr.decode(), (args, done.stderr)
        assert "Docker engine" not in done.stderr.decode()


def test_egress_events_are_json_lines_with_the_sandbox_id(make_box):
    box = make_box(network="allowlist", allow_hosts=("dest.callbox.test:8080",))
    curl(box, "http://nope.callbox.test:8080/")
    api = box.engine.client.api
    # Docker's log copier may lag the proxy's write: wait for the first line to reach the log.
    follow = api.logs(proxy_name(box.id), stdout=True, stderr=False, stream=True, follow=True)
    try:
        next(follow)
    finally:
        follow.close()
    raw = api.logs(proxy_name(box.id), stdout=True, stderr=False).decode()
    lines = [json.loads(line) for line in raw.splitlines() if line.strip()]
    assert lines and all(line["sandbox_id"] == box.id for line in lines)


def test_the_harness_records_every_egress_decision_in_the_audit_store(net_engine, tmp_path):
    from harness.audit.store import AuditStore
    from harness.core.calls import ToolCall
    from harness.core.policy import Policy
    from harness.core.registry import ToolRegistry
    from harness.core.session import Session
    from harness.tools.bash import BASH

    spec = SandboxSpec(image=IMAGE, network="allowlist", allow_hosts=("dest.callbox.test:8080",))
    with AuditStore(tmp_path / "audit.sqlite3") as audit:
        with Session(ToolRegistry([BASH]), Policy(), audit, spec=spec, engine_factory=lambda: net_engine) as harness:
            ok = harness.call(ToolCall("bash", {"command": f"curl -sS -m 10 http://dest.callbox.test:{HTTP_PORT}/a"},
                                       "c1"))
            assert ok.text == f"{BANNER} /a connection=close", ok.text
            refused = harness.call(ToolCall("bash", {"command": "curl -sS -m 10 http://evil.callbox.test/"}, "c2"))
            assert "refused evil.callbox.test:80" in refused.text
            sandbox_id = harness.active_sandbox.id  # type: ignore[union-attr]
        rows = audit.egress(harness.run_id)
    assert [(r["call_id"], r["decision"], r["host"], r["port"], r["sandbox_id"]) for r in rows] == [
        ("c1", "allow", "dest.callbox.test", HTTP_PORT, sandbox_id),
        ("c2", "deny", "evil.callbox.test", 80, sandbox_id),
    ]
    assert rows[0]["address"] == "198.18.77.2" and rows[1]["reason"]


def test_an_expired_allowlist_sandbox_stops_with_its_proxy_without_any_harness(make_box):
    import time

    from harness.engine.docker.kept import write_expiry

    box = make_box(network="allowlist", allow_hosts=("dest.callbox.test:8080",))
    api = box.engine.client.api
    past = time.time() - 1
    write_expiry(box.socket_dir, past)  # what the files say once the expiry has passed
    box.engine.networks.set_expiry(box.id, past)
    # both stop on their own (the agent and the proxy each watch their file): wait for it
    assert api.wait(box.container_id, timeout=60)["StatusCode"] is not None
    assert api.wait(proxy_name(box.id), timeout=60)["StatusCode"] == 0
    logs = api.logs(proxy_name(box.id), stdout=False, stderr=True).decode()
    assert "the sandbox expired" in logs
