"""A pydantic model's JSON Schema in the two forms tool APIs expect.

**Strict** (:func:`strict_json_schema`), for OpenAI function tools with ``"strict": true``
(Structured Outputs). Strict mode accepts a subset of JSON Schema and adds two rules:
every object has ``"additionalProperties": false`` and lists every property in
``required``. So here:

* an optional field (one with a default, or typed ``X | None``) is made *nullable* and
  required: the model sends ``null`` to mean "use the default". A non-``None`` default is
  stated in the field's description ("Default: 30.") because ``default`` keys are removed.
  :func:`nulls_to_defaults` undoes this on incoming arguments before validation, so
  ``null`` for a field that does not accept ``None`` falls back to its default;
* descriptions stay (they are what the model reads); ``title`` (generated noise),
  ``default``, ``examples`` and the validation keywords strict mode rejects
  (``minLength``, ``maxLength``, ``uniqueItems``, ...) are dropped: the arguments are still
  validated with the pydantic model itself, which enforces them;
* ``$defs``/``$ref`` stay (recursive models work); a ``$ref`` that carries a sibling
  ``description`` is inlined, since strict mode does not accept siblings next to ``$ref``;
  ``oneOf`` (pydantic's discriminated unions) becomes ``anyOf``.

**Plain** (:func:`plain_json_schema`), for everything that reads ordinary JSON Schema
(Anthropic, MCP clients, OpenAI without strict mode). Clients such as MCP SDKs check
``required`` themselves and refuse a call that leaves a required argument out, so:

* ``required`` lists only the fields the model has no default for;
* an optional field whose default is ``None`` loses its ``null`` branch (leaving it out
  says the same, and costs the model no tokens); ``null`` stays where it means something
  else than the default (``X | None`` with a non-``None`` default, or a required
  ``X | None``). Server-side validation still accepts an explicit ``null`` either way;
* a non-``None`` default is kept as ``default``; validation keywords (``minLength``,
  ``maxItems``, ...) and ``examples`` are kept; ``title`` is dropped;
* every ``$ref`` is inlined, so the schema is self-contained; only a recursive model
  keeps the ``$defs`` entry it refers back to.

Both forms come from one walk over pydantic's schema (:func:`json_schema`), with
``additionalProperties: false`` on every object. A model either form cannot express
raises :class:`StrictSchemaError` naming the field and the fix: free-form objects
(``dict[str, X]``, ``extra="allow"``), fields typed ``Any``, tuples with per-position
types, a root that is not an object, unknown keywords.
"""

from __future__ import annotations

import copy
import json
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal

import pydantic

__all__ = [
    "SchemaForm",
    "StrictSchemaError",
    "json_schema",
    "nulls_to_defaults",
    "plain_json_schema",
    "strict_json_schema",
]

SchemaForm = Literal["strict", "plain"]
"""``strict``: OpenAI strict mode (every property required, optional ones nullable);
``plain``: ordinary JSON Schema (only real requirements, defaults shown)."""


class StrictSchemaError(ValueError):
    """The model's schema cannot be made strict; ``field`` names where, the message says how to fix it."""

    def __init__(self, field: str, problem: str, fix: str) -> None:
        super().__init__(f"field {field!r} {problem}; {fix}")
        self.field = field
        self.problem = problem
        self.fix = fix


# Keywords strict mode accepts and that we keep as they are (their values are not schemas).
_KEPT = frozenset(
    {
        "type",
        "description",
        "enum",
        "const",
        "pattern",
        "multipleOf",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minItems",
        "maxItems",
    }
)
# Kept in the plain form as well: standard JSON Schema that clients and models understand.
_PLAIN_KEPT = _KEPT | frozenset(
    {"minLength", "maxLength", "uniqueItems", "minProperties", "maxProperties", "examples", "deprecated"}
)
# Keywords handled structurally below.
_STRUCTURAL = frozenset({"properties", "required", "additionalProperties", "items", "anyOf", "$ref", "$defs", "format"})
# Annotations and validation-only keywords strict mode rejects; pydantic still enforces them.
_DROPPED = frozenset(
    {
        "title",
        "default",
        "examples",
        "minLength",
        "maxLength",
        "uniqueItems",
        "minProperties",
        "maxProperties",
        "discriminator",
        "readOnly",
        "writeOnly",
        "deprecated",
        "contentEncoding",
        "contentMediaType",
        "$comment",
        "$schema",
    }
)
# String formats strict mode understands; other formats (pydantic's "path", "uri", ...) are dropped.
_FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"})
_PRIMITIVES = frozenset({"string", "number", "integer", "boolean"})
_FREE_FORM_FIX = "use a list of {key, value} objects or a model with fixed fields"
_TYPE_KEYS = ("type", "anyOf", "oneOf", "allOf", "$ref", "enum", "const")


