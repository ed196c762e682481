"""Function tools: a typed Python function as a callbox tool.

``@function_tool`` reads everything the model sees from the function itself: the name
(the function's), the description (its docstring's first paragraph), one argument per
parameter with its type and default, each argument's description from the docstring's
``Args:`` section (or ``:param name:`` fields, see :mod:`harness.tools.function_docs`).
The result is a :class:`FunctionTool`, a :class:`~harness.core.registry.Tool` that any
registry takes (``builtin_registry().add(word_count)``) and that is still callable as the
plain function::

    @function_tool(read_only=True)
    def word_count(ctx: FunctionContext, path: str, min_length: int = 1) -> dict[str, int]:
        \"\"\"Count the words in a text file in the sandbox.

        Args:
            path: The file, absolute or relative to the workspace.
            min_length: Count only words at least this long.
        \"\"\"
        text = ctx.runtime().agent.read_file(path).data.decode()
        return {"words": sum(1 for w in text.split() if len(w) >= min_length)}

**Where it runs.** The function runs in the harness's process, on the host, with the
harness's privileges; only what it does through ``ctx.runtime()`` (the sandbox's agent
client: exec, files) happens in the sandbox. Validation, the policy's decision (``[tools.NAME]``
decisions and, with ``path_fields``/``command_field``, its rules), approvals, budgets,
output bounds and the audit log apply to its calls as to a built-in tool's.

**The context.** An optional first parameter annotated :class:`FunctionContext` (or the
harness's own :class:`~harness.core.context.ToolContext`) receives the call's context; it
is found by its annotation, whatever its name, and is not an argument the model sees.

**Arguments** are validated against a pydantic model made from the signature (unknown
arguments refused) before the function runs, and arrive converted (a nested model as its
instance). The argument schema must be one OpenAI strict mode can describe; a parameter that
cannot be (``*args``, no annotation, ``dict[str, X]``, ``Any``, a type pydantic cannot
validate) is a :class:`~harness.core.registry.RegistryError` at decoration, naming the
parameter and the fix. ``async def`` functions are refused the same way.

**The return value**: a ``str`` is the result text; a :class:`~harness.core.calls.ToolOutput`
is the result as it is; anything else pydantic serializes to JSON (dict, list, number, bool,
None, a pydantic model, a dataclass) becomes JSON text plus structured content (a dict as it
is, any other value as ``{"result": value}``; left out when the JSON text is longer than the
output budget, since only the text is cut to it). An exception the function raises is a
``tool_failed`` result naming its type and message (its traceback goes to the
``callbox.tools`` log); the sandbox being unavailable (no engine, the session ended) stays
``sandbox_unavailable``.
"""

from __future__ import annotations

import inspect
import json
import logging
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeVar, overload

import pydantic
import pydantic_core
from pydantic.fields import FieldInfo

from harness.core.calls import ErrorCode, ToolOutput
from harness.core.context import OutputSink, ToolContext
from harness.core.errors import AgentCallError, CallboxError
from harness.core.registry import RegistryError, Tool, ToolAnnotations, ToolDefinition, ToolRegistry
from harness.core.strict_schema import SchemaForm, StrictSchemaError
from harness.engine.base import SandboxRuntime
from harness.tools.function_docs import parse_docstring

__all__ = ["FunctionContext", "FunctionTool", "function_tool"]

log = logging.getLogger("callbox.tools")

P = ParamSpec("P")
R = TypeVar("R")

_RESERVED = frozenset(dir(pydantic.BaseModel))


@dataclass(frozen=True)
class FunctionContext:
    """What a function tool gets of its call: ids, a deadline, the sandbox, an output stream."""

    call_id: str
    """The call's id (unique within the run)."""
    run_id: str
    deadline: float
    """``time.monotonic()`` by which the call should be done: when the function started plus
    the policy's default call timeout (``budgets.default_call_timeout_s``, never above
    ``call_timeout_ceiling_s``). Advisory: nothing interrupts the function at it; pass
    :meth:`timeout_ms` to what it starts in the sandbox, which the sandbox does enforce."""
    on_output: OutputSink | None
    """Receives ``(stream, chunk)`` to show output while the call runs (MCP progress, gRPC
    output events); None when nobody listens."""
    tool_context: ToolContext
    """The harness's full context (output budget, timeout settings)."""

    def runtime(self) -> SandboxRuntime:
        """The run's sandbox (started on first use): ``.agent`` (exec, read_file, write_file,
        list_dir, ...), ``.env``, ``.workdir``, ``.sandbox_id``."""
        return self.tool_context.runtime()

    def remaining_s(self) -> float:
        """Seconds left until :attr:`deadline` (0 once it has passed)."""
        return self.tool_context.remaining_s()

    def timeout_ms(self) -> int:
        """Milliseconds left until :attr:`deadline`, at least 1: for ``agent.exec(timeout_ms=...)``
        (where 0 would mean the agent's own default)."""
        return max(1, int(self.remaining_s() * 1000))


