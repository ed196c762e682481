"""Function tools: what ``@function_tool`` derives from a function (schema in each format,
descriptions from the docstring, defaults, the hidden context), what a call returns (text,
structured, errors), and the signatures it refuses at decoration, each with the fix."""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
import pytest

from harness.audit.store import AuditStore
from harness.core.calls import Action, ErrorCode, ToolCall, ToolOutput, ToolResult
from harness.core.context import ToolContext
from harness.core.errors import AgentCallError, EngineUnavailable
from harness.core.formats import tool_definitions
from harness.core.policy import Policy, ToolPolicy
from harness.core.registry import RegistryError, Tool, ToolAnnotations, ToolRegistry
from harness.core.session import Session
from harness.tools import builtin_registry
from harness.tools.function import FunctionContext, FunctionTool, function_tool
from harness.tools.function_docs import parse_docstring


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Window(pydantic.BaseModel):
    start: int
    end: int | None = None


@function_tool
def grep_count(ctx: FunctionContext, pattern: str, path: str = ".", *, ignore_case: bool = False,
               limit: int | None = None) -> dict[str, Any]:
    """Count the lines matching a pattern
    in the sandbox's files.

    Searching is literal, not a regular expression.

    Args:
        pattern (str): The text to look for.
        path: Where to search, relative to the
            workspace, or absolute.
        ignore_case: Match upper and lower case alike.

    Returns:
        The count.
    """
    return {"pattern": pattern, "path": path, "ignore_case": ignore_case, "limit": limit, "call": ctx.call_id}


@function_tool(name="paint", read_only=True, title="Paint a window")
def paint_it(color: Color, window: Window, mode: Literal["fill", "edge"] = "fill",
             tags: list[str] | None = None) -> str:
    """Paint something.

    :param color: Which color.
    :param Window window: The lines to paint,
        inclusive.
    :param mode: How.
    """
    return f"{color.value} {window.start}-{window.end} {mode} {tags}"


class FakeProvider:
    def sandbox(self) -> Any:
        raise AssertionError("this tool never asks for the sandbox")


def _context(call_id: str = "call-1", budget: int = 30_000) -> ToolContext:
    return ToolContext(run_id="run-1", call_id=call_id, provider=FakeProvider(), default_timeout_s=30.0,
                       timeout_ceiling_s=600.0, output_budget=budget)


def _run(tool: Tool, arguments: dict[str, Any], ctx: ToolContext | None = None) -> ToolOutput:
    from harness.core.validation import validate_call

    return tool.handler(ctx or _context(), validate_call(tool.definition, arguments))


# ---- the definition -----------------------------------------------------------------------------


def test_name_description_and_argument_descriptions_come_from_the_function() -> None:
    definition = grep_count.definition
    assert isinstance(grep_count, FunctionTool) and isinstance(grep_count, Tool)
    assert definition.name == "grep_count"
    assert definition.description == "Count the lines matching a pattern in the sandbox's files."
    plain = definition.input_schema("plain")
    assert list(plain["properties"]) == ["pattern", "path", "ignore_case", "limit"]  # no context
    assert plain["properties"]["pattern"] == {"type": "string", "description": "The text to look for."}
    assert plain["properties"]["path"] == {
        "type": "string", "description": "Where to search, relative to the workspace, or absolute.", "default": "."}
    assert plain["properties"]["ignore_case"]["default"] is False
    assert plain["properties"]["limit"] == {"type": "integer"}
    assert plain["required"] == ["pattern"]
    assert plain["additionalProperties"] is False


def test_the_strict_form_requires_every_argument_and_makes_optional_ones_nullable() -> None:
    strict = grep_count.definition.input_schema("strict")
    assert strict["required"] == ["pattern", "path", "ignore_case", "limit"]
    assert strict["properties"]["path"]["type"] == ["string", "null"]
    assert "Default: \".\"." in strict["properties"]["path"]["description"]
    assert "default" not in strict["properties"]["path"]


def test_every_format_gets_the_definition_and_its_schema_form() -> None:
    openai, chat, anthropic, mcp = (tool_definitions([grep_count, paint_it], fmt)
                                    for fmt in ("openai", "chat", "anthropic", "mcp"))
    assert [d["name"] for d in openai] == ["grep_count", "paint"]
    assert openai[0]["strict"] is True and openai[0]["parameters"] == grep_count.definition.input_schema("strict")
    assert chat[1]["function"]["parameters"] == paint_it.definition.input_schema("strict")
    assert anthropic[0]["input_schema"] == grep_count.definition.input_schema("plain")
    assert mcp[1]["inputSchema"]["required"] == ["color", "window"]
    assert mcp[1]["annotations"] == {"title": "Paint a window", "readOnlyHint": True, "destructiveHint": False,
                                     "idempotentHint": False, "openWorldHint": False}
    assert mcp[0]["annotations"]["destructiveHint"] is True  # not read-only: MCP's default


