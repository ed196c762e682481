"""``view_image`` (the name and arguments of Codex's tool): an image file in the sandbox,
returned to the model as a picture.

The file is read through the sandbox agent's Filesystem service like ``read_file``'s (the
same path rules: relative to the workspace, never outside the allowed roots). It must be a
PNG, JPEG, GIF or WebP (read from its header, whatever its name says) within the policy's
image bounds (``budgets.max_image_bytes``, ``budgets.max_image_pixels``): a larger one is
refused with its size and the bound, before more of it than the first chunk is read. It is
not scaled down: make a smaller copy in the sandbox (``convert``, or Python) and view that.

The result's text names the picture (``image/png 640x480, 12.3 KiB (chart.png)``); the
picture is its image part.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from harness.core.calls import ToolOutput
from harness.core.context import ToolContext
from harness.core.errors import AgentCallError
from harness.core.images import NotAnImage, describe, image_part, over_bound
from harness.tools.file_support import agent_failure, file_tool, refuse, show_path

READ_CHUNK = 1 << 20


class ViewImageArgs(BaseModel):
    """View an image file in the sandbox."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1, description="The image file: an absolute path, or relative to the workspace.")


def run_view_image(ctx: ToolContext, args: ViewImageArgs) -> ToolOutput:
    """Read the image file through the agent, check it, and return it as an image part."""
    agent = ctx.runtime().agent
    limit = ctx.image_bounds.max_bytes
    parts: list[bytes] = []
    offset = 0
    while True:
        try:
            response = agent.read_file(args.path, offset=offset, limit=READ_CHUNK)
        except AgentCallError as error:
            hint = "view_image reads image files only." if error.reason == "WRONG_TYPE" else ""
            return agent_failure(error, args.path, hint=hint)
        if response.size > limit:
            raise refuse(
                f"{show_path(args.path)} is {response.size} bytes, above budgets.max_image_bytes = {limit}; "
                "view_image does not scale pictures down. Make a smaller copy in the sandbox and view that.",
                path=args.path, size=response.size, max_image_bytes=limit,
            )
        data = bytes(response.data)
        parts.append(data)
        offset += len(data)
        if not response.truncated or not data or offset > limit:
            break
    content = b"".join(parts)
    try:
        image = image_part(content, label=args.path)
    except NotAnImage as exc:
        raise refuse(f"{show_path(args.path)} is not an image view_image can show: {exc}. "
                     "It shows PNG, JPEG, GIF and WebP files.", path=args.path) from None
    why = over_bound(image, ctx.image_bounds)
    if why is not None:
        raise refuse(f"{show_path(args.path)} ({image.media_type}, {image.width}x{image.height}) is too large to "
                     f"view: {why}. view_image does not scale pictures down: make a smaller copy in the sandbox and "
                     "view that.",
                     path=args.path, media_type=image.media_type, width=image.width, height=image.height,
                     size=len(content))
    return ToolOutput(
        text=f"Image {describe(image)}.",
        structured={"path": args.path, "media_type": image.media_type, "width": image.width,
                    "height": image.height, "size": len(content)},
        raw_bytes=len(content), images=(image,),
    )


VIEW_IMAGE = file_tool(
    "view_image",
    (
        "View an image file in the sandbox (PNG, JPEG, GIF or WebP): the picture is attached to the result "
        "for you to look at. The path is absolute or relative to the workspace. Images above the size "
        "limits are refused with their size: make a smaller copy first."
    ),
    ViewImageArgs, run_view_image, title="View image",
)
