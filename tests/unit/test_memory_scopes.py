"""Which memory a run uses (``[memory]`` scope: project or client), how the tool is offered
(only when the policy names it; Anthropic's own tool type, a plain schema elsewhere), and
that a call goes through the call path: audited, redacted, no sandbox started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.audit.store import AuditStore
from harness.core.calls import ToolCall
from harness.core.formats import tool_definitions
from harness.core.memory import MemoryScope, MemorySettings, dir_name
from harness.core.policy import PolicyError, parse_policy
from harness.core.session import Session
from harness.models.anthropic_messages import AnthropicMessagesModel
from harness.tools import registry_for
from harness.tools.memory import MEMORY

GITHUB = "ghp_" + "Zz09" * 9


def no_engine() -> Any:
    raise AssertionError("the memory tool never starts a sandbox")


def policy_text(root: Path, extra: str = "") -> str:
    return f'[tools.memory]\ndecision = "allow"\n\n[memory]\nroot = "{root}"\n{extra}'


def test_project_scope_is_shared_and_client_scope_is_per_client(tmp_path: Path) -> None:
    project = MemorySettings(root=tmp_path, project="shop")
    assert MemoryScope.of(project, "alice") == MemoryScope.of(project, "bob")
    assert MemoryScope.of(project, "alice").directory == tmp_path / "projects" / "shop"
    per_client = MemorySettings(root=tmp_path, scope="client", project="shop")
    alice, bob, local = (MemoryScope.of(per_client, c) for c in ("alice", "bob", None))
    assert alice.directory == tmp_path / "clients" / "alice" / "shop" and alice.label == "client:alice/shop"
    assert len({alice.directory, bob.directory, local.directory}) == 3
    assert local.directory == tmp_path / "clients" / "local" / "shop"


def test_client_names_become_safe_distinct_directory_names() -> None:
    assert dir_name("alice") == "alice"
    assert dir_name("..") == "%2E%2E" and dir_name(".") == "%2E" and dir_name("a/b") == "a%2Fb"
    assert dir_name("a.b") != dir_name("a%2Eb")
    assert dir_name("x" * 300).startswith("sha256-") and dir_name("") == "%"


def test_default_root_is_the_state_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert MemoryScope.of(MemorySettings(), None).directory == tmp_path / "callbox" / "memory" / "projects" / "default"


def test_the_policy_table_is_checked() -> None:
    with pytest.raises(PolicyError, match=r"memory\.root"):
        parse_policy('[memory]\nroot = "relative/dir"\n')
    with pytest.raises(PolicyError, match=r"memory\.project"):
        parse_policy('[memory]\nproject = "../up"\n')
    with pytest.raises(PolicyError, match=r"memory\.scope"):
        parse_policy('[memory]\nscope = "everyone"\n')
    assert parse_policy('[memory]\nmax_file_bytes = "1k"\n').memory.max_file_bytes == 1024


def test_the_tool_is_offered_only_when_the_policy_names_it(tmp_path: Path) -> None:
    assert "memory" not in registry_for(parse_policy(""))
    assert "memory" not in registry_for(parse_policy(f'[memory]\nroot = "{tmp_path}"\n'))
    assert "memory" in registry_for(parse_policy(policy_text(tmp_path)))
    assert "memory" in registry_for(parse_policy('allowed_tools = ["memory", "shell"]\n'))


def test_plain_and_strict_schemas_and_anthropic_s_own_tool_type() -> None:
    (mcp,) = tool_definitions([MEMORY], "mcp")
    assert mcp["inputSchema"]["required"] == ["command"]
    assert set(mcp["inputSchema"]["properties"]) == {"command", "path", "view_range", "file_text", "old_str",
                                                     "new_str", "insert_line", "insert_text", "old_path", "new_path"}
    (strict,) = tool_definitions([MEMORY], "openai")
    assert strict["strict"] is True and len(strict["parameters"]["required"]) == 10
    model = AnthropicMessagesModel("claude-sonnet-4-5", api_key="k")
    other = registry_for(parse_policy("")).get("shell")
    assert other is not None
    body = model.request(model.start("", "remember"), [other.definition, MEMORY.definition], "auto")
    assert body["tools"][1] == {"type": "memory_20250818", "name": "memory"}
    assert body["tools"][0]["name"] == "shell" and "extra_headers" not in body


def test_a_call_goes_through_the_call_path_without_a_sandbox(tmp_path: Path) -> None:
    policy = parse_policy(policy_text(tmp_path / "mem"))
    with AuditStore(tmp_path / "audit.sqlite3") as audit, Session(
            registry_for(policy), policy, audit, engine_factory=no_engine, client="alice") as session:
        created = session.call(ToolCall("memory", {"command": "create", "path": "/memories/k.md",
                                                   "file_text": f"token {GITHUB}\n"}, "c1"))
        assert not created.is_error, created.text
        viewed = session.call(ToolCall("memory", {"command": "view", "path": "/memories/k.md"}, "c2"))
        escaped = session.call(ToolCall("memory", {"command": "view", "path": "/memories/../../etc"}, "c3"))
        records = audit.calls_for_run(session.run_id)
    assert GITHUB not in viewed.text and "redacted" in viewed.text.lower(), viewed.text
    assert viewed.meta["redactions"] and viewed.structured == {"command": "view", "scope": "project:default"}
    assert escaped.is_error and "`..`" in escaped.text
    assert [r["call_id"] for r in records] == ["c1", "c2", "c3"] and records[0]["tool"] == "memory"
    assert GITHUB not in str(records[1:])  # the stored results hold no secret (c1's arguments do: the model's)
    assert session.active_sandbox is None


def test_the_session_knows_its_client_from_the_run(tmp_path: Path) -> None:
    policy = parse_policy(policy_text(tmp_path / "mem", 'scope = "client"\n'))
    with AuditStore(tmp_path / "audit.sqlite3") as audit:
        audit.start_run("grpc-run", meta={"door": "grpc", "client": "bob"})
        with Session(registry_for(policy), policy, audit, run_id="grpc-run", engine_factory=no_engine) as session:
            assert session.client == "bob" and session.memory.label == "client:bob/default"
            session.call(ToolCall("memory", {"command": "create", "path": "/memories/b", "file_text": "bob's"}, "c"))
        with Session(registry_for(policy), policy, audit, engine_factory=no_engine) as local:
            assert local.client == "local"
            seen = local.call(ToolCall("memory", {"command": "view", "path": "/memories/b"}, "c"))
    assert seen.is_error and "does not exist" in seen.text
    assert (tmp_path / "mem" / "clients" / "bob" / "default" / "memories" / "b").read_text() == "bob's"


def test_policy_path_rules_apply_to_memory_paths(tmp_path: Path) -> None:
    policy = parse_policy(policy_text(tmp_path / "mem") + '\n[[tools.memory.rules]]\naction = "deny"\n'
                          'path = "/memories/private/**"\nreason = "not for the model"\n')
    with AuditStore(tmp_path / "audit.sqlite3") as audit, Session(
            registry_for(policy), policy, audit, engine_factory=no_engine) as session:
        denied = session.call(ToolCall("memory", {"command": "rename", "old_path": "/memories/a",
                                                  "new_path": "/memories/private/a"}, "c1"))
        allowed = session.call(ToolCall("memory", {"command": "create", "path": "/memories/a", "file_text": ""}, "c2"))
    assert denied.is_error and denied.meta["decision"] == "deny" and "not for the model" in denied.text
    assert not allowed.is_error
    assert not (tmp_path / "mem" / "projects" / "default" / "memories" / "private").exists()
