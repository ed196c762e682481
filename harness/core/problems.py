"""pydantic's validation errors as sentences, each naming the key path of its problem.

What a tool call's arguments, a policy file and a server configuration have in common when
a value is refused: :func:`describe_validation_error` words every problem pydantic found as
one sentence that names where it is (``files[2].path``, ``sandbox.memory``), what was
expected and what came instead; :func:`parse_toml_model` reads a TOML file into a model and
reports its problems that way.

A value outside a field's bounds (``ge``, ``le``, ...) is worded by :mod:`harness.core.bounds`
from the field itself: its whole allowed range, sizes as a user writes them (``32m``).
"""

from __future__ import annotations

import json
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from harness.core.bounds import BOUND_ERRORS, out_of_bounds

__all__ = ["describe_validation_error", "is_model", "parse_toml_model", "render_path", "show_value"]

_MAX_SHOWN_CHARS = 60


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def render_path(path: Sequence[str | int]) -> str:
    """``("files", 2, "path")`` -> ``files[2].path``; unusual keys are quoted: ``env."A B"``."""
    out: list[str] = []
    for part in path:
        if isinstance(part, int):
            out.append(f"[{part}]")
        else:
            text = part if _IDENTIFIER.fullmatch(part) else json.dumps(part, ensure_ascii=False)
            out.append(f".{text}" if out else text)
    return "".join(out)


def show_value(value: Any) -> str:
    """A short rendering of a value the model sent, for "got ..." in a message."""
    if isinstance(value, str):
        return repr(value if len(value) <= _MAX_SHOWN_CHARS else value[:_MAX_SHOWN_CHARS] + "...")
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)
    except (TypeError, ValueError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= _MAX_SHOWN_CHARS else text[:_MAX_SHOWN_CHARS] + "..."


# What each pydantic type error expected, in JSON words.
_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "decimal_type": "a number",
    "decimal_parsing": "a number",
    "string_type": "a string",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "an array",
    "tuple_type": "an array",
    "set_type": "an array",
    "frozen_set_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "dataclass_type": "an object",
    "none_required": "null",
    "path_type": "a path string",
}
_SHOULD = re.compile(r"^(?:Input|String|List|Value|Dictionary|Tuple|Set|Object|Data|Decimal|Array)\s+should\s+")
_NO_GOT = frozenset({"missing", "extra_forbidden", "value_error", "assertion_error"})


def describe_validation_error(
    exc: ValidationError,
    model: type[BaseModel],
    *,
    noun: str = "argument",
    object_word: str = "an object",
    array_word: str = "an array",
    name: Callable[[str], str] | None = None,
) -> list[str]:
    """One sentence per problem in ``exc``, each naming its path (``files[2].path``).

    ``noun`` names what the paths are ("argument"; the policy loader says "key"), and
    ``object_word``/``array_word`` the container words ("a table"/"an array" for TOML).
    ``name`` words the path of a refused value (default ``argument 'PATH'``; the command
    line names the flag that set it, ``--memory``). Errors of one path (the branches of a
    union) are merged into one sentence. A value outside its field's bounds is worded by
    :func:`~harness.core.bounds.out_of_bounds` (``key 'sandbox.pids': 0 is below the
    minimum of 8 (allowed: 8 to 65536)``).
    """

    def subject(path: str) -> str:
        return name(path) if name is not None else f"{noun} '{path}'"

    grouped: dict[str, list[str]] = {}
    got: dict[str, Any] = {}
    order: list[str] = []
    for error in exc.errors(include_url=False):
        kind = error["type"]
        loc = tuple(error["loc"])
        path, parent = _resolve_loc(model, loc)
        if kind in BOUND_ERRORS:
            field = _field(parent, loc)
            problem = out_of_bounds(error.get("input"), field, kind, error.get("ctx"))
            _add(grouped, order, f"!{path}:{problem}", f"{subject(path)}: {problem}" if path else problem)
            continue
        if kind == "missing":
            sentence = f"missing required {noun} '{path}'"
            _add(grouped, order, f"!{path}", sentence)
            continue
        if kind == "extra_forbidden":
            allowed = _allowed_keys(parent)
            hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
            _add(grouped, order, f"!{path}", f"unexpected {noun} '{path}'{hint}")
            continue
        if kind in ("value_error", "assertion_error"):
            message = str(error.get("ctx", {}).get("error", error["msg"]))
            message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
            sentence = f"{subject(path)}: {message}" if path else message
            _add(grouped, order, f"!{path}:{message}", sentence)
            continue
        expected = _EXPECTED.get(kind)
        phrase = f"be {expected}" if expected else _SHOULD.sub("", error["msg"])
        phrase = phrase.replace("an object", object_word).replace("an array", array_word)
        if "valid dictionary" in phrase:
            phrase = f"be {object_word}"
        _add(grouped, order, path, phrase)
        if kind not in _NO_GOT:
            got.setdefault(path, error.get("input"))
    sentences: list[str] = []
    for key in order:
        phrases = grouped[key]
        if key.startswith("!"):
            sentences.extend(phrases)
            continue
        sentence = f"{subject(key) if key else 'the arguments'} must {_merge(phrases)}"
        if key in got:
            sentence += f", got {show_value(got[key])}"
        sentences.append(sentence)
    return sentences


