"""``[[tool]]``: the tools a policy declares, as data (their handlers are in :mod:`harness.tools.declared`).

Each ``[[tool]]`` table is a :class:`DeclaredTool`: a name, a description, a ``kind``, the
arguments, annotations, an environment, mounts and a timeout. Everything is checked when
the policy is read, so a mistake is a :class:`~harness.core.policy.PolicyError` (exit 2)
naming the key, before any call:

* unknown keys, or a key of another kind (``argv`` on a ``python`` tool);
* for ``mcp`` (:mod:`harness.core.declared_mcp`): no ``command``, ``arguments`` or
  ``parameters`` (the server lists its own), a name containing ``__``;
* for ``sql`` (:mod:`harness.core.declared_sql`): a ``database`` that is not ``sqlite:///PATH``
  or ``postgresql://USER@HOST[:PORT]/DBNAME``, a password in the URL, ``arguments``,
  ``parameters`` or ``env`` (its arguments are fixed: ``query`` and ``params``);
* for ``http`` (:mod:`harness.core.declared_http`): a URL whose scheme or host is not literal,
  a placeholder outside the path, query and body, a header that is not literal or
  ``{ env = "VAR" }``, a body on ``GET``;
* both ``arguments`` and ``parameters``; an argument name that is not an identifier;
  a ``default`` or ``enum`` that does not fit the argument's ``type``; a JSON Schema
  ``parameters`` using a keyword outside the supported subset;
* for ``command``: a ``{placeholder}`` naming no argument, an argument no placeholder uses,
  a placeholder in ``argv[0]`` (the model never picks the program), an array argument
  anywhere but as a whole argv element;
* two tools with one name (:class:`~harness.core.policy.Policy`); a name clashing with a
  built-in tool is refused when the registry is built (``harness.tools.registry_for``).

Arguments are a small typed table (``[tool.arguments.NAME]`` with ``type`` = ``string``,
``integer``, ``number``, ``boolean`` or ``array`` (of strings), ``description``,
``required``, ``default``, ``enum``) or ``parameters``, a JSON Schema object using the same
subset (``type``, ``description``, ``enum``, ``default``, ``items = {type = "string"}``, and
the object's ``required`` list). Both become one pydantic input model
(:meth:`DeclaredTool.input_model`), from which the registry derives the strict and plain
schemas every format uses. An argument that is neither required nor has a default is
optional: absent, the argv element or environment variable that uses it is left out
(``command``) or the function's own default applies (``python``).

Templates: ``{name}`` stands for an argument, ``{{`` and ``}}`` for literal braces; any
other brace is an error at load.
"""

from __future__ import annotations

import keyword
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from harness.core.calls import TOOL_NAME_PATTERN
from harness.core.declared_http import (
    FIXED_HEADERS,
    HEADER_NAME,
    PLACEHOLDER_LIKE,
    HttpBody,
    HttpMethod,
    SecretHeader,
    check_header_value,
    split_url,
)
from harness.core.declared_mcp import check_mcp_table
from harness.core.declared_sql import SQL_KEYS, Database, SqlPassword, check_sql_table, sql_input_model
from harness.core.sandbox_settings import MountSetting

__all__ = [
    "ArgumentSpec",
    "DeclaredAnnotations",
    "DeclaredTool",
    "Placeholder",
    "parse_template",
]

ArgumentType = Literal["string", "integer", "number", "boolean", "array"]
_PY_TYPES: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list[str]}
_ARGUMENT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
_TEMPLATE_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_FUNCTION = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")
_NOT_YET: tuple[str, ...] = ()
_KIND_KEYS = {"command": ("argv", "workdir"), "python": ("function", "path"),
              "http": ("method", "url", "query", "headers", "body"), "mcp": ("command",), "sql": SQL_KEYS}
_SCHEMA_KEYS = frozenset({"type", "description", "enum", "default", "items"})


@dataclass(frozen=True)
class Placeholder:
    """``{name}`` in a template."""

    name: str


