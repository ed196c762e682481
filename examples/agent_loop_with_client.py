"""A plain OpenAI-client tool loop whose tools run in a callbox sandbox, through the gRPC executor.

The loop is the usual Responses API one; callbox supplies the tool definitions
(``list_tools("openai")``) and runs each ``function_call`` the model emits
(``call(...)``), returning the ``function_call_output`` item to append for the same
``call_id``. Validation, policy, approvals and the audit log happen on the server.

Run it against a live model::

    callbox serve --grpc &                  # first start prints a token; or export CALLBOX_TOKEN
    export OPENAI_API_KEY=...
    python examples/agent_loop_with_client.py --model gpt-5 "Which Python version is in the sandbox?"

or without one, replaying a transcript with callbox's scripted model in place of the
OpenAI client (this is how the test runs it)::

    python examples/agent_loop_with_client.py --scripted transcript.jsonl "any task"
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from harness.client import ExecutorClient, OutputEvent


def run_loop(
    responses: Any,
    executor: ExecutorClient,
    *,
    model: str,
    task: str,
    max_turns: int = 20,
    on_output: Callable[[OutputEvent], None] | None = None,
) -> str:
    """Ask the model, run its tool calls in one sandbox, repeat until it answers; the answer."""
    tools = executor.list_tools("openai")  # [{"type": "function", "name": ..., "parameters": ..., "strict": true}]
    sandbox = executor.create_sandbox()
    try:
        items: list[Any] = [{"role": "user", "content": task}]
        for _ in range(max_turns):
            response = responses.create(model=model, input=items, tools=tools)
            calls = []
            for item in response.output:
                items.append(item)  # the model's own items go back into the context as they are
                data = item if isinstance(item, dict) else item.model_dump()
                if data.get("type") == "function_call":
                    calls.append(data)
            if not calls:
                return str(response.output_text)
            for call in calls:
                result = executor.call(sandbox, call["name"], call["arguments"], call_id=call["call_id"],
                                       fmt="openai", on_output=on_output)
                items.append(result.item)  # {"type": "function_call_output", "call_id": ..., "output": ...}
        raise RuntimeError(f"no final answer after {max_turns} turns")
    finally:
        executor.delete_sandbox(sandbox)


class ScriptedResponses:
    """Stands in for ``OpenAI().responses``: each ``create`` returns the transcript's next turn."""

    def __init__(self, transcript: str) -> None:
        from harness.models.factory import make_model

        self.model = make_model(f"scripted:{transcript}")

    def create(self, *, model: str, input: list[Any], tools: list[dict[str, Any]], **_: Any) -> Any:
        from harness.models.base import Context

        turn = self.model.complete(Context(system="", items=list(input)), [], "auto")
        return SimpleNamespace(output=list(turn.items), output_text=turn.text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task")
    parser.add_argument("--model", default="gpt-5")
    parser.add_argument("--scripted", metavar="TRANSCRIPT", help="replay a JSONL transcript instead of calling OpenAI")
    parser.add_argument("--target", help="the executor (unix:/path or host:port; default: the local socket)")
    parser.add_argument("--token", help="bearer token (default: $CALLBOX_TOKEN or the token file)")
    args = parser.parse_args(argv)

    if args.scripted:
        responses: Any = ScriptedResponses(args.scripted)
    else:
        from openai import OpenAI

        responses = OpenAI().responses

    def show(event: OutputEvent) -> None:
        sys.stderr.buffer.write(event.data)
        sys.stderr.flush()

    with ExecutorClient(args.target, args.token) as executor:
        print(run_loop(responses, executor, model=args.model, task=args.task, on_output=show))
    return 0


if __name__ == "__main__":
    sys.exit(main())
