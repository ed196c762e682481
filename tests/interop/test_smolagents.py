"""smolagents (``smolagents[e2b]``, pinned in pyproject's dev extras) runs its code in callbox.

``CodeAgent(executor_type="e2b")`` as smolagents' documentation writes it: the agent's
``E2BExecutor`` creates an ``e2b_code_interpreter`` sandbox (the SDK's default template,
``code-interpreter-v1``: callbox's code-interpreter image variant, built first when missing)
against ``callbox serve --e2b``, found through ``E2B_API_URL``/``E2B_SANDBOX_URL``/``E2B_API_KEY``,
then sends it the agent's tools (a ``@tool`` of ours and ``final_answer``), runs ``!pip install``
for ``additional_authorized_imports`` (numpy, already in the image) and the task's
``additional_args``. The model is a subclass of smolagents' own ``Model`` playing code blobs in
CodeAgent's format (``Thought:`` then ``<code>...</code>``), one per step, recording what it was
sent, so the test asserts on the observations the model really reads: step 1's printed output,
step 2's exception as the kernel raised it, the reason of the policy rule that denies step 3,
step 1's variable used again in step 4 and the value of ``final_answer``. One server (its policy
denies ``git push``) and one agent (one sandbox) for the module.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from e2b import Sandbox as BaseSandbox
from smolagents import ChatMessage, MessageRole, Model, tool

from harness.engine.image.build import default_repo_root
from harness.engine.image.variants import build_variant
from tests.interop.e2b_server import (
    DENIED_COMMAND_REASON,
    INTEROP_POLICY,
    E2bServer,
    sdk_environment,
    serve_e2b,
)

pytestmark = [pytest.mark.docker, pytest.mark.interop, pytest.mark.smolagents]

STEPS = [
    # Step 1: state the next steps use (from additional_args, numpy, a tool of the agent's), and a
    # file to find in the sandbox afterwards.
    "Thought: I count the primes below the limit and keep them.\n<code>\n"
    "import numpy as np\n"
    "primes = [n for n in range(2, limit) if all(n % d for d in range(2, n))]\n"
    "open('/tmp/smolagents-step1.txt', 'w').write(str(len(primes)))\n"
    "print(shout(f'found {len(primes)} primes summing to {np.sum(primes)}'))\n</code>",
    # Step 2: an exception, which the model must read as the kernel raised it.
    "Thought: I check the largest one.\n<code>\nassert primes[-1] == 101, f'largest is {primes[-1]}'\n</code>",
    # Step 3: code the server's policy denies: the model reads the rule's reason.
    "Thought: I publish the result.\n<code>\nimport os\nos.system('git push origin main')\n</code>",
    # Step 4: step 1's variable again (the kernel kept it), and the answer.
    "Thought: 97 is the largest; I answer.\n<code>\n"
    "final_answer({'count': len(primes), 'largest': primes[-1]})\n</code>",
]


@tool
def shout(text: str) -> str:
    """Says a text louder: upper case, with an exclamation mark.

    Args:
        text: what to say.
    """
    return text.upper() + "!"


class ScriptedModel(Model):
    """smolagents' ``Model`` playing ``replies`` in order; ``seen[n]`` is the text of the
    messages step n was sent."""

    def __init__(self, replies: list[str]) -> None:
        super().__init__(model_id="scripted")
        self.replies = list(replies)
        self.seen: list[str] = []

    def generate(self, messages: list[Any], stop_sequences: list[str] | None = None,
                 response_format: dict[str, str] | None = None, tools_to_call_from: list[Any] | None = None,
                 **kwargs: Any) -> ChatMessage:
        self.seen.append("\n".join(_text(m) for m in messages))
        if not self.replies:
            raise AssertionError(f"smolagents asked for step {len(self.seen)} beyond the script")
        return ChatMessage(role=MessageRole.ASSISTANT, content=self.replies.pop(0))


def _text(message: Any) -> str:
    content = message.content if isinstance(message, ChatMessage) else message["content"]
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text", "") for part in content or [])


@pytest.fixture(scope="module")
def server(engine: Any) -> Iterator[E2bServer]:
    build_variant(engine.client, "code-interpreter", repo_root=default_repo_root(), progress=lambda _line: None)
    with serve_e2b(engine, policy=INTEROP_POLICY) as served:
        yield served


def test_code_agent_runs_its_steps_in_the_code_interpreter(server: E2bServer) -> None:
    model = ScriptedModel(STEPS)
    with sdk_environment(server):  # E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY
        # README: smolagents snippet start
        from smolagents import CodeAgent

        with CodeAgent(
            tools=[shout],
            model=model,
            executor_type="e2b",  # an e2b_code_interpreter Sandbox (template code-interpreter-v1)
            additional_authorized_imports=["numpy"],  # pip-installed in the sandbox first
        ) as agent:  # leaving the block kills the sandbox
            answer = agent.run("How many primes are below the limit, and which is the largest?",
                               additional_args={"limit": 100})
            print(answer)
            # README: smolagents snippet end
            sandbox_id = agent.python_executor.sandbox.sandbox_id
            in_sandbox = BaseSandbox.connect(sandbox_id).files.read("/tmp/smolagents-step1.txt")
        assert not [s for s in BaseSandbox.list().next_items() if s.sandbox_id == sandbox_id], "not killed"

    assert answer == {"count": 25, "largest": 97}, f"smolagents: final_answer returned {answer!r}"
    assert in_sandbox == "25", f"smolagents: step 1's file in the sandbox holds {in_sandbox!r}"
    assert len(model.seen) == 4, f"smolagents: the model was asked {len(model.seen)} times"
    # Each observation reaches the model's next step: step 1's output, step 2's exception, the
    # policy's refusal of step 3.
    assert "FOUND 25 PRIMES SUMMING TO 1060!" in model.seen[1], model.seen[1]
    assert "AssertionError" in model.seen[2] and "largest is 97" in model.seen[2], model.seen[2]
    assert DENIED_COMMAND_REASON in model.seen[3], model.seen[3][-2000:]
