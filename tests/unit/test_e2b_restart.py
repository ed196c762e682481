"""What the E2B door decides when it adopts a sandbox after a restart, without a container:
its access tokens (digests only in the audit store, the old ones still accepted, a bounded
record), its door state read back from the run meta, and the template it starts from."""

from __future__ import annotations

import json
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.audit.store import AuditStore
from harness.core.policy import parse_policy
from harness.doors.e2b import restart
from harness.doors.e2b.access_tokens import ENVD_TOKENS, TRAFFIC_TOKENS, token_digest
from harness.doors.e2b.boxes import DEFAULT_TEMPLATE, E2bSandbox, E2bSandboxes
from harness.doors.grpc.overrides import SandboxOverrides
from harness.doors.grpc.service import ExecutorService
from harness.doors.grpc.sessions import ClientSession
from harness.doors.grpc.tokens import TokenSet
from harness.tools import registry_for


@pytest.fixture
def sandboxes(tmp_path: Path) -> Iterator[E2bSandboxes]:
    policy = parse_policy('[sandbox]\nimage = "callbox-sandbox:latest"\n')
    with AuditStore(tmp_path / "audit.sqlite3") as audit:
        executor = ExecutorService(registry=registry_for(policy), policy=policy, audit=audit,
                                   tokens=TokenSet({"alice": "k" * 32}, source="test"),
                                   engine_factory=lambda: None)  # type: ignore[arg-type,return-value]
        try:
            yield E2bSandboxes(executor)
        finally:
            executor.shutdown()


def _session(run_id: str, env: dict[str, str] | None = None) -> ClientSession:
    harness: Any = types.SimpleNamespace(run_id=run_id, active_sandbox=None)
    return ClientSession("alice", harness, parse_policy(""), [], 300, SandboxOverrides(env=env or {}))


def test_a_sandbox_accepts_its_token_and_those_handed_out_before_by_digest() -> None:
    sandbox = E2bSandbox(session=_session("e2b-1"), template_id="base", access_token="new-token",
                         token_digests=(token_digest("old-token"), token_digest("new-token")))
    assert sandbox.accepts("new-token") and sandbox.accepts("old-token")
    assert not sandbox.accepts("other-token") and not sandbox.accepts(token_digest("old-token"))


def test_an_adopted_sandbox_gets_a_new_token_its_door_state_and_a_bounded_digest_record(
        sandboxes: E2bSandboxes) -> None:
    run_id = sandboxes.audit.start_run("e2b-x", meta={"door": "e2b", "client": "alice"})
    old = [token_digest(f"t{i}") for i in range(restart.MAX_TOKENS)]
    sandboxes.audit.update_run_meta(run_id, {"template": "base", "metadata": {"suite": "s"}, "started_at": 123.5,
                                             ENVD_TOKENS: old, TRAFFIC_TOKENS: [token_digest("port-token")],
                                             "public_ports": True})
    run = sandboxes.audit.get_run(run_id)
    session = _session(run_id, {"GREETING": "hi"})
    restart.e2b_hooks(sandboxes).adopted(session, run)
    sandbox = sandboxes.find(run_id)
    assert sandbox is not None and sandbox.session is session
    assert (sandbox.template_id, sandbox.metadata, sandbox.env_vars, sandbox.started_at) == (
        "base", {"suite": "s"}, {"GREETING": "hi"}, 123.5)
    recorded = sandboxes.audit.get_run(run_id).meta[ENVD_TOKENS]
    assert recorded == [*old[1:], token_digest(sandbox.access_token)]  # the oldest dropped
    assert sandbox.access_token not in json.dumps(sandboxes.audit.get_run(run_id).meta)
    assert sandbox.accepts("t1") and not sandbox.accepts("t0")
    # The ports' traffic token too: a new one, and the one a client got before still works.
    meta = sandboxes.audit.get_run(run_id).meta
    assert meta[TRAFFIC_TOKENS] == [token_digest("port-token"), token_digest(sandbox.traffic_access_token)]
    assert sandbox.traffic_access_token not in json.dumps(meta)
    assert sandbox.accepts_traffic("port-token") and sandbox.accepts_traffic(sandbox.traffic_access_token)
    assert not sandbox.accepts_traffic("t1") and not sandbox.accepts_traffic(token_digest("port-token"))
    assert sandbox.public_ports  # as it was created


def test_a_run_without_door_state_gets_defaults_and_an_unknown_template_no_policy(sandboxes: E2bSandboxes) -> None:
    run_id = sandboxes.audit.start_run("e2b-y", meta={"door": "e2b", "client": "alice"})
    run = sandboxes.audit.get_run(run_id)
    hooks = restart.e2b_hooks(sandboxes)
    assert hooks.door == "e2b"
    assert hooks.base_policy(run) is sandboxes.templates[DEFAULT_TEMPLATE]
    hooks.adopted(_session(run_id), run)
    sandbox = sandboxes.find(run_id)
    assert sandbox is not None
    assert (sandbox.template_id, sandbox.metadata, sandbox.started_at) == (DEFAULT_TEMPLATE, {}, run.created)
    assert not sandbox.public_ports
    sandboxes.audit.update_run_meta(run_id, {"template": "gone"})
    assert hooks.base_policy(sandboxes.audit.get_run(run_id)) is None  # destroyed, run ends policy_changed
