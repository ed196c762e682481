"""References of TOML files read from the pydantic models that validate them.

A model is walked field by field. A field whose type is a model is a table (``[sandbox]``); a
``dict[str, Model]`` is a table per key (``[tools.NAME]``); a tuple or list of models is an
array of tables (``[[sandbox.mounts]]``); anything else is a key of the table it is in. Each key
is listed with its dotted path (``sandbox.memory``, also its anchor), its type, its default and
the field's docstring, the one place it is written. A field without a docstring is an error
that names it: the reference would otherwise say nothing about that key.
"""

from __future__ import annotations

import ast
import enum
import functools
import inspect
import itertools
import textwrap
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from docs.hooks.text import cell, code, docstring_markdown, table

NAME = "NAME"
"""How a key the user chooses (a tool's name, a profile's) is written in a path."""


class MissingDocstrings(Exception):
    """Fields whose keys the reference cannot describe; the message lists each one."""


@dataclass(frozen=True)
class Key:
    """One key of a table."""

    path: tuple[str, ...]
    type: str
    default: str
    doc: str

    @property
    def dotted(self) -> str:
        return ".".join(self.path)


@dataclass
class Table:
    """One TOML table (or array of tables) and its keys; the root table has an empty path."""

    path: tuple[str, ...]
    array: bool
    doc: str
    keys: list[Key] = field(default_factory=list)
    names: list[tuple[str, str]] = field(default_factory=list)
    """For a table of fixed names of one shape: each name and what it is for."""

    @property
    def dotted(self) -> str:
        return ".".join(self.path)

    @property
    def header(self) -> str:
        if not self.path:
            return "top level"
        return f"[[{self.dotted}]]" if self.array else f"[{self.dotted}]"


# --- docstrings -------------------------------------------------------------------------------


@functools.cache
def _class_field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of ``cls``'s own source: a string right after ``name: type``."""
    if cls is BaseModel or not issubclass(cls, BaseModel) or cls.__module__.startswith("pydantic."):
        return {}
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    tree = ast.parse(source)
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef)), None)
    if node is None:
        return {}
    docs: dict[str, str] = {}
    body = node.body
    for statement, following in itertools.pairwise(body):
        if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            docs[statement.target.id] = following.value.value
    return docs


def field_docs(model: type[BaseModel], doc_sources: Mapping[type, type] = {}) -> dict[str, str]:
    """Each field's docstring (or ``description``), looked up along the class's bases; a
    parametrized generic model is read from its origin's source. ``doc_sources`` names, for a
    model whose fields were made at run time, the class whose source documents them."""
    docs: dict[str, str] = {}
    classes: list[type] = []
    for cls in model.__mro__:
        classes.append(cls)
        origin = getattr(cls, "__pydantic_generic_metadata__", {}).get("origin")
        if origin is not None:
            classes.append(origin)
        if cls in doc_sources:
            classes.append(doc_sources[cls])
    for cls in reversed(classes):
        docs.update(_class_field_docs(cls))  # a subclass's docstring wins over its base's
    for name, info in model.model_fields.items():
        if info.description:
            docs[name] = info.description
    return docs


# --- types ------------------------------------------------------------------------------------


def _strip(annotation: Any) -> tuple[Any, list[Any]]:
    """``annotation`` without ``Annotated`` (its metadata returned beside it)."""
    metadata: list[Any] = []
    while typing.get_origin(annotation) is typing.Annotated:
        metadata.extend(annotation.__metadata__)
        annotation = annotation.__origin__
    return annotation, metadata


def _alternatives(annotation: Any) -> list[Any]:
    """The members of a union (``X | None`` gives ``[X, None]``), else ``[annotation]``; a
    member keeps its ``Annotated`` metadata (a size is an annotated int)."""
    bare, _ = _strip(annotation)
    if typing.get_origin(bare) in (typing.Union, types.UnionType):
        return [a for arg in typing.get_args(bare) for a in _alternatives(arg)]
    return [annotation]


