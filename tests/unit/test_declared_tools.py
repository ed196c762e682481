"""Declared tools (``[[tool]]``): the model, load errors, rendering, schemas, rules, registry."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from harness.core.calls import Action
from harness.core.formats import FORMATS, tool_definitions
from harness.core.policy import Policy, PolicyError
from harness.core.validation import CallRejected, validate_call
from harness.tools import builtin_registry, registry_for
from harness.tools.declared.command import render_argv, render_env
from tests.support.declared_policies import load, problem

RUN_TESTS = """
[[tool]]
name = "run_tests"
description = "Run the project's unit tests."
kind = "command"
argv = ["python3", "-m", "unittest", "-v", "{pattern}"]
[tool.arguments.pattern]
type = "string"
description = "A test module or pattern."
required = true
"""


def python_tool(pytools: Path, extra: str = "") -> str:
    return f"""
[[tool]]
name = "add"
kind = "python"
function = "tools:add"
path = "/srv/pytools"
mounts = [{{ source = "{pytools}", target = "/srv/pytools", mode = "ro" }}]
{extra}
"""


# ---- the model -----------------------------------------------------------------------------------


def test_the_contract_example_loads(tmp_path: Path) -> None:
    policy = load(RUN_TESTS + python_tool(tmp_path))
    assert [t.name for t in policy.tool] == ["run_tests", "add"]
    assert policy.tool[0].argument_specs["pattern"].required
    assert [m.target for m in policy.sandbox_spec().mounts] == ["/srv/pytools"]
    registry = registry_for(policy)
    assert registry.names()[-2:] == ["run_tests", "add"]
    assert registry.get("add").definition.description == "Call the Python function tools:add in the sandbox."  # type: ignore[union-attr]


def test_the_policy_round_trips_through_json(tmp_path: Path) -> None:
    # A paused run's checkpoint keeps its policy as JSON and rebuilds it from there.
    policy = load(RUN_TESTS + python_tool(tmp_path, 'parameters = { type = "object", properties = '
                                                     '{ a = { type = "integer" } }, required = ["a"] }'))
    again = Policy.model_validate(policy.model_dump(mode="json"))
    assert again.tool == policy.tool
    assert registry_for(again).names() == registry_for(policy).names()


@pytest.mark.parametrize(("text", "expected"), [
    (RUN_TESTS + 'shell = "x"\n', "unexpected key 'tool[0].arguments.pattern.shell'"),
    (RUN_TESTS.replace('kind = "command"', 'kind = "command"\ncmd = "x"'), "unexpected key 'tool[0].cmd'"),
    (RUN_TESTS.replace('kind = "command"', 'kind = "command"\nfunction = "a:b"'),
     "key 'function' is for kind = \"python\" tools, not \"command\""),
    (RUN_TESTS.replace("{pattern}", "{patern}"), "argv[4] uses {patern}, which is not an argument"),
    (RUN_TESTS.replace('"{pattern}"', '"tests"'), "argument 'pattern' is used nowhere"),
    (RUN_TESTS.replace('"python3"', '"{pattern}"'), "argv[0] '{pattern}' must name the program itself"),
    (RUN_TESTS.replace('"{pattern}"', '"{pattern"'), "stray '{'"),
    (RUN_TESTS + RUN_TESTS, "tool[0] and tool[1] are both named 'run_tests'"),
    (RUN_TESTS.replace('name = "run_tests"', 'name = "shell"'),
     "key 'tool[0].name': 'shell' is the name of a built-in tool; give the declared tool another name"),
    (RUN_TESTS.replace("required = true", 'required = true\ndefault = "x"'), "a required argument has no default"),
    (RUN_TESTS.replace('type = "string"', 'type = "integer"\nenum = ["a"]'), "enum value 'a' is not a integer"),
    (RUN_TESTS + 'parameters = { type = "object" }\n', "unexpected key 'tool[0].arguments.pattern.parameters'"),
    (RUN_TESTS.replace("[tool.arguments.pattern]", 'parameters = { type = "object" }\n[tool.arguments.pattern]'),
     "not both"),
    (RUN_TESTS.replace("[tool.arguments.pattern]", "[tool.arguments.json]").replace("{pattern}", "{json}"),
     "argument name 'json' is reserved"),
    ('[[tool]]\nname = "t"\nkind = "command"\nargv = ["ls", "{xs}"]\n'
     'parameters = { type = "object", properties = { xs = { type = "array", items = { type = "integer" } } } }',
     'an array argument is a list of strings'),
    ('[[tool]]\nname = "t"\nkind = "command"\nargv = ["ls", "--x={xs}"]\n[tool.arguments.xs]\ntype = "array"\n',
     'the array argument \'xs\' can only fill whole argv elements'),
    ('[[tool]]\nname = "t"\nkind = "command"\nargv = ["ls", "{a}"]\n'
     'parameters = { type = "object", properties = { a = { type = "string", minLength = 1 } } }',
     "keyword 'minLength' is not supported"),
    ('[[tool]]\nname = "t"\nkind = "command"\n', 'needs argv = ["PROGRAM", "ARG", ...]'),
    ('[[tool]]\nname = "t"\nkind = "python"\nfunction = "tools"\npath = "/srv"', 'needs function = "module:function"'),
    ('[[tool]]\nname = "t"\nkind = "python"\nfunction = "tools:f"\npath = "/srv/x"',
     "key 'tool[0].path': /srv/x is in no mount"),
    ('[[tool]]\nname = "t"\nkind = "shell"\nargv = ["ls"]', "key 'tool[0].kind' must be"),
])
def test_load_errors_name_the_key_and_the_fix(text: str, expected: str) -> None:
    assert expected in problem(text)


def test_a_missing_mount_source_fails_at_load(tmp_path: Path) -> None:
    message = problem(python_tool(tmp_path / "absent"))
    assert "key 'tool[0].mounts[0].source'" in message and "absent" in message


def test_a_python_tool_needs_its_code_read_only(tmp_path: Path) -> None:
    text = python_tool(tmp_path).replace('mode = "ro"', 'mode = "rw"')
    assert 'mount the code of a python tool with mode = "ro"' in problem(text)


def test_relative_mount_sources_are_taken_against_the_policy_file(tmp_path: Path) -> None:
    (tmp_path / "pytools").mkdir()
    policy = load(python_tool(Path("pytools")), base_dir=tmp_path)
    assert policy.sandbox_spec().mounts[0].source == tmp_path / "pytools"


def test_tools_sharing_a_mount_mount_it_once_and_a_clash_is_refused(tmp_path: Path) -> None:
    second = python_tool(tmp_path).replace('name = "add"', 'name = "mul"')
    policy = load(python_tool(tmp_path) + second)
    assert len(policy.sandbox_spec().mounts) == 1
    other = tmp_path / "other"
    other.mkdir()
    clash = python_tool(tmp_path) + python_tool(other).replace('name = "add"', 'name = "mul"')
    assert "tool[1].mounts[0] and tool[0].mounts[0] both mount at /srv/pytools" in problem(clash)


def test_a_rw_tool_mount_is_a_loosening(tmp_path: Path) -> None:
    text = RUN_TESTS.replace('kind = "command"', f'kind = "command"\nmounts = [{{ source = "{tmp_path}", '
                                                 'target = "/workspace/project", mode = "rw" }]')
    tmp_path.chmod(0o777)  # writable by the tool user, whoever owns it
    policy = load(text)
    assert any(note.startswith("tool[0].mounts[0] mounts") for note in policy.loosened())


def test_mounts_of_tools_allowed_tools_leaves_out_are_not_mounted(tmp_path: Path) -> None:
    policy = load('allowed_tools = ["shell"]\n' + python_tool(tmp_path))
    assert policy.sandbox_spec().mounts == ()


# ---- rendering -----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["; rm -rf /", "$(touch /tmp/x)", "`id`", "a b\nc", "'\"", "-rf", ""])
def test_a_whole_element_placeholder_is_one_literal_element(value: str) -> None:
    assert render_argv(["python3", "-m", "unittest", "{p}"], {"p": value}) == ["python3", "-m", "unittest", value]


def test_placeholders_inside_an_element_are_text_and_braces_escape() -> None:
    argv = ["prog", "--k={k}", "{{literal}}", "{a}-{b}"]
    assert render_argv(argv, {"k": "x; y", "a": 1, "b": True}) == ["prog", "--k=x; y", "{literal}", "1-true"]


def test_an_array_argument_expands_and_an_absent_optional_drops_its_element() -> None:
    argv = ["prog", "{files}", "--filter={f}", "{g}", "end"]
    assert render_argv(argv, {"files": ["a b", "$(c)"], "f": None, "g": None}) == ["prog", "a b", "$(c)", "end"]
    assert render_argv(argv, {"files": [], "f": "x", "g": 0}) == ["prog", "--filter=x", "0", "end"]


def test_env_values_are_filled_and_absent_ones_left_out() -> None:
    rendered = render_env({"A": "{a}", "B": "x{b}", "C": "plain"}, {"a": "$(id)", "b": None})
    assert rendered == {"A": "$(id)", "C": "plain"}


# ---- schemas, validation and rules ------------------------------------------------------------


TYPED = """
[[tool]]
name = "lint"
kind = "command"
argv = ["ruff", "check", "{paths}", "--line-length={width}", "--fix={fix}", "--select={rule}"]
env = { LINT_MODE = "{mode}" }
[tool.annotations]
read_only = true
destructive = false
idempotent = true
[tool.arguments.paths]
type = "array"
required = true
[tool.arguments.width]
type = "integer"
default = 100
[tool.arguments.fix]
type = "boolean"
[tool.arguments.rule]
type = "string"
enum = ["E", "F"]
[tool.arguments.mode]
type = "number"
description = "A number."
"""


def test_typed_arguments_give_every_format_its_schema() -> None:
    registry = registry_for(load(TYPED))
    tool = registry.get("lint")
    assert tool is not None
    strict = tool.definition.input_schema("strict")
    assert strict["required"] == ["paths", "width", "fix", "rule", "mode"]
    assert strict["properties"]["paths"] == {"type": "array", "items": {"type": "string"}}
    assert strict["properties"]["rule"] == {"anyOf": [{"type": "string", "enum": ["E", "F"]}, {"type": "null"}]}
    plain = tool.definition.input_schema("plain")
    assert plain["required"] == ["paths"]
    assert plain["properties"]["width"] == {"type": "integer", "default": 100}
    assert plain["properties"]["rule"] == {"type": "string", "enum": ["E", "F"]}
    assert plain["properties"]["mode"] == {"type": "number", "description": "A number."}
    for fmt in FORMATS:
        [shown] = tool_definitions([tool], fmt)
        assert "lint" in json.dumps(shown)
    [mcp] = tool_definitions([tool], "mcp")
    assert mcp["annotations"]["readOnlyHint"] is True and mcp["annotations"]["idempotentHint"] is True
    [openai] = tool_definitions([tool], "openai")
    assert openai["strict"] is True


def test_arguments_are_validated_strictly() -> None:
    tool = registry_for(load(TYPED)).get("lint")
    assert tool is not None
    with pytest.raises(CallRejected):
        validate_call(tool.definition, {"paths": ["a"], "extra": 1})
    with pytest.raises(CallRejected):
        validate_call(tool.definition, {"paths": ["a"], "rule": "X"})
    args = validate_call(tool.definition, {"paths": ["a", "b"], "fix": None})
    assert args.model_dump() == {"paths": ["a", "b"], "width": 100, "fix": None, "rule": None, "mode": None}


def test_command_rules_match_the_rendered_argv() -> None:
    text = RUN_TESTS + """
