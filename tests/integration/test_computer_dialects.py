"""The ``computer`` tool in each model dialect, end to end through ``callbox run``: the example
transcripts (``examples/computer-anthropic.jsonl``, ``examples/computer-openai.jsonl``, shown in
the docs) write a page whose button fills the window, open it on the desktop, take a screenshot,
click the button and take another. The scripted model is the one ``callbox run`` made (caught at
the factory), so the test reads what its context received: Anthropic ``tool_result`` image blocks,
OpenAI ``computer_call_output`` screenshots. The button is blue in the screenshot before the click
and green after it, in the pixels the model got.

One desktop sandbox per run (each ``callbox run`` makes its own), every hardening default on.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

import harness.models.factory as factory
from harness.cli.main import main
from harness.tools.computer import DESKTOP_IMAGE
from tests.conftest import unavailable
from tests.integration.test_computer_tool import BLUE, GREEN, decode_png, pixels_of

pytestmark = pytest.mark.docker

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def desktop_image(engine: Any) -> str:
    try:
        engine.client.images.get(DESKTOP_IMAGE)
    except Exception:
        unavailable(f"image {DESKTOP_IMAGE} is missing (run `make image-desktop`)", module=True)
    return DESKTOP_IMAGE


def _run(transcript: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
         ) -> tuple[Any, str]:
    """``callbox run`` on the example transcript; the scripted model it made, and what it printed."""
    made: list[Any] = []
    real = factory.make_model

    def catching(*args: Any, **kwargs: Any) -> Any:
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(factory, "make_model", catching)
    monkeypatch.setenv("CALLBOX_AUDIT_DB", str(tmp_path / "audit.sqlite3"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    code = main(["run", str(EXAMPLES / transcript), "--policy", str(EXAMPLES / "desktop.toml")])
    printed = capsys.readouterr().out
    assert code == 0, printed
    (model,) = made
    assert model.remaining == 0
    return model, printed


def _colours(png: bytes) -> tuple[int, int]:
    """How many sampled pixels are the button's blue, and its green (of 256,000 sampled)."""
    width, height, rgb = decode_png(png)
    assert (width, height) == (1280, 800)
    return len(pixels_of(rgb, width, BLUE)), len(pixels_of(rgb, width, GREEN))


def test_the_anthropic_dialect_clicks_and_the_model_sees_the_change(
        desktop_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model, printed = _run("computer-anthropic.jsonl", tmp_path, monkeypatch, capsys)
    assert model.format == "anthropic" and "final answer: The button turned green" in printed
    items = model.requests[-1].items
    uses = {block["id"]: block for item in items if item["role"] == "assistant" for block in item["content"]
            if block["type"] == "tool_use"}
    assert uses["toolu_click"]["input"] == {"action": "left_click", "coordinate": [640, 500]}
    shots = {}
    for item in items:
        for block in item["content"] if item["role"] == "user" and isinstance(item["content"], list) else []:
            assert block["type"] == "tool_result" and not block["is_error"], block
            images = [part for part in block["content"] if isinstance(part, dict) and part["type"] == "image"]
            if uses[block["tool_use_id"]]["name"] == "computer":
                (image,) = images
                assert image["source"]["media_type"] == "image/png"
                shots[block["tool_use_id"]] = base64.b64decode(image["source"]["data"])
    assert set(shots) == {"toolu_look", "toolu_before", "toolu_click", "toolu_after"}
    blue, green = _colours(shots["toolu_before"])
    assert blue > 200_000 and green == 0  # the button fills the window, not yet clicked
    blue, green = _colours(shots["toolu_after"])
    assert blue == 0 and green > 200_000


def test_the_openai_dialect_clicks_through_computer_call_and_the_model_sees_the_change(
        desktop_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model, printed = _run("computer-openai.jsonl", tmp_path, monkeypatch, capsys)
    assert model.format == "openai" and "computer call_click:1" in printed and "computer call_click:2" in printed
    items = model.requests[-1].items
    calls = [item["call_id"] for item in items if item.get("type") == "computer_call"]
    outputs = {item["call_id"]: item for item in items if item.get("type") == "computer_call_output"}
    assert calls == list(outputs) == ["call_look", "call_before", "call_click"]  # one output per computer_call
    assert not [item for item in items if item.get("role") == "user" and item is not items[0]]  # no failures said
    shots = {}
    for call_id, output in outputs.items():
        screenshot = output["output"]
        assert screenshot["type"] == "computer_screenshot" and "acknowledged_safety_checks" not in output
        shots[call_id] = base64.b64decode(screenshot["image_url"].removeprefix("data:image/png;base64,"))
    blue, green = _colours(shots["call_before"])
    assert blue > 200_000 and green == 0
    blue, green = _colours(shots["call_click"])  # the batch's last screenshot: after the click and a wait
    assert blue == 0 and green > 200_000