def strict_json_schema(model: type[pydantic.BaseModel]) -> dict[str, Any]:
    """The strict JSON Schema of ``model``'s input (a new dict each call)."""
    return json_schema(model, "strict")


def plain_json_schema(model: type[pydantic.BaseModel]) -> dict[str, Any]:
    """The plain JSON Schema of ``model``'s input (a new dict each call)."""
    return json_schema(model, "plain")


def json_schema(model: type[pydantic.BaseModel], form: SchemaForm) -> dict[str, Any]:
    """The JSON Schema of ``model``'s input in ``form`` (a new dict each call)."""
    if form not in ("strict", "plain"):
        raise ValueError(f"unknown schema form {form!r}; choose 'strict' or 'plain'")
    if not (isinstance(model, type) and issubclass(model, pydantic.BaseModel)):
        raise TypeError(f"expected a pydantic BaseModel subclass, got {model!r}")
    raw = model.model_json_schema(mode="validation")
    defs: dict[str, Any] = raw.pop("$defs", {})
    name = model.__name__

    root = raw
    root_ref = root.get("$ref")
    if isinstance(root_ref, str) and len(root) == 1:
        # A recursive root model: pydantic puts it in $defs and points at it.
        root = copy.deepcopy(_resolve(root_ref, defs, name))
    else:
        root_ref = None
    if root.get("type") != "object" or "anyOf" in root or "oneOf" in root:
        raise StrictSchemaError(
            name,
            "is the root of the tool input but is not an object",
            "tool arguments must be a JSON object: wrap the value in a model with named fields",
        )

    converter = _Converter(defs, plain=form == "plain")
    out = converter.convert_expanding(root_ref, root, name)
    converted_defs = {
        def_name: converter.convert_expanding(f"#/$defs/{def_name}", schema, def_name)
        for def_name, schema in defs.items()
    }
    used = _reachable(out, converted_defs)
    if used:
        out["$defs"] = {def_name: converted_defs[def_name] for def_name in converted_defs if def_name in used}
    return out