def _field(parent: type[BaseModel] | None, loc: tuple[Any, ...]) -> FieldInfo | None:
    """The field of ``parent`` a loc ends in (past any union-branch tags), if any."""
    if parent is None:
        return None
    for part in reversed(loc):
        if isinstance(part, str) and part in parent.model_fields:
            return parent.model_fields[part]
    return None


def _add(grouped: dict[str, list[str]], order: list[str], key: str, phrase: str) -> None:
    if key not in grouped:
        grouped[key] = []
        order.append(key)
    if phrase not in grouped[key]:
        grouped[key].append(phrase)


def _merge(phrases: list[str]) -> str:
    if len(phrases) == 1:
        return phrases[0]
    if all(p.startswith("be ") for p in phrases):
        return "be " + " or ".join(p.removeprefix("be ") for p in phrases)
    return ", or ".join(phrases)


def _strip(annotation: Any) -> Any:
    """Unwrap ``Annotated`` and ``X | None``."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
            continue
        if origin is typing.Union or origin is types.UnionType:
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(members) == 1:
                annotation = members[0]
                continue
        return annotation


def is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _resolve_loc(root: type[BaseModel], loc: tuple[Any, ...]) -> tuple[str, type[BaseModel] | None]:
    """The readable path of a pydantic ``loc`` and the model holding its last key.

    Walks the model's annotations alongside the loc, so dict keys (tool names like
    ``my-tool``) are kept as keys and union-branch tags (``str``, ``list[str]``,
    ``function-after[...]``) are dropped.
    """
    current: Any = root
    parent: type[BaseModel] | None = root
    parts: list[str | int] = []
    for part in loc:
        current = _strip(current)
        origin = typing.get_origin(current)
        if is_model(current):
            parent = current
            fields = current.model_fields
            parts.append(part)
            current = fields[part].annotation if isinstance(part, str) and part in fields else None
        elif origin is typing.Union or origin is types.UnionType:
            members = [a for a in typing.get_args(current) if a is not type(None)]
            models = [m for m in members if is_model(m) and isinstance(part, str) and part in m.model_fields]
            if models:  # the loc goes straight into a model branch
                parent = models[0]
                parts.append(part)
                current = models[0].model_fields[part].annotation
            else:  # a branch tag: follow the branch it names when we can tell, else lose the type
                current = next((m for m in members if _tag(m) == part), None)
        elif origin in (list, tuple, set, frozenset) or (origin is not None and _is_sequence(origin)):
            args = typing.get_args(current)
            parts.append(part)
            current = args[0] if args else None
        elif origin is dict or (origin is not None and _is_mapping(origin)):
            args = typing.get_args(current)
            parts.append(part)
            current = args[1] if len(args) == 2 else None
            parent = None
        else:
            parts.append(part)
            current = None
            parent = None
    return render_path(parts), parent


def _tag(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation)


def _is_sequence(origin: Any) -> bool:
    return isinstance(origin, type) and issubclass(origin, Sequence) and not issubclass(origin, str)


def _is_mapping(origin: Any) -> bool:
    return isinstance(origin, type) and issubclass(origin, Mapping)


@lru_cache(maxsize=256)
def _allowed_keys(model: type[BaseModel] | None) -> tuple[str, ...]:
    if model is None:
        return ()
    names: list[str] = []
    for name, info in model.model_fields.items():
        alias = info.validation_alias if isinstance(info.validation_alias, str) else info.alias
        names.append(alias or name)
    return tuple(names)



_ModelT = typing.TypeVar("_ModelT", bound=BaseModel)


def parse_toml_model(text: str, model: type[_ModelT], *, source: str,
                     error: typing.Callable[[str], Exception],
                     message: typing.Callable[[str, list[str]], str]) -> _ModelT:
    """TOML ``text`` validated as ``model``: a syntax error or the key paths of every problem
    raised as ``error(...)``; ``message(source, problems)`` words the problems."""
    import tomllib

    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{source} is not valid TOML: {exc}; fix the syntax there") from None
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problems = describe_validation_error(exc, model, noun="key", object_word="a table")
        raise error(message(source, problems)) from None
