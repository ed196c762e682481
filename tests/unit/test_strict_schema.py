"""JSON Schema generation in both forms: OpenAI strict-mode rules, and plain JSON Schema
(only real requirements, no null branches for defaults), on the shapes tools use."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import jsonschema
import pytest
from pydantic import BaseModel, ConfigDict, Field, RootModel

from harness.core.strict_schema import (
    StrictSchemaError,
    json_schema,
    nulls_to_defaults,
    plain_json_schema,
    strict_json_schema,
)

# --- models -------------------------------------------------------------------------------


class Shell(BaseModel):
    """Run a command."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    command: str
    """The shell command to run."""
    workdir: str | None = None
    """Directory to run it in."""
    timeout: int = Field(30, ge=1, le=600, description="Seconds before the command is killed.")


class Point(BaseModel):
    model_config = ConfigDict(extra="forbid")

    x: int
    y: int


class Shape(BaseModel):
    """A shape made of points."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["line", "polygon"] = Field(description="What to draw.")
    origin: Point = Field(description="Where it starts.")
    points: list[Point]
    label: Point | None = None
    color: Literal["red", "blue"] = "red"


class Node(BaseModel):
    """A tree node."""

    model_config = ConfigDict(extra="forbid")

    name: str
    children: list[Node] = []


class Tree(BaseModel):
    model_config = ConfigDict(extra="forbid")

    root: Node


class Cat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pet: Literal["cat"]
    meows: bool


class Dog(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pet: Literal["dog"]
    barks: int


class Owner(BaseModel):
    model_config = ConfigDict(extra="forbid")

    animal: Annotated[Cat | Dog, Field(discriminator="pet")]


class Constrained(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=10, pattern=r"^[a-z]+$")
    when: str = Field(json_schema_extra={"format": "date-time"})
    path: Annotated[str, Field(json_schema_extra={"format": "path"})]
    tags: list[str] = Field(min_length=1, max_length=3)


# --- helpers ------------------------------------------------------------------------------


def assert_strict(schema: dict[str, Any]) -> None:
    """The strict-mode rules, checked on every node."""

    def walk(node: Any, where: str) -> None:
        if isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, f"{where}[{i}]")
            return
        if not isinstance(node, dict):
            return
        assert "default" not in node, where
        assert "title" not in node, where
        if "$ref" in node:
            assert set(node) == {"$ref"}, f"$ref with siblings at {where}"
        if node.get("type") == "object" or "properties" in node:
            assert node["additionalProperties"] is False, where
            assert node["required"] == list(node["properties"]), where
        for key, value in node.items():
            if key in ("properties", "$defs"):
                for name, sub in value.items():
                    walk(sub, f"{where}.{key}.{name}")
            elif key not in ("enum", "const", "required"):
                walk(value, f"{where}.{key}")

    assert schema["type"] == "object"
    assert "anyOf" not in schema
    walk(schema, "$")


# --- schemas ------------------------------------------------------------------------------


def test_flat_model_with_optional_fields_and_descriptions() -> None:
    schema = strict_json_schema(Shell)
    assert schema == {
        "type": "object",
        "description": "Run a command.",
        "properties": {
            "command": {"type": "string", "description": "The shell command to run."},
            "workdir": {
                "description": "Directory to run it in.",
                "anyOf": [{"type": "string"}, {"type": "null"}],
            },
            "timeout": {
                "type": ["integer", "null"],
                "description": "Seconds before the command is killed. Default: 30.",
                "maximum": 600,
                "minimum": 1,
            },
        },
        "required": ["command", "workdir", "timeout"],
        "additionalProperties": False,
    }
    assert_strict(schema)


def test_nested_models_lists_enums_and_optional_refs() -> None:
    schema = strict_json_schema(Shape)
    point = {
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
        "required": ["x", "y"],
        "additionalProperties": False,
    }
    assert schema == {
        "type": "object",
        "description": "A shape made of points.",
        "properties": {
            "kind": {"type": "string", "description": "What to draw.", "enum": ["line", "polygon"]},
            # a $ref with a description beside it is inlined (strict mode takes no siblings next to $ref)
            "origin": {**point, "description": "Where it starts."},
            "points": {"type": "array", "items": {"$ref": "#/$defs/Point"}},
            "label": {"anyOf": [{"$ref": "#/$defs/Point"}, {"type": "null"}]},
            "color": {
                "description": 'Default: "red".',
                "anyOf": [{"type": "string", "enum": ["red", "blue"]}, {"type": "null"}],
            },
        },
        "required": ["kind", "origin", "points", "label", "color"],
        "additionalProperties": False,
        "$defs": {"Point": point},
    }
    assert_strict(schema)


def test_recursive_model_uses_ref() -> None:
    schema = strict_json_schema(Tree)
    node = {
        "type": "object",
        "description": "A tree node.",
        "properties": {
            "name": {"type": "string"},
            "children": {
                "description": "Default: [].",
                "anyOf": [{"type": "array", "items": {"$ref": "#/$defs/Node"}}, {"type": "null"}],
            },
        },
        "required": ["name", "children"],
        "additionalProperties": False,
    }
    assert schema == {
        "type": "object",
        "properties": {"root": {"$ref": "#/$defs/Node"}},
        "required": ["root"],
        "additionalProperties": False,
        "$defs": {"Node": node},
    }
    assert_strict(schema)


def test_recursive_root_model_is_inlined_at_the_root() -> None:
    schema = strict_json_schema(Node)
    # pydantic emits {"$ref": "#/$defs/Node"} as the root; strict mode needs an object there
    assert schema["type"] == "object"
    assert "$ref" not in schema
    assert schema["required"] == ["name", "children"]
    assert schema["$defs"]["Node"]["properties"] == schema["properties"]
    assert_strict(schema)


def test_discriminated_union_becomes_any_of() -> None:
    schema = strict_json_schema(Owner)
    assert schema["properties"]["animal"] == {"anyOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}]}
    assert "discriminator" not in str(schema)
    assert schema["$defs"]["Cat"] == {
        "type": "object",
        "properties": {"pet": {"type": "string", "const": "cat"}, "meows": {"type": "boolean"}},
        "required": ["pet", "meows"],
        "additionalProperties": False,
    }
    assert_strict(schema)


def test_unsupported_validation_keywords_are_dropped_supported_ones_kept() -> None:
    schema = strict_json_schema(Constrained)
    assert schema["properties"] == {
        "name": {"type": "string", "pattern": "^[a-z]+$"},
        "when": {"type": "string", "format": "date-time"},
        "path": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3, "minItems": 1},
    }
    assert_strict(schema)


def test_unused_defs_are_pruned() -> None:
    class OnlyInlined(BaseModel):
        model_config = ConfigDict(extra="forbid")
        at: Point = Field(description="Inlined because of this description.")

    schema = strict_json_schema(OnlyInlined)
    assert "$defs" not in schema
    assert schema["properties"]["at"]["description"] == "Inlined because of this description."


def test_model_without_extra_config_still_gets_additional_properties_false() -> None:
    class Loose(BaseModel):
        a: int

    assert strict_json_schema(Loose) == {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
        "additionalProperties": False,
    }


def test_empty_model() -> None:
    class NoArgs(BaseModel):
        model_config = ConfigDict(extra="forbid")

    assert strict_json_schema(NoArgs) == {
        "type": "object",
        "properties": {},
        "required": [],
        "additionalProperties": False,
    }


def test_result_is_a_fresh_dict() -> None:
    first = strict_json_schema(Shell)
    first["properties"]["command"]["type"] = "integer"
    assert strict_json_schema(Shell)["properties"]["command"]["type"] == "string"


# --- failures -----------------------------------------------------------------------------


def test_dict_field_is_rejected_with_the_fix() -> None:
    class Env(BaseModel):
        model_config = ConfigDict(extra="forbid")
        env: dict[str, str]

    with pytest.raises(StrictSchemaError) as info:
        strict_json_schema(Env)
    assert info.value.field == "Env.env"
    assert "free-form object" in str(info.value)
    assert "use a list of {key, value} objects or a model with fixed fields" in str(info.value)


def test_free_form_dict_any_is_rejected() -> None:
    class Blob(BaseModel):
        model_config = ConfigDict(extra="forbid")
        data: dict[str, Any] | None = None

    with pytest.raises(StrictSchemaError, match="list of \\{key, value\\} objects") as info:
        strict_json_schema(Blob)
    assert info.value.field == "Blob.data"


def test_dict_inside_a_nested_model_names_the_nested_field() -> None:
    class Inner(BaseModel):
        labels: dict[str, int]

    class Outer(BaseModel):
        inner: list[Inner]

    with pytest.raises(StrictSchemaError) as info:
        strict_json_schema(Outer)
    assert info.value.field == "Inner.labels"


def test_extra_allow_is_rejected() -> None:
    class Open(BaseModel):
        model_config = ConfigDict(extra="allow")
        a: int

    with pytest.raises(StrictSchemaError, match="extra='forbid'") as info:
        strict_json_schema(Open)
    assert info.value.field == "Open"
    assert "extra='allow'" in str(info.value)


def test_any_field_is_rejected() -> None:
    class Anything(BaseModel):
        value: Any

    with pytest.raises(StrictSchemaError, match="accepts any JSON value") as info:
        strict_json_schema(Anything)
    assert info.value.field == "Anything.value"
    assert "give it a concrete type" in str(info.value)


def test_tuple_with_positions_is_rejected() -> None:
    class Pair(BaseModel):
        pair: tuple[int, str]

    with pytest.raises(StrictSchemaError, match="prefixItems") as info:
        strict_json_schema(Pair)
    assert info.value.field == "Pair.pair"
    assert "model with named fields" in str(info.value)


def test_root_that_is_not_an_object_is_rejected() -> None:
    class Items(RootModel[list[int]]):
        pass

    with pytest.raises(StrictSchemaError, match="not an object") as info:
        strict_json_schema(Items)
    assert "wrap the value in a model with named fields" in str(info.value)


def test_unknown_keyword_is_rejected() -> None:
    class Odd(BaseModel):
        name: str = Field(json_schema_extra={"x-secret": 1})

    with pytest.raises(StrictSchemaError, match="'x-secret'") as info:
        strict_json_schema(Odd)
    assert info.value.field == "Odd.name"


def test_not_a_model_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        strict_json_schema(dict)  # type: ignore[arg-type]


def test_strict_schema_error_is_a_value_error() -> None:
    assert issubclass(StrictSchemaError, ValueError)


# --- nulls_to_defaults --------------------------------------------------------------------


def test_null_for_a_defaulted_field_means_the_default() -> None:
    args = {"command": "ls", "workdir": None, "timeout": None}
    cleaned = nulls_to_defaults(Shell, args)
    assert cleaned == {"command": "ls", "workdir": None}
    assert Shell.model_validate(cleaned).timeout == 30
    assert args == {"command": "ls", "workdir": None, "timeout": None}  # not mutated


def test_null_for_a_required_field_is_left_for_validation_to_reject() -> None:
    assert nulls_to_defaults(Shell, {"command": None}) == {"command": None}


def test_nulls_in_nested_models_and_lists() -> None:
    args = {
        "kind": "line",
        "origin": {"x": 1, "y": 2},
        "points": [{"x": 0, "y": 0}],
        "label": None,
        "color": None,
    }
    cleaned = nulls_to_defaults(Shape, args)
    assert cleaned == {"kind": "line", "origin": {"x": 1, "y": 2}, "points": [{"x": 0, "y": 0}], "label": None}
    shape = Shape.model_validate(cleaned)
    assert shape.color == "red"

    tree = {"root": {"name": "a", "children": [{"name": "b", "children": None}]}}
    assert nulls_to_defaults(Tree, tree) == {"root": {"name": "a", "children": [{"name": "b"}]}}
    assert Tree.model_validate(nulls_to_defaults(Tree, tree)).root.children[0].children == []


def test_unknown_keys_pass_through() -> None:
    assert nulls_to_defaults(Shell, {"command": "ls", "bogus": None}) == {"command": "ls", "bogus": None}


def test_every_strict_instance_validates_after_nulls_to_defaults() -> None:
    # what a strict-mode model must send when it wants the defaults: every key, nulls for the optional ones
    everything_null = {"command": "true", "workdir": None, "timeout": None}
    assert Shell.model_validate(nulls_to_defaults(Shell, everything_null)) == Shell.model_validate({"command": "true"})


class Link(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    following: Link = Field(description="The next link.")


def test_self_reference_with_a_description_is_inlined_once() -> None:
    schema = strict_json_schema(Link)
    following = schema["properties"]["following"]
    # inlined once (to carry the description), then a plain $ref: no endless inlining
    assert following["description"] == "The next link."
    assert following["properties"]["following"] == {"$ref": "#/$defs/Link"}
    assert schema["$defs"]["Link"]["properties"]["following"]["properties"]["following"] == {"$ref": "#/$defs/Link"}
    assert_strict(schema)


# --- the plain form ------------------------------------------------------------------------


def assert_plain(schema: dict[str, Any]) -> None:
    """Plain JSON Schema rules, checked on every node: a valid 2020-12 schema, objects closed,
    ``required`` a subset of the properties, no titles, no ``default: null``."""
    jsonschema.Draft202012Validator.check_schema(schema)

    def walk(node: Any, where: str) -> None:
        if isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, f"{where}[{i}]")
            return
        if not isinstance(node, dict):
            return
        assert "title" not in node, where
        assert node.get("default", 0) is not None, where
        if node.get("type") == "object" or "properties" in node:
            assert node["additionalProperties"] is False, where
            if "required" in node:
                assert node["required"], f"empty required list at {where}"
                assert set(node["required"]) <= set(node["properties"]), where
        for key, value in node.items():
            if key in ("properties", "$defs"):
                for name, sub in value.items():
                    walk(sub, f"{where}.{key}.{name}")
            elif key not in ("enum", "const", "required", "default", "examples"):
                walk(value, f"{where}.{key}")

    assert schema["type"] == "object"
    walk(schema, "$")


def test_plain_flat_model_requires_only_what_has_no_default() -> None:
    schema = plain_json_schema(Shell)
    assert schema == {
        "type": "object",
        "description": "Run a command.",
        "properties": {
            "command": {"type": "string", "description": "The shell command to run."},
            # a None default is the same as leaving it out: no null branch
            "workdir": {"type": "string", "description": "Directory to run it in."},
            # a real default is stated as one, not in the description
            "timeout": {
                "type": "integer",
                "description": "Seconds before the command is killed.",
                "maximum": 600,
                "minimum": 1,
                "default": 30,
            },
        },
        "required": ["command"],
        "additionalProperties": False,
    }
    assert_plain(schema)


def test_plain_nested_models_are_inlined() -> None:
    schema = plain_json_schema(Shape)
    point = {
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
        "required": ["x", "y"],
        "additionalProperties": False,
    }
    assert schema == {
        "type": "object",
        "description": "A shape made of points.",
        "properties": {
            "kind": {"type": "string", "description": "What to draw.", "enum": ["line", "polygon"]},
            "origin": {**point, "description": "Where it starts."},
            "points": {"type": "array", "items": point},
            "label": point,
            "color": {"type": "string", "enum": ["red", "blue"], "default": "red"},
        },
        "required": ["kind", "origin", "points"],
        "additionalProperties": False,
    }
    assert_plain(schema)


def test_plain_recursive_model_keeps_only_the_reference_back() -> None:
    schema = plain_json_schema(Tree)
    node = {
        "type": "object",
        "description": "A tree node.",
        "properties": {
            "name": {"type": "string"},
            "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}, "default": []},
        },
        "required": ["name"],
        "additionalProperties": False,
    }
    assert schema == {
        "type": "object",
        "properties": {"root": node},
        "required": ["root"],
        "additionalProperties": False,
        "$defs": {"Node": node},
    }
    assert_plain(schema)
    jsonschema.validate({"root": {"name": "a", "children": [{"name": "b", "children": []}]}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"root": {"name": "a", "children": [{"name": "b", "extra": 1}]}}, schema)


def test_plain_recursive_root_model_is_expanded_once() -> None:
    schema = plain_json_schema(Node)
    assert "$ref" not in schema
    assert schema["required"] == ["name"]
    assert schema["properties"]["children"]["items"] == {"$ref": "#/$defs/Node"}
    assert schema["$defs"]["Node"]["properties"] == schema["properties"]
    assert_plain(schema)


def test_plain_self_reference_keeps_its_description() -> None:
    schema = plain_json_schema(Link)
    following = {"$ref": "#/$defs/Link", "description": "The next link."}
    assert schema["properties"]["following"] == following
    assert schema["$defs"]["Link"]["properties"]["following"] == following
    assert_plain(schema)


def test_plain_discriminated_union_is_inlined() -> None:
    schema = plain_json_schema(Owner)
    cat, dog = schema["properties"]["animal"]["anyOf"]
    assert cat == {
        "type": "object",
        "properties": {"pet": {"type": "string", "const": "cat"}, "meows": {"type": "boolean"}},
        "required": ["pet", "meows"],
        "additionalProperties": False,
    }
    assert dog["properties"]["pet"] == {"type": "string", "const": "dog"}
    assert "$defs" not in schema and "discriminator" not in str(schema)
    assert_plain(schema)


def test_plain_keeps_validation_keywords_and_known_formats() -> None:
    schema = plain_json_schema(Constrained)
    assert schema["properties"] == {
        "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 10, "minLength": 1},
        "when": {"type": "string", "format": "date-time"},
        "path": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3, "minItems": 1},
    }
    assert_plain(schema)


class Meaningful(BaseModel):
    """null means something for these fields, so the plain form keeps it."""

    model_config = ConfigDict(extra="forbid")

    limit: int | None = Field(30, description="null: no limit.")
    parent: str | None = Field(description="null: at the top.")
    note: str | None = None
    tags: list[str] | None = Field(default_factory=list)


def test_plain_keeps_null_where_it_is_not_the_default() -> None:
    schema = plain_json_schema(Meaningful)
    assert schema["properties"] == {
        "limit": {"description": "null: no limit.", "anyOf": [{"type": "integer"}, {"type": "null"}], "default": 30},
        "parent": {"description": "null: at the top.", "anyOf": [{"type": "string"}, {"type": "null"}]},
        "note": {"type": "string"},
        # a computed default is not in the schema, so null (None, not []) may mean something
        "tags": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
    }
    assert schema["required"] == ["parent"]
    assert_plain(schema)
    jsonschema.validate({"limit": None, "parent": None}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"limit": 5}, schema)  # parent is required


def test_plain_empty_and_all_optional_models_have_no_required_list() -> None:
    class NoArgs(BaseModel):
        model_config = ConfigDict(extra="forbid")

    class AllOptional(BaseModel):
        model_config = ConfigDict(extra="forbid")
        depth: int = 1

    assert plain_json_schema(NoArgs) == {"type": "object", "properties": {}, "additionalProperties": False}
    assert plain_json_schema(AllOptional) == {
        "type": "object",
        "properties": {"depth": {"type": "integer", "default": 1}},
        "additionalProperties": False,
    }


def test_plain_form_refuses_what_strict_refuses() -> None:
    class Env(BaseModel):
        model_config = ConfigDict(extra="forbid")
        env: dict[str, str]

    with pytest.raises(StrictSchemaError) as info:
        plain_json_schema(Env)
    assert info.value.field == "Env.env"


def test_json_schema_names_the_forms() -> None:
    assert json_schema(Shell, "strict") == strict_json_schema(Shell)
    assert json_schema(Shell, "plain") == plain_json_schema(Shell)
    with pytest.raises(ValueError, match="choose 'strict' or 'plain'"):
        json_schema(Shell, "loose")  # type: ignore[arg-type]


def test_plain_form_is_a_new_dict_each_call() -> None:
    first = plain_json_schema(Shape)
    first["properties"]["origin"]["properties"].clear()
    assert plain_json_schema(Shape)["properties"]["points"]["items"]["properties"] == {
        "x": {"type": "integer"},
        "y": {"type": "integer"},
    }