class _Converter:
    def __init__(self, defs: Mapping[str, Any], *, plain: bool) -> None:
        self.defs = defs
        self.plain = plain
        self.kept = _PLAIN_KEPT if plain else _KEPT
        self.inlining: list[str] = []

    def convert_expanding(self, ref: str | None, node: Any, where: str) -> dict[str, Any]:
        """``convert`` for the schema ``ref`` names: in the plain form, where every reference
        is inlined, a reference back to it inside stays a reference."""
        if not self.plain or ref is None:
            return self.convert(node, where)
        self.inlining.append(ref)
        try:
            return self.convert(node, where)
        finally:
            self.inlining.pop()

    def convert(self, node: Any, where: str) -> dict[str, Any]:
        if not isinstance(node, dict):
            raise StrictSchemaError(where, f"has a schema strict mode cannot use ({node!r})", "give it a concrete type")
        if not any(key in node for key in _TYPE_KEYS):
            raise StrictSchemaError(
                where,
                "accepts any JSON value (typed Any, object or left without a type)",
                "give it a concrete type (str, int, a Literal, a model, a list of those)",
            )
        node = {key: value for key, value in node.items() if key not in _DROPPED or key in self.kept}

        if "oneOf" in node:  # pydantic's discriminated unions; anyOf means the same here
            if "anyOf" in node:
                raise StrictSchemaError(where, "combines oneOf and anyOf", "use a single union")
            node["anyOf"] = node.pop("oneOf")
        if "allOf" in node:
            parts = node.pop("allOf")
            if not isinstance(parts, list) or len(parts) != 1:
                raise StrictSchemaError(
                    where,
                    "is an intersection (allOf), which strict mode does not support",
                    "describe it with a single model",
                )
            node = {**parts[0], **node}

        ref = node.get("$ref")
        if ref is not None and (len(node) > 1 or self.plain):
            return self._inline(node, ref, where)

        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in self.kept or key == "$ref":
                out[key] = value
            elif key == "format":
                if value in _FORMATS:
                    out[key] = value
            elif key not in _STRUCTURAL:
                raise StrictSchemaError(
                    where,
                    f"uses the JSON Schema keyword {key!r}, which strict mode does not support"
                    + (" (a tuple with per-position types)" if key == "prefixItems" else ""),
                    "use a list of one item type or a model with named fields"
                    if key == "prefixItems"
                    else "remove it (from json_schema_extra) or use a plainer type",
                )
        if "items" in node:
            items = node["items"]
            if not isinstance(items, dict):
                raise StrictSchemaError(where, "is an array without one item schema", "use list[X] with a concrete X")
            out["items"] = self.convert(items, f"{where}[]")
        if "anyOf" in node:
            out["anyOf"] = [self.convert(variant, where) for variant in node["anyOf"]]
        if node.get("type") == "object" or "properties" in node or "additionalProperties" in node:
            self._object(node, out, where)
        return _ordered(out)

    def _object(self, node: dict[str, Any], out: dict[str, Any], where: str) -> None:
        properties = node.get("properties", {})
        extra = node.get("additionalProperties", False)
        if extra is not False:
            if properties:
                raise StrictSchemaError(
                    where,
                    "accepts extra keys (a model with extra='allow')",
                    "set model_config = ConfigDict(extra='forbid')",
                )
            raise StrictSchemaError(
                where,
                "is a free-form object (dict[str, ...]), which strict mode cannot describe",
                _FREE_FORM_FIX,
            )
        required = set(node.get("required", ()))
        converted: dict[str, Any] = {}
        for prop, schema in properties.items():
            field_where = f"{where}.{prop}"
            prop_schema = self.convert(schema, field_where)
            if prop not in required:
                default = schema.get("default") if isinstance(schema, dict) else None
                if self.plain:
                    stated = isinstance(schema, dict) and "default" in schema
                    prop_schema = _with_default(prop_schema, default, stated=stated)
                else:
                    if default is not None:
                        prop_schema = _with_note(prop_schema, f"Default: {json.dumps(default)}.")
                    prop_schema = _nullable(prop_schema)
            converted[prop] = prop_schema
        out["type"] = "object"
        out["properties"] = converted
        if not self.plain:
            out["required"] = list(converted)
        elif required:
            # Draft 4 validators refuse an empty list, and leaving it out says the same.
            out["required"] = [prop for prop in converted if prop in required]
        out["additionalProperties"] = False

    def _inline(self, node: dict[str, Any], ref: Any, where: str) -> dict[str, Any]:
        siblings = {key: value for key, value in node.items() if key != "$ref"}
        if not isinstance(ref, str):
            raise StrictSchemaError(where, f"has a non-string $ref {ref!r}", "use pydantic's generated schema")
        if ref in self.inlining:
            # Inlining again would never end; keep the reference (strict mode: and lose the
            # sibling text, which it does not accept next to $ref).
            if self.plain and "description" in siblings:
                return {"$ref": ref, "description": siblings["description"]}
            return {"$ref": ref}
        target = _resolve(ref, self.defs, where)
        self.inlining.append(ref)
        try:
            return self.convert({**target, **siblings}, where)
        finally:
            self.inlining.pop()


_ORDER = {key: i for i, key in enumerate(("type", "description", "enum", "const", "$ref", "anyOf", "items"))}
_LAST = ("properties", "required", "additionalProperties")


def _ordered(schema: dict[str, Any]) -> dict[str, Any]:
    """Keys in reading order: type and description first, an object's properties last."""
    head = sorted((key for key in schema if key not in _LAST), key=lambda key: _ORDER.get(key, len(_ORDER)))
    return {key: schema[key] for key in (*head, *(key for key in _LAST if key in schema))}


def _resolve(ref: str, defs: Mapping[str, Any], where: str) -> dict[str, Any]:
    prefix = "#/$defs/"
    target = defs.get(ref[len(prefix) :]) if ref.startswith(prefix) else None
    if not isinstance(target, dict):
        raise StrictSchemaError(where, f"refers to {ref!r}, which is not in $defs", "use pydantic's generated schema")
    return target


def _with_note(schema: dict[str, Any], note: str) -> dict[str, Any]:
    description = schema.get("description")
    text = f"{description.rstrip()} {note}" if isinstance(description, str) and description.strip() else note
    return {**schema, "description": text}


