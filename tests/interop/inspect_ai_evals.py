"""Two Inspect AI evals on E2B sandboxes, as Inspect's and inspect-sandboxes' docs write them.

Run in the Inspect AI harness virtualenv (tests/interop/requirements/inspect-ai.txt) by
tests/interop/test_inspect_ai.py, with ``E2B_API_URL``, ``E2B_SANDBOX_URL`` and
``E2B_API_KEY`` pointing at ``callbox serve --e2b``:

    python inspect_ai_evals.py LOG_DIR DOCKERFILE

The model is Inspect's ``mockllm/model``, scripted with ``ModelOutput.for_tool_call``: no API
key, no network. The first eval (``sandbox="e2b"``, nothing else) runs ``bash()`` and
``python()``; the second builds its sandbox from ``DOCKERFILE`` (through the E2B template
build API) and edits the file that image holds with ``text_editor()``, then runs it in a
``bash_session()``: those two run Inspect's own tool binary, which Inspect copies into the
sandbox. Each eval's scorer reads the sandbox's state.

The last line printed is a JSON object: per eval, its status, error, scores and the text of
each tool result the model received.
"""

# ruff: noqa: E402  (each snippet the docs copy brings its own imports)
from __future__ import annotations

import json
import sys
from typing import Any

LOG_DIR, DOCKERFILE = sys.argv[1], sys.argv[2]

# README: inspect-ai snippet start
from inspect_ai import Task, eval, task
from inspect_ai.dataset import Sample
from inspect_ai.model import Model, ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import TaskState, generate, use_tools
from inspect_ai.tool import bash, python
from inspect_ai.util import sandbox


@scorer(metrics=[accuracy()])
def file_holds(path: str):
    """Correct when the sandbox's file ``path`` holds the sample's target."""

    async def score(state: TaskState, target: Target) -> Score:
        text = await sandbox().read_file(path)
        return Score(value=CORRECT if target.text in text else INCORRECT, answer=text)

    return score


def scripted(*outputs: ModelOutput) -> Model:
    """Inspect's mockllm model, answering ``outputs`` in turn."""
    for output in outputs:  # with a usage given, mockllm counts no tokens (tiktoken downloads its tables)
        output.usage = ModelUsage()
    return get_model("mockllm/model", custom_outputs=outputs)


@task
def hello_e2b() -> Task:
    return Task(
        dataset=[Sample(input="Save 6 * 7 in /tmp/answer.txt.", target="42")],
        solver=[use_tools([bash(), python()]), generate()],
        scorer=file_holds("/tmp/answer.txt"),
        sandbox="e2b",  # E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY lead to callbox
    )


model = scripted(
    ModelOutput.for_tool_call("mockllm/model", "python", {"code": "print(6 * 7)"}),
    ModelOutput.for_tool_call("mockllm/model", "bash", {"command": "echo 42 > /tmp/answer.txt; whoami"}),
    ModelOutput.from_content("mockllm/model", "Saved."),
)
[log] = eval(hello_e2b(), model=model, log_dir=LOG_DIR, display="none")
print(log.status, log.results.scores[0].metrics["accuracy"].value if log.results else log.error)
# README: inspect-ai snippet end
hello_log = log

APP = "/home/user/app/greet.py"
"""The file the Dockerfile's image holds."""

# README: inspect-ai-dockerfile snippet start
from inspect_ai.tool import bash_session, text_editor


@task
def fix_greeting() -> Task:
    return Task(
        dataset=[Sample(input=f"Make {APP} greet in French.", target="bonjour")],
        # as the sandbox's user, whose files these are (callbox's root may not write them)
        solver=[use_tools([text_editor(user="user"), bash_session(user="user")]), generate()],
        scorer=file_holds(APP),
        sandbox=("e2b", DOCKERFILE),  # a Dockerfile: built through E2B's template build API
    )


model = scripted(
    ModelOutput.for_tool_call("mockllm/model", "text_editor",
                              {"command": "str_replace", "path": APP, "old_str": "hello", "new_str": "bonjour"}),
    ModelOutput.for_tool_call("mockllm/model", "bash_session",
                              {"action": "type_submit", "input": f"python3 {APP}"}),
    ModelOutput.from_content("mockllm/model", "It says bonjour."),
)
[log] = eval(fix_greeting(), model=model, log_dir=LOG_DIR, display="none")
print(log.status, log.results.scores[0].metrics["accuracy"].value if log.results else log.error)
# README: inspect-ai-dockerfile snippet end


def summary(log: Any) -> dict[str, Any]:
    """What the test checks of one eval's log."""
    sample = log.samples[0] if log.samples else None
    return {
        "status": log.status,
        "error": None if log.error is None else f"{log.error.message}\n{log.error.traceback[-3000:]}",
        "accuracy": log.results.scores[0].metrics["accuracy"].value if log.results else None,
        "score": None if sample is None else {k: [s.value, s.answer] for k, s in (sample.scores or {}).items()},
        "tool_results": [] if sample is None else [
            {"tool": m.function, "text": m.text, "error": None if m.error is None else m.error.message}
            for m in sample.messages if m.role == "tool"],
        "sample_error": None if sample is None or sample.error is None else sample.error.message,
    }


print(json.dumps({"hello_e2b": summary(hello_log), "fix_greeting": summary(log)}))
