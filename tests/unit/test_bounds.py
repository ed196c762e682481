"""Values outside a field's bounds, worded from the field: the value as written, the whole range."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field, ValidationError

from harness.core.bounds import allowed_range, is_size, out_of_bounds
from harness.core.problems import describe_validation_error
from harness.core.units import ByteSize
from harness.engine.spec import SandboxSpec


class Limits(BaseModel):
    memory: ByteSize = Field(default=64 << 20, ge=32 << 20)
    scratch: ByteSize | None = None
    pids: int = Field(default=8, ge=8, le=65536)
    wait_s: float = Field(default=1.0, gt=0, le=60)
    share: float = Field(default=0.5, lt=1)


def problems(**values: object) -> list[str]:
    with pytest.raises(ValidationError) as info:
        Limits.model_validate(values)
    return describe_validation_error(info.value, Limits, noun="key")


def test_sizes_are_recognised_optional_or_not() -> None:
    fields = Limits.model_fields
    assert is_size(fields["memory"]) and is_size(fields["scratch"])
    assert not is_size(fields["pids"]) and not is_size(None)
    assert is_size(SandboxSpec.model_fields["tmp_size"]) and is_size(SandboxSpec.model_fields["fsize"])


def test_the_allowed_range_in_words() -> None:
    fields = Limits.model_fields
    assert allowed_range(fields["memory"]) == "at least 32m"
    assert allowed_range(fields["pids"]) == "8 to 65536"
    assert allowed_range(fields["wait_s"]) == "more than 0 and at most 60"
    assert allowed_range(fields["share"]) == "less than 1"
    assert allowed_range(fields["scratch"]) == ""


@pytest.mark.parametrize(("values", "sentence"), [
    ({"memory": "1k"}, "key 'memory': 1k is below the minimum of 32m"),
    ({"memory": 1500}, "key 'memory': 1500 is below the minimum of 32m"),
    ({"pids": 0}, "key 'pids': 0 is below the minimum of 8 (allowed: 8 to 65536)"),
    ({"pids": 70000}, "key 'pids': 70000 is above the maximum of 65536 (allowed: 8 to 65536)"),
    ({"wait_s": 0}, "key 'wait_s': 0 is too small: it must be more than 0 (allowed: more than 0 and at most 60)"),
    ({"wait_s": 90.5}, "key 'wait_s': 90.5 is above the maximum of 60 (allowed: more than 0 and at most 60)"),
    ({"share": 1}, "key 'share': 1 is too large: it must be less than 1"),
])
def test_a_value_out_of_bounds_names_it_and_what_is_allowed(values: dict[str, object], sentence: str) -> None:
    assert problems(**values) == [sentence]


def test_a_bound_without_a_field_comes_from_the_error() -> None:
    assert out_of_bounds(3, None, "greater_than_equal", {"ge": 5}) == "3 is below the minimum of 5"


def test_the_caller_names_the_setting_its_own_way() -> None:
    with pytest.raises(ValidationError) as info:
        SandboxSpec(memory="1k")
    named = describe_validation_error(info.value, SandboxSpec, name=lambda path: f"--{path}")
    assert named == ["--memory: 1k is below the minimum of 32m"]