def _is_model(annotation: Any) -> bool:
    annotation, _ = _strip(annotation)
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _model(annotation: Any) -> type[BaseModel]:
    annotation, _ = _strip(annotation)
    assert isinstance(annotation, type) and issubclass(annotation, BaseModel)
    return annotation


def _named_tables(model: type[BaseModel]) -> type[BaseModel] | None:
    """The model every field of ``model`` is, when there are several of them: a table of
    fixed names with one shape (``[actions.process]``, ``[actions.attach]``, ...), shown once
    as ``[actions.NAME]`` with the names listed."""
    kinds = {info.annotation for info in model.model_fields.values()}
    if len(model.model_fields) < 3 or len(kinds) != 1:
        return None
    (kind,) = kinds
    return _model(kind) if _is_model(kind) else None


def _is_size(metadata: list[Any]) -> bool:
    """Whether a field is a :data:`harness.core.units.ByteSize` (bytes, or ``"512m"``)."""
    from harness.core.units import ByteSize

    size_validator = typing.get_args(ByteSize)[1]
    return any(m is size_validator or m == size_validator for m in metadata)


def type_text(annotation: Any, metadata: list[Any] = ()) -> str:  # type: ignore[assignment]
    """How the reference names a value's type."""
    annotation, more = _strip(annotation)
    metadata = [*metadata, *more]
    if _is_size(metadata):
        return 'size (bytes, or "512m")'
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        names = [type_text(a) for a in args if a is not type(None)]
        return " or ".join(dict.fromkeys(names))
    if origin is typing.Literal:
        return " \\| ".join(code(_toml(a)) for a in args)
    if origin in (tuple, list, set, frozenset):
        item = args[0] if args else Any
        return f"array of {type_text(item)}"
    if origin in (dict, Mapping):
        return f"table of {type_text(args[1])}" if len(args) == 2 else "table"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(code(_toml(m.value)) for m in annotation)
    if _is_model(annotation):
        return "table"
    plain: dict[Any, str] = {bool: "boolean", int: "integer", float: "number", str: "string", Any: "any"}
    if annotation in plain:
        return plain[annotation]
    if isinstance(annotation, type) and issubclass(annotation, PurePath):
        return "path"
    return str(getattr(annotation, "__name__", annotation))