def parse_template(text: str) -> list[str | Placeholder]:
    """``text`` as literal pieces and placeholders; ``ValueError`` for a stray brace or a
    placeholder that is not an argument name."""
    parts: list[str | Placeholder] = []
    literal: list[str] = []
    position = 0
    for match in _TEMPLATE_TOKEN.finditer(text):
        literal.append(text[position:match.start()])
        position = match.end()
        token = match.group(0)
        if token in ("{{", "}}"):
            literal.append(token[0])
            continue
        name = match.group(1)
        if name is None or _ARGUMENT_NAME.fullmatch(name) is None:
            raise ValueError(f"{text!r} has a stray {token!r}: write {{NAME}} for an argument, "
                             "{{ and }} for literal braces")
        if "".join(literal):
            parts.append("".join(literal))
        literal = []
        parts.append(Placeholder(name))
    literal.append(text[position:])
    if "".join(literal):
        parts.append("".join(literal))
    return parts


def _placeholders(text: str) -> list[str]:
    return [p.name for p in parse_template(text) if isinstance(p, Placeholder)]


class ArgumentSpec(BaseModel):
    """``[tool.arguments.NAME]``: one argument of a declared tool."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: ArgumentType = "string"
    """``string`` (default), ``integer``, ``number``, ``boolean`` or ``array`` (a list of strings)."""
    description: str | None = None
    """What the model reads about this argument."""
    required: bool = False
    """The model must give it; a required argument has no ``default``."""
    default: str | int | float | bool | list[str] | None = None
    """The value when the model leaves it out."""
    enum: tuple[str | int | float, ...] | None = None
    """The only values allowed (string, integer or number arguments)."""

    @model_validator(mode="after")
    def _check(self) -> ArgumentSpec:
        if self.required and self.default is not None:
            raise ValueError("a required argument has no default: remove `default` or set required = false")
        if self.enum is not None:
            if self.type not in ("string", "integer", "number"):
                raise ValueError(f"enum applies to string, integer and number arguments, not {self.type}")
            if not self.enum:
                raise ValueError("enum is empty: list the allowed values")
            for value in self.enum:
                _check_value(self.type, value, "enum value")
        if self.default is not None:
            _check_value(self.type, self.default, "default")
            if self.enum is not None and self.default not in self.enum:
                raise ValueError(f"default {self.default!r} is not one of the enum values")
        return self

    def field(self) -> tuple[Any, Any]:
        """The pydantic field (type, FieldInfo) of this argument."""
        annotation: Any = _PY_TYPES[self.type]
        if self.enum is not None:
            annotation = Literal[self.enum]
        if self.required:
            return annotation, Field(description=self.description)
        if self.default is None:
            return annotation | None, Field(default=None, description=self.description)
        return annotation, Field(default=self.default, description=self.description)


def _check_value(kind: str, value: Any, what: str) -> None:
    ok = {
        "string": isinstance(value, str),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        "array": isinstance(value, list) and all(isinstance(v, str) for v in value),
    }[kind]
    if not ok:
        raise ValueError(f"{what} {value!r} is not a {kind if kind != 'array' else 'list of strings'}")


class DeclaredAnnotations(BaseModel):
    """``[tool.annotations]``: hints about what the tool does (MCP ToolAnnotations)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    read_only: bool = False
    """It does not modify its environment."""
    destructive: bool = True
    """It may delete or overwrite."""
    idempotent: bool = False
    """Calling it again with the same arguments has no further effect."""
    open_world: bool = False
    """It reaches outside the sandbox."""
    title: str | None = None
    """A human-readable title."""


