"""A JavaScript context: one node process running ``node_driver.js`` (a vm context kept across cells).

The server hands it each cell as a JSON line on a request pipe; the driver answers on the
control pipe with the cell's ``result`` (the last expression's value, as ``text``, the main
result), its ``error`` (the thrown error's name, message and stack) and its end. ``console``
output is the process's stdout and stderr. ``env_vars`` are set in ``process.env`` for the cell
(and its promise) and put back after it.

A TypeScript context is the same process with the driver told so: it transpiles each cell
(types stripped, not checked) and runs the JavaScript in its one vm context.
"""

from __future__ import annotations

import json
import os
from typing import Any

from process_context import Emit, ProcessContext

NODE = "/usr/bin/node"
DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node_driver.js")


class NodeContext(ProcessContext):
    language = "javascript"
    name = "node"

    def pipes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        control_read, control_write = os.pipe()
        request_read, request_write = os.pipe()
        self.requests = request_write
        return (request_read, control_write), (control_read, request_write)

    def command(self, child_fds: tuple[int, ...]) -> list[str]:
        return [NODE, DRIVER, str(child_fds[0]), str(child_fds[1]), self.language]

    def submit(self, code: str, env_vars: dict[str, str]) -> None:
        line = json.dumps({"seq": self.seq, "code": code, "env": env_vars}).encode() + b"\n"
        view = memoryview(line)
        try:
            while view:
                view = view[os.write(self.requests, view):]
        except OSError:
            pass  # node has exited: the cell ends with that

    def control(self, message: bytes, emit: Emit) -> bool:
        try:
            doc: dict[str, Any] = json.loads(message)
        except ValueError:
            return False
        if doc.get("seq") != self.seq:
            return False
        kind = doc.get("type")
        if kind == "result":
            emit({"type": "result", "text": doc.get("text", ""), "is_main_result": True})
        elif kind == "error":
            emit({"type": "error", "name": doc.get("name", ""), "value": doc.get("value", ""),
                  "traceback": doc.get("traceback", "")})
        return kind == "done"


class TypeScriptContext(NodeContext):
    """A node process whose driver transpiles each cell (Debian's node-typescript) before it runs."""

    language = "typescript"
    name = "node (typescript)"