def test_sphinx_docstrings_enums_literals_and_models() -> None:
    plain = paint_it.definition.input_schema("plain")
    assert paint_it.definition.description == "Paint something."
    assert plain["properties"]["color"] == {"type": "string", "enum": ["red", "blue"], "description": "Which color."}
    assert plain["properties"]["window"]["description"] == "The lines to paint, inclusive."
    assert plain["properties"]["window"]["properties"]["start"] == {"type": "integer"}
    assert plain["properties"]["mode"] == {"type": "string", "enum": ["fill", "edge"], "description": "How.",
                                           "default": "fill"}


def test_options_replace_what_the_function_says() -> None:
    @function_tool(name="renamed", description="Says hello.", annotations=ToolAnnotations(idempotent=True))
    def hello(who: str) -> str:
        """Not this."""
        return f"hello {who}"

    assert hello.definition.name == "renamed"
    assert hello.definition.description == "Says hello."
    assert hello.definition.annotations == ToolAnnotations(idempotent=True)
    assert hello("you") == "hello you"  # still the function


def test_an_annotated_field_description_wins_over_the_docstring() -> None:
    @function_tool
    def f(n: Annotated[int, pydantic.Field(ge=1, description="From Field.")] = 2) -> int:
        """Doubles.

        Args:
            n: From the docstring.
        """
        return n * 2

    assert f.definition.input_schema("plain")["properties"]["n"] == {
        "type": "integer", "minimum": 1, "description": "From Field.", "default": 2}


def test_parameter_names_pydantic_reserves_still_reach_the_function() -> None:
    @function_tool
    def g(json: str, _private: int = 0, model_name: str = "m") -> str:
        """Echo."""
        return f"{json} {_private} {model_name}"

    assert list(g.definition.input_schema("plain")["properties"]) == ["json", "_private", "model_name"]
    assert _run(g, {"json": "j", "_private": 3, "model_name": "x"}).text == "j 3 x"


def test_policy_hints_name_parameters() -> None:
    @function_tool(path_fields=["path"], command_field="cmd")
    def run_in(path: str, cmd: str) -> str:
        """Run cmd in path."""
        return cmd

    assert run_in.definition.path_fields == ("path",)
    assert run_in.definition.command_field == "cmd"


def test_registries_take_function_tools() -> None:
    registry = builtin_registry().add(grep_count, paint_it)
    assert registry.names()[-2:] == ["grep_count", "paint"]
    assert registry.get("paint") is paint_it
    with pytest.raises(RegistryError, match="already registered"):
        registry.add(grep_count)


# ---- docstrings ---------------------------------------------------------------------------------


def test_docstring_parsing() -> None:
    doc = parse_docstring("Summary line one\nand two.\n\nMore.\n\nArgs:\n    a (int): First.\n"
                          "    b: Second,\n        continued.\n\n    c: Third after a blank line.\n"
                          "Returns:\n    x: not a parameter.\n")
    assert doc.summary == "Summary line one and two."
    assert doc.params == {"a": "First.", "b": "Second, continued.", "c": "Third after a blank line."}
    sphinx = parse_docstring("Do it.\n:param x: The x.\n:type x: int\n:param str y: The y\n  goes on.\n"
                             ":returns: nothing")
    assert sphinx.summary == "Do it."
    assert sphinx.params == {"x": "The x.", "y": "The y goes on."}
    assert parse_docstring("Args:\n    a: only args").summary == ""
    assert parse_docstring(None).params == {}


# ---- calls --------------------------------------------------------------------------------------


def test_the_context_parameter_gets_the_call_and_a_deadline() -> None:
    seen: list[FunctionContext] = []

    @function_tool
    def probe(c: FunctionContext, x: int) -> str:
        """Probe."""
        seen.append(c)
        return str(x)

    before = time.monotonic()
    ctx = _context("call-7")
    assert _run(probe, {"x": 1}, ctx).text == "1"
    got = seen[0]
    assert (got.call_id, got.run_id, got.tool_context) == ("call-7", "run-1", ctx)
    assert before + 30.0 <= got.deadline <= time.monotonic() + 30.0
    assert 29.0 < got.remaining_s() <= 30.0 and 29_000 < got.timeout_ms() <= 30_000


def test_a_tool_context_annotation_gets_the_harness_context_itself() -> None:
    @function_tool
    def raw(ctx: ToolContext) -> str:
        """Raw."""
        return str(ctx.output_budget)

    assert raw.definition.input_schema("plain")["properties"] == {}
    assert _run(raw, {}, _context(budget=1234)).text == "1234"


