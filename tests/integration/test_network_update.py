"""A sandbox's network rules, set at create and changed while it runs, through the gRPC door
and ``callbox sandbox network``, against the servers of the test destination (``tests/netdest.py``).

The policy's allowlist (``*.callbox.test:8080``) is the ceiling; a client's rules narrow it.
An allowed host answers and a denied one is refused by the egress proxy, before and after
an update, and the update is the ``network`` action in the sandbox's run."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from harness.audit.store import AuditStore
from harness.client import ExecutorClient
from harness.core.policy import parse_policy
from harness.doors.grpc.server import serve_grpc
from harness.doors.grpc.tokens import TokenSet
from harness.engine.docker.engine import DockerEngine
from harness.engine.spec import SandboxSpec
from harness.v1 import executor_pb2, executor_pb2_grpc, sandboxes_pb2, sandboxes_pb2_grpc
from tests.conftest import IMAGE
from tests.integration.helpers import run
from tests.netdest import BANNER, HTTP_PORT

pytestmark = pytest.mark.docker

TOKEN = "token-of-network-update-0123456"
META = (("authorization", f"Bearer {TOKEN}"),)
CEILING = f"*.callbox.test:{HTTP_PORT}"
DEST = f"dest.callbox.test:{HTTP_PORT}"
API = f"api.callbox.test:{HTTP_PORT}"
POLICY = textwrap.dedent(f"""
    [sandbox]
    image = "{IMAGE}"
    network = "allowlist"
    allow_hosts = ["{CEILING}"]
""")
CURL = "curl -sS -m 10 -o /dev/null -w '%{http_code}' http://{}/ ; true"
CALLBOX = str(Path(sys.executable).parent / "callbox")


@pytest.fixture(scope="module")
def door(net_engine: DockerEngine) -> Iterator[tuple[ExecutorClient, AuditStore]]:
    state = Path(tempfile.mkdtemp(prefix="cbx-net-"))
    short = Path(tempfile.mkdtemp(prefix="cbx-", dir="/tmp"))
    audit = AuditStore(state / "audit.sqlite3")
    server = serve_grpc(str(short / "x.sock"), policy=parse_policy(POLICY), audit=audit,
                        tokens=TokenSet({"alice": TOKEN}, source="test tokens"), announce=None,
                        engine_factory=lambda: net_engine)
    client = ExecutorClient(server.target, TOKEN)
    try:
        yield client, audit
    finally:
        client.close()
        server.stop(grace=1)
        audit.close()
        shutil.rmtree(short, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


def status(client: ExecutorClient, sandbox_id: str, host: str) -> str:
    """The HTTP status curl gets for ``host`` in the sandbox (403: the proxy refused it)."""
    return client.call(sandbox_id, "shell", {"command": CURL.replace("{}", host)}).text.strip().splitlines()[-1]


def test_grpc_create_rules_and_update_network(door: tuple[ExecutorClient, AuditStore], destination: Any) -> None:
    client, audit = door
    executor = executor_pb2_grpc.ExecutorStub(client.channel)
    created = executor.CreateSandbox(executor_pb2.CreateSandboxRequest(network_allow=[DEST],
                                                                       network_deny=["0.0.0.0/0"]), metadata=META)
    sid = created.sandbox_id
    stub = sandboxes_pb2_grpc.SandboxesStub(client.channel)
    try:
        assert status(client, sid, DEST).endswith("200")
        assert status(client, sid, API).endswith("403")
        rules = stub.UpdateNetwork(sandboxes_pb2.UpdateNetworkRequest(sandbox_id=sid, allow=[API],
                                                                      deny=["0.0.0.0/0"]), metadata=META)
        assert (rules.network, list(rules.allow_hosts), list(rules.allow)) == ("allowlist", [CEILING], [API])
        assert status(client, sid, API).endswith("200")  # the next request already sees the new rules
        assert status(client, sid, DEST).endswith("403")
        # Beyond the ceiling: the rule is kept but reaches nothing more than the policy's allowlist.
        stub.UpdateNetwork(sandboxes_pb2.UpdateNetworkRequest(sandbox_id=sid, allow=["example.org"],
                                                              deny=["0.0.0.0/0"]), metadata=META)
        refused = client.call(sid, "shell", {"command": "curl -sS -m 10 http://example.org/ ; true"}).text
        assert "not in this sandbox's allowlist" in refused, refused
        with pytest.raises(grpc.RpcError) as bad:
            stub.UpdateNetwork(sandboxes_pb2.UpdateNetworkRequest(sandbox_id=sid, allow=["*bad*"]), metadata=META)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad.value  # type: ignore[attr-defined]
        actions = [c for c in audit.calls_for_run(sid) if c["tool"] == "sandbox.network"]
        assert len(actions) == 3 and actions[0]["state"] == "done", actions
    finally:
        client.delete_sandbox(sid)


def test_callbox_sandbox_network_changes_a_named_sandbox(net_engine: DockerEngine, destination: Any,
                                                          tmp_path: Path) -> None:
    name = f"net-{secrets.token_hex(3)}"
    box = net_engine.create(SandboxSpec(image=IMAGE, network="allowlist", allow_hosts=(CEILING,)), name=name)
    env = {**os.environ, "CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}

    def cli(*args: str) -> Any:
        done = subprocess.run([CALLBOX, "sandbox", "network", name, *args, "--json"], capture_output=True,
                              env=env, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def reach(host: str) -> str:
        return run(box, ["sh", "-c", CURL.replace("{}", host)], env=box.spec.env).stdout.data().decode()

    try:
        assert reach(API) == "200"
        changed = cli("--deny", "api.callbox.test")
        assert changed["deny"] == ["api.callbox.test"] and "narrowed" in changed["summary"]
        assert reach(API) == "403"
        assert reach(DEST) == "200"
        assert cli()["deny"] == ["api.callbox.test"]  # no rule flag: shows them
        assert cli("--clear")["deny"] == []
        assert reach(API) == "200"
        body = run(box, ["curl", "-sS", "-m", "10", f"http://{DEST}/x"], env=box.spec.env).stdout.data().decode()
        assert body.startswith(BANNER)
    finally:
        box.destroy()