class DeclaredTool(BaseModel):
    """One ``[[tool]]`` table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """The tool's name as the model sees it (letters, digits, ``_``, ``.``, ``-``)."""
    kind: Literal["command", "python", "http", "mcp", "sql"]
    """``command`` (an argv template), ``python`` (a function from a mounted directory),
    ``http`` (a request made from the sandbox through its egress proxy), ``mcp`` (the
    tools of a stdio MCP server started in the sandbox) or ``sql`` (one statement on a
    SQLite file or a PostgreSQL server, run from the sandbox)."""
    description: str | None = None
    """What the model reads about the tool; default a sentence naming the argv or function."""
    arguments: dict[str, ArgumentSpec] | None = None
    """``[tool.arguments.NAME]``: the arguments as a typed table (or give ``parameters``)."""
    parameters: dict[str, Any] | None = None
    """The arguments as a JSON Schema object (or give ``arguments``)."""
    annotations: DeclaredAnnotations = Field(default_factory=DeclaredAnnotations)
    """``[tool.annotations]``: read_only, destructive, idempotent, open_world, title."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables of the tool's process; for ``command`` a value may be ``{name}``."""
    mounts: tuple[MountSetting, ...] = ()
    """Mounts the tool needs, joined to ``[sandbox] mounts`` and checked like them."""
    timeout_s: float | None = Field(default=None, gt=0)
    """Seconds a call may run (default ``budgets.default_call_timeout_s``; never above the ceiling)."""
    command: tuple[str, ...] | None = None
    """``mcp``: the stdio MCP server to start in the sandbox, as an argv (no shell)."""
    argv: tuple[str, ...] | None = None
    """``command``: the program and its arguments; ``{name}`` fills a whole element or part of one."""
    workdir: str | None = None
    """``command``: the working directory inside the sandbox (default the sandbox's workdir)."""
    function: str | None = None
    """``python``: ``module:function``, imported from ``path``."""
    path: str | None = None
    """``python``: the directory inside the sandbox (a read-only mount) put first on ``sys.path``."""
    method: HttpMethod | None = None
    """``http``: the request method (default ``GET``)."""
    url: str | None = None
    """``http``: ``https://HOST[:PORT]/PATH``; ``{name}`` placeholders only in the path, each one segment."""
    query: dict[str, str] | None = None
    """``http``: query parameters, ``"{name}"`` or literal; left out when an optional argument is absent."""
    headers: dict[str, str | SecretHeader] | None = None
    """``http``: literal values, or ``{ env = "VAR", prefix = "Bearer " }`` read from the host's environment."""
    body: HttpBody | None = None
    """``http``: ``{ json = { ... } }`` (an object template) or ``{ text = "{name}" }``."""
    database: str | None = None
    """``sql``: ``sqlite:///PATH`` (a file inside the sandbox) or ``postgresql://USER@HOST[:PORT]/DBNAME``."""
    password: SqlPassword | None = None
    """``sql``: ``{ env = "VAR" }`` or ``{ file = "/path" }`` on the harness's host (PostgreSQL); never in the sandbox's
    environment, the model's view or the audit."""
    write: bool | None = None
    """``sql``: ``true`` lets the statement change the database (default false: the database refuses changes)."""
    max_rows: int | None = Field(default=None, ge=1, le=100_000)
    """``sql``: rows a result returns at most (default 100)."""
    max_bytes: int | None = Field(default=None, ge=1024, le=8 << 20)
    """``sql``: bytes of rows (as JSON) a result returns at most (default 65536)."""
    statement_timeout_s: float | None = Field(default=None, gt=0)
    """``sql``: seconds the database lets the statement run (default 10; within the call's timeout)."""

    @model_validator(mode="before")
    @classmethod
    def _kind_first(cls, data: Any) -> Any:
        if isinstance(data, dict):
            kind = data.get("kind")
            if kind in _NOT_YET:
                raise ValueError(
                    f'kind = "{kind}" is not available in this version of callbox (it offers "command" and '
                    '"python"); remove this [[tool]] table or declare the tool with kind = "command"'
                )
            if kind in _KIND_KEYS:
                for other, keys in _KIND_KEYS.items():
                    for key in keys:
                        if other != kind and data.get(key) is not None:
                            raise ValueError(f'key {key!r} is for kind = "{other}" tools, not "{kind}"; remove it')
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if TOOL_NAME_PATTERN.fullmatch(value) is None:
            raise ValueError(f"{value!r} is not a tool name (1 to 64 letters, digits, '_', '.', '-')")
        return value

    @field_validator("arguments")
    @classmethod
    def _argument_names(cls, value: dict[str, ArgumentSpec] | None) -> dict[str, ArgumentSpec] | None:
        for name in value or {}:
            _check_argument_name(name)
        return value

    @field_validator("workdir", "path")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"{value!r} must be an absolute path inside the sandbox")
        return None if value is None else "/" + posixpath.normpath(value).lstrip("/")

    @model_validator(mode="after")
    def _check(self) -> DeclaredTool:
        if self.arguments is not None and self.parameters is not None:
            raise ValueError("give the arguments as [tool.arguments.NAME] tables or as parameters, not both")
        _ = self.argument_specs  # a bad parameters schema is an error now
        if self.kind == "command":
            self._check_command()
        elif self.kind == "mcp":
            check_mcp_table(self.command, self.name, self.arguments is not None or self.parameters is not None)
        elif self.kind == "sql":
            _ = self.sql_database
        elif self.kind == "http":
            _check_http(method=self.method, url=self.url, query=self.query or {}, headers=self.headers or {},
                        body=self.body, env=self.env, specs=self.argument_specs)
        else:
            self._check_python()
        if self.description is not None and not self.description.strip():
            raise ValueError("description is empty: tell the model what the tool does, or leave it out")
        _ = self.input_model
        return self

    def _check_command(self) -> None:
        if not self.argv:
            raise ValueError('a kind = "command" tool needs argv = ["PROGRAM", "ARG", ...]')
        if _placeholders(self.argv[0]):
            raise ValueError(f"argv[0] {self.argv[0]!r} must name the program itself, without placeholders")
        specs = self.argument_specs
        used: set[str] = set()
        for where, text in [*((f"argv[{i}]", t) for i, t in enumerate(self.argv)),
                            *((f"env.{k}", v) for k, v in self.env.items())]:
            try:
                names = _placeholders(text)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
            for name in names:
                if name not in specs:
                    known = ", ".join(specs) or "none"
                    raise ValueError(f"{where} uses {{{name}}}, which is not an argument (arguments: {known}); "
                                     f"declare [tool.arguments.{name}] or fix the placeholder")
                if specs[name].type == "array" and (where.startswith("env.") or text != f"{{{name}}}"):
                    raise ValueError(f"{where}: the array argument {name!r} can only fill whole argv "
                                     f'elements: write the element as exactly "{{{name}}}"')
                used.add(name)
        unused = [name for name in specs if name not in used]
        if unused:
            raise ValueError(f"argument {unused[0]!r} is used nowhere: put {{{unused[0]}}} in argv or env, "
                             "or remove the argument")

    def _check_python(self) -> None:
        if self.function is None or _FUNCTION.fullmatch(self.function) is None:
            raise ValueError('a kind = "python" tool needs function = "module:function" (e.g. "tools:add")')
        if self.path is None:
            raise ValueError('a kind = "python" tool needs path = "/DIR", the sandbox directory holding the '
                             "module (provide it with a read-only mount)")
        for key, value in self.env.items():
            try:
                placeholders = _placeholders(value)
            except ValueError:
                placeholders = ["?"]
            if placeholders:
                raise ValueError(f"env.{key}: a python tool's arguments reach the function as keyword "
                                 "arguments, not the environment; remove the placeholder")

    @cached_property
    def argument_specs(self) -> dict[str, ArgumentSpec]:
        """The arguments, from ``arguments`` or converted from ``parameters``."""
        if self.parameters is not None:
            return _from_json_schema(self.parameters)
        return dict(self.arguments or {})

    @cached_property
    def sql_database(self) -> Database:
        """``sql``: the checked ``database`` (ValueError for a table that is not a good sql one)."""
        return check_sql_table(database=self.database, password=self.password,
                               has_arguments=self.arguments is not None or self.parameters is not None,
                               has_env=bool(self.env), timeout_s=self.timeout_s,
                               statement_timeout_s=self.statement_timeout_s)

    @cached_property
    def input_model(self) -> type[BaseModel]:
        """The pydantic model the call's arguments are validated with."""
        if self.kind == "sql":
            return sql_input_model(_model_name(self.name), self.shown_description, self.sql_database)
        fields = {name: spec.field() for name, spec in self.argument_specs.items()}
        model: type[BaseModel] = create_model(  # type: ignore[call-overload]
            _model_name(self.name), __config__=ConfigDict(extra="forbid"), __doc__=self.shown_description,
            __module__=__name__, **fields,
        )
        return model

    @property
    def shown_description(self) -> str:
        """The description the model reads."""
        if self.description is not None:
            return self.description
        if self.kind == "python":
            return f"Call the Python function {self.function} in the sandbox."
        if self.kind == "http":
            return f"Send {self.method or 'GET'} {self.url} (an HTTP request made from the sandbox)."
        if self.kind == "sql":
            mode = "it may change data" if self.write else "read-only: the database refuses changes"
            return f"Run one SQL statement on {self.sql_database.shown()} ({mode})."
        return f"Run {' '.join(self.argv or ())} in the sandbox."