def test_return_shapes() -> None:
    @dataclasses.dataclass
    class Point:
        x: int
        y: int

    values: dict[str, Any] = {
        "dict": ({"a": 1, "é": [True, None]}, '{"a": 1, "é": [true, null]}', {"a": 1, "é": [True, None]}),
        "list": ([1, "two"], '[1, "two"]', {"result": [1, "two"]}),
        "int": (3, "3", {"result": 3}),
        "bool": (False, "false", {"result": False}),
        "none": (None, "null", {"result": None}),
        "model": (Window(start=1), '{"start": 1, "end": null}', {"start": 1, "end": None}),
        "dataclass": (Point(1, 2), '{"x": 1, "y": 2}', {"x": 1, "y": 2}),
        "str": ("plain text", "plain text", None),
    }

    @function_tool
    def give(kind: str) -> Any:
        """Give a value."""
        return values[kind][0]

    for kind, (_, text, structured) in values.items():
        out = _run(give, {"kind": kind})
        assert (out.text, out.structured, out.is_error) == (text, structured, False), kind
    own = ToolOutput(text="mine", is_error=True, error=ErrorCode.NONZERO_EXIT)

    @function_tool
    def passthrough() -> ToolOutput:
        """Pass."""
        return own

    assert _run(passthrough, {}) is own


def test_structured_content_is_left_out_when_the_text_exceeds_the_budget() -> None:
    @function_tool
    def big(n: int) -> dict[str, str]:
        """Big."""
        return {"data": "x" * n}

    assert _run(big, {"n": 10}, _context(budget=100)).structured == {"data": "x" * 10}
    large = _run(big, {"n": 500}, _context(budget=100))
    assert large.structured is None and large.raw_bytes == len(large.text) > 500


def test_a_value_that_is_not_json_is_an_error_result_naming_the_fix() -> None:
    @function_tool
    def odd() -> object:
        """Odd."""
        return object()

    out = _run(odd, {})
    assert out.is_error and out.error is ErrorCode.TOOL_FAILED
    assert "returned a object, which is not JSON-able" in out.text and "must return str" in out.text


def test_an_exception_is_a_tool_failed_result_naming_its_type_and_message() -> None:
    @function_tool
    def boom(path: str) -> str:
        """Boom."""
        raise FileNotFoundError(f"no such file: {path}")

    out = _run(boom, {"path": "a.txt"})
    assert out == ToolOutput(text="tool 'boom' failed: FileNotFoundError: no such file: a.txt", is_error=True,
                             error=ErrorCode.TOOL_FAILED, structured={"exception": "FileNotFoundError"},
                             raw_bytes=len("tool 'boom' failed: FileNotFoundError: no such file: a.txt"))


# ---- through a session: errors and policy -----------------------------------------------------


@pytest.fixture
def audit(tmp_path: Path) -> Iterator[AuditStore]:
    with AuditStore(tmp_path / "audit.sqlite3") as store:
        yield store


def _no_engine() -> Any:
    raise EngineUnavailable("no engine in unit tests; start Docker")


@function_tool
def fails() -> str:
    """Always fails."""
    raise ValueError("bad input")


@function_tool
def needs_sandbox(ctx: FunctionContext) -> str:
    """Asks for the sandbox."""
    return ctx.runtime().sandbox_id


def _session(audit: AuditStore, policy: Policy | None = None) -> Session:
    registry = ToolRegistry().add(grep_count, fails, needs_sandbox)
    return Session(registry, policy or Policy(), audit, engine_factory=_no_engine)


def test_through_a_session_an_exception_is_tool_failed_not_internal(audit: AuditStore) -> None:
    with _session(audit) as session:
        result = session.call(ToolCall("fails", "{}", "c-1"))
        assert (result.is_error, result.error) == (True, ErrorCode.TOOL_FAILED)
        assert result.text == "tool 'fails' failed: ValueError: bad input"
        ok = session.call(ToolCall("grep_count", '{"pattern": "x", "limit": null}', "c-2"))
        assert not ok.is_error and ok.structured is not None and ok.structured["call"] == "c-2"


def test_through_a_session_no_engine_stays_sandbox_unavailable(audit: AuditStore) -> None:
    with _session(audit) as session:
        result = session.call(ToolCall("needs_sandbox", "{}", "c-1"))
    assert result.error is ErrorCode.SANDBOX_UNAVAILABLE and "start Docker" in result.text


def test_bad_arguments_never_reach_the_function(audit: AuditStore) -> None:
    with _session(audit) as session:
        wrong = session.call(ToolCall("grep_count", '{"pattern": 5}', "c-1"))
        extra = session.call(ToolCall("grep_count", '{"pattern": "a", "nope": 1}', "c-2"))
    assert wrong.error is ErrorCode.INVALID_ARGUMENTS and "'pattern' must be a string" in wrong.text
    assert extra.error is ErrorCode.INVALID_ARGUMENTS and "unexpected argument 'nope'" in extra.text