_CONTEXT_TYPES: tuple[type, ...] = (FunctionContext, ToolContext)
"""The annotations that mark a function's first parameter as the call's context."""


@dataclass(frozen=True)
class FunctionTool(Tool, Generic[P, R]):
    """A tool made by :func:`function_tool`; calling it calls the function as written."""

    function: Callable[P, R]

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.function(*args, **kwargs)


@dataclass(frozen=True)
class _Param:
    name: str
    """The parameter's name, which is also the argument's name in the schema."""
    field: str
    """Its field in the input model (the name, unless pydantic reserves it)."""
    keyword_only: bool


@dataclass(frozen=True)
class _Options:
    name: str | None
    description: str | None
    annotations: ToolAnnotations | None
    read_only: bool
    destructive: bool | None
    idempotent: bool
    open_world: bool
    title: str | None
    path_fields: Sequence[str]
    command_field: str | None


@overload
def function_tool(function: Callable[P, R], /) -> FunctionTool[P, R]: ...


@overload
def function_tool(
    *, name: str | None = None, description: str | None = None, read_only: bool = False,
    destructive: bool | None = None, idempotent: bool = False, open_world: bool = False, title: str | None = None,
    annotations: ToolAnnotations | None = None, path_fields: Sequence[str] = (), command_field: str | None = None,
) -> Callable[[Callable[P, R]], FunctionTool[P, R]]: ...


def function_tool(
    function: Callable[P, R] | None = None, /, *, name: str | None = None, description: str | None = None,
    read_only: bool = False, destructive: bool | None = None, idempotent: bool = False, open_world: bool = False,
    title: str | None = None, annotations: ToolAnnotations | None = None, path_fields: Sequence[str] = (),
    command_field: str | None = None,
) -> FunctionTool[P, R] | Callable[[Callable[P, R]], FunctionTool[P, R]]:
    """Make a tool of a typed function: ``@function_tool`` or ``@function_tool(...)``.

    ``name`` and ``description`` replace the function's name and docstring summary.
    ``read_only``, ``destructive`` (default: not ``read_only``), ``idempotent``,
    ``open_world`` and ``title`` are the MCP annotations (or pass ``annotations`` whole);
    set ``open_world`` when the function reaches beyond the sandbox (it runs on the host).
    ``path_fields``/``command_field`` name the parameters the policy's path and command
    rules apply to. Raises RegistryError when the function cannot be a tool.
    """
    options = _Options(name, description, annotations, read_only, destructive, idempotent, open_world, title,
                       tuple(path_fields), command_field)
    if function is None:
        def decorate(fn: Callable[P, R]) -> FunctionTool[P, R]:
            return _make_tool(fn, options)
        return decorate
    return _make_tool(function, options)


# ---- building the definition ------------------------------------------------------------------


def _make_tool(function: Callable[P, R], options: _Options) -> FunctionTool[P, R]:
    if isinstance(function, Tool):
        raise RegistryError(f"{function.name!r} is already a tool; apply @function_tool once")
    if not callable(function):
        raise RegistryError(f"@function_tool takes a function, not {function!r}")
    label = f"@function_tool {getattr(function, '__qualname__', repr(function))}"
    if inspect.iscoroutinefunction(function):
        raise RegistryError(f"{label}: it is an async function; define it with `def` (the harness calls "
                            "tool handlers from worker threads)")
    name = options.name if options.name is not None else getattr(function, "__name__", "")
    doc = parse_docstring(inspect.getdoc(function))
    description = options.description if options.description is not None else doc.summary
    if not description.strip():
        raise RegistryError(f"{label}: it has no description; give the function a docstring whose first "
                            "paragraph tells the model what the tool does, or pass description=...")
    signature = inspect.signature(function)
    hints = _type_hints(function, label)
    context, params, fields = _parameters(signature, hints, doc.params, label)
    model = _input_model(name, fields, function, label)
    annotations = options.annotations or ToolAnnotations(
        read_only=options.read_only,
        destructive=not options.read_only if options.destructive is None else options.destructive,
        idempotent=options.idempotent, open_world=options.open_world, title=options.title,
    )
    by_param = {p.name: p.field for p in params}
    definition = ToolDefinition(
        name=name, description=description, input_model=model, annotations=annotations,
        command_field=by_param.get(options.command_field or "", options.command_field),
        path_fields=tuple(by_param.get(p, p) for p in options.path_fields),
    )
    _check_schema(definition, label)
    handler = _handler(function, name, context, tuple(params))
    tool = FunctionTool(definition=definition, handler=handler, function=function)
    ToolRegistry().register(tool)  # the registry's own checks (name, hints), at decoration time
    return tool


