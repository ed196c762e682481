"""``ask`` egress end to end: the real engine, the real egress proxy, the test destination's
servers (``tests/netdest.py``), one gRPC server and ONE sandbox for every case.

``curl`` in the sandbox to an ``ask`` host waits; the call's output stream says so and names
the approval; the answer comes from the gRPC door or ``callbox approvals``: allow once (the
next request waits again), deny (curl gets a 403 naming the approval), allow for the sandbox
(later requests go through without a hold), and no answer (refused after ``ask_timeout``)."""

from __future__ import annotations

import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.audit.store import AuditStore
from harness.client import CallResult, ExecutorClient, ExecutorError, OutputEvent
from harness.core.policy import parse_policy
from harness.doors.grpc.server import serve_grpc
from harness.doors.grpc.tokens import TokenSet
from harness.engine.docker.engine import DockerEngine
from tests.conftest import IMAGE
from tests.netdest import BANNER, HTTP_PORT

pytestmark = pytest.mark.docker

TOKEN = "token-of-egress-ask-0123456789"
OPS_TOKEN = "operator-token-of-egress-ask-0123"
API = f"api.callbox.test:{HTTP_PORT}"
DEST = f"dest.callbox.test:{HTTP_PORT}"
ASK_TIMEOUT_S = 5
POLICY = textwrap.dedent(f"""
    [sandbox]
    image = "{IMAGE}"
    network = "allowlist"
    allow_hosts = ["ask *.callbox.test:{HTTP_PORT}"]
    ask_timeout = {ASK_TIMEOUT_S}
""")
CALLBOX = str(Path(sys.executable).parent / "callbox")
WAITING = re.compile(r"callbox: waiting for a person: egress to (\S+) \(GET\) is held as approval (\w+)")


@pytest.fixture(scope="module")
def door(net_engine: DockerEngine) -> Iterator[tuple[ExecutorClient, ExecutorClient, Path, str]]:
    state = Path(tempfile.mkdtemp(prefix="cbx-ask-"))
    short = Path(tempfile.mkdtemp(prefix="cbx-", dir="/tmp"))
    audit = AuditStore(state / "audit.sqlite3")
    server = serve_grpc(str(short / "x.sock"), policy=parse_policy(POLICY), audit=audit,
                        tokens=TokenSet({"alice": TOKEN, "ops": OPS_TOKEN}, source="test tokens", operators=["ops"]),
                        announce=None, engine_factory=lambda: net_engine)
    client = ExecutorClient(server.target, TOKEN)
    operator = ExecutorClient(server.target, OPS_TOKEN)
    sandbox_id = client.create_sandbox()
    try:
        yield client, operator, state / "audit.sqlite3", sandbox_id
    finally:
        client.delete_sandbox(sandbox_id)
        operator.close()
        client.close()
        server.stop(grace=1)
        audit.close()
        shutil.rmtree(short, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


class Curl:
    """``curl http://HOST/`` as a call in the sandbox, in a thread; ``held()`` waits for the
    stream's line saying the connection is held and gives the approval it names."""

    def __init__(self, client: ExecutorClient, sandbox_id: str, target: str) -> None:
        self.lines: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.result: CallResult | None = None
        self.stderr = b""

        def on_output(event: OutputEvent) -> None:
            if event.stream == "stderr":
                self.stderr += event.data
                for line in event.data.decode().splitlines():
                    self.lines.put(line)

        def work() -> None:
            self.result = client.call(sandbox_id, "shell", {"command": f"curl -sS -m 60 http://{target}/x; true"},
                                      on_output=on_output)
            self.lines.put("<done>")

        self.thread = threading.Thread(target=work, daemon=True)
        self.thread.start()

    def held(self) -> tuple[str, str]:
        while True:
            line = self.lines.get(timeout=60)
            assert line != "<done>", (self.result, self.stderr)
            if match := WAITING.search(line):
                return match.group(1), match.group(2)

    def done(self) -> CallResult:
        self.thread.join(90)
        assert self.result is not None
        return self.result


def cli(audit_db: Path, *args: str) -> str:
    done = subprocess.run([CALLBOX, "approvals", *args, "--audit-db", str(audit_db)], capture_output=True, text=True,
                          env={**os.environ, "LOGNAME": "ann", "USER": "ann"}, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_person_answers_held_egress(door: tuple[ExecutorClient, ExecutorClient, Path, str],
                                      destination: Any) -> None:
    client, operator, audit_db, sid = door

    # Allow once, by an operator from the gRPC door (the sandbox's client may not): that request goes through.
    curl = Curl(client, sid, API)
    destination_seen, first = curl.held()
    assert destination_seen == API
    with pytest.raises(ExecutorError) as refused_client:
        client.resolve_approval(first, True)
    assert refused_client.value.error_code == "permission_denied"
    assert operator.resolve_approval(first, True).scope == "once"
    result = curl.done()
    assert result.text.strip().endswith(f"{BANNER} /x connection=close"), result.text
    [egress] = result.meta["egress"]
    assert egress["decision"] == "allow" and egress["host"] == "api.callbox.test"
    assert egress["reason"] == f"approval {first}: allowed once by grpc:ops", egress
    assert f"approval {first}: egress to {API} allowed once by grpc:ops" in curl.stderr.decode()

    # The next one waits again; denied from the CLI, curl gets a 403 naming the approval.
    curl = Curl(client, sid, API)
    _, second = curl.held()
    assert second != first
    assert "egress" in cli(audit_db, "list")
    assert cli(audit_db, "deny", second, "--reason", "not this one").split()[:2] == [second, "denied"]
    refused = curl.done().text
    assert f"approval {second}: {API} denied by" in refused and "not this one" in refused, refused

    # Allowed for the sandbox, from the CLI: this one and every later one go through.
    curl = Curl(client, sid, API)
    _, third = curl.held()
    assert cli(audit_db, "approve", third, "--scope", "sandbox").startswith(f"{third} approved (sandbox)")
    assert curl.done().text.strip().endswith("connection=close")
    later = client.call(sid, "shell", {"command": f"curl -sS -m 60 http://{API}/x; true"})
    assert later.text.strip().endswith("connection=close"), later.text
    assert "allowed for this sandbox" in later.meta["egress"][0]["reason"]

    # Nobody answers for another host under the same ask entry: refused after ask_timeout.
    curl = Curl(client, sid, DEST)
    _, fourth = curl.held()
    timed_out = curl.done().text
    assert f"approval {fourth}: {DEST} denied by callbox: no answer in time" in timed_out, timed_out

    with AuditStore(audit_db, create=False) as audit:
        answers = {a.id: (a.state, a.resolved_by, a.scope) for a in audit.list_approvals(None, run_id=sid)}
        assert answers[first] == ("consumed", "grpc:ops", "once")
        assert answers[second][:2] == ("denied", "ann")
        assert answers[third] == ("consumed", "ann", "sandbox")
        assert answers[fourth][:2] == ("denied", "callbox")
        reasons = [e["reason"] for e in audit.egress(sid)]
        assert sum(1 for r in reasons if r and first in r) == 1
