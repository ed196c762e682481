"""``apply_patch``: edit files in the sandbox with a patch in the Codex ``*** Begin Patch`` format.

The patch arrives as plain text (a freeform call, as Codex sends it) or as ``{"patch": ...}``.
Parsing and the new file contents come from :mod:`harness.tools.patch_format`; every read and
write goes through the sandbox agent's Filesystem service, which resolves relative paths from
the sandbox's working directory and refuses anything outside the allowed roots.

Result text is what Codex prints: on success ``Success. Updated the following files:`` then
``A path`` / ``M path`` / ``D path`` lines; on failure Codex's message (``Invalid patch: ...``,
``Failed to find expected lines in ...``, ``Failed to delete file ...``). As in Codex, hunks are
applied in order and a failure leaves the hunks before it applied (``structured`` lists them).
A path the agent refuses (outside the roots, NUL byte, too long) fails with Codex's message
followed by the agent's reason.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from harness.core.calls import ErrorCode, ToolOutput
from harness.core.context import ToolContext
from harness.core.errors import AgentCallError
from harness.core.registry import Tool, ToolAnnotations, ToolDefinition
from harness.engine.agent_client import AgentClient
from harness.tools.patch_format import (
    NOT_UTF8_DETAIL,
    ApplyError,
    FileOp,
    ParseError,
    PatchError,
    ReadFailure,
    apply_patch,
    parse_patch,
)
from sandbox.v1 import filesystem_pb2

# Agent reasons Codex's own messages already cover (a missing file, a directory where a file
# is expected, ...): the message stays exactly Codex's. Other reasons are the sandbox's own
# refusals (outside the roots, bad path, no space, agent trouble): their sentence is appended.
_CODEX_WORDED = frozenset({"NOT_FOUND", "WRONG_TYPE", "ALREADY_EXISTS", "PERMISSION_DENIED"})

# How Rust's io::Error words these causes in "Failed to read file to update PATH: CAUSE".
_IS_A_DIRECTORY = "Is a directory (os error 21)"
_NOT_A_DIRECTORY = "Not a directory (os error 20)"
_PERMISSION_DENIED = "Permission denied (os error 13)"


class ApplyPatchArgs(BaseModel):
    """Apply a patch in the Codex apply_patch format to files in the sandbox."""

    model_config = ConfigDict(extra="forbid")

    patch: str = Field(description="The whole patch, from '*** Begin Patch' to '*** End Patch'.")


DESCRIPTION = """\
Edit files with a patch in the Codex apply_patch format: pass the whole patch as `patch` (a \
freeform call may send the patch text itself). Paths are relative to the working directory; \
absolute paths must stay inside the sandbox's allowed roots.

*** Begin Patch
*** Add File: <path>          (new file; every following line starts with +)
*** Delete File: <path>
*** Update File: <path>
*** Move to: <new path>       (optional, right after Update File, to rename)
@@ <optional context line, e.g. a class or function header>
 <unchanged line>
-<removed line>
+<added line>
*** End of File               (optional: the chunk ends at the end of the file)
*** End Patch

Show about 3 unchanged lines around each change so it can be located. On success the \
result lists the changed files: A added, M modified, D deleted."""


def _detail(error: AgentCallError) -> str:
    return "" if error.reason in _CODEX_WORDED else f": {error.message}"


class _AgentTarget:
    """Applies the patch's steps through the sandbox agent (the sandbox starts on first use)."""

    def __init__(self, agent: Callable[[], AgentClient]) -> None:
        self._get_agent = agent
        self._agent: AgentClient | None = None

    @property
    def agent(self) -> AgentClient:
        if self._agent is None:
            self._agent = self._get_agent()
        return self._agent

    def read(self, location: str) -> str | None:
        try:
            data = self._read_all(location)
        except AgentCallError as error:
            if error.reason == "NOT_FOUND":
                return None
            raise ReadFailure(self._read_detail(location, error)) from None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ReadFailure(NOT_UTF8_DETAIL) from None

    def _read_all(self, location: str) -> bytes:
        chunks: list[bytes] = []
        offset = 0
        while True:
            response = self.agent.read_file(location, offset=offset)
            chunks.append(response.data)
            offset += len(response.data)
            if not response.truncated or not response.data:
                return b"".join(chunks)

    def _read_detail(self, location: str, error: AgentCallError) -> str:
        if error.reason == "PERMISSION_DENIED":
            return _PERMISSION_DENIED
        if error.reason != "WRONG_TYPE":
            return error.message
        try:
            info = self.agent.stat(location)
        except AgentCallError as stat_error:
            return _NOT_A_DIRECTORY if stat_error.reason == "WRONG_TYPE" else error.message
        return _IS_A_DIRECTORY if info.type == filesystem_pb2.FILE_TYPE_DIRECTORY else error.message

    def perform(self, op: FileOp) -> None:
        if op.kind != "write":
            try:
                self.agent.remove(op.location)
            except AgentCallError as error:
                raise ApplyError(op.failed() + _detail(error)) from None
            return
        parent = posixpath.dirname(op.location)
        if op.make_parents and parent:
            try:
                self.agent.make_dir(parent, parents=True, exist_ok=True)
            except AgentCallError as error:
                raise ApplyError(op.parents_failed() + _detail(error)) from None
        try:
            self.agent.write_file(op.location, op.contents.encode("utf-8"))
        except AgentCallError as error:
            raise ApplyError(op.failed() + _detail(error)) from None


def _failure(error: PatchError, code: ErrorCode) -> ToolOutput:
    text = error.message + "\n"
    return ToolOutput(
        text=text, is_error=True, error=code, structured={"applied": False, **error.affected.as_dict()},
        raw_bytes=len(text.encode()),
    )


def run_apply_patch(ctx: ToolContext, args: ApplyPatchArgs) -> ToolOutput:
    try:
        args.patch.encode("utf-8")
    except UnicodeEncodeError:
        return _failure(ParseError("the patch is not valid Unicode text (it contains a lone surrogate)"),
                        ErrorCode.INVALID_ARGUMENTS)
    try:
        patch = parse_patch(args.patch)
    except ParseError as error:  # nothing was touched: the model should fix the patch
        return _failure(error, ErrorCode.INVALID_ARGUMENTS)
    try:
        affected = apply_patch(patch, _AgentTarget(lambda: ctx.runtime().agent))
    except PatchError as error:
        return _failure(error, ErrorCode.TOOL_FAILED)
    text = affected.summary()
    return ToolOutput(text=text, structured={"applied": True, **affected.as_dict()}, raw_bytes=len(text.encode()))


APPLY_PATCH = Tool(
    ToolDefinition(
        name="apply_patch",
        description=DESCRIPTION,
        input_model=ApplyPatchArgs,
        annotations=ToolAnnotations(read_only=False, destructive=True, idempotent=False, open_world=False,
                                    title="Apply patch"),
        freeform_field="patch",
    ),
    run_apply_patch,
)
