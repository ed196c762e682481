"""The ``python`` tool without a sandbox: its schemas, its policy hook and how a cell's events
become the result the model reads (text, images, errors)."""

from __future__ import annotations

import base64
import struct
import zlib

from harness.core.calls import Action, ErrorCode
from harness.core.policy import parse_policy
from harness.tools import builtin_registry
from harness.tools.python_kernel import (
    KERNEL_IMAGE,
    PYTHON,
    Cell,
    cell_output,
    image_part,
    no_kernel,
    value_text,
)


def _png(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\x00\x00\x00" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def _jpeg(width: int, height: int) -> bytes:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof0 = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app0 + sof0 + b"\xff\xd9"


def _cell(*events: dict[str, object]) -> Cell:
    cell = Cell()
    for event in events:
        cell.add(event)
    return cell


def test_registered_with_plain_and_strict_schemas():
    tool = builtin_registry().get("python")
    assert tool is PYTHON
    plain = PYTHON.definition.input_schema("plain")
    strict = PYTHON.definition.input_schema("strict")
    assert plain["required"] == ["code"] and set(plain["properties"]) == {"code", "timeout_ms"}
    assert strict["additionalProperties"] is False and sorted(strict["required"]) == ["code", "timeout_ms"]
    assert PYTHON.definition.command_field == "code"


def test_policy_rules_match_the_code_text():
    policy = parse_policy("""
[tools.python]
decision = "allow"
[[tools.python.rules]]
action = "deny"
command = "*os.system*"
reason = "no shelling out"
[[tools.python.rules]]
action = "ask"
command = "*requests*"
""")
    definition = PYTHON.definition
    assert policy.decide(definition, {"code": "import os\nos.system('ls')"}).action is Action.DENY
    assert policy.decide(definition, {"code": "import requests"}).action is Action.ASK
    assert policy.decide(definition, {"code": "print(1)"}).action is Action.ALLOW


def test_stdout_then_the_main_result():
    cell = _cell({"type": "number_of_executions", "execution_count": 3},
                 {"type": "stdout", "text": "hello"},
                 {"type": "result", "is_main_result": True, "text": "42"},
                 {"type": "end_of_execution"})
    out = cell_output(cell, duration_ms=5.0)
    assert out.text == "hello\nOut[3]: 42"
    assert (out.is_error, out.error, out.images) == (False, None, ())
    assert out.structured is not None and out.structured["execution_count"] == 3


def test_a_table_starts_on_a_line_of_its_own():
    table = "   a  b\n0  1  x\n1  2  y"
    cell = _cell({"type": "number_of_executions", "execution_count": 1},
                 {"type": "result", "is_main_result": True, "text": table, "html": "<table>...</table>"})
    assert cell_output(cell, duration_ms=1.0).text == f"Out[1]:\n{table}"


def test_a_figure_becomes_an_image_part_with_its_header_size():
    png = _png(64, 48)
    cell = _cell({"type": "number_of_executions", "execution_count": 2},
                 {"type": "result", "is_main_result": False, "text": "<Figure size 64x48 with 1 Axes>",
                  "png": base64.b64encode(png).decode()})
    out = cell_output(cell, duration_ms=1.0)
    assert out.text == "<Figure size 64x48 with 1 Axes> (image 1)"
    [part] = out.images
    assert (part.media_type, part.width, part.height, part.data) == ("image/png", 64, 48, png)
    assert out.structured is not None and out.structured["images"] == 1


def test_image_parts_of_a_cell():
    png = image_part("png", base64.b64encode(_png(3, 7)).decode(), "Out")
    assert png is not None and (png.width, png.height) == (3, 7)
    assert image_part("png", base64.b64encode(_jpeg(10, 20)).decode(), "Out") is None  # not what it says
    jpeg = image_part("jpeg", base64.b64encode(_jpeg(10, 20)).decode(), "Out")
    assert jpeg is not None and (jpeg.media_type, jpeg.width, jpeg.height) == ("image/jpeg", 10, 20)
    assert image_part("png", base64.b64encode(b"not a png").decode(), "Out") is None
    assert image_part("png", 12, "Out") is None


def test_value_text_prefers_plain_then_markdown_then_html():
    assert value_text({"text": "t", "html": "h"}) == "t"
    assert value_text({"markdown": "**m**", "html": "h"}) == "**m**"
    assert value_text({"html": "<b>h</b>"}) == "<b>h</b>"
    assert value_text({"svg": "<svg/>"}) == "[a value shown as svg]"


def test_an_exception_is_an_error_with_its_traceback_uncoloured():
    cell = _cell({"type": "stdout", "text": "before\n"},
                 {"type": "error", "name": "ZeroDivisionError", "value": "division by zero",
                  "traceback": "\x1b[0;31mZeroDivisionError\x1b[0m Traceback\n----> 1 1/0\n"
                               "ZeroDivisionError: division by zero"})
    out = cell_output(cell, duration_ms=1.0)
    assert (out.is_error, out.error) == (True, ErrorCode.TOOL_FAILED)
    assert out.text == "before\nZeroDivisionError Traceback\n----> 1 1/0\nZeroDivisionError: division by zero"
    assert out.structured is not None
    assert out.structured["error"] == {"name": "ZeroDivisionError", "value": "division by zero"}


def test_a_timeout_keeps_what_came_and_says_the_state_stays():
    out = cell_output(_cell({"type": "stdout", "text": "before\n"}), duration_ms=1500.0, timed_out_after_ms=1500)
    assert (out.is_error, out.error) == (True, ErrorCode.TIMED_OUT)
    assert out.text.startswith("before\nThe cell was interrupted after 1500 milliseconds")
    assert "the kernel and its variables stay" in out.text


def test_an_empty_cell_says_so():
    assert cell_output(_cell({"type": "end_of_execution"}), duration_ms=1.0).text == "(no output)"


def test_no_kernel_names_the_image_and_the_policy_key():
    out = no_kernel("callbox-sandbox:latest")
    assert (out.is_error, out.error) == (True, ErrorCode.NOT_SUPPORTED)
    assert "callbox-sandbox:latest" in out.text and f'image = "{KERNEL_IMAGE}"' in out.text
    assert "[sandbox]" in out.text and "callbox image build --variant code-interpreter" in out.text


def test_a_dead_kernel_is_an_error_in_the_tools_own_words():
    cell = _cell({"type": "stdout", "text": "going\n"},
                 {"type": "error", "name": "KernelDied", "value": "the kernel exited during the cell; restart the "
                  "context", "traceback": ""})
    out = cell_output(cell, duration_ms=1.0)
    assert (out.is_error, out.error) == (True, ErrorCode.TOOL_FAILED)
    assert out.text == "going\nThe kernel exited during the cell."


def test_a_cell_that_prints_without_end_keeps_a_head_and_a_tail():
    cell = Cell(keep=10)
    for piece in ("0123", "456789abc", "defghij"):
        cell.add({"type": "stdout", "text": piece})
    out = cell_output(cell, duration_ms=1.0)
    assert out.text == "01234\n[... 10 characters of output dropped ...]\nfghij"
    assert out.raw_bytes == 20 and out.structured is not None and out.structured["dropped_chars"] == 10


def test_images_beyond_the_kept_bytes_are_counted():
    png = _png(4, 4)
    cell = Cell(keep_image_bytes=len(png) + 1)
    for _ in range(3):
        cell.add({"type": "result", "png": base64.b64encode(png).decode(), "text": "<Figure size 4x4 with 1 Axes>"})
    out = cell_output(cell, duration_ms=1.0)
    assert len(out.images) == 1 and out.structured is not None and out.structured["images_dropped"] == 2
    assert out.text.endswith(f"[2 more image(s) not kept: a cell's images may hold {len(png) + 1} bytes]")


def test_python_is_served_only_to_a_policy_that_names_it() -> None:
    from harness.core.policy import Policy
    from harness.tools import registry_for

    assert "python" not in registry_for(Policy()).names()
    assert "python" in registry_for(Policy.model_validate({"allowed_tools": ["shell", "python"]})).names()
    assert "python" in registry_for(Policy.model_validate({"tools": {"python": {"decision": "ask"}}})).names()
    assert "shell" in registry_for(Policy()).names()
