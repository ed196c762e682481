"""``kind = "mcp"`` without a sandbox: the table's checks, tool names, the argument check
against a server's inputSchema, the schema forms, result mapping, and ``[tools."PREFIX__*"]``
globs in the policy."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from harness.core.calls import ErrorCode
from harness.core.declared_mcp import check_value, mcp_tool_name, schema_problem
from harness.core.policy import Policy, PolicyError, load_policy
from harness.core.validation import CallRejected, validate_call
from harness.tools.declared.mcp import call_result, mcp_tools


def _load(tmp_path: Path, text: str) -> Policy:
    path = tmp_path / "test.toml"
    path.write_text(text)
    return load_policy(path)


def _problem(tmp_path: Path, text: str) -> str:
    with pytest.raises(PolicyError) as caught:
        _load(tmp_path, text)
    return str(caught.value)


MCP_TABLE = '[[tool]]\nname = "git"\nkind = "mcp"\ncommand = ["python3", "-m", "mcp_server_git"]\n'


def test_an_mcp_table_loads(tmp_path: Path) -> None:
    policy = _load(tmp_path, MCP_TABLE + 'env = { PYTHONPATH = "/srv/mcp-git" }\n')
    [tool] = policy.tool
    assert tool.kind == "mcp" and tool.command == ("python3", "-m", "mcp_server_git")


@pytest.mark.parametrize(("text", "expected"), [
    ('[[tool]]\nname = "git"\nkind = "mcp"\n', 'needs command = ["PROGRAM", "ARG", ...]'),
    (MCP_TABLE + 'argv = ["x"]\n', "key 'argv' is for kind = \"command\" tools"),
    (MCP_TABLE + '[tool.arguments.a]\ntype = "string"\n', "the ones its server lists"),
    ('[[tool]]\nname = "a__b"\nkind = "mcp"\ncommand = ["x"]\n', "cannot contain '__'"),
    ('[[tool]]\nname = "t"\nkind = "command"\nargv = ["ls"]\ncommand = ["x"]\n',
     "key 'command' is for kind = \"mcp\" tools"),
])
def test_bad_mcp_tables_name_the_fix(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in _problem(tmp_path, text)


def test_tool_names() -> None:
    assert mcp_tool_name("git", "git_status") == "git__git_status"
    assert mcp_tool_name("git", "bad name") is None
    assert mcp_tool_name("git", "x" * 60) is None


SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "repo_path": {"type": "string", "title": "Repo Path"},
        "max_count": {"type": "integer", "default": 10, "minimum": 1},
        "files": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "mode": {"enum": ["soft", "hard"]},
        "target": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        "opts": {"$ref": "#/$defs/Opts"},
    },
    "required": ["repo_path"],
    "$defs": {"Opts": {"type": "object", "properties": {"quiet": {"type": "boolean"}},
                       "additionalProperties": False}},
}


@pytest.mark.parametrize(("value", "problem"), [
    ({"repo_path": "/r"}, None),
    ({"repo_path": "/r", "max_count": 3, "files": ["a"], "mode": "soft", "target": None, "opts": {"quiet": True}},
     None),
    ({}, "missing required argument 'repo_path'"),
    ({"repo_path": 3}, "argument 'repo_path' must be string"),
    ({"repo_path": "/r", "max_count": 0}, "argument 'max_count' must be at least 1"),
    ({"repo_path": "/r", "max_count": True}, "argument 'max_count' must be integer"),
    ({"repo_path": "/r", "files": []}, "argument 'files' must have at least 1 items"),
    ({"repo_path": "/r", "files": [1]}, "argument 'files[0]' must be string"),
    ({"repo_path": "/r", "mode": "mixed"}, "argument 'mode' must be one of 'soft', 'hard'"),
    ({"repo_path": "/r", "target": 5}, "argument 'target' fits none of the allowed forms"),
    ({"repo_path": "/r", "opts": {"loud": True}}, "unexpected argument 'opts.loud' (allowed: quiet)"),
])
def test_arguments_are_checked_against_the_servers_schema(value: dict[str, Any], problem: str | None) -> None:
    assert schema_problem(SCHEMA) is None
    problems = check_value(SCHEMA, value, SCHEMA)
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems


def test_a_schema_with_a_keyword_callbox_cannot_check_is_refused() -> None:
    assert schema_problem({"type": "object", "properties": {"x": {"not": {}}}}) == (
        "inputSchema.properties.x uses the JSON Schema keyword 'not', which callbox cannot check")
    assert schema_problem({"type": "array"}) == 'inputSchema is not type "object"'
    assert schema_problem({"type": "object", "properties": {"x": {"$ref": "http://x/s.json"}}}) is not None


def _listed(schema: dict[str, Any], name: str = "git_log") -> list[dict[str, Any]]:
    return [{"name": name, "description": "Show the log.", "inputSchema": schema,
             "annotations": {"readOnlyHint": True, "title": "Log"}}]


def test_a_listed_tool_becomes_a_registered_tool_in_both_schema_forms(tmp_path: Path) -> None:
    declared = _load(tmp_path, MCP_TABLE).tool[0]
    [tool] = mcp_tools(declared, _listed(SCHEMA))
    definition = tool.definition
    assert definition.name == "git__git_log" and definition.description == "Show the log."
    assert definition.annotations.read_only and not definition.annotations.destructive
    assert definition.annotations.title == "Log"
    plain = definition.input_schema("plain")
    assert plain["required"] == ["repo_path"]
    assert plain["properties"]["max_count"] == {"type": "integer", "minimum": 1, "default": 10}
    strict = definition.input_schema("strict")
    assert set(strict["required"]) == set(SCHEMA["properties"])
    assert strict["additionalProperties"] is False
    # The validated arguments reach the server as the model sent them.
    args = validate_call(definition, {"repo_path": "/r", "max_count": 2})
    assert args.arguments() == {"repo_path": "/r", "max_count": 2}  # type: ignore[attr-defined]
    with pytest.raises(CallRejected) as rejected:
        validate_call(definition, {"max_count": "x"})
    assert rejected.value.code is ErrorCode.INVALID_ARGUMENTS
    assert "repo_path" in str(rejected.value)


def test_a_schema_strict_mode_cannot_describe_is_offered_as_the_server_wrote_it(tmp_path: Path) -> None:
    declared = _load(tmp_path, MCP_TABLE).tool[0]
    free = {"type": "object", "properties": {"labels": {"type": "object"}}, "required": ["labels"]}
    [tool] = mcp_tools(declared, _listed(free, "tag"))
    assert tool.definition.input_schema("plain") == free
    args = validate_call(tool.definition, {"labels": {"any": ["thing"]}})
    assert args.arguments() == {"labels": {"any": ["thing"]}}  # type: ignore[attr-defined]


def test_unmappable_names_and_schemas_are_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    declared = _load(tmp_path, MCP_TABLE).tool[0]
    tools = mcp_tools(declared, [*_listed(SCHEMA, "bad name"), *_listed({"type": "object", "not": {}}, "odd"),
                                 *_listed(SCHEMA, "ok")])
    assert [t.name for t in tools] == ["git__ok"]
    assert "skipped 'bad name'" in caplog.text and "keyword 'not'" in caplog.text


def test_results_map_text_structured_content_and_errors() -> None:
    ok = call_result({"content": [{"type": "text", "text": "a"}, {"type": "image", "mimeType": "image/png",
                                                                  "data": "AAAA"}],
                      "structuredContent": {"n": 1}})
    assert not ok.is_error and ok.text == "a\n[image image/png, 4 base64 characters]" and ok.structured == {"n": 1}
    failed = call_result({"content": [{"type": "text", "text": "no such repo"}], "isError": True})
    assert failed.is_error and failed.error is ErrorCode.TOOL_FAILED and failed.text == "no such repo"
    only_structured = call_result({"content": [], "structuredContent": {"n": 2}})
    assert only_structured.text == '{"n": 2}'


def test_an_image_the_server_returns_is_a_picture_of_the_result() -> None:
    png = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de"
                        "0000000c4944415478da63f8cfc0000003010100c9fe92ef0000000049454e44ae426082")
    got = call_result({"content": [{"type": "text", "text": "shot"},
                                   {"type": "image", "mimeType": "image/png", "data": base64.b64encode(png).decode()}]},
                      "browser")
    assert got.text == "shot" and len(got.images) == 1
    assert (got.images[0].data, got.images[0].width, got.images[0].label) == (png, 1, "from the MCP server browser")


class _Target:
    def __init__(self, name: str) -> None:
        self.name = name
        self.command_field: str | None = None
        self.path_fields: tuple[str, ...] = ()
        self.command_of = None


def test_glob_entries_decide_an_mcp_servers_tools(tmp_path: Path) -> None:
    policy = _load(tmp_path, MCP_TABLE + '[tools."git__*"]\ndecision = "ask"\n[tools.git__git_status]\n'
                                         'decision = "allow"\n[tools."git__git_d*"]\ndecision = "deny"\n')
    status, log, diff = _Target("git__git_status"), _Target("git__git_log"), _Target("git__git_diff")
    policy.check_tools([status, log, diff])
    assert policy.decide(status, {}).action.value == "allow"
    asked = policy.decide(log, {})
    assert asked.action.value == "ask" and 'tools."git__*".decision' in asked.rule
    assert policy.decide(diff, {}).action.value == "deny"  # the longer glob wins
    assert policy.decide(_Target("shell"), {}).action.value == "allow"


def test_a_glob_matching_no_tool_is_refused(tmp_path: Path) -> None:
    policy = _load(tmp_path, MCP_TABLE + '[tools."gti__*"]\ndecision = "deny"\n')
    with pytest.raises(PolicyError, match=r'\[tools."gti__\*"\] is a glob that matches no registered tool'):
        policy.check_tools([_Target("git__git_status")])


def test_a_glob_key_must_be_a_tool_name_pattern(tmp_path: Path) -> None:
    assert "is not a tool name" in _problem(tmp_path, '[tools."git /*"]\ndecision = "deny"\n')


def test_an_mcp_tables_mounts_count_when_allowed_tools_names_its_tools(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    text = ('allowed_tools = ["git__git_status"]\n' + MCP_TABLE
            + f'mounts = [{{ source = "{site}", target = "/srv/mcp-git", mode = "ro" }}]\n')
    policy = _load(tmp_path, text)
    assert [m.target for _, m in policy.mount_settings()] == ["/srv/mcp-git"]
