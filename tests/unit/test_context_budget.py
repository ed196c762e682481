"""The context budget: older tool outputs become stubs, in every provider's item shapes."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from harness.core.calls import ToolResult
from harness.core.formats import result_item
from harness.loop.context_budget import context_size, elide, stub, tool_outputs

BIG = "x" * 2000


def responses_items(outputs: list[str]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"role": "user", "content": "do the task"}]
    for n, text in enumerate(outputs):
        items.append({"type": "function_call", "call_id": f"call_{n}", "name": "read_file",
                      "arguments": json.dumps({"path": f"f{n}"})})
        items.append(result_item(ToolResult(f"call_{n}", text), "openai"))
    return items


def chat_items(outputs: list[str]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"role": "user", "content": "do the task"}]
    for n, text in enumerate(outputs):
        items.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{n}", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]})
        items.append(result_item(ToolResult(f"call_{n}", text), "chat"))
    return items


def anthropic_items(outputs: list[str]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"role": "user", "content": "do the task"}]
    for n, text in enumerate(outputs):
        items.append({"role": "assistant", "content": [
            {"type": "tool_use", "id": f"call_{n}", "name": "read_file", "input": {"path": f"f{n}"}}]})
        items.append({"role": "user", "content": [result_item(ToolResult(f"call_{n}", text, is_error=n == 0),
                                                              "anthropic")]})
    return items


SHAPES = {"responses": responses_items, "chat": chat_items, "anthropic": anthropic_items}


def output_values(items: list[dict[str, Any]]) -> list[Any]:
    return [o.holder[o.key] for o in tool_outputs(items)]


@pytest.mark.parametrize("shape", SHAPES)
def test_under_the_trigger_nothing_changes(shape: str) -> None:
    items = SHAPES[shape]([BIG] * 3)
    before = copy.deepcopy(items)
    size = context_size(items)
    report = elide(items, budget_bytes=int(size / 0.9) + 10)
    assert not report.changed
    assert items == before
    assert report.bytes_before == report.bytes_after == size


@pytest.mark.parametrize("shape", SHAPES)
def test_oldest_outputs_become_stubs_and_the_latest_stay_whole(shape: str) -> None:
    items = SHAPES[shape]([BIG] * 6)
    original = copy.deepcopy(items)
    report = elide(items, budget_bytes=8000, keep_latest=2)
    values = output_values(items)
    assert values[-2:] == [BIG, BIG]  # the latest two are whole
    assert values[0] == stub("call_0", 2000) == "[output of call_0 elided: 2000 bytes]"
    assert report.call_ids == tuple(f"call_{n}" for n in range(len(report.call_ids)))  # oldest first
    assert report.bytes_after == context_size(items) <= 0.7 * 8000
    assert report.bytes_before == context_size(original)
    # everything that is not a tool output is untouched
    assert len(items) == len(original)
    for now, then in zip(items, original, strict=True):
        if now != then:
            assert tool_outputs([now]) and tool_outputs([then])


def test_anthropic_keeps_the_error_flag_and_the_block_shape() -> None:
    items = anthropic_items([BIG] * 4)
    elide(items, budget_bytes=5000, keep_latest=1)
    block = items[2]["content"][0]
    assert block == {"type": "tool_result", "tool_use_id": "call_0", "is_error": True,
                     "content": "[output of call_0 elided: 2000 bytes]"}


def test_a_bare_anthropic_tool_result_block_and_list_content() -> None:
    blocks = [{"type": "text", "text": BIG}]
    items: list[dict[str, Any]] = [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": copy.deepcopy(blocks)},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": BIG},
    ]
    elide(items, budget_bytes=1500, keep_latest=1)
    size = len(json.dumps(blocks, ensure_ascii=False, separators=(",", ":")).encode())
    assert items[0]["content"] == f"[output of toolu_1 elided: {size} bytes]"
    assert items[1]["content"] == BIG


def test_sizes_count_utf8_bytes() -> None:
    items = responses_items(["é" * 1000, "y"])  # 2000 bytes, 1000 characters
    elide(items, budget_bytes=1200, keep_latest=1)
    assert output_values(items)[0] == "[output of call_0 elided: 2000 bytes]"


def test_eliding_is_idempotent_and_small_outputs_stay() -> None:
    items = responses_items(["tiny", BIG, BIG, BIG])
    elide(items, budget_bytes=3000, keep_latest=1)
    values = output_values(items)
    assert values[0] == "tiny"  # a stub would not be smaller
    assert values[1].startswith("[output of call_1 elided")
    again = copy.deepcopy(items)
    report = elide(items, budget_bytes=3000, keep_latest=1)
    assert items == again
    assert not report.changed


def test_keep_latest_wins_over_the_budget() -> None:
    items = responses_items([BIG] * 3)
    report = elide(items, budget_bytes=1024, keep_latest=3)
    assert not report.changed
    assert output_values(items) == [BIG] * 3


def test_stops_at_the_target_not_eliding_more_than_needed() -> None:
    items = responses_items([BIG] * 10)
    size = context_size(items)
    report = elide(items, budget_bytes=size, keep_latest=0, trigger=0.9, target=0.85)
    assert len(report.call_ids) == 2  # two stubs save enough to be under 85 %
    assert report.bytes_after <= 0.85 * size


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        elide([], budget_bytes=0)
    with pytest.raises(ValueError, match="target"):
        elide([], budget_bytes=10, trigger=0.5, target=0.7)