def _check_http(
    *,
    method: HttpMethod | None,
    url: str | None,
    query: Mapping[str, str],
    headers: Mapping[str, str | SecretHeader],
    body: HttpBody | None,
    env: Mapping[str, str],
    specs: Mapping[str, ArgumentSpec],
) -> None:
    """The checks of a ``kind = "http"`` table; ``ValueError`` naming the key and the fix."""
    if url is None:
        raise ValueError('a kind = "http" tool needs url = "https://HOST/PATH/{ARG}"')
    if env:
        raise ValueError("env: an http tool starts no program of its own; send values as headers, "
                         "query parameters or the body, and remove env")
    parts = split_url(url)
    used: dict[str, str] = {}

    def names(text: str, where: str) -> list[tuple[str, bool]]:
        """The placeholders of ``text`` and whether each is the whole text."""
        try:
            template = parse_template(text)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        found = [p.name for p in template if not isinstance(p, str)]
        for name in found:
            if name not in specs:
                known = ", ".join(specs) or "none"
                raise ValueError(f"{where} uses {{{name}}}, which is not an argument (arguments: {known}); "
                                 f"declare [tool.arguments.{name}] or fix the placeholder")
            used.setdefault(name, where)
        return [(name, len(template) == 1) for name in found]

    for name, _whole in names(parts.path, "url"):
        spec = specs[name]
        if spec.type == "array":
            raise ValueError(f"url: the array argument {name!r} cannot fill a path segment; use it in query or body")
        if not spec.required and spec.default is None:
            raise ValueError(f"url: argument {name!r} fills the URL path, so it must be given: set "
                             "required = true or a default")
    for key, text in query.items():
        for name, whole in names(text, f"query.{key}"):
            if specs[name].type == "array" and not whole:
                raise ValueError(f'query.{key}: the array argument {name!r} must be the whole value: "{{{name}}}"')
    for key, value in headers.items():
        if HEADER_NAME.fullmatch(key) is None:
            raise ValueError(f"headers: {key!r} is not a header name (letters, digits and !#$%&'*+.^_`|~-)")
        if key.lower() in FIXED_HEADERS or key.lower().startswith("proxy-"):
            raise ValueError(f"headers.{key}: callbox sets this header itself; remove it")
        if isinstance(value, str):
            check_header_value(value, f"headers.{key}")
            if PLACEHOLDER_LIKE.search(value):
                raise ValueError(f"headers.{key}: header values are literal, never arguments; for a secret "
                                 'write { env = "VAR" }, for an argument use query or body')
    if body is not None:
        if method in (None, "GET", "HEAD"):
            raise ValueError(f"body: a {method or 'GET'} request has no body; set method = \"POST\" (or PUT, "
                             "PATCH, DELETE) or remove body")
        if body.text is not None:
            found = names(body.text, "body.text")
            if len(found) != 1 or not found[0][1] or specs[found[0][0]].type != "string":
                raise ValueError('body.text must be exactly "{ARG}", one string argument sent as the body')
        else:
            _check_http_json(body.json_template, "body.json", names, specs)
    unused = [name for name in specs if name not in used]
    if unused:
        raise ValueError(f"argument {unused[0]!r} is used nowhere: put {{{unused[0]}}} in url, query or body, "
                         "or remove the argument")