[[tools.run_tests.rules]]
action = "deny"
command = "*rm -rf*"
[[tools.run_tests.rules]]
action = "ask"
command = "python3 -m unittest -v tests.test_slow"
"""
    policy = load(text)
    registry = registry_for(policy)
    policy.check_tools(t.definition for t in registry.tools())
    definition = registry.get("run_tests").definition  # type: ignore[union-attr]
    assert definition.command_of is not None
    assert definition.command_of({"pattern": "a b"}) == shlex.join(["python3", "-m", "unittest", "-v", "a b"])

    def decide(pattern: str) -> Action:
        return policy.decide(definition, validate_call(definition, {"pattern": pattern})).action

    assert decide("; rm -rf /") is Action.DENY
    assert decide("tests.test_slow") is Action.ASK
    assert decide("tests") is Action.ALLOW
    # a dict of arguments (as the policy is asked without a validated model) renders the same
    assert policy.decide(definition, {"pattern": "x; rm -rf /"}).action is Action.DENY


def test_decisions_and_allowed_tools_apply_to_declared_tools(tmp_path: Path) -> None:
    policy = load('allowed_tools = ["run_tests"]\n' + RUN_TESTS + '[tools.run_tests]\ndecision = "ask"\n')
    registry = registry_for(policy)
    policy.check_tools(t.definition for t in registry.tools())
    assert registry.exposed_names(policy) == ["run_tests"]
    assert policy.decide(registry.get("run_tests").definition, {"pattern": "x"}).action is Action.ASK  # type: ignore[union-attr]


def test_a_command_rule_on_a_python_tool_is_refused(tmp_path: Path) -> None:
    policy = load(python_tool(tmp_path) + '[[tools.add.rules]]\naction = "deny"\ncommand = "*"\n')
    with pytest.raises(PolicyError, match="is a command rule, but 'add' takes no command"):
        policy.check_tools(t.definition for t in registry_for(policy).tools())


def test_without_declared_tools_the_registry_is_the_builtin_one() -> None:
    assert registry_for(Policy()).names() == builtin_registry(python=False, computer=False, browser=False).names()


def test_the_readme_example_loads_and_decides_as_documented(tmp_path: Path) -> None:
    from tests.doc_examples import block_with

    block = block_with("toml", 'name = "run_tests"', 'name = "add"').body
    (tmp_path / "project").mkdir()
    (tmp_path / "pytools").mkdir()
    policy = load(block, base_dir=tmp_path)
    registry = registry_for(policy)
    policy.check_tools(t.definition for t in registry.tools())
    definition = registry.get("run_tests").definition  # type: ignore[union-attr]
    assert policy.decide(definition, {"pattern": "; rm -rf /"}).action is Action.DENY
    assert policy.decide(definition, {"pattern": "test_math"}).action is Action.ALLOW
    assert [m.target for m in policy.sandbox_spec().mounts] == ["/workspace/project", "/srv/pytools"]
    assert registry.get("add").definition.input_schema("plain")["required"] == ["a", "b"]  # type: ignore[union-attr]