def _type_hints(function: Callable[..., Any], label: str) -> dict[str, Any]:
    try:
        return typing.get_type_hints(function, include_extras=True)
    except Exception as exc:
        raise RegistryError(f"{label}: its annotations cannot be resolved ({type(exc).__name__}: {exc}); "
                            "import every type they name at module level, not under TYPE_CHECKING") from None


def _is_context(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, _CONTEXT_TYPES)


def _parameters(
    signature: inspect.Signature, hints: dict[str, Any], docs: dict[str, str], label: str
) -> tuple[type | None, list[_Param], dict[str, Any]]:
    """The type of the context the function takes first (None if it takes none), its other
    parameters, and the input model's fields."""
    context: type | None = None
    params: list[_Param] = []
    fields: dict[str, Any] = {}
    for index, (pname, parameter) in enumerate(signature.parameters.items()):
        where = f"{label}: parameter {pname!r}"
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            star = "*" if parameter.kind is parameter.VAR_POSITIONAL else "**"
            raise RegistryError(f"{where} ({star}{pname}) takes any number of arguments, which a tool schema "
                                "cannot describe; name each argument as a parameter of its own")
        if pname not in hints:
            raise RegistryError(f"{where} has no type annotation; annotate it (e.g. `{pname}: str`) so the "
                                "model knows what to send")
        annotation = hints[pname]
        if _is_context(annotation):
            if index != 0:
                raise RegistryError(f"{where} is the call's context, which must be the first parameter; move it first")
            context = annotation
            continue
        doc = docs.get(pname)
        field = _field(annotation, parameter.default, doc, where)
        internal = pname if not (pname.startswith("_") or pname in _RESERVED or pname.startswith("model_")) \
            else f"arg{index}_{pname.lstrip('_')}"
        if internal != pname:
            field = (field[0], _aliased(field[1], pname))
        fields[internal] = field
        params.append(_Param(pname, internal, parameter.kind is parameter.KEYWORD_ONLY))
    unknown = [d for d in docs if d not in signature.parameters]
    if unknown:
        known = ", ".join(p.name for p in params) or "none"
        raise RegistryError(f"{label}: its docstring describes {', '.join(map(repr, unknown))}, which "
                            f"{'is not a parameter' if len(unknown) == 1 else 'are not parameters'} (the parameters "
                            f"are: {known}); fix the name in the docstring or the signature")
    return context, params, fields


def _field(annotation: Any, default: Any, doc: str | None, where: str) -> tuple[Any, FieldInfo]:
    try:
        pydantic.TypeAdapter(annotation)
    except Exception as exc:
        raise RegistryError(
            f"{where} has type {_type_name(annotation)}, which pydantic cannot validate ({type(exc).__name__}); "
            "use str, int, float, bool, a Literal, an Enum, a list of those, or a pydantic model") from None
    options: dict[str, Any] = {"default": ... if default is inspect.Parameter.empty else default}
    if doc and not _described(annotation):
        options["description"] = doc
    info: FieldInfo = pydantic.Field(**options)
    return annotation, info


def _described(annotation: Any) -> bool:
    """Whether ``Annotated[T, Field(description=...)]`` already gives the argument a description."""
    if typing.get_origin(annotation) is not typing.Annotated:
        return False
    return any(isinstance(m, FieldInfo) and m.description for m in annotation.__metadata__)


def _aliased(info: FieldInfo, alias: str) -> FieldInfo:
    options: dict[str, Any] = {"default": info.default, "alias": alias}
    if info.description is not None:
        options["description"] = info.description
    aliased: FieldInfo = pydantic.Field(**options)
    return aliased


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or repr(annotation)


