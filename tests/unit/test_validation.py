"""Argument validation: every rejection and the exact words the model reads."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field

from harness.core.calls import ErrorCode
from harness.core.validation import (
    CallRejected,
    check_call_id,
    parse_arguments,
    render_path,
    validate_call,
)
from harness.tools import builtin_registry
from harness.tools.computer import ACTION_NEEDS, SCREEN_HEIGHT, SCREEN_WIDTH


class ShellArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: str
    workdir: str | None = None
    timeout_ms: int = Field(default=30000, ge=1)


class FileSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str
    mode: str = "r"


class BatchArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    files: list[FileSpec]
    choice: int | list[str] = 1
    label: str = Field(default="x", max_length=5)


@dataclass(frozen=True)
class Definition:
    name: str
    input_model: type[BaseModel]


SHELL = Definition("shell", ShellArgs)
BATCH = Definition("batch", BatchArgs)


def rejected(definition: Definition, raw: Any, **kw: Any) -> CallRejected:
    with pytest.raises(CallRejected) as info:
        validate_call(definition, raw, **kw)
    return info.value


# ---- accepted calls ---------------------------------------------------------------------


def test_valid_text_becomes_the_model() -> None:
    args = validate_call(SHELL, '{"command": "ls -la", "timeout_ms": 5000}')
    assert args == ShellArgs(command="ls -la", timeout_ms=5000)


def test_valid_object_becomes_the_model() -> None:
    args = validate_call(SHELL, {"command": "ls", "workdir": "/tmp"})
    assert args == ShellArgs(command="ls", workdir="/tmp")


@pytest.mark.parametrize("raw", ['{"command": "ls", "workdir": null, "timeout_ms": null}',
                                 {"command": "ls", "workdir": None, "timeout_ms": None}])
def test_null_means_the_default(raw: Any) -> None:
    # The strict schema makes optional fields nullable: null is "use the default".
    # The plain schema lets them be left out; a caller may still send null.
    args = validate_call(SHELL, raw)
    assert isinstance(args, ShellArgs)
    assert args.timeout_ms == 30000
    assert args.workdir is None


def test_null_for_a_nested_model_field_means_its_default() -> None:
    args = validate_call(BATCH, '{"files": [{"path": "a", "mode": null}], "choice": null, "label": null}')
    assert args == BatchArgs(files=[FileSpec(path="a")])


def test_null_for_a_required_field_is_still_an_error() -> None:
    exc = rejected(SHELL, '{"command": null}')
    assert exc.message == "invalid arguments for tool 'shell': argument 'command' must be a string, got null"


def test_parse_arguments_returns_a_plain_dict_copy() -> None:
    given = {"a": [1, {"b": "c"}]}
    out = parse_arguments(given)
    assert out == given
    assert out is not given


# ---- JSON -------------------------------------------------------------------------------


def test_invalid_json_quotes_the_parser_position() -> None:
    exc = rejected(SHELL, '{"command": "ls" "x"}')
    assert exc.code is ErrorCode.INVALID_JSON
    assert exc.message == "arguments are not valid JSON: Expecting ',' delimiter at line 1 column 18"


def test_invalid_json_position_on_a_later_line() -> None:
    exc = rejected(SHELL, '{\n  "command": \n}')
    assert exc.message == "arguments are not valid JSON: Expecting value at line 3 column 1"


def test_empty_arguments() -> None:
    exc = rejected(SHELL, "  ")
    assert exc.code is ErrorCode.INVALID_JSON
    assert exc.message == "arguments are empty; send a JSON object (use {} when the tool takes no arguments)"


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_json_constants_are_refused(constant: str) -> None:
    exc = rejected(SHELL, f'{{"command": "ls", "timeout_ms": {constant}}}')
    assert exc.code is ErrorCode.INVALID_JSON
    assert exc.message == f"arguments are not valid JSON: {constant} is not a JSON value"


def test_integer_too_long_to_convert() -> None:
    exc = rejected(SHELL, '{"command": "ls", "timeout_ms": ' + "9" * 5000 + "}")
    assert exc.code is ErrorCode.INVALID_ARGUMENTS
    assert exc.message.startswith("arguments contain an integer with more than ")
    assert exc.message.endswith(" digits; send it as a string if it must be that long")


def test_raw_control_character_in_text_is_invalid_json() -> None:
    exc = rejected(SHELL, '{"command": "a\x00b"}')
    assert exc.code is ErrorCode.INVALID_JSON
    assert exc.message == "arguments are not valid JSON: Invalid control character at at line 1 column 15"


@pytest.mark.parametrize(
    ("raw", "kind"),
    [("[1, 2]", "an array"), ('"ls"', "a string"), ("null", "null"), ("3", "a number"), ("true", "a boolean")],
)
def test_arguments_must_be_an_object(raw: str, kind: str) -> None:
    exc = rejected(SHELL, raw)
    assert exc.code is ErrorCode.INVALID_ARGUMENTS
    assert exc.message == f'arguments must be a JSON object like {{"name": value, ...}}, got {kind}'


def test_arguments_of_another_python_type() -> None:
    exc = rejected(SHELL, ["ls"])
    assert exc.code is ErrorCode.INVALID_ARGUMENTS
    assert exc.message == "arguments must be a JSON object (or its JSON text), got an array"


# ---- size -------------------------------------------------------------------------------


def test_size_limit_counts_utf8_bytes_of_text() -> None:
    text = json.dumps({"command": "é" * 60}, ensure_ascii=False)  # 75 characters, 135 bytes
    assert len(text) <= 100 < len(text.encode())
    exc = rejected(SHELL, text, max_bytes=100)
    assert exc.code is ErrorCode.ARGUMENTS_TOO_LARGE
    assert exc.message == (
        "arguments are 135 bytes of JSON, over the limit of 100 bytes; send less (split large content over "
        "several calls)"
    )


def test_size_exactly_at_the_limit_is_accepted() -> None:
    text = '{"command": "' + "x" * 50 + '"}'
    assert validate_call(SHELL, text, max_bytes=len(text)) == ShellArgs(command="x" * 50)
    assert rejected(SHELL, text, max_bytes=len(text) - 1).code is ErrorCode.ARGUMENTS_TOO_LARGE


def test_default_limit_is_one_mebibyte() -> None:
    text = '{"command": "' + "x" * (1 << 20) + '"}'
    exc = rejected(SHELL, text)
    assert exc.message == (
        "arguments are 1,048,591 bytes of JSON, over the limit of 1,048,576 bytes (1 MiB); send less (split "
        "large content over several calls)"
    )


def test_size_limit_of_an_object_measures_its_compact_json() -> None:
    obj = {"command": "ü" * 40}  # compact JSON: {"command":"üü..."} = 14 + 80 bytes
    assert validate_call(SHELL, obj, max_bytes=94) == ShellArgs(command="ü" * 40)
    exc = rejected(SHELL, obj, max_bytes=93)
    assert exc.code is ErrorCode.ARGUMENTS_TOO_LARGE
    assert exc.message.startswith("arguments are 94 bytes of JSON, over the limit of 93 bytes")


# ---- nesting ----------------------------------------------------------------------------

DEPTH_MESSAGE = "arguments are nested more than 32 levels deep (the limit); flatten them"


@pytest.mark.parametrize("opener", ['{"a":', "["])
def test_ten_thousand_levels_are_rejected_without_a_crash(opener: str) -> None:
    closer = "}" if opener.startswith("{") else "]"
    text = opener * 10_000 + "1" + closer * 10_000
    exc = rejected(SHELL, text)
    assert exc.code is ErrorCode.INVALID_ARGUMENTS
    assert exc.message == DEPTH_MESSAGE


def test_depth_limit_is_exact() -> None:
    # The arguments object is level 1; 31 nested arrays make 32 levels.
    ok = '{"x": ' + "[" * 31 + "]" * 31 + "}"
    assert parse_arguments(ok) == json.loads(ok)
    too_deep = '{"x": ' + "[" * 32 + "]" * 32 + "}"
    with pytest.raises(CallRejected) as info:
        parse_arguments(too_deep)
    assert info.value.message == DEPTH_MESSAGE


def test_custom_depth_limit_in_the_message() -> None:
    with pytest.raises(CallRejected) as info:
        parse_arguments('{"a": {"b": {"c": 1}}}', max_depth=2)
    assert info.value.message == "arguments are nested more than 2 levels deep (the limit); flatten them"


def test_many_brackets_inside_strings_are_not_depth() -> None:
    text = json.dumps({"command": "[" * 100 + "{" * 100})
    assert validate_call(SHELL, text) == ShellArgs(command="[" * 100 + "{" * 100)


def test_deep_python_object_is_rejected_without_recursion() -> None:
    obj: dict[str, Any] = {}
    node = obj
    for _ in range(10_000):
        node["a"] = {}
        node = node["a"]
    exc = rejected(SHELL, obj)
    assert exc.message == DEPTH_MESSAGE


def test_cyclic_python_object_is_rejected() -> None:
    obj: dict[str, Any] = {"command": "ls"}
    obj["self"] = obj
    assert rejected(SHELL, obj).message == DEPTH_MESSAGE


# ---- NUL --------------------------------------------------------------------------------


def test_nul_in_a_top_level_string() -> None:
    exc = rejected(SHELL, '{"command": "cat /etc/passwd\\u0000.txt"}')
    assert exc.code is ErrorCode.INVALID_ARGUMENTS
    assert exc.message == (
        "argument 'command' contains a NUL character (\\u0000), which no argument may contain; remove it"
    )


def test_nul_in_a_nested_string_names_its_path() -> None:
    text = '{"files": [{"path": "a"}, {"path": "b"}, {"path": "c\\u0000", "mode": "r"}]}'
    exc = rejected(BATCH, text)
    assert exc.message == (
        "argument 'files[2].path' contains a NUL character (\\u0000), which no argument may contain; remove it"
    )


def test_nul_in_a_python_object() -> None:
    exc = rejected(BATCH, {"files": [{"path": "ok"}, {"path": "x\0y"}]})
    assert exc.message.startswith("argument 'files[1].path' contains a NUL character")


def test_nul_in_a_key() -> None:
    exc = rejected(BATCH, '{"files": [{"pa\\u0000th": "a"}]}')
    assert exc.message == "argument 'files[0]' has a key containing a NUL character (\\u0000); remove it"


def test_escaped_backslash_before_u0000_is_not_a_nul() -> None:
    args = validate_call(SHELL, r'{"command": "echo \\u0000"}')
    assert args == ShellArgs(command="echo \\u0000")


# ---- Python objects that are not JSON ---------------------------------------------------


def test_non_json_value_in_an_object() -> None:
    exc = rejected(SHELL, {"command": "ls", "workdir": {1, 2}})
    assert exc.code is ErrorCode.INVALID_ARGUMENTS
    assert exc.message == "argument 'workdir' is a set, which is not JSON data"


def test_nan_in_an_object() -> None:
    exc = rejected(SHELL, {"command": "ls", "timeout_ms": float("nan")})
    assert exc.message == "argument 'timeout_ms' is nan, which is not a JSON number"


def test_non_string_key_in_an_object() -> None:
    exc = rejected(SHELL, {"command": "ls", 3: "x"})
    assert exc.message == "object keys must be strings; the arguments object has the key 3"


# ---- schema -----------------------------------------------------------------------------


def test_wrong_type_says_what_was_expected_and_what_came() -> None:
    exc = rejected(SHELL, '{"command": "ls", "timeout_ms": "abc"}')
    assert exc.code is ErrorCode.INVALID_ARGUMENTS
    assert exc.message == "invalid arguments for tool 'shell': argument 'timeout_ms' must be an integer, got 'abc'"


def test_unknown_argument_lists_the_allowed_ones() -> None:
    exc = rejected(SHELL, '{"command": "ls", "foo": 1}')
    assert exc.message == (
        "invalid arguments for tool 'shell': unexpected argument 'foo' (allowed: command, workdir, timeout_ms)"
    )


def test_missing_required_argument() -> None:
    exc = rejected(SHELL, "{}")
    assert exc.message == "invalid arguments for tool 'shell': missing required argument 'command'"


def test_constraint_violation() -> None:
    exc = rejected(SHELL, '{"command": "ls", "timeout_ms": 0}')
    assert exc.message == (
        "invalid arguments for tool 'shell': argument 'timeout_ms': 0 is below the minimum of 1"
    )


def test_several_problems_in_one_message_with_nested_paths() -> None:
    text = '{"files": [{"path": "a"}, {"path": "b", "x": 1}, {"mode": 3}], "label": "toolong"}'
    exc = rejected(BATCH, text)
    assert exc.message == (
        "invalid arguments for tool 'batch' (4 problems): "
        "unexpected argument 'files[1].x' (allowed: path, mode); "
        "missing required argument 'files[2].path'; "
        "argument 'files[2].mode' must be a string, got 3; "
        "argument 'label' must have at most 5 characters, got 'toolong'"
    )


def test_union_branches_merge_into_one_sentence() -> None:
    exc = rejected(BATCH, '{"files": [], "choice": {"a": 1}}')
    assert exc.message == (
        "invalid arguments for tool 'batch': argument 'choice' must be an integer or an array, got {\"a\": 1}"
    )


def test_long_values_are_shortened_in_the_message() -> None:
    exc = rejected(SHELL, {"command": "ls", "timeout_ms": "y" * 500})
    assert exc.message == (
        "invalid arguments for tool 'shell': argument 'timeout_ms' must be an integer, got '" + "y" * 60 + "...'"
    )


def test_many_problems_are_capped() -> None:
    class Wide(BaseModel):
        model_config = ConfigDict(extra="forbid")

    exc = rejected(Definition("wide", Wide), {f"k{i}": i for i in range(15)})
    assert exc.message.startswith("invalid arguments for tool 'wide' (11 problems): unexpected argument 'k0'")
    assert exc.message.endswith("; and 5 more")


# ---- call ids ---------------------------------------------------------------------------


@pytest.mark.parametrize("call_id", ["call_1", "toolu_01A09q90qw90lq917835lq9", "a", "x" * 128, "a.b:c-d_e"])
def test_good_call_ids(call_id: str) -> None:
    check_call_id(call_id)


@pytest.mark.parametrize(
    ("call_id", "shown"),
    [("", "''"), ("x" * 129, None), ("a b", "'a b'"), ("call_1\n", "'call_1\\n'"), ("é", "'é'"), ("a/b", "'a/b'")],
)
def test_bad_call_ids(call_id: str, shown: str | None) -> None:
    with pytest.raises(CallRejected) as info:
        check_call_id(call_id)
    assert info.value.code is ErrorCode.BAD_CALL_ID
    assert info.value.message.endswith(
        " is not valid: a call_id is 1 to 128 characters, each a letter, a digit or one of _ . : -"
    )
    if shown is not None:
        assert info.value.message.startswith(f"call_id {shown} is not valid")


def test_call_id_of_another_type() -> None:
    with pytest.raises(CallRejected) as info:
        check_call_id(12)
    assert info.value.message.startswith("call_id int is not valid")


# ---- helpers ----------------------------------------------------------------------------


def test_render_path() -> None:
    assert render_path(("files", 2, "path")) == "files[2].path"
    assert render_path(("env", "A B")) == 'env."A B"'
    assert render_path(("tools", "my-tool", "rules", 0)) == "tools.my-tool.rules[0]"
    assert render_path(()) == ""


def test_call_rejected_is_a_plain_exception_with_a_code() -> None:
    exc = CallRejected(ErrorCode.INVALID_JSON, "words")
    assert isinstance(exc, Exception)
    assert (exc.code, exc.message, str(exc)) == (ErrorCode.INVALID_JSON, "words", "words")


# ---- built-in tools: either schema form's arguments, missing vs null --------------------------

BUILTINS = builtin_registry()

# Per built-in tool: the fewest arguments a call can have, and one with every optional one.
EXAMPLES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "shell": ({"command": "ls"}, {"command": "ls", "workdir": "/workspace", "timeout_ms": 5000}),
    "bash": ({}, {"command": "echo hi", "restart": False}),
    "str_replace_based_edit_tool": (
        {"command": "view", "path": "/workspace/a.py"},
        {
            "command": "str_replace",
            "path": "/workspace/a.py",
            "file_text": "x\n",
            "old_str": "x",
            "new_str": "y",
            "insert_line": 0,
            "insert_text": "z\n",
            "view_range": [1, -1],
            "max_characters": 100,
        },
    ),
    "apply_patch": ({"patch": "*** Begin Patch\n*** End Patch"}, {"patch": "*** Begin Patch\n*** End Patch"}),
    "read_file": ({"path": "a.txt"}, {"path": "a.txt", "start_line": 2, "end_line": 9, "max_bytes": 4096}),
    "write_file": ({"path": "a.txt", "content": ""}, {"path": "a.txt", "content": "hi\n", "create_only": True}),
    "list_dir": ({}, {"path": "src", "depth": 3, "include_hidden": True}),
    "search": (
        {"pattern": "def "},
        {"pattern": "def ", "path": "src", "literal": True, "glob": "*.py", "max_results": 5},
    ),
    "view_image": ({"path": "chart.png"}, {"path": "chart.png"}),
    "exec_command": (
        {"cmd": "ls"},
        {"cmd": "ls", "workdir": "/workspace", "shell": "/bin/sh", "login": False, "tty": True,
         "yield_time_ms": 1000, "max_output_tokens": 500},
    ),
    "write_stdin": (
        {"session_id": 7}, {"session_id": 7, "chars": "q\n", "yield_time_ms": 1000, "max_output_tokens": 500},
    ),
    "python": ({"code": "1 + 1"}, {"code": "import pandas", "timeout_ms": 5000}),
    "computer": (
        {"action": "screenshot"},
        {"action": "left_click", "coordinate": [10, 20], "start_coordinate": [0, 0], "text": "a",
         "scroll_direction": "down", "scroll_amount": 2, "duration": 1, "region": [0, 0, 10, 10]},
    ),
    "browser_navigate": ({"url": "http://127.0.0.1:8000/"}, {"url": "http://127.0.0.1:8000/"}),
    "browser_snapshot": ({}, {}),
    "browser_click": ({"element": "Save button", "ref": "e2"},
                      {"element": "Save button", "ref": "e2", "doubleClick": True, "button": "right",
                       "modifiers": ["Shift"]}),
    "browser_type": ({"element": "Name", "ref": "e3", "text": "Ada"},
                     {"element": "Name", "ref": "e3", "text": "Ada", "submit": True, "slowly": True}),
    "browser_press_key": ({"key": "Enter"}, {"key": "Control+a"}),
    "browser_take_screenshot": ({}, {"type": "jpeg", "element": "Save button", "ref": "e2", "fullPage": False}),
    "browser_tabs": ({"action": "list"}, {"action": "close", "index": 1}),
    "browser_console_messages": ({}, {"onlyErrors": True}),
    "browser_wait_for": ({"time": 1}, {"time": 1, "text": "Saved", "textGone": "Saving"}),
}


def builtin(name: str) -> Any:
    tool = BUILTINS.get(name)
    assert tool is not None
    return tool.definition


def with_nulls(definition: Any, args: dict[str, Any]) -> dict[str, Any]:
    """``args`` with an explicit null for every argument left out (what a strict-mode model sends)."""
    return {**dict.fromkeys(definition.input_schema("strict")["properties"]), **args}


def test_examples_cover_every_builtin_and_each_optional_argument() -> None:
    assert list(EXAMPLES) == BUILTINS.names()
    for name, (minimal, full) in EXAMPLES.items():
        properties = builtin(name).input_schema("plain")["properties"]
        assert set(full) == set(properties), name
        required = set(builtin(name).input_schema("plain").get("required", []))
        # browser_wait_for requires none of its three arguments but one of them: its fewest is one
        assert set(minimal) == required or (name, set(minimal)) == ("browser_wait_for", {"time"}), name


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_builtin_examples_match_both_schema_forms(name: str) -> None:
    definition = builtin(name)
    plain, strict = definition.input_schema("plain"), definition.input_schema("strict")
    minimal, full = EXAMPLES[name]
    jsonschema.validate(minimal, plain)
    jsonschema.validate(full, plain)
    jsonschema.validate(full, strict)
    jsonschema.validate(with_nulls(definition, minimal), strict)
    if set(minimal) != set(full):
        # the strict form needs every key; the plain one does not take nulls for None defaults
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(minimal, strict)
    for prop in set(plain["properties"]) - set(minimal):
        if "default" not in plain["properties"][prop]:
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate({**minimal, prop: None}, plain)


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_builtin_missing_and_null_optional_arguments_validate_the_same(name: str) -> None:
    definition = builtin(name)
    minimal, full = EXAMPLES[name]
    expected = validate_call(definition, minimal)
    assert expected == definition.input_model(**minimal)
    nulls = with_nulls(definition, minimal)
    assert validate_call(definition, nulls) == expected
    assert validate_call(definition, json.dumps(nulls)) == expected
    assert validate_call(definition, json.dumps(minimal)) == expected
    assert validate_call(definition, json.dumps(full)) == validate_call(definition, full)
    # one argument at a time left out or null: the same result either way (the same refusal, when
    # arguments go together, as a browser_take_screenshot's element and ref do)
    def outcome(args: dict[str, Any]) -> Any:
        try:
            return validate_call(definition, args)
        except CallRejected as exc:
            return exc.message

    for prop in set(full) - set(minimal):
        without = {k: v for k, v in full.items() if k != prop}
        assert outcome({**without, prop: None}) == outcome(without), prop


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("shell", {"command": "ls", "timeout_ms": "abc"}, "argument 'timeout_ms' must be an integer, got 'abc'"),
        ("shell", {"command": "ls", "workdir": 5}, "argument 'workdir' must be a string, got 5"),
        ("bash", {"restart": "maybe"}, "argument 'restart' must be true or false, got 'maybe'"),
        (
            "str_replace_based_edit_tool",
            {"command": "view", "path": "/w", "view_range": "1-2"},
            "argument 'view_range' must be an array, got '1-2'",
        ),
        ("read_file", {"path": "a", "start_line": 0},
         "argument 'start_line': 0 is below the minimum of 1"),
        ("list_dir", {"depth": 9}, "argument 'depth': 9 is above the maximum of 5 (allowed: 1 to 5)"),
        ("search", {"pattern": "x", "literal": None, "max_results": "many"},
         "argument 'max_results' must be an integer, got 'many'"),
        ("write_file", {"path": "a"}, "missing required argument 'content'"),
    ],
)
def test_builtin_wrong_arguments_get_the_readable_error(name: str, args: dict[str, Any], message: str) -> None:
    exc = rejected(builtin(name), args)
    assert exc.code is ErrorCode.INVALID_ARGUMENTS
    assert exc.message == f"invalid arguments for tool {name!r}: {message}"


_TEXT = st.characters(codec="utf-8", exclude_characters="\0")  # NUL is refused in any argument


def from_schema(node: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values a plain-form schema accepts (the keywords the built-in tools use)."""
    if "enum" in node:
        return st.sampled_from(node["enum"])
    if "const" in node:
        return st.just(node["const"])
    if "anyOf" in node:
        return st.one_of([from_schema(variant) for variant in node["anyOf"]])
    kind = node["type"]
    if kind == "string" and "pattern" in node:
        return st.from_regex(node["pattern"], fullmatch=True)
    if kind == "string":
        return st.text(_TEXT, min_size=node.get("minLength", 0), max_size=node.get("maxLength", 12))
    if kind == "integer":
        return st.integers(min_value=node.get("minimum"), max_value=node.get("maximum"))
    if kind == "number":
        return st.floats(min_value=node.get("minimum"), max_value=node.get("maximum"), allow_nan=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        return st.lists(from_schema(node["items"]), min_size=node.get("minItems", 0), max_size=node.get("maxItems", 4))
    assert kind == "object", node
    required = set(node.get("required", []))
    props = node["properties"]
    return st.fixed_dictionaries(
        {key: from_schema(value) for key, value in props.items() if key in required},
        optional={key: from_schema(value) for key, value in props.items() if key not in required},
    )


@st.composite
def builtin_calls(draw: st.DrawFn) -> tuple[Any, dict[str, Any]]:
    definition = builtin(draw(st.sampled_from(BUILTINS.names())))
    return definition, draw(from_schema(definition.input_schema("plain")))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(builtin_calls())
def test_whatever_the_plain_schema_accepts_validates_and_null_equals_missing(call: tuple[Any, dict[str, Any]]) -> None:
    definition, args = call
    jsonschema.validate(args, definition.input_schema("plain"))
    # the one rule JSON Schema cannot state: read_file's end_line may not come before start_line
    if definition.name == "read_file" and args.get("end_line") is not None:
        assume(args["end_line"] >= args.get("start_line", 1))
    # and computer's: each action's own required fields, points on the screen, a region ordered
    if definition.name == "computer":
        assume(all(args.get(name) is not None for name in ACTION_NEEDS.get(args["action"], ())))
        for name in ("coordinate", "start_coordinate"):
            assume(args.get(name) is None or (args[name][0] < SCREEN_WIDTH and args[name][1] < SCREEN_HEIGHT))
        region = args.get("region")
        assume(region is None or (region[0] < region[2] <= SCREEN_WIDTH and region[1] < region[3] <= SCREEN_HEIGHT))
    # and the browser tools': a screenshot's element with its ref, tabs' index, something to wait for
    if definition.name == "browser_take_screenshot":
        assume((args.get("element") is None) == (args.get("ref") is None))
        assume(args.get("ref") is None or not args.get("fullPage"))
    if definition.name == "browser_tabs":
        assume(args.get("index") is not None if args["action"] == "select" else True)
        assume(args.get("index") is None or args["action"] in ("close", "select"))
    if definition.name == "browser_wait_for":
        assume(any(args.get(name) is not None for name in ("time", "text", "textGone")))
    accepted = validate_call(definition, args)
    assert validate_call(definition, json.dumps(args)) == accepted
    assert validate_call(definition, with_nulls(definition, args)) == accepted