def _with_default(schema: dict[str, Any], default: Any, *, stated: bool) -> dict[str, Any]:
    """An optional field's plain schema: a ``None`` default is the same as leaving the field
    out, so its ``null`` branch goes; another default is stated and ``null`` is left as is
    (as it is when the default is computed, ``default_factory``, and so not in the schema)."""
    if not stated:
        return schema
    if default is not None:
        return _ordered({**schema, "default": default})
    return _without_null(schema)


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    kind = schema.get("type")
    if isinstance(kind, list) and "null" in kind:
        rest = [k for k in kind if k != "null"]
        if rest:
            return {**schema, "type": rest[0] if len(rest) == 1 else rest}
    variants = schema.get("anyOf")
    if not isinstance(variants, list):
        return schema
    kept = [v for v in variants if not (isinstance(v, dict) and v.get("type") == "null" and len(v) == 1)]
    if not kept or len(kept) == len(variants):
        return schema
    outer = {key: value for key, value in schema.items() if key != "anyOf"}
    if len(kept) > 1:
        return _ordered({**outer, "anyOf": kept})
    return _ordered({**kept[0], **outer})


def _accepts_null(schema: Mapping[str, Any]) -> bool:
    kind = schema.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    return any(isinstance(v, dict) and _accepts_null(v) for v in schema.get("anyOf", ()))


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` that also accepts ``null`` (type list for primitives, anyOf otherwise)."""
    if _accepts_null(schema):
        return schema
    if "anyOf" in schema:
        return {**schema, "anyOf": [*schema["anyOf"], {"type": "null"}]}
    kind = schema.get("type")
    if isinstance(kind, str) and kind in _PRIMITIVES and "enum" not in schema and "const" not in schema:
        return {**schema, "type": [kind, "null"]}
    inner = {key: value for key, value in schema.items() if key != "description"}
    out: dict[str, Any] = {}
    if "description" in schema:
        out["description"] = schema["description"]
    out["anyOf"] = [inner, {"type": "null"}]
    return out


def _reachable(root: dict[str, Any], defs: Mapping[str, Any]) -> set[str]:
    """Names of the $defs the root refers to, directly or through other defs."""
    prefix = "#/$defs/"
    seen: set[str] = set()
    stack: list[Any] = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith(prefix):
                name = ref[len(prefix) :]
                if name not in seen and name in defs:
                    seen.add(name)
                    stack.append(defs[name])
            stack.extend(value for key, value in node.items() if key != "$defs")
        elif isinstance(node, list):
            stack.extend(node)
    return seen


# --- incoming arguments -----------------------------------------------------------------


def nulls_to_defaults(model: type[pydantic.BaseModel], arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Drop ``null`` values the strict schema allowed only to mean "use the default".

    A strict schema makes every optional field nullable, so a model may send ``null`` for
    ``timeout: int = 30``. This removes such keys (for fields that have a default and do
    not themselves accept ``None``), recursing into nested models and lists of models, so
    ``model.model_validate(nulls_to_defaults(model, args))`` applies the default. Anything
    else is returned unchanged for the model to validate. Returns a new dict.
    """
    out: dict[str, Any] = {}
    fields = _fields_by_key(model)
    for key, value in arguments.items():
        info = fields.get(key)
        if info is None:
            out[key] = value
            continue
        if value is None and not info.is_required() and not _accepts_none(info.annotation):
            continue
        out[key] = _descend(info.annotation, value)
    return out


def _fields_by_key(model: type[pydantic.BaseModel]) -> dict[str, pydantic.fields.FieldInfo]:
    keys: dict[str, pydantic.fields.FieldInfo] = {}
    for name, info in model.model_fields.items():
        keys[name] = info
        if isinstance(info.alias, str):
            keys[info.alias] = info
        if isinstance(info.validation_alias, str):
            keys[info.validation_alias] = info
    return keys


def _strip_annotated(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _accepts_none(annotation: Any) -> bool:
    annotation = _strip_annotated(annotation)
    if annotation is None or annotation is type(None) or annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return None in typing.get_args(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return any(_accepts_none(arg) for arg in typing.get_args(annotation))
    return False


def _model_in(annotation: Any) -> type[pydantic.BaseModel] | None:
    """The single model type an (optional) annotation holds, if any."""
    annotation = _strip_annotated(annotation)
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        models = [m for m in (_model_in(arg) for arg in typing.get_args(annotation)) if m is not None]
        return models[0] if len(models) == 1 else None
    return None


def _descend(annotation: Any, value: Any) -> Any:
    model = _model_in(annotation)
    if model is not None and isinstance(value, dict):
        return nulls_to_defaults(model, value)
    annotation = _strip_annotated(annotation)
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        non_null = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(non_null) == 1:
            return _descend(non_null[0], value)
        return value
    if origin in (list, tuple, set, frozenset) and isinstance(value, list):
        args = typing.get_args(annotation)
        if args and (origin is not tuple or (len(args) == 2 and args[1] is Ellipsis)):
            return [_descend(args[0], item) for item in value]
    return value
