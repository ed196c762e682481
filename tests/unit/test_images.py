"""Pictures in tool results: headers read without a decoder, the policy's image bounds, the
call path carrying pictures (and refusing one over a bound in words), and each format's
shape of a result with pictures. No sandbox: the tool is a function in this process."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest

from harness.audit.chain_verify import verify
from harness.audit.store import AuditStore
from harness.core.calls import ImagePart, ToolCall, ToolOutput, ToolResult
from harness.core.formats import chat_image_message, data_url, result_item
from harness.core.images import ImageBounds, NotAnImage, bound_images, describe, image_part, read_header
from harness.core.policy import PolicyError, parse_policy
from harness.core.registry import Tool, ToolDefinition, ToolRegistry
from harness.core.session import Session
from harness.models.base import Context
from harness.models.common import append_results
from tests.support.pictures import gif, jpeg, png, webp_extended, webp_lossless, webp_lossy

MAKERS: dict[str, Callable[[int, int], bytes]] = {
    "png": png, "gif": gif, "jpeg": jpeg, "webp VP8": webp_lossy, "webp VP8L": webp_lossless,
    "webp VP8X": webp_extended,
}


@pytest.mark.parametrize("kind", list(MAKERS))
def test_each_format_gives_its_media_type_and_size(kind: str) -> None:
    media_type, width, height = read_header(MAKERS[kind](1280, 801))
    assert (media_type, width, height) == (f"image/{kind.split(maxsplit=1)[0]}", 1280, 801)


@pytest.mark.parametrize(("data", "why"), [
    (b"%PDF-1.7\n", "not a PNG, JPEG, GIF or WebP"),
    (b"<svg xmlns='http://www.w3.org/2000/svg'/>", "not a PNG, JPEG, GIF or WebP"),
    (b"BM" + bytes(60), "not a PNG, JPEG, GIF or WebP"),  # BMP is not one of the four
    (png(4, 4)[:20], "without its IHDR header"),
    (b"\xff\xd8\xff\xe0\x00\x10JFIF", "without a frame header"),
    (b"GIF89a\x01", "cut inside its header"),
    (webp_lossy(4, 4)[:24], "without a VP8"),
    (gif(0, 5), "size of 0x5"),
])
def test_anything_else_is_refused_saying_why(data: bytes, why: str) -> None:
    with pytest.raises(NotAnImage, match=why):
        read_header(data)


def test_bounds_leave_out_pictures_over_them_and_say_their_numbers() -> None:
    bounds = ImageBounds(max_bytes=2000, max_pixels=10_000, max_count=2)
    small, wide = image_part(png(10, 10), "a.png"), image_part(gif(200, 100), "wide.gif")
    heavy = ImagePart("image/png", png(10, 10) + bytes(3000), 10, 10, "heavy.png")
    bounded = bound_images([small, wide, heavy, small, small], bounds)
    assert bounded.kept == (small, small)
    assert bounded.refused == (
        "[image left out: image/gif 200x100, 14 bytes (wide.gif): it is 20000 pixels, above "
        "budgets.max_image_pixels = 10000]",
        f"[image left out: {describe(heavy)}: it is {len(heavy.data)} bytes, above budgets.max_image_bytes = 2000 "
        "(2.0 KiB)]",
        f"[image left out: {describe(small)}: it is picture 3 of this result, above "
        "budgets.max_images_per_result = 2]",
    )


def test_policy_image_bounds_default_on_and_refuse_out_of_range_values() -> None:
    assert parse_policy("").budgets.image_bounds() == ImageBounds(5 << 20, 4 << 20, 4)
    looser = parse_policy('[budgets]\nmax_image_bytes = "10m"\nmax_images_per_result = 0\n').budgets
    assert looser.image_bounds() == ImageBounds(10 << 20, 4 << 20, 0)
    with pytest.raises(PolicyError, match="max_image_bytes"):
        parse_policy('[budgets]\nmax_image_bytes = "1g"\n')
    with pytest.raises(PolicyError, match=r"times max_images_per_result \(5\) is 26214400 bytes, above the 24 MiB"):
        parse_policy('[budgets]\nmax_images_per_result = 5\n')


# ---- the call path ------------------------------------------------------------------------------


class Args(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    count: int


SECRET = "ghp_" + "Zz09" * 9


def pictures(_ctx: Any, args: Args) -> ToolOutput:
    images = tuple(image_part(png(8, 6), f"/workspace/p{n}.png") for n in range(args.count))
    leaky = image_part(png(8, 6), f"/workspace/{SECRET}.png")
    return ToolOutput(text=f"made {args.count}; token {SECRET}", images=(*images, leaky))


def no_engine() -> Any:
    raise AssertionError("these tests never start a sandbox")


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    policy = parse_policy("[budgets]\nmax_images_per_result = 2\n")
    registry = ToolRegistry([Tool(ToolDefinition("pictures", "Makes pictures.", Args), pictures)])
    with AuditStore(tmp_path / "audit.sqlite3") as audit, \
            Session(registry, policy, audit, run_id="r1", engine_factory=no_engine) as made:
        yield made


def test_call_path_carries_pictures_refuses_extra_ones_in_words_and_redacts_text_and_labels(
        session: Session) -> None:
    result = session.call(ToolCall("pictures", {"count": 1}, "c1"))
    assert [image.label for image in result.images] == ["/workspace/p0.png", "/workspace/[redacted: github_token].png"]
    assert result.images[0].data == png(8, 6) and (result.images[0].width, result.images[0].height) == (8, 6)
    assert result.text == "made 1; token [redacted: github_token]"
    assert result.meta["images"][0] == {"media_type": "image/png", "width": 8, "height": 6,
                                        "bytes": len(png(8, 6)), "label": "/workspace/p0.png",
                                        "sha256": hashlib.sha256(png(8, 6)).hexdigest()}
    assert result.meta["redactions"]["count"] == 2

    over = session.call(ToolCall("pictures", {"count": 3}, "c2"))
    assert len(over.images) == 2 and over.meta["images_refused"] == 2
    assert over.text.splitlines()[1:] == [
        f"[image left out: image/png 8x6, {len(png(8, 6))} bytes (/workspace/p2.png): it is picture 3 of this "
        "result, above budgets.max_images_per_result = 2]",
        f"[image left out: image/png 8x6, {len(png(8, 6))} bytes (/workspace/[redacted: github_token].png): it is "
        "picture 3 of this result, above budgets.max_images_per_result = 2]",
    ]


def test_audit_keeps_each_picture_once_and_a_replay_gets_the_pictures_back(session: Session) -> None:
    first = session.call(ToolCall("pictures", {"count": 1}, "c1"))
    session.call(ToolCall("pictures", {"count": 1}, "c2"))
    assert session.audit.image_bytes() == len(png(8, 6))  # four pictures of the same bytes, kept once
    replayed = session.call(ToolCall("pictures", {"count": 1}, "c1"))  # the call_id seen before: not run again
    assert replayed.images == first.images and replayed.text == first.text
    digest = first.meta["images"][0]["sha256"]
    assert session.audit.image_blob(digest) == ("image/png", png(8, 6))
    assert session.audit.image_blob("0" * 64) is None
    assert verify(session.audit.path).ok  # the blobs are in the audit chain like every record


# ---- formats -----------------------------------------------------------------------------------

PICTURE = image_part(png(3, 2), "chart.png")
B64 = base64.b64encode(PICTURE.data).decode()
WITH_PICTURE = ToolResult(call_id="c1", text="a chart", images=(PICTURE,))


def test_responses_output_is_text_then_input_image() -> None:
    assert result_item(WITH_PICTURE, "openai") == {
        "type": "function_call_output", "call_id": "c1",
        "output": [{"type": "input_text", "text": "a chart"},
                   {"type": "input_image", "image_url": f"data:image/png;base64,{B64}"}],
    }
    assert data_url(PICTURE) == f"data:image/png;base64,{B64}"


def test_anthropic_tool_result_is_text_then_image_block() -> None:
    assert result_item(WITH_PICTURE, "anthropic") == {
        "type": "tool_result", "tool_use_id": "c1", "is_error": False,
        "content": [{"type": "text", "text": "a chart"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64}}],
    }
    no_text = ToolResult(call_id="c1", text="", images=(PICTURE,))
    assert [block["type"] for block in result_item(no_text, "anthropic")["content"]] == ["image"]  # no empty text


def test_mcp_result_has_image_content_after_the_text() -> None:
    assert result_item(WITH_PICTURE, "mcp")["content"] == [
        {"type": "text", "text": "a chart"}, {"type": "image", "data": B64, "mimeType": "image/png"}]


def test_chat_tool_message_names_the_picture_and_a_user_message_after_the_turn_carries_it() -> None:
    tool_message = result_item(WITH_PICTURE, "chat")
    assert tool_message == {"role": "tool", "tool_call_id": "c1", "content": (
        "a chart\n[image 1: image/png 3x2, " f"{len(PICTURE.data)} bytes (chart.png); it follows in a user message]")}
    context = Context(system="")
    plain = ToolResult(call_id="c2", text="no picture")
    append_results(context, [WITH_PICTURE, plain], "chat")
    assert [item["role"] for item in context.items] == ["tool", "tool", "user"]  # tool messages first, together
    assert context.items[2]["content"] == [
        {"type": "text", "text": f"[image 1 of tool call c1: image/png 3x2, {len(PICTURE.data)} bytes (chart.png)]"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{B64}"}},
    ]
    assert chat_image_message([plain]) is None
    append_results(context, [plain], "chat")
    assert context.items[-1]["role"] == "tool"


def test_a_result_without_pictures_keeps_its_plain_shape() -> None:
    plain = ToolResult(call_id="c1", text="hi")
    assert result_item(plain, "openai")["output"] == "hi"
    assert result_item(plain, "anthropic")["content"] == "hi"
    assert result_item(plain, "chat")["content"] == "hi"


def test_grpc_result_message_carries_the_pictures_to_the_python_client() -> None:
    from harness.client import CallResult
    from harness.doors.grpc.messages import result_message

    message = result_message(WITH_PICTURE, "anthropic")
    wire = type(message).FromString(message.SerializeToString())
    got = CallResult.from_proto(wire)
    assert got.images == (PICTURE,)
    assert got.item["content"][1]["source"]["data"] == B64


# ---- the terminal ------------------------------------------------------------------------------


def test_terminal_saves_each_picture_and_names_it_with_its_size_and_path(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.cli.pictures import picture_lines
    from harness.cli.run import _LiveView
    from harness.loop.events import RunStarted, ToolCallFinished

    saved = tmp_path / "images" / "r_1" / "c1-1.png"
    assert picture_lines(WITH_PICTURE, "r/1", tmp_path / "images") == [
        f"[image 1: image/png 3x2, {len(PICTURE.data)} bytes (chart.png) saved to {saved}]"]
    assert saved.read_bytes() == PICTURE.data and saved.stat().st_mode & 0o777 == 0o600
    assert picture_lines(ToolResult(call_id="c2", text="none"), "r1", tmp_path) == []

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    view = _LiveView()
    view.show(RunStarted(run_id="r9", model="scripted", resumed=False))
    view.show(ToolCallFinished(turn=1, call_id="c1", name="view_image", decision="allow", result=WITH_PICTURE))
    shown = capsys.readouterr().out
    assert "a chart" in shown and "[image 1: image/png 3x2" in shown and "/images/r9/c1-1.png]" in shown
    assert (tmp_path / "state" / "callbox" / "images" / "r9" / "c1-1.png").read_bytes() == PICTURE.data


# ---- the console -------------------------------------------------------------------------------


def test_console_shows_a_calls_pictures_from_a_route_behind_its_auth(session: Session) -> None:
    from starlette.testclient import TestClient

    from harness.doors.grpc.tokens import TokenSet
    from harness.doors.http.app import console_app
    from harness.doors.http.auth import Sessions
    from harness.doors.http.console import Console

    result = session.call(ToolCall("pictures", {"count": 1}, "c1"))
    session.audit.start_run("other", meta={"client": "someone"})
    digest = result.meta["images"][0]["sha256"]
    tokens = TokenSet({"admin": "admin-token-0123456789", "agent": "agent-token-0123456789"}, source="unit",
                      operators=["admin"])
    app = console_app(Console(session.audit, None), Sessions(tokens), engine_ping=lambda: None, tls=False,
                      loopback=True)
    with TestClient(app, base_url="http://127.0.0.1") as http:
        admin = {"authorization": "Bearer admin-token-0123456789"}
        page = http.get(f"/runs/{session.run_id}", headers=admin)
        assert page.status_code == 200
        src = f"/runs/{session.run_id}/images/{digest}"
        assert f'<img src="{src}" alt="/workspace/p0.png" width="8" height="6"' in page.text
        served = http.get(src, headers=admin)
        assert served.status_code == 200 and served.content == png(8, 6)
        assert served.headers["content-type"] == "image/png" and served.headers["x-content-type-options"] == "nosniff"
        assert http.get(src).status_code == 401  # no token
        assert http.get(src, headers={"authorization": "Bearer agent-token-0123456789"}).status_code == 404
        assert http.get(f"/runs/other/images/{digest}", headers=admin).status_code == 404  # not that run's


# ---- view_image without a sandbox ----------------------------------------------------------------


class _Files:
    """The agent's file reads over a dict of files, in chunks as the real agent answers them."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.reads: list[int] = []

    def read_file(self, path: str, *, offset: int = 0, limit: int = 0) -> Any:
        from types import SimpleNamespace

        from harness.core.errors import AgentCallError

        if path not in self.files:
            raise AgentCallError(f"{path} does not exist", reason="NOT_FOUND", grpc_code="NOT_FOUND", retryable=False)
        data = self.files[path]
        self.reads.append(offset)
        chunk = data[offset:offset + limit]
        return SimpleNamespace(data=chunk, size=len(data), truncated=offset + len(chunk) < len(data))


