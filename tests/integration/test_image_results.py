"""Pictures reaching an MCP client: ``view_image`` of PNGs a sandbox wrote, and a chart the
``python`` tool drew, through the MCP door to the official ``mcp`` client as ``ImageContent``;
the policy's image bounds refusing pictures with their numbers. One HTTP server, one session,
one sandbox per test."""

from __future__ import annotations

import base64
import hashlib
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.types import ImageContent, TextContent

from harness.audit.store import AuditStore
from harness.core.images import read_header
from harness.doors.mcp.http import serve_mcp_http
from harness.engine.image.build import default_repo_root
from harness.engine.image.variants import VARIANTS, build_variant
from tests.conftest import IMAGE
from tests.support.pictures import PNG_SCRIPT, gif, jpeg, png, webp_lossy

OTHER_FORMATS = {"photo.jpg": (jpeg(40, 30), "image/jpeg"), "anim.gif": (gif(12, 7), "image/gif"),
                 "shot.webp": (webp_lossy(64, 48), "image/webp")}

pytestmark = pytest.mark.docker

FLOW_TIMEOUT_S = 120


def _text(result: Any) -> str:
    return "".join(block.text for block in result.content if isinstance(block, TextContent))


def test_view_image_reaches_the_mcp_client_and_bounds_refuse_with_their_numbers(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    policy = tmp_path / "policy.toml"
    policy.write_text(textwrap.dedent(f"""
        [sandbox]
        image = "{IMAGE}"
        [budgets]
        max_image_bytes = "64k"
        max_image_pixels = 1000000
    """))
    audit_path = tmp_path / "audit.sqlite3"
    server = serve_mcp_http("127.0.0.1:0", policy_path=policy, audit_path=audit_path)

    async def flow() -> str:
        async with Client(server.url) as client:
            made = await client.call_tool("shell", {"command": (
                f"cat > /tmp/png.py <<'EOF'\n{PNG_SCRIPT}EOF\n"
                "python3 /tmp/png.py 320 200 chart.png && python3 /tmp/png.py 1100 1000 wide.png && "
                "head -c 100000 /dev/urandom > noise.png && echo text > note.txt && "
                + " && ".join(f"echo {base64.b64encode(data).decode()} | base64 -d > {name}"
                              for name, (data, _kind) in OTHER_FORMATS.items())
            )})
            assert made.is_error is False, _text(made)
            for name, (data, kind) in OTHER_FORMATS.items():
                other = await client.call_tool("view_image", {"path": name})
                assert other.is_error is False, _text(other)
                [picture] = [block for block in other.content if isinstance(block, ImageContent)]
                assert picture.mime_type == kind and base64.b64decode(picture.data) == data, name

            seen = await client.call_tool("view_image", {"path": "chart.png"})
            assert seen.is_error is False, _text(seen)
            images = [block for block in seen.content if isinstance(block, ImageContent)]
            assert len(images) == 1 and images[0].mime_type == "image/png"
            data = base64.b64decode(images[0].data)
            assert read_header(data) == ("image/png", 320, 200) and data == png(320, 200)
            assert _text(seen) == f"Image image/png 320x200, {len(data)} bytes (chart.png)."

            wide = await client.call_tool("view_image", {"path": "wide.png"})
            assert wide.is_error is True
            assert _text(wide).startswith("wide.png (image/png, 1100x1000) is too large to view: it is 1100000 "
                                          "pixels, above budgets.max_image_pixels = 1000000. view_image does not")
            assert not [block for block in wide.content if isinstance(block, ImageContent)]

            noise = await client.call_tool("view_image", {"path": "noise.png"})
            assert noise.is_error is True
            assert _text(noise).startswith("noise.png is 100000 bytes, above budgets.max_image_bytes = 65536")

            text = await client.call_tool("view_image", {"path": "note.txt"})
            assert text.is_error is True and "not a PNG, JPEG, GIF or WebP image" in _text(text)
            return str((seen.meta or {})["callbox/run_id"])

    try:
        async def bounded() -> str:
            with anyio.fail_after(FLOW_TIMEOUT_S):
                return await flow()

        run_id = anyio.run(bounded)
    finally:
        server.stop()
    with AuditStore(audit_path) as audit:
        call = audit.get_call(run_id, f"mcp-{2 + len(OTHER_FORMATS):06d}")  # the view of chart.png
        assert call is not None and call.result is not None
        assert call.result.meta["images"] == [{"media_type": "image/png", "width": 320, "height": 200,
                                               "bytes": len(png(320, 200)), "label": "chart.png",
                                               "sha256": hashlib.sha256(png(320, 200)).hexdigest()}]
        assert audit.image_blob(hashlib.sha256(png(320, 200)).hexdigest()) == ("image/png", png(320, 200))


def test_a_python_chart_reaches_the_mcp_client_as_a_png_of_its_size(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    build_variant(engine.client, "code-interpreter", repo_root=default_repo_root(), progress=lambda _line: None)
    policy = tmp_path / "policy.toml"
    policy.write_text(textwrap.dedent(f"""
        [sandbox]
        image = "{VARIANTS["code-interpreter"].tag}"
        [tools.python]
    """))
    server = serve_mcp_http("127.0.0.1:0", policy_path=policy, audit_path=tmp_path / "audit.sqlite3")
    # The inline backend crops a figure to its drawing, as Jupyter does; uncropped, a figure of
    # 5 x 2.5 inches at 80 dpi is 400 x 200 pixels.
    chart = ("%config InlineBackend.print_figure_kwargs = {'bbox_inches': None}\n"
             "import matplotlib.pyplot as plt\n"
             "fig = plt.figure(figsize=(5, 2.5), dpi=80)\nplt.bar(range(len(heights)), heights)\nplt.show()")

    async def flow() -> None:
        async with Client(server.url) as client:
            tools = {tool.name for tool in (await client.list_tools()).tools}
            assert "python" in tools, tools
            first = await client.call_tool("python", {"code": "heights = [3, 1, 4, 1, 5]\nlen(heights)"})
            assert first.is_error is False and _text(first).endswith(": 5"), _text(first)
            drawn = await client.call_tool("python", {"code": chart})  # uses the first call's variable
            assert drawn.is_error is False, _text(drawn)
            [image] = [block for block in drawn.content if isinstance(block, ImageContent)]
            assert image.mime_type == "image/png"
            data = base64.b64decode(image.data)
            assert read_header(data) == ("image/png", 400, 200) and len(data) > 1000

    try:
        async def bounded() -> None:
            with anyio.fail_after(FLOW_TIMEOUT_S):
                await flow()

        anyio.run(bounded)
    finally:
        server.stop()