def test_policy_decisions_apply_as_to_a_built_in(audit: AuditStore) -> None:
    policy = Policy(tools={"fails": ToolPolicy(decision=Action.DENY), "grep_count": ToolPolicy(decision=Action.ASK)})
    with _session(audit, policy) as session:
        denied: ToolResult = session.call(ToolCall("fails", "{}", "c-1"))
        asked = session.call(ToolCall("grep_count", '{"pattern": "x"}', "c-2"))
    assert denied.error is ErrorCode.DENIED
    assert asked.error is ErrorCode.APPROVAL_PENDING and asked.meta["approval_id"]


# ---- refused at decoration ----------------------------------------------------------------------


def _refused(match: str, make: Any) -> None:
    with pytest.raises(RegistryError, match=match):
        make()


def test_bad_signatures_are_refused_naming_the_parameter_and_the_fix() -> None:
    def star_args(*items: str) -> str:
        """Doc."""
        return ""

    def star_kwargs(**options: str) -> str:
        """Doc."""
        return ""

    def untyped(x) -> str:  # type: ignore[no-untyped-def]
        """Doc."""
        return ""

    def free_dict(env: dict[str, str]) -> str:
        """Doc."""
        return ""

    def anything(value: Any) -> str:
        """Doc."""
        return ""

    def unknown_type(when: FakeProvider) -> str:
        """Doc."""
        return ""

    def late_context(x: int, ctx: FunctionContext) -> str:
        """Doc."""
        return ""

    def nested_free(window: list[dict[str, int]]) -> str:
        """Doc."""
        return ""

    cases = [
        (star_args, r"parameter 'items' \(\*items\) takes any number of arguments.*name each argument"),
        (star_kwargs, r"parameter 'options' \(\*\*options\).*name each argument"),
        (untyped, r"parameter 'x' has no type annotation; annotate it \(e\.g\. `x: str`\)"),
        (free_dict, r"parameter 'env' is a free-form object.*use a list of \{key, value\} objects"),
        (anything, r"parameter 'value' accepts any JSON value.*give it a concrete type"),
        (unknown_type, r"parameter 'when' has type FakeProvider, which pydantic cannot validate.*use str, int"),
        (late_context, r"parameter 'ctx' is the call's context, which must be the first parameter; move it first"),
        (nested_free, r"parameter 'window.*free-form object"),
    ]
    for function, match in cases:
        _refused(rf"@function_tool .*{function.__name__}: {match}", lambda f=function: function_tool(f))


def test_other_mistakes_are_refused_with_the_fix() -> None:
    def undocumented(x: int) -> int:
        return x

    def typo(path: str) -> str:
        """Read.

        Args:
            pth: The path.
        """
        return path

    async def later(x: int) -> int:
        """Async."""
        return x

    def hinted(path: str) -> str:
        """Hinted."""
        return path

    _refused(r"undocumented: it has no description; give the function a docstring",
             lambda: function_tool(undocumented))
    _refused(r"docstring describes 'pth', which is not a parameter \(the parameters are: path\); fix the name",
             lambda: function_tool(typo))
    _refused(r"later: it is an async function; define it with `def`", lambda: function_tool(later))
    _refused(r"tool name 'bad name' is invalid", lambda: function_tool(name="bad name")(hinted))
    _refused(r"names 'nope' as a command, freeform or path field.*has no such field",
             lambda: function_tool(path_fields=["nope"])(hinted))
    _refused(r"already a tool; apply @function_tool once", lambda: function_tool(grep_count))


def test_positional_only_and_keyword_only_parameters_get_their_arguments() -> None:
    @function_tool
    def shapes(a: int, /, b: str, *, c: bool = True) -> str:
        """Shapes."""
        return f"{a} {b} {c}"

    assert _run(shapes, {"a": 1, "b": "x", "c": False}).text == "1 x False"


def test_an_agent_refusal_is_tool_failed_with_its_reason() -> None:
    @function_tool
    def refused() -> str:
        """Refused."""
        raise AgentCallError("path /etc is outside the sandbox's allowed directories", reason="PATH_ESCAPE",
                             grpc_code="PERMISSION_DENIED", retryable=False)

    out = _run(refused, {})
    assert (out.error, out.structured) == (ErrorCode.TOOL_FAILED, {"exception": "AgentCallError",
                                                                   "reason": "PATH_ESCAPE"})
    assert out.text == "tool 'refused' failed: AgentCallError: path /etc is outside the sandbox's allowed directories"
