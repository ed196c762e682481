"""Driver for tests/interop/test_deepagents.py: run in the deepagents harness's virtualenv
(tests/interop/requirements/deepagents.txt), never imported by the suite.

A deep agent (``create_deep_agent``) on ``langchain-e2b``'s ``E2BSandbox`` backend, as that
package's README writes it: an E2B sandbox made with the ``e2b`` SDK, found through
``E2B_API_URL``/``E2B_SANDBOX_URL``/``E2B_API_KEY`` (the test points them at ``callbox serve
--e2b``). The model is langchain_core's ``FakeMessagesListChatModel`` playing one tool call a
turn (CALLS: ``write_file``, ``edit_file``, ``read_file``, ``grep``, ``execute``, ``ls``,
``glob``, an edit too big to inline, a failing, a denied and a timed-out command) then a last
message; it records the tool results each turn received. Then the async variant
(``AsyncE2BSandbox``, ``ainvoke``) on the same sandbox. The program prints one JSON line: what
each model received, the tool messages, the files read back through the e2b SDK and the
sandbox's processes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatResult
from pydantic import Field

PROJECT = "/home/user/proj"
APP = f"{PROJECT}/app.py"
FINAL = "greet() now names callbox."
DATA = f"{PROJECT}/data.txt"
BIG = 60_000  # an edit over 50 kB: langchain-e2b uploads old and new text instead of inlining them
DENIED = "git push origin main"  # the test's policy denies it
OUTSIDE = "/opt/outside.txt"  # not under /home/user, /tmp or /workspace
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("write_file", {"file_path": APP, "content": "def greet():\n    return 'hello'\n"}),
    ("edit_file", {"file_path": APP, "old_string": "'hello'", "new_string": "'hello from callbox'"}),
    ("read_file", {"file_path": APP}),
    ("grep", {"pattern": "callbox", "path": PROJECT, "output_mode": "content"}),
    ("execute", {"command": f"cd {PROJECT} && python3 -c 'import app; print(app.greet())' && uname -s"}),
    ("ls", {"path": PROJECT}),
    ("glob", {"pattern": "*.py", "path": PROJECT}),
    ("write_file", {"file_path": DATA, "content": "HEAD\n" + "x" * BIG + "\nTAIL\n"}),
    ("edit_file", {"file_path": DATA, "old_string": "x" * BIG, "new_string": "y" * BIG}),
    ("execute", {"command": "echo partial; exit 3"}),
    ("execute", {"command": DENIED}),
    ("execute", {"command": "sleep 30", "timeout": 1}),
]
ASYNC_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("write_file", {"file_path": f"{PROJECT}/async.txt", "content": "written by an async agent\n"}),
    ("execute", {"command": f"wc -c < {PROJECT}/async.txt"}),
]


class ScriptedChatModel(FakeMessagesListChatModel):
    """``FakeMessagesListChatModel`` that accepts the agent's tools and keeps what each turn
    received in ``seen``. ``create_deep_agent`` binds its tools to the model, and neither of
    langchain_core's fake chat models (this one, ``GenericFakeChatModel``) implements
    ``bind_tools``: this one binds none, its replies being scripted."""

    seen: list[list[BaseMessage]] = Field(default_factory=list)
    tool_names: list[str] = Field(default_factory=list)

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: str | None = None,
                   **kwargs: Any) -> ScriptedChatModel:
        self.tool_names = [getattr(t, "name", None) or t.get("name", "") for t in tools]
        return self

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        self.seen.append(list(messages))
        if len(self.seen) > len(self.responses):
            raise AssertionError(f"deepagents asked the model for turn {len(self.seen)} beyond the script")
        return super()._generate(messages, stop, run_manager, **kwargs)


def script(calls: list[tuple[str, dict[str, Any]]]) -> list[BaseMessage]:
    turns: list[BaseMessage] = [
        AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call_{i}", "type": "tool_call"}])
        for i, (name, args) in enumerate(calls)]
    return [*turns, AIMessage(content=FINAL)]


def summary(model: ScriptedChatModel, result: dict[str, Any]) -> dict[str, Any]:
    """What the run returned and what its model received, as JSON."""
    tool_messages = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    return {
        "final": result["messages"][-1].content,
        "tool_results": [{"name": m.name, "status": m.status, "content": str(m.content)} for m in tool_messages],
        "model_received": [[str(m.content) for m in turn if isinstance(m, ToolMessage)] for turn in model.seen],
    }


def run_outside(sandbox: Any) -> str:
    """A ``write_file`` outside the sandbox user's places: callbox refuses it; what the run
    does with that (langchain-e2b lets the SDK's exception out of the tool)."""
    from deepagents import create_deep_agent
    from langchain_e2b import E2BSandbox

    model = ScriptedChatModel(responses=script([("write_file", {"file_path": OUTSIDE, "content": "x\n"})]))
    agent = create_deep_agent(model=model, backend=E2BSandbox(sandbox=sandbox))
    try:
        result = agent.invoke({"messages": [{"role": "user", "content": "write outside"}]})
    except Exception as exc:  # reported for the test to check, not handled
        return f"raised {type(exc).__name__}: {exc}"
    return f"returned {[str(m.content) for m in result['messages'] if isinstance(m, ToolMessage)]}"


async def run_async(sandbox_id: str) -> dict[str, Any]:
    """The async variant on the same sandbox: ``AsyncE2BSandbox`` and ``ainvoke``."""
    model = ScriptedChatModel(responses=script(ASYNC_CALLS))
    # README: deepagents-async snippet start
    from deepagents import create_deep_agent
    from e2b import AsyncSandbox
    from langchain_e2b import AsyncE2BSandbox

    sandbox = await AsyncSandbox.connect(sandbox_id)
    agent = create_deep_agent(model=model, backend=AsyncE2BSandbox(sandbox=sandbox))
    result = await agent.ainvoke({"messages": [{"role": "user", "content": "leave a note"}]})
    print(result["messages"][-1].content)
    # README: deepagents-async snippet end
    return summary(model, result)


def main() -> None:
    model = ScriptedChatModel(responses=script(CALLS))
    # README: deepagents snippet start
    from deepagents import create_deep_agent
    from e2b import Sandbox
    from langchain_e2b import E2BSandbox

    with Sandbox.create() as sandbox:  # killed when the block ends
        agent = create_deep_agent(model=model, backend=E2BSandbox(sandbox=sandbox),
                                  system_prompt="You fix code in /home/user/proj.")
        result = agent.invoke({"messages": [{"role": "user", "content": "make greet() name callbox"}]})
        print(result["messages"][-1].content)
        # README: deepagents snippet end
        report = {"tools_offered": model.tool_names, **summary(model, result)}
        report["async"] = asyncio.run(run_async(sandbox.sandbox_id))
        report["outside"] = run_outside(sandbox)
        report["in_sandbox"] = {path: sandbox.files.read(path) for path in (APP, DATA, f"{PROJECT}/async.txt")}
        report["listed"] = [entry.name for entry in sandbox.files.list(PROJECT)]
        report["processes"] = sandbox.commands.run("ps -eo args").stdout.splitlines()
    report["left_running"] = [s.sandbox_id for s in Sandbox.list().next_items() if s.sandbox_id == sandbox.sandbox_id]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