def _check_http_json(value: Any, where: str, names: Any, specs: Mapping[str, ArgumentSpec]) -> None:
    if isinstance(value, str):
        for name, whole in names(value, where):
            if specs[name].type == "array" and not whole:
                raise ValueError(f'{where}: the array argument {name!r} must be the whole value: "{{{name}}}"')
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_http_json(item, f"{where}.{key}", names, specs)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_http_json(item, f"{where}[{index}]", names, specs)


def _model_name(tool: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", tool) if part) + "Args"


def _check_argument_name(name: str) -> None:
    if _ARGUMENT_NAME.fullmatch(name) is None or keyword.iskeyword(name):
        raise ValueError(f"argument name {name!r} must be an identifier (a letter, then letters, digits, '_')")
    if hasattr(BaseModel, name) or name.startswith("model_"):
        raise ValueError(f"argument name {name!r} is reserved (pydantic uses it); choose another name")


def _from_json_schema(schema: dict[str, Any]) -> dict[str, ArgumentSpec]:
    """``parameters`` (a JSON Schema object) as argument specs; the supported subset only."""
    if schema.get("type") != "object":
        raise ValueError('parameters must be a JSON Schema object: type = "object" with properties')
    extra = set(schema) - {"type", "properties", "required", "additionalProperties", "description", "title"}
    if extra:
        raise ValueError(f"parameters: keyword {sorted(extra)[0]!r} is not supported (supported: type, "
                         "properties, required, additionalProperties = false); use [tool.arguments.NAME] tables")
    if schema.get("additionalProperties", False) is not False:
        raise ValueError("parameters: additionalProperties must be false (a tool takes only its declared arguments)")
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    if not isinstance(properties, dict) or not isinstance(required, list):
        raise ValueError("parameters: properties must be a table and required a list of names")
    for name in required:
        if name not in properties:
            raise ValueError(f"parameters.required names {name!r}, which is not in parameters.properties")
    specs: dict[str, ArgumentSpec] = {}
    for name, prop in properties.items():
        _check_argument_name(name)
        where = f"parameters.properties.{name}"
        if not isinstance(prop, dict):
            raise ValueError(f"{where} must be a table (a JSON Schema)")
        unknown = set(prop) - _SCHEMA_KEYS
        if unknown:
            raise ValueError(f"{where}: keyword {sorted(unknown)[0]!r} is not supported "
                             f"(supported: {', '.join(sorted(_SCHEMA_KEYS))})")
        values = {k: v for k, v in prop.items() if k != "items"}
        if prop.get("type") == "array" and prop.get("items") != {"type": "string"}:
            raise ValueError(f'{where}: an array argument is a list of strings: items = {{ type = "string" }}')
        if "items" in prop and prop.get("type") != "array":
            raise ValueError(f"{where}: items applies to type = \"array\" only")
        try:
            specs[name] = ArgumentSpec.model_validate({**values, "required": name in required})
        except ValueError as exc:
            first = exc.errors()[0] if hasattr(exc, "errors") else None
            message = first["msg"].removeprefix("Value error, ") if first else str(exc)
            raise ValueError(f"{where}: {message}") from None
    return specs