def _input_model(
    name: str, fields: dict[str, Any], function: Callable[..., Any], label: str
) -> type[pydantic.BaseModel]:
    model_name = "".join(part[:1].upper() + part[1:] for part in name.replace("-", "_").replace(".", "_").split("_"))
    try:
        model: type[pydantic.BaseModel] = pydantic.create_model(
            f"{model_name or 'Function'}Args", __config__=pydantic.ConfigDict(extra="forbid"),
            __module__=getattr(function, "__module__", __name__), **fields,
        )
    except Exception as exc:
        raise RegistryError(f"{label}: its parameters do not make an argument model ({type(exc).__name__}: {exc}); "
                            "fix the parameter the message names") from None
    return model


def _check_schema(definition: ToolDefinition, label: str) -> None:
    model = definition.input_model
    names = {f: (info.alias or f) for f, info in model.model_fields.items()}
    forms: tuple[SchemaForm, ...] = ("strict", "plain")
    for form in forms:
        try:
            definition.input_schema(form)
        except StrictSchemaError as exc:
            where = exc.field.removeprefix(model.__name__ + ".")
            top, _, rest = where.partition(".")
            shown = names.get(top, top) + (f".{rest}" if rest else "")
            raise RegistryError(f"{label}: parameter {shown!r} {exc.problem}; {exc.fix}") from None
        except pydantic.PydanticUserError as exc:
            raise RegistryError(f"{label}: its arguments have no JSON Schema ({exc}); use JSON types for "
                                "every parameter (str, int, float, bool, Literal, Enum, list, a pydantic model)"
                                ) from None


# ---- running a call ---------------------------------------------------------------------------


def _handler(
    function: Callable[..., Any], name: str, context: type | None, params: tuple[_Param, ...]
) -> Callable[[ToolContext, pydantic.BaseModel], ToolOutput]:
    def handle(ctx: ToolContext, args: pydantic.BaseModel) -> ToolOutput:
        positional: list[Any] = []
        keyword: dict[str, Any] = {}
        if context is not None:
            positional.append(ctx if issubclass(context, ToolContext) else _function_context(ctx))
        for param in params:
            value = getattr(args, param.field)
            if param.keyword_only:
                keyword[param.name] = value
            else:
                positional.append(value)
        try:
            value = function(*positional, **keyword)
        except AgentCallError as error:
            # The sandbox refused or failed what the function asked of it: the tool failed (the
            # harness turns this into sandbox_unavailable if the sandbox no longer answers).
            return _failed(name, error, reason=error.reason)
        except CallboxError:
            raise  # no sandbox to run in (no engine, the session ended): the harness says so
        except Exception as error:
            log.info("function tool %s raised", name, exc_info=True)
            return _failed(name, error)
        return _output(value, name, ctx.output_budget)

    return handle


def _function_context(ctx: ToolContext) -> FunctionContext:
    return FunctionContext(call_id=ctx.call_id, run_id=ctx.run_id, deadline=ctx.deadline,
                           on_output=ctx.on_output, tool_context=ctx)


def _failed(name: str, error: BaseException, **structured: Any) -> ToolOutput:
    message = str(error).strip()
    kind = type(error).__name__
    text = f"tool {name!r} failed: {kind}: {message}" if message else f"tool {name!r} failed: {kind}"
    return ToolOutput(text=text, is_error=True, error=ErrorCode.TOOL_FAILED,
                      structured={"exception": kind, **structured}, raw_bytes=len(text.encode()))


def _output(value: Any, name: str, budget: int) -> ToolOutput:
    if isinstance(value, ToolOutput):
        return value
    if isinstance(value, str):
        return ToolOutput(text=value, raw_bytes=len(value.encode()))
    try:
        encoded = pydantic_core.to_json(value)
    except pydantic_core.PydanticSerializationError as exc:
        text = (f"tool {name!r} returned a {type(value).__name__}, which is not JSON-able ({exc}); the function "
                "must return str, a JSON-able value (dict, list, number, bool, None), a pydantic model or a ToolOutput")
        log.error("%s", text)
        return ToolOutput(text=text, is_error=True, error=ErrorCode.TOOL_FAILED, structured={"exception": "TypeError"})
    data = json.loads(encoded)
    text = json.dumps(data, ensure_ascii=False)
    structured = data if isinstance(data, dict) else {"result": data}
    size = len(text.encode())
    return ToolOutput(text=text, structured=structured if size <= budget else None, raw_bytes=size)