def _view(files: _Files, path: str, bounds: ImageBounds) -> ToolOutput:
    from types import SimpleNamespace

    from harness.core.context import ToolContext
    from harness.tools.view_image import VIEW_IMAGE, ViewImageArgs

    box = SimpleNamespace(runtime=lambda: SimpleNamespace(agent=files))
    ctx = ToolContext(run_id="r", call_id="c", provider=SimpleNamespace(sandbox=lambda: box),
                      default_timeout_s=30, timeout_ceiling_s=60, output_budget=30000, image_bounds=bounds)
    return VIEW_IMAGE.handler(ctx, ViewImageArgs(path=path))


def test_view_image_reads_in_chunks_and_refuses_a_file_over_the_bound_after_one_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.tools.view_image as view_image

    monkeypatch.setattr(view_image, "READ_CHUNK", 100)
    picture = png(300, 300, (1, 2, 3)) + bytes(250)  # trailing bytes a PNG reader ignores
    files = _Files({"a.png": picture, "big.png": picture + bytes(5000), "shot.webp": webp_lossy(64, 48)})
    bounds = ImageBounds(max_bytes=4096, max_pixels=100_000, max_count=1)
    seen = _view(files, "a.png", bounds)
    assert not seen.is_error and seen.images[0].data == picture and len(files.reads) == -(-len(picture) // 100)
    assert seen.structured == {"path": "a.png", "media_type": "image/png", "width": 300, "height": 300,
                               "size": len(picture)}
    files.reads.clear()
    big = _view(files, "big.png", bounds)
    assert big.is_error and files.reads == [0]
    assert big.text.startswith(f"big.png is {len(picture) + 5000} bytes, above budgets.max_image_bytes = 4096")
    assert _view(files, "shot.webp", bounds).images[0].media_type == "image/webp"
    missing = _view(files, "none.png", bounds)
    assert missing.is_error and missing.text.startswith("no such file or directory: none.png")


def test_the_loops_context_budget_elides_the_chat_pictures_message_like_an_output() -> None:
    from harness.core.formats import chat_images_call_id
    from harness.loop.context_budget import elide, tool_outputs

    context = Context(system="")
    big = ToolResult(call_id="call:1", text="shot", images=(image_part(png(200, 200, (9, 9, 9)) + bytes(4000)),))
    append_results(context, [big], "chat")
    append_results(context, [ToolResult(call_id="c2", text="later")], "chat")
    assert chat_images_call_id(context.items[1]) == "call:1"
    assert [out.call_id for out in tool_outputs(context.items)] == ["call:1", "call:1", "c2"]
    done = elide(context.items, 2000, keep_latest=1)
    assert done.call_ids == ("call:1", "call:1")
    assert context.items[1] == {"role": "user", "content": context.items[1]["content"]}
    assert str(context.items[1]["content"]).startswith("[output of call:1 elided: ")