def _toml(value: Any) -> str:
    """``value`` written as TOML would (as far as defaults and literals go)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return _toml(value.value)
    if isinstance(value, str | PurePath):
        return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, float) and value.is_integer():
        return str(int(value)) if abs(value) < 1e15 else repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }" if value else "{}"
    return str(value)


def default_text(info: FieldInfo) -> str:
    """The default as TOML in a code span; ``required`` or ``absent`` when there is none."""
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True, validated_data={})
    if value is None:
        return "absent"
    if isinstance(value, BaseModel):
        return ""
    if _is_size(info.metadata) and isinstance(value, int):
        from harness.core.units import format_size

        return code(_toml(format_size(value)))
    return code(_toml(value))


# --- walking ----------------------------------------------------------------------------------


def walk(model: type[BaseModel], *, doc_sources: Mapping[type, type] = {},
         path: tuple[str, ...] = (), array: bool = False, doc: str = "") -> Iterator[Table]:
    """The tables of ``model`` (at ``path``), this one first, then its subtables depth first.
    Raises :class:`MissingDocstrings` listing every undocumented field of the whole tree."""
    missing: list[str] = []
    tables = list(_walk(model, doc_sources, path, array, doc, missing))
    if missing:
        raise MissingDocstrings("these fields have no docstring, so the reference cannot describe their key: "
                                + "; ".join(missing) + " (add a docstring under each field)")
    yield from tables


def _walk(model: type[BaseModel], doc_sources: Mapping[type, type], path: tuple[str, ...], array: bool,
          doc: str, missing: list[str]) -> Iterator[Table]:
    docs = field_docs(model, doc_sources)
    here = Table(path, array, doc or inspect.cleandoc(model.__doc__ or ""))
    below: list[Iterator[Table]] = []
    shape = _named_tables(model)
    if shape is not None:
        for name, info in model.model_fields.items():
            text = docs.get(name, "").strip()
            if not text:
                missing.append(f"{model.__module__}.{model.__qualname__}.{name} ({'.'.join((*path, name))})")
            here.names.append((info.alias or name, text))
        yield here
        yield from _walk(shape, doc_sources, (*path, NAME), False, "", missing)
        return
    for name, info in model.model_fields.items():
        key = info.alias or name
        text = docs.get(name, "").strip()
        if not text:
            missing.append(f"{model.__module__}.{model.__qualname__}.{name} ({'.'.join((*path, key))})")
        annotation, metadata = _strip(info.annotation)
        metadata = [*info.metadata, *metadata]
        scalar = []
        for alternative in _alternatives(annotation):
            bare, _ = _strip(alternative)
            origin, args = typing.get_origin(bare), typing.get_args(bare)
            if _is_model(alternative):
                below.append(_walk(_model(alternative), doc_sources, (*path, key), False, text, missing))
            elif origin in (dict, Mapping) and len(args) == 2 and any(map(_is_model, _alternatives(args[1]))):
                for value in _alternatives(args[1]):
                    if _is_model(value):
                        below.append(_walk(_model(value), doc_sources, (*path, key, NAME), False, text, missing))
                    elif value is not type(None):
                        scalar.append(alternative)
            elif origin in (tuple, list) and args and _is_model(args[0]):
                below.append(_walk(_model(args[0]), doc_sources, (*path, key), True, text, missing))
            elif bare is not type(None):
                scalar.append(alternative)
        if scalar:
            shown = scalar[0] if len(scalar) == 1 else typing.Union[tuple(scalar)]  # noqa: UP007
            here.keys.append(Key((*path, key), type_text(shown, metadata), default_text(info), text))
    yield here
    for tables in below:
        yield from tables


# --- Markdown ---------------------------------------------------------------------------------


def render(tables: list[Table], *, level: int = 2) -> str:
    """A section per table: its header as a heading (anchored at its dotted path), what it is
    for, and its keys, each anchored at its own dotted path."""
    sections = []
    for t in tables:
        if not t.keys and not t.doc and not t.names:
            continue
        anchor = t.dotted or "top-level"
        parts = [f"{'#' * level} {code(t.header) if t.path else 'Top-level keys'} {{#{anchor}}}"]
        if t.doc:
            parts.append(docstring_markdown(t.doc))
        if t.names:
            names = [(code(name), cell(docstring_markdown(doc))) for name, doc in t.names]
            parts.append(table(("NAME", "what it is for"), names))
        if t.keys:
            rows = [(f'<a id="{k.dotted}"></a>{code(k.path[-1])}', cell(k.type), k.default,
                     cell(docstring_markdown(k.doc))) for k in t.keys]
            parts.append(table(("key", "type", "default", "meaning"), rows))
        sections.append("\n\n".join(parts))
    return "\n\n".join(sections) + "\n"


def policy_tables() -> list[Table]:
    """The tables of a policy file: :class:`harness.core.policy.Policy`, which ``load_policy``
    validates. ``[sandbox]``'s fields are made at run time from the spec's, so their docs are
    read from :class:`harness.engine.spec.SandboxFields`."""
    from harness.core.policy import Policy
    from harness.core.sandbox_settings import SandboxSettings
    from harness.engine.spec import SandboxFields

    return list(walk(Policy, doc_sources={SandboxSettings: SandboxFields}))


def config_tables() -> list[Table]:
    """The tables of a server configuration file: :class:`harness.cli.server_config.ServerConfig`."""
    from harness.cli.server_config import ServerConfig

    return list(walk(ServerConfig))


def generate_policy() -> str:
    return render(policy_tables())


def generate_config() -> str:
    return render(config_tables())
